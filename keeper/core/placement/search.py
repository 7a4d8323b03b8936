"""Find the best node set of a given size that a cycle runs through, without listing every cycle.

exo lists every simple cycle of the topology and filters the list. Every rule of placement but
two looks only at a cycle's node *set* (its size, memory, backends, leaves), and the two that
look at the order (all-RDMA hops, the rank order) only need *some* cycle through the set. So a
query here is "the best-ranked set of k nodes from this pool, with enough free memory, that a
(RDMA-)cycle runs through", where sets rank by the most of the model their nodes hold (when a
query says how much each holds: the sum of their download fractions), then by most free memory,
then by the lexicographically smallest sorted id tuple. Two exact ways answer it, one for each
kind of graph:

- **Walking sets** (dense graphs, where nearly every set has a cycle). Per strongly connected
  component (a cycle never leaves one), sets come off a heap: the members are sorted by
  (memory descending, id ascending) and a set's children move one member to the next node in
  that order, which never improves the rank, so sets come off in exact rank order and the first
  with a cycle is the answer. A set whose memory is short ends the walk: later ones have less.
  When nodes hold different amounts of the model, memory no longer falls along one order of all
  the members (a node holding more may have less memory), so the members are split into classes
  of equal download fraction, each sorted as above, and a member moves only within its class: a
  set keeps how many members it takes from each class, hence its download score, and its
  children still never gain memory, so the cut-off above stays exact within each choice of counts.
  The choices of counts come off a second heap by score, best first (``count_groups``, a
  branch and bound that skips every choice whose best set is short of memory), and all the
  choices of one score are walked together on one heap by (memory, ids), so the first set with a
  cycle among them is the best of that score; only if there is none do lower scores follow.
- **Listing cycles** (sparse graphs, where few sets have a cycle and walking sets would try them
  all). Every simple cycle of the pool is listed once and kept per node set; a query is then a
  lookup. This is exo's method, used only where it is cheap: it is abandoned past
  ``CYCLE_LISTING_LIMIT`` steps.

A query walks sets first; if ``SET_WALK_PATIENCE`` sets in a row have no cycle, it tries to
list the pool's cycles, and walks sets to the end only if that listing is too long too. Both
ways are exact, so the choice changes the cost, never the answer.

The cycle check is a depth-first search from the set's smallest node, trying successors in id
order and remembering dead (visited set, node) states, so the first cycle found is the set's
lexicographically smallest and no state is explored twice.

Every step of either way spends one unit of a ``SearchBudget``; running out is a ``ValueError``
that says so, rather than a master stuck in one placement (see ``SEARCH_STEP_LIMIT``).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import accumulate, count
from math import lcm

from keeper.core.placement.graph import (
    NOTHING,
    Adjacency,
    ClusterGraph,
    bits,
    reach,
    strong_components,
)

# The most steps (sets taken off the heap or queued, cycle-search and cycle-listing steps) one
# placement may take. A step costs one to two microseconds: an adversarial topology (two
# complete graphs of 8 joined by one link, a model needing 9 nodes; ``make bench``) runs out in
# about 0.1 s, so the keeper's once-a-second step stays responsive. Realistic clusters of 16
# nodes, dense or sparse, and a one-way ring of 64 need a few hundred steps.
SEARCH_STEP_LIMIT = 50_000
# Sets a query walks without finding a cycle before it tries listing cycles instead. Dense
# graphs find a cycle in the first set or two and never get here.
SET_WALK_PATIENCE = 64
# The most steps spent trying to list a pool's cycles before walking sets instead. A 16-node
# one-way or two-way ring lists in a few hundred; a complete graph of 16 never finishes.
CYCLE_LISTING_LIMIT = 2_000


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


# How placement ranks node sets of one download score, smaller first: (-total free memory,
# -reversed membership), where bit (n - 1 - i) of the reversed membership is node i. For sets of
# equal size the set holding the smallest id where they differ has the larger reversed
# membership, so the second part orders sets as their sorted id tuples do, as one int. Sets of
# different scores rank by score first (``Found.key``).
SetRank = tuple[int, int]


@dataclass(frozen=True)
class Found:
    rank: SetRank
    cycle: tuple[int, ...]  # node indices in cycle order, starting at the smallest
    score: Fraction = NOTHING  # the download score of its set: the most ranks first

    def key(self) -> tuple[Fraction, SetRank]:
        return (-self.score, self.rank)


class _PatienceExhaustedError(Exception):
    """A set walk ran out of patience before finding a cycle or running out of sets."""


class _ListingTooLongError(Exception):
    """Listing cycles ran past its limit."""


@dataclass
class CycleSearch:
    """Answers the queries of one placement over one graph, caching per-pool work."""

    graph: ClusterGraph
    budget: SearchBudget = field(default_factory=SearchBudget)
    # Sets a query walks without a cycle before listing cycles; None: never list, 0: list first.
    patience: int | None = SET_WALK_PATIENCE
    listing_limit: int = CYCLE_LISTING_LIMIT
    _components: dict[tuple[int, bool], list[int]] = field(
        default_factory=dict[tuple[int, bool], list[int]]
    )
    # Per pool and edge kind: its cycles grouped by size, best-ranked first; None when listing
    # them ran past the limit.
    _listings: dict[tuple[int, bool], dict[int, list[Found]] | None] = field(
        default_factory=dict[tuple[int, bool], dict[int, list[Found]] | None]
    )

    def best(
        self,
        pool: int,
        size: int,
        required: int,
        rdma_only: bool,
        touching: int = 0,
        held: Sequence[Fraction] | None = None,
    ) -> tuple[int, ...] | None:
        """The cycle through the best-ranked set of ``size`` nodes from ``pool`` whose free
        memory is at least ``required``, or None; with ``touching``, only sets that include one
        of those nodes count. ``rdma_only`` restricts cycles to RDMA edges. With ``held`` (how
        much of the model each node holds, by node index), sets rank first by its sum over
        their nodes; without, as if no node held any."""
        if size == 1:
            return self._best_single(pool, required, touching, held)
        key = (pool, rdma_only)
        edges = self.graph.rdma_edge if rdma_only else self.graph.any_edge
        if key not in self._listings:
            if self.patience is None:
                return self._walk_sets(pool, size, required, rdma_only, edges, touching, None, held)
            try:
                if self.patience > 0:
                    return self._walk_sets(
                        pool, size, required, rdma_only, edges, touching, self.patience, held
                    )
            except _PatienceExhaustedError:
                pass
            self._listings[key] = self._list_cycles(pool, edges)
        listing = self._listings[key]
        if listing is None:
            return self._walk_sets(pool, size, required, rdma_only, edges, touching, None, held)
        best: Found | None = None
        for found in listing.get(size, []):
            if -found.rank[0] < required:
                break  # the listing runs by memory, most first: the rest are short too
            if touching and not any(touching >> node & 1 for node in found.cycle):
                continue
            if held is None:
                return found.cycle
            scored = Found(found.rank, found.cycle, sum_held(held, found.cycle))
            if best is None or scored.key() < best.key():
                best = scored
        return best.cycle if best is not None else None

    def _best_single(
        self, pool: int, required: int, touching: int, held: Sequence[Fraction] | None
    ) -> tuple[int, ...] | None:
        if touching:
            pool &= touching
        ram = self.graph.ram_of
        fits = [node for node in bits(pool) if ram(node) >= required]
        if not fits:
            return None
        if held is None:
            return (min(fits, key=lambda node: (-ram(node), node)),)
        return (min(fits, key=lambda node: (-held[node], -ram(node), node)),)

    # --- walking sets ---------------------------------------------------------------------

    def _walk_sets(
        self,
        pool: int,
        size: int,
        required: int,
        rdma_only: bool,
        edges: Adjacency,
        touching: int,
        patience: int | None,
        held: Sequence[Fraction] | None,
    ) -> tuple[int, ...] | None:
        key = (pool, rdma_only)
        if key not in self._components:
            self._components[key] = strong_components(pool, edges)
        best: Found | None = None
        for component in self._components[key]:
            if component.bit_count() < size or (touching and not component & touching):
                continue
            found = self._walk_component(component, size, required, edges, touching, patience, held)
            if found is not None and (best is None or found.key() < best.key()):
                best = found
        return best.cycle if best is not None else None

    def _walk_component(
        self,
        component: int,
        size: int,
        required: int,
        edges: Adjacency,
        touching: int,
        patience: int | None,
        held: Sequence[Fraction] | None,
    ) -> Found | None:
        graph = self.graph
        top_bit = len(graph.ids) - 1

        def by_memory(node: int) -> tuple[int, int]:
            return (-graph.ram_of(node), node)

        # The classes: members of equal download fraction, most first, each sorted by memory.
        # A fraction is held as its numerator over the members' common denominator: whole
        # numbers add and compare exactly, and much faster than Fractions.
        denominator = 1
        if held is None:
            weights = [0]
            classes = [sorted(bits(component), key=by_memory)]
        else:
            nodes = list(bits(component))
            denominator = lcm(*(held[node].denominator for node in nodes))
            by_weight: dict[int, list[int]] = {}
            for node in nodes:
                share = held[node]
                weight = share.numerator * (denominator // share.denominator)
                by_weight.setdefault(weight, []).append(node)
            weights = sorted(by_weight, reverse=True)
            classes = [sorted(by_weight[weight], key=by_memory) for weight in weights]
        members = [node for members_of_class in classes for node in members_of_class]
        ram = [graph.ram_of(node) for node in members]
        bit = [1 << node for node in members]
        reversed_bit = [1 << (top_bit - node) for node in members]
        # A member moves only within its class: up to (not including) position end[position].
        # The walk starts from the first set of each choice of counts per class, every choice of
        # one score together, best score first.
        end: list[int] = []
        groups: Iterable[tuple[int, Iterable[tuple[int, ...]]]]
        if len(classes) == 1:
            if sum(ram[:size]) < required:
                return None  # the first set has the most memory
            end = [len(members)] * len(members)
            groups = [(weights[0] * size, [tuple(range(size))])]
        else:
            starts: list[int] = []
            for members_of_class in classes:
                starts.append(len(end))
                end += [len(end) + len(members_of_class)] * len(members_of_class)
            rams = [ram[start : end[start]] for start in starts]
            groups = (
                (score, [first_positions(starts, taken) for taken in choices])
                for score, choices in count_groups(rams, weights, size, required, self.budget)
            )
        misses = 0
        for score, firsts in groups:
            heap = [
                (
                    -sum([ram[position] for position in first]),
                    -sum([reversed_bit[position] for position in first]),
                    sum([bit[position] for position in first]),
                    first,
                )
                for first in firsts
            ]
            heapq.heapify(heap)
            queued = {entry[2] for entry in heap}
            while heap:
                negative_total, negative_reversed, mask, positions = heapq.heappop(heap)
                self.budget.spend()
                if not touching or mask & touching:
                    cycle = hamiltonian_cycle(mask, edges, self.budget)
                    if cycle is not None:
                        rank = (negative_total, negative_reversed)
                        return Found(
                            rank, cycle, Fraction(score, denominator) if score else NOTHING
                        )
                    misses += 1
                    if patience is not None and misses > patience:
                        raise _PatienceExhaustedError
                total = -negative_total
                for slot, position in enumerate(positions):
                    moved = position + 1
                    if moved == end[position] or (slot + 1 < size and moved == positions[slot + 1]):
                        continue
                    child = mask ^ bit[position] ^ bit[moved]
                    child_total = total - ram[position] + ram[moved]
                    if child_total < required or child in queued:
                        continue
                    self.budget.spend()
                    queued.add(child)
                    heapq.heappush(
                        heap,
                        (
                            -child_total,
                            negative_reversed + reversed_bit[position] - reversed_bit[moved],
                            child,
                            (*positions[:slot], moved, *positions[slot + 1 :]),
                        ),
                    )
        return None

    # --- listing cycles -------------------------------------------------------------------

    def _list_cycles(self, pool: int, edges: Adjacency) -> dict[int, list[Found]] | None:
        try:
            cycles = list_cycles(pool, edges, self.listing_limit, self.budget)
        except _ListingTooLongError:
            return None
        graph = self.graph
        top_bit = len(graph.ids) - 1
        by_size: dict[int, list[Found]] = {}
        for cycle in cycles:
            total = sum(graph.ram_of(node) for node in cycle)
            reversed_mask = sum(1 << (top_bit - node) for node in cycle)
            by_size.setdefault(len(cycle), []).append(Found((-total, -reversed_mask), cycle))
        for found in by_size.values():
            found.sort(key=lambda entry: entry.rank)
        return by_size


def first_positions(starts: list[int], taken: tuple[int, ...]) -> tuple[int, ...]:
    """The positions of the first ``taken[c]`` members of each class c, which starts at
    ``starts[c]``."""
    return tuple(
        position
        for start, number in zip(starts, taken, strict=True)
        for position in range(start, start + number)
    )


def sum_held(held: Sequence[Fraction], nodes: Iterable[int]) -> Fraction:
    """The download score of ``nodes``: the sum of how much of the model each holds."""
    return sum((held[node] for node in nodes), NOTHING)


def count_groups(
    rams: list[list[int]], weights: list[int], size: int, required: int, budget: SearchBudget
) -> Iterator[tuple[int, list[tuple[int, ...]]]]:
    """The ways to take ``size`` members from classes of members, as counts per class, whose
    best set (each class's first members) has at least ``required`` memory: grouped by the
    download score they give (the sum of count x weight), best first, every way of one score in
    one group. ``rams[c]`` is class c's memory per member, most first; ``weights`` is each
    class's download fraction (over a common denominator), most first.

    A branch and bound, best first: a partial choice (counts for the first classes) is bounded
    by its score plus the best that its remaining members can add (the first ones, as shares
    fall along the classes), and dropped if even the most memory its remaining members could
    add leaves it short. The bound of a complete choice is its score, and no choice bounds
    above its parent, so complete choices come off the heap by score, best first."""
    classes = len(rams)
    prefix = [list(accumulate(class_rams, initial=0)) for class_rams in rams]
    # From class c on, for r more members: the most memory they can add, and the most score.
    most_memory: list[list[int]] = []
    most_score: list[list[int]] = []
    for first in range(classes + 1):
        rest = sorted((ram for class_rams in rams[first:] for ram in class_rams), reverse=True)
        most_memory.append(list(accumulate(rest, initial=0)))
        rest_weights = [weights[c] for c in range(first, classes) for _ in rams[c]]
        most_score.append(list(accumulate(rest_weights, initial=0)))
    heap: list[tuple[int, int, int, int, int, int, tuple[int, ...]]] = []
    order = count()  # so that equal bounds never compare the rest

    def push(next_class: int, left: int, score: int, memory: int, taken: tuple[int, ...]) -> None:
        if left >= len(most_memory[next_class]):
            return  # not enough members left
        if memory + most_memory[next_class][left] < required:
            return
        budget.spend()
        bound = score + most_score[next_class][left]
        heapq.heappush(heap, (-bound, next(order), next_class, left, score, memory, taken))

    push(0, size, 0, 0, ())
    group: list[tuple[int, ...]] = []
    group_score = 0
    while heap:
        if group and -heap[0][0] < group_score:  # nothing left scores as much
            yield group_score, group
            group = []
        _, _, next_class, left, score, memory, taken = heapq.heappop(heap)
        if next_class == classes:
            group_score = score
            group.append(taken)
            continue
        for number in range(min(left, len(rams[next_class])) + 1):
            # With nothing left to take, the later classes take none: the choice is complete.
            done = number == left
            push(
                classes if done else next_class + 1,
                left - number,
                score + number * weights[next_class],
                memory + prefix[next_class][number],
                (*taken, number, *[0] * (classes - next_class - 1 if done else 0)),
            )
    if group:
        yield group_score, group


def list_cycles(
    pool: int, edges: Adjacency, limit: int, budget: SearchBudget
) -> list[tuple[int, ...]]:
    """For every node set of ``pool`` that a cycle of two or more nodes runs through, its
    lexicographically smallest such cycle (starting at its smallest node). Raises
    _ListingTooLongError after ``limit`` steps."""
    succ = edges.succ
    first_cycle: dict[int, tuple[int, ...]] = {}
    steps = 0

    def walk(path: list[int], visited: int, region: int) -> None:
        nonlocal steps
        steps += 1
        if steps > limit:
            raise _ListingTooLongError
        budget.spend()
        start, node = path[0], path[-1]
        if node != start and succ[node] >> start & 1:
            first_cycle.setdefault(visited, tuple(path))  # DFS order: the first is the smallest
        for following in bits(succ[node] & region & ~visited):
            path.append(following)
            walk(path, visited | 1 << following, region)
            path.pop()

    for start in bits(pool):
        later = pool & ~((2 << start) - 1)  # a cycle is listed from its smallest node only
        # Only nodes that can still get back to start are worth visiting.
        walk([start], 1 << start, reach(start, later | 1 << start, edges.pred) & later)
    return list(first_cycle.values())


def hamiltonian_cycle(mask: int, edges: Adjacency, budget: SearchBudget) -> tuple[int, ...] | None:
    """The lexicographically smallest directed cycle through exactly the nodes of ``mask``,
    starting at its smallest node, or None. A single node is a cycle of one."""
    start = (mask & -mask).bit_length() - 1
    if mask == 1 << start:
        return (start,)
    succ, pred = edges.succ, edges.pred
    rest = mask
    while rest:
        low = rest & -rest
        node = low.bit_length() - 1
        if not succ[node] & mask or not pred[node] & mask:
            return None
        rest ^= low
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
