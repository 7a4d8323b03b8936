"""Following the master's State through the soak: duplicates, deletions, and the keeper's latency.

``ClusterWatch`` is fed what the master's event stream carries (a snapshot State whenever the
stream (re)connects, then every indexed event) with the moment it arrived, and keeps:

- the current State, for the run to see which nodes hold runners and which models serve;
- duplicates: every moment a model has two or more instances, counted once per episode (from
  the first state with two until a state with at most one);
- when each instance was first seen ready and when it was deleted, so a fault can tell whether
  the instances it hit survived it;
- the keeper-added latency: from the deletion of a model's last instance reaching the State to
  the keeper's InstanceCreated for it. Only gaps the keeper is meant to close at its next step
  are samples; the others are counted by why they had to wait (see ``ExclusionReason``).

It is plain synchronous code over ``keeper.apply``, so both soaks (processes and virtual time)
share it, and ``check_log`` replays a master's whole event log through the same duplicate check:
the stream misses what happens while the master is down, the log holds every State it had.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from keeper.apply import apply, apply_indexed
from keeper.constants import STARTUP_GRACE
from keeper.events import (
    DeploymentPlacementFailed,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.readiness import instance_is_ready
from keeper.runtime.log_scan import iter_log_file
from keeper.state import AnyInstance, State

# The keeper steps once a second and only an instance it saw ready at a step counts as having
# been ready: one lost sooner is a failed placement and waits out the backoff by design.
KEEPER_STEP_S = 1.0


class ExclusionReason(StrEnum):
    """Why a gap between losing a model's last instance and placing a new one is not a sample."""

    BACKOFF = "lost_before_ready"  # the keeper had not seen it ready: backoff applies
    GRACE = "master_startup_grace"  # a new master places nothing for STARTUP_GRACE
    NO_CAPACITY = "nothing_fit"  # placement failed until the cluster changed
    MASTER_RESTART = "master_restarted"  # the master changed mid-gap
    UNFINISHED = "never_placed"  # still open when the run ended


@dataclass
class _Gap:
    deleted_at: float
    excluded: ExclusionReason | None
    queued: bool = False  # another model was placed first (one placement per step)


def model_of(instance: AnyInstance) -> str:
    return instance.shard_assignments.model_id


def doubled_models(state: State) -> set[str]:
    counts = Counter(model_of(instance) for instance in state.instances.values())
    return {model for model, count in counts.items() if count > 1}


@dataclass
class DuplicateCounter:
    """Counts episodes of a model having two or more instances, over a sequence of States."""

    episodes: int = 0
    examples: list[str] = field(default_factory=list[str])
    _doubled: set[str] = field(default_factory=set[str])

    def check(self, state: State) -> None:
        doubled = doubled_models(state)
        for model in sorted(doubled - self._doubled):
            self.episodes += 1
            if len(self.examples) < 10:
                self.examples.append(f"event {state.last_event_applied_idx}: two of {model}")
        self._doubled = doubled


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

    ``on_deleted(instance_id, now)`` is told of every instance that leaves the State."""

    def __init__(self, on_deleted: Callable[[str, float], None] | None = None) -> None:
        self._on_deleted = on_deleted
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
        self._gaps: dict[str, _Gap] = {}

    # --- what the run tells it ------------------------------------------------------------

    def master_started(self, at: float) -> None:
        """A (new) master began at ``at``: its deletions within STARTUP_GRACE wait by design."""
        self._master_started_at = at

    # --- what the stream carries -----------------------------------------------------------

    def snapshot(self, state: State, now: float) -> None:
        """The stream (re)connected: this is the master's State now."""
        for instance_id in self.state.instances:
            if instance_id not in state.instances:
                self._deleted(instance_id, now)
        for gap in self._gaps.values():
            gap.excluded = gap.excluded or ExclusionReason.MASTER_RESTART
        self.state = state
        self.duplicates.check(state)
        self._note_ready(now)
        for model in self._deployed_models_without_instance():
            self._gaps.setdefault(model, _Gap(now, ExclusionReason.MASTER_RESTART))

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
        elif isinstance(event, DeploymentPlacementFailed):
            deployment = self.state.deployments.get(event.deployment_id)
            gap = self._gaps.get(deployment.model_card.model_id) if deployment else None
            if gap is not None and gap.excluded is None:
                gap.excluded = ExclusionReason.NO_CAPACITY
        self.duplicates.check(self.state)
        self._note_ready(now)

    def finish(self) -> None:
        """The run is over: gaps still open were never closed."""
        for _ in self._gaps.values():
            self.excluded[ExclusionReason.UNFINISHED] += 1
        self._gaps.clear()

    # --- reading --------------------------------------------------------------------------

    def serving_models(self) -> set[str]:
        return {
            model_of(instance)
            for instance in self.state.instances.values()
            if instance_is_ready(instance, self.state)
        }

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

    def _deployed_models_without_instance(self) -> list[str]:
        with_instance = {model_of(i) for i in self.state.instances.values()}
        return sorted(
            deployment.model_card.model_id
            for deployment in self.state.deployments.values()
            if deployment.model_card.model_id not in with_instance
        )

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
        if model in {model_of(i) for i in self.state.instances.values()}:
            return
        if not any(d.model_card.model_id == model for d in self.state.deployments.values()):
            return
        excluded: ExclusionReason | None = None
        if now < self._master_started_at + STARTUP_GRACE:
            excluded = ExclusionReason.GRACE
        elif ready_at is None or now - ready_at < KEEPER_STEP_S:
            excluded = ExclusionReason.BACKOFF
        self._gaps[model] = _Gap(now, excluded)

    def _instance_created(self, instance: AnyInstance, now: float) -> None:
        gap = self._gaps.pop(model_of(instance), None)
        for other in self._gaps.values():
            other.queued = True
        if gap is None:
            return
        if gap.excluded is not None:
            self.excluded[gap.excluded] += 1
            return
        self.latencies.append(now - gap.deleted_at)
        if not gap.queued:
            self.latencies_alone.append(now - gap.deleted_at)
