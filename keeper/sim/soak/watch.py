"""Following the master's State through the soak: duplicates, deletions, and the keeper's latency.

``ClusterWatch`` is fed what the master's event stream carries (a snapshot State whenever the
stream (re)connects, then every indexed event) with the moment it arrived, and keeps:

- the current State, for the run to see which nodes hold runners and which models serve;
- duplicates: every moment a model has more instances than its deployment's replicas (two or
  more, for a model deployed once), counted once per episode (from the first such state until
  one with no more than its replicas);
- when each instance was first seen ready and when it was deleted, so a fault can tell whether
  the instances it hit survived it;
- the keeper-added latency: from a deletion that leaves a model with fewer instances than its
  replicas (its last one, for a model deployed once) reaching the State, to the keeper's
  InstanceCreated that replaces it (oldest gap first). Only gaps the keeper is meant to close at
  its next step are samples; the others are counted by why they had to wait (see
  ``ExclusionReason``).

It is plain synchronous code over ``keeper.model.apply``, so both soaks (processes and virtual time)
share it, and ``check_log`` replays a master's whole event log through the same duplicate check:
the stream misses what happens while the master is down, the log holds every State it had.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from keeper.model.apply import apply, apply_indexed
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    DeploymentPlacementFailed,
    DeploymentRepairPlaced,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.readiness import instance_is_ready
from keeper.model.state import AnyInstance, State
from keeper.runtime.log_scan import iter_log_file

# The keeper steps once a second and only an instance it saw ready at a step counts as having
# been ready: one lost sooner is a failed placement and waits out the backoff by design.
KEEPER_STEP_S = 1.0


class ExclusionReason(StrEnum):
    """Why a gap between losing a model's instance and placing its replacement is not a sample."""

    BACKOFF = "lost_before_ready"  # the keeper had not seen it ready: backoff applies
    GRACE = "master_startup_grace"  # a new master places nothing for STARTUP_GRACE
    NO_CAPACITY = "nothing_fit"  # placement failed until the cluster changed
    MASTER_RESTART = "master_restarted"  # the master changed mid-gap
    UNFINISHED = "never_placed"  # still open when the run ended
    # The keeper had judged it broken (a health verdict or a repair): to the keeper it never
    # served, so its loss is a failed start and the backoff applies, as for one lost before ready.
    BROKEN = "judged_broken"


@dataclass
class _Gap:
    deleted_at: float
    excluded: ExclusionReason | None
    queued: bool = False  # another model was placed first (one placement per step)


def model_of(instance: AnyInstance) -> str:
    return instance.shard_assignments.model_id


def wanted_instances(state: State) -> dict[str, int]:
    """Each deployed model's replicas: how many instances the keeper keeps of it."""
    wanted: dict[str, int] = {}
    for deployment in state.deployments.values():
        model = deployment.model_card.model_id
        wanted[model] = max(wanted.get(model, 0), deployment.replicas)
    return wanted


def moving_models(state: State) -> set[str]:
    """Models with a make-before-break move under way (a drain's, a rolling change's, a
    failover's, a repair's): the move owns one instance beyond the replicas until the old one
    goes (docs/design.md §5.17), so that one is no duplicate."""
    draining = {move.deployment_id for drain in state.drains.values() for move in drain.moves}
    return {
        deployment.model_card.model_id
        for deployment in state.deployments.values()
        if deployment.deployment_id in draining
        or deployment.moving is not None
        or deployment.failover is not None
        or deployment.repairing is not None
    }


def excess_instances(state: State) -> dict[str, str]:
    """Models with more instances than their deployment's replicas (more than one if none),
    or than replicas + 1 while a move owns the extra one, each with a few words saying how many
    of how many."""
    counts = Counter(model_of(instance) for instance in state.instances.values())
    wanted = wanted_instances(state)
    moving = moving_models(state)
    return {
        model: f"{count} instances of {model} (replicas {wanted.get(model, 1)})"
        for model, count in counts.items()
        if count > wanted.get(model, 1) + (1 if model in moving else 0)
    }


