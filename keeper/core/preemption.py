"""Priorities and preemption (docs/design.md §5.13): which deployment goes first, and which
instances a deployment that cannot be placed may have deleted to make room.

Placement reads each node's free memory as the node reports it, so a cluster too small for every
model is a cluster whose memory the models already placed hold. A deployment that opted in
(``preempt``) may take that memory back from deployments of strictly lower priority: the keeper
deletes some of their instances and places its own on the State as it will be without them.

Pure, like the rest of the core. ``find`` answers "which of these candidates, deleted, let the
deployment be placed?" by asking placement itself on a view of the State without them
(``without_instances``), so whatever placement requires (memory, backends, links, tensor splits)
is what preemption makes room for; a reason that no deletion can cure (no backend, no RDMA) is
found on the first trial, with every candidate deleted, and ends the search.

Only the keeper's own instances are candidates (those some deployment records in
``placed_instance_ids``), of deployments of strictly lower priority: an instance a person placed
is never deleted, and neither is one of equal or higher priority, so a victim can never preempt
back (it ranks lower by construction) and two deployments can never take turns.

The freed memory is counted as the sum of each deleted runner's shard (its layers' share of the
model for a pipeline, an even share for tensor sharding), capped at the node's total: what a
simulated node reports it holds, and no more than a real node can have back.

Each trial is a placement, which may walk the topology's cycles, and the master holds its lock
while stepping; so a step spends at most ``MAX_PREEMPTION_TRIALS_PER_STEP`` trials on
preemption, and looks at no more than ``MAX_CANDIDATES`` instances (the lowest-ranked ones).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

from keeper.core.memo import recorded
from keeper.model.state import (
    AnyInstance,
    Deployment,
    DeploymentId,
    InstanceId,
    Memory,
    MemoryUsage,
    NodeId,
    State,
    TensorShardMetadata,
)

# Placement trials a step may spend on preemption. A trial costs what one placement attempt costs
# (around a millisecond on a large cluster, docs/design.md §5.9), so 32 keep a step that preempts
# in the tens of milliseconds of lock time; preemption is tried only by an opted-in deployment
# that has just failed to place, which is rare. A search that runs short keeps the best answer
# found so far (every answer found fits).
MAX_PREEMPTION_TRIALS_PER_STEP = 32
# Candidate instances one search looks at, the lowest-ranked first. With the first trial (every
# candidate deleted) and one trial to spare each of them, a full first answer costs 16 trials,
# half the step's budget; the rest looks for fewer victims. A cluster runs a few dozen instances.
MAX_CANDIDATES = 15


@dataclass(frozen=True)
class Victim:
    """An instance the keeper placed for ``deployment_id``, a candidate for deletion."""

    deployment_id: DeploymentId
    instance_id: InstanceId
    priority: int


@dataclass(frozen=True)
class Preemption:
    """The instances to delete, lowest-ranked first, and the instance placed without them."""

    victims: tuple[Victim, ...]
    instance: AnyInstance

    def by_deployment(self) -> dict[DeploymentId, tuple[InstanceId, ...]]:
        """The victims' instances per deployment, in the victims' order."""
        removed: dict[DeploymentId, tuple[InstanceId, ...]] = {}
        for victim in self.victims:
            earlier = removed.get(victim.deployment_id, ())
            removed[victim.deployment_id] = (*earlier, victim.instance_id)
        return removed


class TrialBudget:
    """The placement trials left to preemption in this step."""

    def __init__(self, trials: int = MAX_PREEMPTION_TRIALS_PER_STEP) -> None:
        self.left = trials

    def spend(self) -> bool:
        """Take one trial; False (and nothing taken) when none is left."""
        if self.left <= 0:
            return False
        self.left -= 1
        return True


def by_priority(due: Sequence[Deployment]) -> list[Deployment]:
    """The deployments highest priority first; equal priorities keep their order (the keeper's
    id order, resumed where its last step stopped)."""
    return sorted(due, key=lambda deployment: -deployment.priority)


def candidates(
    state: State,
    preemptor: Deployment,
    *,
    spared: Collection[DeploymentId] = (),
    leaving: Collection[InstanceId] = (),
) -> list[Victim]:
    """The instances ``preemptor`` may have deleted, lowest-ranked first, at most
    ``MAX_CANDIDATES``: those the State shows and a deployment of strictly lower priority records
    as the keeper's, but not of a deployment in ``spared`` (being deleted) nor one ``leaving``
    already (being removed). Lowest-ranked: lowest priority, then deployment id, then newest
    first (the oldest replicas are the ones most likely serving)."""
    lower = [
        deployment
        for deployment in state.deployments.values()
        if deployment.priority < preemptor.priority and deployment.deployment_id not in spared
    ]
    found: list[Victim] = []
    for deployment in sorted(lower, key=lambda d: (d.priority, d.deployment_id)):
        for instance_id in reversed(recorded(deployment)):
            if instance_id in state.instances and instance_id not in leaving:
                found.append(Victim(deployment.deployment_id, instance_id, deployment.priority))
    return found[:MAX_CANDIDATES]


def find(
    place: Callable[[State], AnyInstance],
    state: State,
    victims: Sequence[Victim],
    budget: TrialBudget,
) -> Preemption | None:
    """The fewest of ``victims`` whose deletion lets ``place`` succeed on ``state``, sparing the
    higher-ranked ones first, and the instance it places; None when deleting them all would not
    do, or no trial is left.

    Deleting more never frees less, so the search first tries them all (nothing else can fit if
    that does not), then spares each in turn from the highest-ranked down while the rest still
    fits: a set no victim can be spared from. Then it looks for a smaller one, size by size,
    within the budget left; the first found is the answer.
    """
    if not victims:
        return None
    best = _trial(place, state, victims, budget)
    if best is None:
        return None
    chosen = list(victims)
    for victim in reversed(victims):
        if len(chosen) == 1 or budget.left == 0:
            break  # the last one cannot be spared: nothing fits without deleting any
        rest = [v for v in chosen if v != victim]
        fits = _trial(place, state, rest, budget)
        if fits is not None:
            chosen, best = rest, fits
    for size in range(1, len(chosen)):
        for combination in _sparing_the_highest(len(victims), size):
            if budget.left == 0:
                return best
            fits = _trial(place, state, [victims[i] for i in combination], budget)
            if fits is not None:
                return fits
    return best


def _trial(
    place: Callable[[State], AnyInstance],
    state: State,
    victims: Sequence[Victim],
    budget: TrialBudget,
) -> Preemption | None:
    """Placement on ``state`` without ``victims``, if a trial is left and it succeeds."""
    if not budget.spend():
        return None
    view = without_instances(state, frozenset(v.instance_id for v in victims))
    try:
        instance = place(view)
    except Exception:  # what placement refuses (or fails on) here is simply no room
        return None
    return Preemption(tuple(victims), instance)


def _sparing_the_highest(n: int, size: int) -> Iterator[tuple[int, ...]]:
    """Every ``size`` of ``range(n)``, the sets of lower indices first: ordered by their highest
    index, then their next highest, and so on, so the higher-ranked victims are spared first."""
    if size == 0:
        yield ()
        return
    # (No mutation of the start: a lower one finds no more sets, as fewer than ``size`` indices
    # hold none, only slower.)
    for top in range(size - 1, n):  # pragma: no mutate
        for rest in _sparing_the_highest(top, size - 1):
            yield (*rest, top)


def without_instances(state: State, instance_ids: frozenset[InstanceId]) -> State:
    """The State as if ``instance_ids`` were deleted: gone with their runners (as ``apply``
    removes them), and the memory their runners hold back on each node's free memory."""
    freed: dict[NodeId, int] = {}
    runners: set[str] = set()
    for instance_id in instance_ids:
        instance = state.instances[instance_id]
        assignments = instance.shard_assignments
        for node_id, runner_id in assignments.node_to_runner.items():
            runners.add(runner_id)
            shard = assignments.runner_to_shard.get(runner_id)
            if shard is None:
                continue
            size = shard.model_card.storage_size.in_bytes
            if isinstance(shard, TensorShardMetadata):
                held = size // max(shard.world_size, 1)
            else:
                held = size * max(shard.end_layer - shard.start_layer, 0) // max(shard.n_layers, 1)
            freed[node_id] = freed.get(node_id, 0) + held
    memory = dict(state.node_memory)
    for node_id, held in freed.items():
        usage = memory.get(node_id)
        if usage is not None:
            memory[node_id] = _with_freed(usage, held)
    return state.model_copy(
        update={
            "instances": {i: v for i, v in state.instances.items() if i not in instance_ids},
            "runners": {r: v for r, v in state.runners.items() if r not in runners},
            "node_memory": memory,
        }
    )


def _with_freed(usage: MemoryUsage, held: int) -> MemoryUsage:
    available = usage.ram_available.in_bytes
    ceiling = max(usage.ram_total.in_bytes, available)
    return usage.model_copy(
        update={"ram_available": Memory(in_bytes=min(available + held, ceiling))}
    )
