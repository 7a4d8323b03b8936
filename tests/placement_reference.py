"""Placement the slow, obvious way: list every simple cycle, then filter the list rule by rule.

This is how exo's /place_instance works, written as plainly as possible so it can be trusted by
reading it. ``keeper.core.placement`` must give the same answer (or the same error) on every state;
the property test compares the two, and the benchmark times this one as the baseline. It shares
no code with ``keeper.core.placement``: the wording of every error is spelled out again here.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from keeper.model.state import (
    Backend,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    ModelCard,
    RDMAConnection,
    State,
)

ENGINE_BACKENDS = {
    "MlxRing": {Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU},
    "MlxJaccl": {Backend.MLX_METAL},
}


@dataclass(frozen=True)
class ReferencePlacement:
    kind: str  # "MlxRingInstance" or "MlxJacclInstance"
    sharding: str  # "Pipeline" or "Tensor"
    ranked_nodes: tuple[str, ...]  # device rank = position
    layer_ranges: tuple[tuple[int, int], ...]  # [start, end) per rank


def successor_map(state: State) -> dict[str, list[str]]:
    """For every live node, the live nodes it has an edge to (edge lists may be empty)."""
    live = set(state.topology.nodes)
    return {
        node: sorted(
            sink
            for sink, edges in state.topology.connections.get(node, {}).items()
            if sink in live and sink != node and edges
        )
        for node in live
    }


def leaves(state: State) -> set[str]:
    """Nodes with at most one distinct neighbour, counting edges in either direction."""
    successors = successor_map(state)
    neighbours = {node: set(sinks) for node, sinks in successors.items()}
    for node, sinks in successors.items():
        for sink in sinks:
            neighbours[sink].add(node)
    return {node for node, around in neighbours.items() if len(around) <= 1}


def simple_cycles(state: State) -> list[tuple[str, ...]]:
    """Every simple directed cycle, once each, written from its smallest node id; a single node
    is a cycle of one."""
    successors = successor_map(state)
    nodes = sorted(successors)
    cycles: list[tuple[str, ...]] = [(node,) for node in nodes]

    def walk(path: list[str]) -> None:
        for following in successors[path[-1]]:
            if following == path[0]:
                cycles.append(tuple(path))
            elif following > path[0] and following not in path:
                walk([*path, following])

    for start in nodes:
        walk([start])
    return cycles


def is_rdma_hop(state: State, source: str, sink: str) -> bool:
    edges = state.topology.connections.get(source, {}).get(sink, [])
    return any(isinstance(edge, RDMAConnection) for edge in edges)


def is_rdma_cycle(state: State, cycle: tuple[str, ...]) -> bool:
    if len(cycle) == 1:
        return True
    return all(is_rdma_hop(state, cycle[i], cycle[(i + 1) % len(cycle)]) for i in range(len(cycle)))


def free_memory(state: State, cycle: tuple[str, ...]) -> int:
    return sum(state.node_memory[node].ram_available.in_bytes for node in cycle)


def node_download_fraction(state: State, node: str, model_id: str) -> Fraction:
    """What exo counts of a node's download of the model: the first of its entries for the
    model decides."""
    for entry in state.downloads.get(node, []):
        if entry.shard_metadata.model_card.model_id != model_id:
            continue
        match entry:
            case DownloadCompleted():
                return Fraction(1)
            case DownloadOngoing():
                progress = entry.download_progress
                if progress.total.in_bytes > 0:
                    return Fraction(progress.downloaded.in_bytes, progress.total.in_bytes)
                return Fraction(0)
            case DownloadPending():
                if entry.total.in_bytes > 0:
                    return Fraction(entry.downloaded.in_bytes, entry.total.in_bytes)
                return Fraction(0)
            case DownloadFailed():
                return Fraction(0)
    return Fraction(0)


def download_score(state: State, cycle: tuple[str, ...], model_id: str) -> Fraction:
    return sum((node_download_fraction(state, node, model_id) for node in cycle), start=Fraction(0))


def proportional_layers(n_layers: int, ram: list[int]) -> list[tuple[int, int]]:
    if sum(ram) == 0:
        ram = [1] * len(ram)
    shares = [Fraction(n_layers * r, sum(ram)) for r in ram]
    counts = [int(share) for share in shares]  # floor: shares are never negative
    leftover = n_layers - sum(counts)
    # Largest fractional part first; on equal parts, the lower rank first.
    order = sorted(range(len(ram)), key=lambda rank: (counts[rank] - shares[rank], rank))
    for rank in order[:leftover]:
        counts[rank] += 1
    # A node left without a layer takes one from the node with the most (the higher rank on a
    # tie).
    for rank in range(len(counts)):
        if counts[rank] == 0:
            most = max(counts)
            donor = max(other for other in range(len(counts)) if counts[other] == most)
            counts[donor] -= 1
            counts[rank] = 1
    ranges: list[tuple[int, int]] = []
    for count in counts:
        start = ranges[-1][1] if ranges else 0
        ranges.append((start, start + count))
    return ranges


def reference_place(
    state: State, card: ModelCard, sharding: str, instance_meta: str, min_nodes: int
) -> ReferencePlacement:
    memory = state.node_memory
    cycles = [
        cycle
        for cycle in simple_cycles(state)
        if len(cycle) >= min_nodes
        and all(node in memory for node in cycle)
        and free_memory(state, cycle) >= card.storage_size.in_bytes
    ]
    if not cycles:
        raise ValueError("No cycles found with sufficient memory")

    if sharding == "Tensor":
        if not card.supports_tensor:
            raise ValueError(
                "Requested Tensor sharding but this model does not support tensor "
                f"parallelism: {card.model_id}"
            )
        cycles = [
            cycle
            for cycle in cycles
            if card.hidden_size % len(cycle) == 0
            and (card.num_key_value_heads is None or card.num_key_value_heads % len(cycle) == 0)
        ]
        if not cycles:
            raise ValueError(
                f"No tensor sharding found for model with hidden_size {card.hidden_size} "
                "candidate cycles"
            )

    smallest = min(len(cycle) for cycle in cycles)
    cycles = [cycle for cycle in cycles if len(cycle) == smallest]

    allowed = ENGINE_BACKENDS[instance_meta] & set(card.backends)
    cycles = [
        cycle
        for cycle in cycles
        if all(set(state.node_backends.get(node, [])) & allowed for node in cycle)
    ]
    if not cycles:
        names = sorted(str(backend) for backend in allowed)
        raise ValueError(
            f"No cycle where every node supports a backend in {names} for {card.model_id}"
        )

    if instance_meta == "MlxJaccl":
        cycles = [cycle for cycle in cycles if is_rdma_cycle(state, cycle)]
        if not cycles:
            raise ValueError("Requested RDMA (MlxJaccl) but no RDMA-connected cycles available")

    leaf_nodes = leaves(state)
    with_leaf = [cycle for cycle in cycles if any(node in leaf_nodes for node in cycle)]
    if with_leaf:
        cycles = with_leaf

    # exo: max(cycles, key=(download score, free memory)), the first of equal keys in its list.
    chosen = min(
        cycles,
        key=lambda cycle: (
            -download_score(state, cycle, card.model_id),
            -free_memory(state, cycle),
            tuple(sorted(cycle)),
            cycle,
        ),
    )

    if len(chosen) == 1:
        kind, sharding = "MlxRingInstance", "Pipeline"
    else:
        kind = f"{instance_meta}Instance"
    if sharding == "Pipeline":
        if card.n_layers < len(chosen):
            raise ValueError(
                f"Cannot split the {card.n_layers} layers of {card.model_id} across "
                f"{len(chosen)} nodes: every node needs at least one layer"
            )
        ram = [memory[node].ram_available.in_bytes for node in chosen]
        ranges = proportional_layers(card.n_layers, ram)
    else:
        ranges = [(0, card.n_layers)] * len(chosen)
    return ReferencePlacement(kind, sharding, chosen, tuple(ranges))
