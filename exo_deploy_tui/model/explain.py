"""Why a deployment cannot be placed, in numbers, from the State the dashboard holds.

The placement error stays in exo's wording (it is what exo's API says and what an operator
searches for); this module adds a line that says what in the cluster made it so: how much memory
the model needs against the most a connected group of nodes offers, which links are not RDMA,
which nodes lack a backend. It is a pure function of the deployment, the State and the friendly
names, so it is tested without a terminal. The nodes the keeper placed without, and named in its
error (those serving the model, cordoned, suspect or dead), are left out of the figures too.

The TUI may not import ``keeper.core.placement`` (tests/pure/test_layering.py), so the memory
figure is the bound placement cannot beat rather than placement's own search: the free memory of
the largest strongly connected group of nodes reporting memory (every cycle lies inside one such
group). On the fully connected clusters exo runs on, that group is a cycle and the bound is exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from keeper.model.state import (
    Backend,
    BackendName,
    Deployment,
    InstanceMeta,
    NodeId,
    RDMAConnection,
    State,
    cordoned_nodes,
)

# exo's placement errors, matched by their stable openings (keeper.core.placement writes the same).
_NO_MEMORY = "No cycles found with sufficient memory"
_NO_RDMA = "Requested RDMA"
_NO_TENSOR_SUPPORT = "Requested Tensor sharding but this model does not support"
_NO_TENSOR_SPLIT = "No tensor sharding found"
_NO_BACKEND = "No cycle where every node supports a backend"
_APART = "no placement apart from the nodes serving"
# How the keeper's error names the other nodes it placed without (keeper.core.apart writes the
# same): the figure leaves out the same nodes, or it would count memory placement never saw.
_CORDONED = "(cordoned, left out: "
_WATCHED = "(suspect or dead, left out: "

# The backends each engine runs on (exo's engine table, as keeper.core.placement.ENGINE_BACKENDS).
_ENGINE_BACKENDS: dict[InstanceMeta, frozenset[BackendName]] = {
    InstanceMeta.MLX_RING: frozenset({Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU}),
    InstanceMeta.MLX_JACCL: frozenset({Backend.MLX_METAL}),
}

# Joins a link's two ends: an en dash, since node names hold hyphens ("mini-a\u2013mini-b").
LINK = "\u2013"

# Past this many nodes or links a list says "and N more", so the line stays one line or two.
_LISTED = 4


def gb(in_bytes: int) -> str:
    """Whole gigabytes (1024**3), one decimal below 10: the precision a fit question needs."""
    value = in_bytes / 1024**3
    return f"{value:.0f}" if value >= 10 else f"{value:.1f}"


def explain_placement(
    deployment: Deployment, state: State, names: Mapping[NodeId, str]
) -> str | None:
    """One line that explains ``deployment.placement_error`` from ``state``, or None."""
    error = deployment.placement_error
    if not error:
        return None
    excluded: set[NodeId] = set()
    if error.startswith(_APART):
        excluded |= _serving_nodes(deployment, state)
        error = error.split(": ", 1)[1] if ": " in error else error
    if _CORDONED in error:
        excluded |= cordoned_nodes(state)
    if _WATCHED in error:
        excluded |= state.node_watch.keys() & set(state.topology.nodes)
    listed = ", ".join(sorted(_name(n, names) for n in excluded))
    prefix = f"without {listed}: " if listed else ""
    nodes = [n for n in sorted(set(state.topology.nodes)) if n not in excluded]
    if error.startswith(_NO_MEMORY):
        why = _memory(deployment, state, nodes, names)
    elif error.startswith(_NO_RDMA):
        why = _rdma(state, nodes, names)
    elif error.startswith(_NO_BACKEND):
        why = _backends(deployment, state, nodes, names)
    elif error.startswith(_NO_TENSOR_SUPPORT):
        why = f"the model card of {deployment.model_card.model_id} says no tensor parallelism"
    elif error.startswith(_NO_TENSOR_SPLIT):
        why = _tensor_split(deployment, state, nodes)
    else:
        return None
    return prefix + why


def _name(node: NodeId, names: Mapping[NodeId, str]) -> str:
    return names.get(node) or node[:8]


def _serving_nodes(deployment: Deployment, state: State) -> frozenset[NodeId]:
    model = deployment.model_card.model_id
    return frozenset(
        node
        for instance in state.instances.values()
        if instance.shard_assignments.model_id == model
        for node in instance.shard_assignments.node_to_runner
    )


# The groups of the last State asked about: every unplaceable deployment of a frame asks the
# same question of the same State (50 of them on 64 nodes spent 140 ms a frame recomputing it).
# States are immutable, and the memo holds the State itself, so identity is a safe key.
class _GroupsMemo:
    def __init__(self) -> None:
        self.state: State | None = None
        self.groups: dict[tuple[frozenset[NodeId], bool], list[list[NodeId]]] = {}


_MEMO = _GroupsMemo()


def _groups(
    state: State, nodes: Iterable[NodeId], *, rdma_only: bool = False
) -> list[list[NodeId]]:
    """The strongly connected groups among ``nodes`` (a node alone is a group of one)."""
    if _MEMO.state is not state:
        _MEMO.state, _MEMO.groups = state, {}
    key = (frozenset(nodes), rdma_only)
    groups = _MEMO.groups.get(key)
    if groups is None:
        groups = _MEMO.groups[key] = _strongly_connected(state, key[0], rdma_only)
    return groups


def _strongly_connected(
    state: State, nodes: frozenset[NodeId], rdma_only: bool
) -> list[list[NodeId]]:
    pool = set(nodes)
    succ: dict[NodeId, set[NodeId]] = {n: set() for n in pool}
    pred: dict[NodeId, set[NodeId]] = {n: set() for n in pool}
    for source, sinks in state.topology.connections.items():
        for sink, edges in sinks.items():
            if source not in pool or sink not in pool or source == sink or not edges:
                continue
            if rdma_only and not any(isinstance(e, RDMAConnection) for e in edges):
                continue
            succ[source].add(sink)
            pred[sink].add(source)
    groups: list[list[NodeId]] = []
    left = set(pool)
    while left:
        root = min(left)
        group = _reach(root, left, succ) & _reach(root, left, pred)
        groups.append(sorted(group))
        left -= group
    return groups


def _reach(root: NodeId, pool: set[NodeId], edges: Mapping[NodeId, set[NodeId]]) -> set[NodeId]:
    seen = {root}
    todo = [root]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt in pool and nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _memory(
    deployment: Deployment, state: State, nodes: list[NodeId], names: Mapping[NodeId, str]
) -> str:
    need = deployment.model_card.storage_size.in_bytes
    at_least = deployment.min_nodes
    needs = f"needs {gb(need)} GB" + (f" on at least {at_least} nodes" if at_least > 1 else "")
    reporting = [n for n in nodes if n in state.node_memory]
    if not reporting:
        return f"{needs}; no node reports its memory"
    free = {n: state.node_memory[n].ram_available.in_bytes for n in reporting}
    groups = [g for g in _groups(state, reporting) if len(g) >= at_least]
    if not groups:
        largest = max(len(g) for g in _groups(state, reporting))
        return f"{needs}; the largest connected group has {largest} node" + (
            "s" if largest != 1 else ""
        )
    best = max(groups, key=lambda g: sum(free[n] for n in g))
    parts = sorted(best, key=lambda n: (-free[n], _name(n, names)))
    listed = ", ".join(f"{_name(n, names)} {gb(free[n])}" for n in parts[:_LISTED])
    if len(parts) > _LISTED:
        listed += f", {len(parts) - _LISTED} more"
    total = sum(free[n] for n in best)
    return f"{needs}; the most any connected group offers is {gb(total)} GB ({listed})"


def _rdma(state: State, nodes: list[NodeId], names: Mapping[NodeId, str]) -> str:
    pool = set(nodes)
    pairs: dict[tuple[NodeId, NodeId], bool] = {}  # unordered link -> any hop is RDMA
    for source, sinks in state.topology.connections.items():
        for sink, edges in sinks.items():
            if source in pool and sink in pool and source != sink and edges:
                key = (min(source, sink), max(source, sink))
                rdma = any(isinstance(e, RDMAConnection) for e in edges)
                pairs[key] = pairs.get(key, False) or rdma
    socket_only = [
        f"{_name(a, names)}{LINK}{_name(b, names)}"
        for (a, b), rdma in sorted(pairs.items())
        if not rdma
    ]
    off = [
        _name(n, names)
        for n in sorted(pool)
        if n in state.node_rdma_ctl and not state.node_rdma_ctl[n].enabled
    ]
    words: list[str] = []
    if socket_only:
        links = ", ".join(socket_only[:_LISTED])
        more = f" and {len(socket_only) - _LISTED} more" if len(socket_only) > _LISTED else ""
        verb = "is a socket link" if len(socket_only) == 1 else "are socket links"
        words.append(f"no RDMA links: {links}{more} {verb}")
    else:
        words.append("no RDMA links between the nodes")
    if off:
        words.append(f"RDMA is off on {', '.join(off)}")
    return "; ".join(words)


def _backends(
    deployment: Deployment, state: State, nodes: list[NodeId], names: Mapping[NodeId, str]
) -> str:
    allowed = _ENGINE_BACKENDS[deployment.instance_meta] & frozenset(deployment.model_card.backends)
    wanted = "/".join(sorted(str(b) for b in allowed)) or "no backend"
    lacking: list[str] = []
    for node in nodes:
        has = state.node_backends.get(node, [])
        if not set(has) & allowed:
            reports = ", ".join(sorted(str(b) for b in has)) if has else "none"
            lacking.append(f"{_name(node, names)} reports no {wanted} (has {reports})")
    if not lacking:
        return f"every node reports {wanted}, but not every connected group does"
    more = f"; {len(lacking) - _LISTED} more" if len(lacking) > _LISTED else ""
    return "; ".join(lacking[:_LISTED]) + more


def _tensor_split(deployment: Deployment, state: State, nodes: list[NodeId]) -> str:
    """Which node counts split the model, against the sizes of the connected groups."""
    card = deployment.model_card
    heads = card.num_key_value_heads
    groups = _groups(state, [n for n in nodes if n in state.node_memory])
    sizes = sorted({len(g) for g in groups})
    divides = [
        k
        for k in range(2, max(sizes, default=1) + 1)
        if card.hidden_size % k == 0 and (heads is None or heads % k == 0)
    ]
    shape = f"hidden_size {card.hidden_size}" + (f", {heads} kv heads" if heads else "")
    splits = f"splits over {', '.join(map(str, divides))} nodes" if divides else "splits no further"
    have = ", ".join(map(str, sizes)) or "no"
    return f"{shape} {splits}; the connected groups have {have} node(s)"
