"""Find the best node set of a given size that a cycle runs through, without listing cycles.

exo lists every simple cycle of the topology and filters the list. Every rule of placement but
two looks only at a cycle's node *set* (its size, memory, backends, leaves), and the two that
look at the order (all-RDMA hops, the rank order) only need *some* cycle through the set. So the
search walks node sets of one size in the order placement ranks them, most free memory first and
then the lexicographically smallest sorted id tuple, and stops at the first set that a
(RDMA-)Hamiltonian cycle runs through:

- sets come off a heap: the pool is sorted by (memory descending, id ascending) and a set's
  children move one member to the next node in that order, which never improves the rank, so
  the heap yields sets in exact rank order and the first hit is the best set;
- a set whose memory is below what the model needs ends the walk: every later set has less;
- the walk runs per strongly connected component, since a cycle never leaves one;
- the cycle check is a depth-first search from the set's smallest id, trying successors in id
  order and remembering dead (visited-set, node) states, so the first cycle it finds is the
  set's lexicographically smallest one and no state is explored twice.

On a well-connected cluster the first set checked almost always has a cycle, so a search costs a
handful of steps. Sparse topologies can make many sets fail; every heap pop and every search
step spends one unit of a ``SearchBudget``, and running out is a ``ValueError`` that says so
rather than a hung master (see ``SEARCH_STEP_LIMIT``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from keeper.placement_graph import Adjacency, ClusterGraph, bits, strong_components

# The most search steps (heap pops plus cycle-search steps) one placement may take. Measured on
# the benchmark machine a step costs about 2 us, so this bounds one placement to roughly 0.1 s
# even for adversarial topologies (for example 64 sparse nodes), which keeps the keeper's
# once-a-second step responsive. Well-connected clusters of 16 nodes need fewer than 100 steps.
SEARCH_STEP_LIMIT = 50_000


class SearchBudget:
    """Counts search steps and stops the search with a clear reason once the limit is hit."""

    def __init__(self, limit: int = SEARCH_STEP_LIMIT) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, steps: int = 1) -> None:
        self.spent += steps
        if self.spent > self.limit:
            raise ValueError(
                f"Placement search gave up after {self.limit} steps: this topology has too many "
                "node sets without a usable cycle to check them all"
            )


# (-total free memory, sorted node indices): smaller is better, as placement ranks sets.
SetRank = tuple[int, tuple[int, ...]]


@dataclass(frozen=True)
class Found:
    rank: SetRank
    cycle: tuple[int, ...]  # node indices in cycle order, starting at the smallest


@dataclass
class CycleSearch:
    """Searches one graph; caches its component splits across the queries of one placement."""

    graph: ClusterGraph
    budget: SearchBudget
    _components: dict[tuple[int, bool], list[int]] = field(
        default_factory=dict[tuple[int, bool], list[int]]
    )

    def best(
        self, pool: int, size: int, required: int, rdma_only: bool, touching: int = 0
    ) -> tuple[int, ...] | None:
        """The cycle through the best-ranked set of ``size`` nodes from ``pool`` whose free
        memory is at least ``required``; with ``touching``, only sets that include one of those
        nodes count. ``rdma_only`` restricts cycles to RDMA edges. None if no set qualifies."""
        if size == 1:
            return self._best_single(pool, required, touching)
        edges = self.graph.rdma_edge if rdma_only else self.graph.any_edge
        best: Found | None = None
        for component in self._components_of(pool, rdma_only, edges):
            if component.bit_count() < size or (touching and not component & touching):
                continue
            found = self._first_in_component(component, size, required, edges, touching)
            if found is not None and (best is None or found.rank < best.rank):
                best = found
        return best.cycle if best is not None else None

    def _best_single(self, pool: int, required: int, touching: int) -> tuple[int, ...] | None:
        if touching:
            pool &= touching
        ram = self.graph.ram_of
        fits = [node for node in bits(pool) if ram(node) >= required]
        if not fits:
            return None
        return (min(fits, key=lambda node: (-ram(node), node)),)

    def _components_of(self, pool: int, rdma_only: bool, edges: Adjacency) -> list[int]:
        key = (pool, rdma_only)
        if key not in self._components:
            self._components[key] = strong_components(pool, edges)
        return self._components[key]

    def _first_in_component(
        self, component: int, size: int, required: int, edges: Adjacency, touching: int
    ) -> Found | None:
        ram = self.graph.ram_of
        members = sorted(bits(component), key=lambda node: (-ram(node), node))
        member_ram = [ram(node) for node in members]
        start = tuple(range(size))
        total = sum(member_ram[:size])
        if total < required:
            return None
        heap: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = [
            (-total, tuple(sorted(members[:size])), start)
        ]
        queued = {start}
        while heap:
            negative_total, nodes, positions = heapq.heappop(heap)
            self.budget.spend()
            mask = sum(1 << node for node in nodes)
            if not touching or mask & touching:
                cycle = hamiltonian_cycle(mask, edges, self.budget)
                if cycle is not None:
                    return Found((negative_total, nodes), cycle)
            for slot, position in enumerate(positions):
                moved = position + 1
                bound = positions[slot + 1] if slot + 1 < size else len(members)
                if moved >= bound:
                    continue
                child = (*positions[:slot], moved, *positions[slot + 1 :])
                child_total = -negative_total - member_ram[position] + member_ram[moved]
                if child_total < required or child in queued:
                    continue
                queued.add(child)
                child_nodes = tuple(sorted(members[p] for p in child))
                heapq.heappush(heap, (-child_total, child_nodes, child))
        return None


def hamiltonian_cycle(mask: int, edges: Adjacency, budget: SearchBudget) -> tuple[int, ...] | None:
    """The lexicographically smallest directed cycle through exactly the nodes of ``mask``,
    starting at its smallest node, or None. A single node is a cycle of one."""
    nodes = list(bits(mask))
    if len(nodes) == 1:
        return (nodes[0],)
    succ, pred = edges.succ, edges.pred
    if any(not succ[node] & mask or not pred[node] & mask for node in nodes):
        return None
    start = nodes[0]
    closers = pred[start] & mask  # the cycle's last node must be one of these
    path = [start]
    dead: set[tuple[int, int]] = set()

    def extend(node: int, visited: int) -> bool:
        budget.spend()
        unvisited = mask & ~visited
        if not unvisited:
            return bool(succ[node] >> start & 1)
        if not closers & unvisited or (visited, node) in dead:
            return False
        for following in bits(succ[node] & unvisited):
            path.append(following)
            if extend(following, visited | 1 << following):
                return True
            path.pop()
        dead.add((visited, node))
        return False

    return tuple(path) if extend(start, 1 << start) else None
