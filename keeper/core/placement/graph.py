"""The cluster as placement sees it: live nodes as bit positions, edges as bitmasks.

Placement asks many small questions of the same topology ("is there a cycle through these five
nodes?", "which of them report memory?"). Answering them on pydantic models and id strings would
dominate its cost, so the State is read once into this flat, immutable view: node ``i`` is the
``i``-th live node id in sorted order (so comparing index tuples compares id tuples), and every
set of nodes is an ``int`` bitmask.

Only nodes listed in ``topology.nodes`` exist here; edges naming anything else, self-loops and
empty edge lists are dropped, so a node that has left can never be chosen.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from fractions import Fraction

from keeper.model.state import (
    AnyDownload,
    BackendName,
    ModelId,
    NodeId,
    RDMAConnection,
    State,
    download_fraction,
)

NOTHING = Fraction(0)


def bits(mask: int) -> Iterator[int]:
    """The positions of the set bits of ``mask``, lowest first."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


@dataclass(frozen=True)
class Adjacency:
    """Directed edges of one kind: ``succ[i]`` / ``pred[i]`` are bitmasks of neighbours."""

    succ: tuple[int, ...]
    pred: tuple[int, ...]


@dataclass(frozen=True)
class ClusterGraph:
    ids: tuple[NodeId, ...]  # sorted; a node's index is its position here
    # ramAvailable in bytes, or None for a node that has not reported its memory.
    ram_available: tuple[int | None, ...]
    backends: tuple[frozenset[BackendName], ...]
    any_edge: Adjacency  # an edge of any kind (socket or RDMA) from i to j
    rdma_edge: Adjacency  # an RDMAConnection edge from i to j
    # Nodes with at most one distinct neighbour, counting edges in either direction (an isolated
    # node is a leaf too).
    leaves: int
    # The download entries of every node that has any, as the State lists them, by node index.
    downloads: dict[int, tuple[AnyDownload, ...]]

    def ram_of(self, node: int) -> int:
        return self.ram_available[node] or 0

    def ids_of(self, nodes: tuple[int, ...]) -> tuple[NodeId, ...]:
        return tuple(self.ids[i] for i in nodes)

    def held(self, model_id: ModelId) -> tuple[Fraction, ...] | None:
        """How much of ``model_id`` each node holds (``download_fraction``), by node index;
        None when no node holds any of it."""
        if not self.downloads:
            return None
        entries = self.downloads
        held = tuple(
            download_fraction(entries[node], model_id) if node in entries else NOTHING
            for node in range(len(self.ids))
        )
        return held if any(share != 0 for share in held) else None


def cluster_graph(state: State) -> ClusterGraph:
    ids = tuple(sorted(set(state.topology.nodes)))
    index = {node: i for i, node in enumerate(ids)}
    size = len(ids)
    any_succ, any_pred = [0] * size, [0] * size
    rdma_succ, rdma_pred = [0] * size, [0] * size
    for source, sinks in state.topology.connections.items():
        src = index.get(source)
        if src is None:
            continue
        for sink, edges in sinks.items():
            dst = index.get(sink)
            if dst is None or dst == src or not edges:
                continue
            any_succ[src] |= 1 << dst
            any_pred[dst] |= 1 << src
            if any(isinstance(edge, RDMAConnection) for edge in edges):
                rdma_succ[src] |= 1 << dst
                rdma_pred[dst] |= 1 << src
    memory = state.node_memory
    ram = tuple(memory[node].ram_available.in_bytes if node in memory else None for node in ids)
    backends = tuple(frozenset(state.node_backends.get(node, ())) for node in ids)
    leaves = sum(1 << i for i in range(size) if (any_succ[i] | any_pred[i]).bit_count() <= 1)
    downloads = {
        index[node]: tuple(entries)
        for node, entries in state.downloads.items()
        if node in index and entries
    }
    return ClusterGraph(
        ids=ids,
        ram_available=ram,
        backends=backends,
        any_edge=Adjacency(tuple(any_succ), tuple(any_pred)),
        rdma_edge=Adjacency(tuple(rdma_succ), tuple(rdma_pred)),
        leaves=leaves,
        downloads=downloads,
    )


def strong_components(pool: int, edges: Adjacency) -> list[int]:
    """The strongly connected components of the subgraph induced by ``pool``, as bitmasks.

    Every cycle through a set of nodes lies inside one component, so searches run per component.
    """
    components: list[int] = []
    remaining = pool
    while remaining:
        root = (remaining & -remaining).bit_length() - 1
        forward = reach(root, remaining, edges.succ)
        backward = reach(root, remaining, edges.pred)
        component = forward & backward
        components.append(component)
        remaining &= ~component
    return components


def reach(root: int, pool: int, step: tuple[int, ...]) -> int:
    """The nodes of ``pool`` reachable from ``root`` (included) along ``step`` (succ or pred)."""
    seen = 1 << root
    frontier = seen
    while frontier:
        grown = 0
        for node in bits(frontier):
            grown |= step[node]
        frontier = grown & pool & ~seen
        seen |= frontier
    return seen