@dataclass
class DuplicateCounter:
    """Counts episodes of a model having more instances than its replicas, over States."""

    episodes: int = 0
    examples: list[str] = field(default_factory=list[str])
    _doubled: set[str] = field(default_factory=set[str])

    def check(self, state: State) -> None:
        excess = excess_instances(state)
        for model in sorted(set(excess) - self._doubled):
            self.episodes += 1
            if len(self.examples) < 10:
                self.examples.append(f"event {state.last_event_applied_idx}: {excess[model]}")
        self._doubled = set(excess)


@dataclass(frozen=True)
class LogCheck:
    events: int
    duplicates: int
    examples: list[str]


def check_log(path: Path) -> LogCheck:
    """Replay a master's event log from the start, checking every State for duplicates.

    A torn last line (a kill -9 mid-write, truncated by the next master) is not an event and
    ends the replay, as it ends the master's own. Compaction keeps every instance and
    deployment event, which is all the duplicate check reads, so a compacted log still shows
    every State in which a model could have had two instances."""
    counter = DuplicateCounter()
    state = State()
    events = 0
    for indexed in iter_log_file(path):
        state = apply(state, indexed.event)
        events += 1
        counter.check(state)
    return LogCheck(events, counter.episodes, counter.examples)


class ClusterWatch:
    """The master's State as the soak sees it; feed it with ``snapshot`` and ``event``.

    ``on_deleted(instance_id, now)`` is told of every instance that leaves the State,
    ``on_repair(instance_id, now)`` of every broken instance the keeper places a replacement for
    (docs/design.md §5.19)."""

    def __init__(
        self,
        on_deleted: Callable[[str, float], None] | None = None,
        on_repair: Callable[[str, float], None] | None = None,
    ) -> None:
        self._on_deleted = on_deleted
        self._on_repair = on_repair
        self.state = State()
        self.duplicates = DuplicateCounter()
        self.latencies: list[float] = []
        # Of those, the gaps during which no other model was placed: the step's own latency.
        self.latencies_alone: list[float] = []
        self.excluded: Counter[ExclusionReason] = Counter()
        self.ready_since: dict[str, float] = {}
        self.deleted_at: dict[str, float] = {}
        self.events = 0
        self._master_started_at = -STARTUP_GRACE
        self._gaps: dict[str, list[_Gap]] = {}  # by model, oldest first
        self._broken: set[str] = set()  # instances the keeper judged broken

    # --- what the run tells it ------------------------------------------------------------

    def master_started(self, at: float) -> None:
        """A (new) master began at ``at``: its deletions within STARTUP_GRACE wait by design."""
        self._master_started_at = at

    def judged_broken(self, instance_id: str) -> None:
        """The keeper judged the instance broken (its health verdict, seen by the run)."""
        self._broken.add(instance_id)

    # --- what the stream carries -----------------------------------------------------------

    def snapshot(self, state: State, now: float) -> None:
        """The stream (re)connected: this is the master's State now."""
        for instance_id in self.state.instances:
            if instance_id not in state.instances:
                self._deleted(instance_id, now)
        for gap in self._open_gaps():
            gap.excluded = gap.excluded or ExclusionReason.MASTER_RESTART
        self.state = state
        self.duplicates.check(state)
        self._note_ready(now)
        for model, missing in self._missing_instances().items():
            gaps = self._gaps.setdefault(model, [])
            gaps.extend(
                _Gap(now, ExclusionReason.MASTER_RESTART) for _ in range(missing - len(gaps))
            )

    def event(self, indexed: IndexedEvent, now: float) -> None:
        if indexed.idx <= self.state.last_event_applied_idx:
            return  # already in the snapshot
        self.events += 1
        before = self.state
        self.state = apply_indexed(before, indexed)
        event = indexed.event
        if isinstance(event, InstanceDeleted):
            gone = before.instances.get(event.instance_id)
            if gone is not None:
                self._instance_deleted(gone, now)
        elif isinstance(event, InstanceCreated):
            self._instance_created(event.instance, now)
        elif isinstance(event, DeploymentRepairPlaced):
            self._broken.add(event.move.old_instance_id)
            if self._on_repair is not None:
                self._on_repair(event.move.old_instance_id, now)
        elif isinstance(event, DeploymentPlacementFailed):
            deployment = self.state.deployments.get(event.deployment_id)
            model = deployment.model_card.model_id if deployment else None
            for gap in self._gaps.get(model, []) if model else []:
                gap.excluded = gap.excluded or ExclusionReason.NO_CAPACITY
        self.duplicates.check(self.state)
        self._note_ready(now)

    def finish(self) -> None:
        """The run is over: gaps still open were never closed."""
        for _ in self._open_gaps():
            self.excluded[ExclusionReason.UNFINISHED] += 1
        self._gaps.clear()

    # --- reading --------------------------------------------------------------------------

    def nodes_holding_runners(self) -> set[str]:
        return {
            node
            for instance in self.state.instances.values()
            for node in instance.shard_assignments.node_to_runner
        }

    def instances_on(self, node_id: str | None) -> list[str]:
        """Instances with a runner on the node (every instance for None)."""
        return sorted(
            instance_id
            for instance_id, instance in self.state.instances.items()
            if node_id is None or node_id in instance.shard_assignments.node_to_runner
        )

    # --- bookkeeping ----------------------------------------------------------------------

    def _open_gaps(self) -> list[_Gap]:
        return [gap for gaps in self._gaps.values() for gap in gaps]

    def _missing_instances(self) -> dict[str, int]:
        """Deployed models with fewer instances than their replicas: how many fewer."""
        counts = Counter(model_of(i) for i in self.state.instances.values())
        return {
            model: wanted - counts[model]
            for model, wanted in sorted(wanted_instances(self.state).items())
            if counts[model] < wanted
        }

    def _note_ready(self, now: float) -> None:
        for instance_id, instance in self.state.instances.items():
            if instance_id not in self.ready_since and instance_is_ready(instance, self.state):
                self.ready_since[instance_id] = now

    def _deleted(self, instance_id: str, now: float) -> float | None:
        """Record a deletion; returns when the instance was first seen ready."""
        self.deleted_at.setdefault(instance_id, now)
        if self._on_deleted is not None:
            self._on_deleted(instance_id, now)
        return self.ready_since.pop(instance_id, None)

    def _instance_deleted(self, gone: AnyInstance, now: float) -> None:
        ready_at = self._deleted(gone.instance_id, now)
        model = model_of(gone)
        gaps = self._gaps.setdefault(model, [])
        if self._missing_instances().get(model, 0) <= len(gaps):
            return  # still as many as its replicas, or no deployment wants it
        excluded: ExclusionReason | None = None
        if gone.instance_id in self._broken:
            excluded = ExclusionReason.BROKEN
        elif now < self._master_started_at + STARTUP_GRACE:
            excluded = ExclusionReason.GRACE
        elif ready_at is None or now - ready_at < KEEPER_STEP_S:
            excluded = ExclusionReason.BACKOFF
        gaps.append(_Gap(now, excluded))

    def _instance_created(self, instance: AnyInstance, now: float) -> None:
        gaps = self._gaps.get(model_of(instance), [])
        gap = gaps.pop(0) if gaps else None
        for other in self._open_gaps():
            other.queued = True
        if gap is None:
            return
        if gap.excluded is not None:
            self.excluded[gap.excluded] += 1
            return
        self.latencies.append(now - gap.deleted_at)
        if not gap.queued:
            self.latencies_alone.append(now - gap.deleted_at)
