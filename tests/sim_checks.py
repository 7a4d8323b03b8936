"""What the keeper simulations check, as observers of a SimCluster.

Why it is shaped this way: the simulator only produces a world; these classes judge it, so the
same checks serve the long randomized runs and the hypothesis state machine.

- ``SafetyChecks`` watches every event applied to the true state and every keeper call: no
  model ever has two instances, no model two deployments, the keeper only adds (its step never
  deletes), places at most once per step and never during the startup grace, never places for
  a model its view already runs or for a deployment being deleted, does nothing when there is
  no deployment, and deleting a deployment removes exactly the instances it placed for it that
  the cluster still has (even one still on its way to the keeper's view), nothing else.
- ``LivenessReferee`` follows each deployment through the keeper's own view and holds it to
  the keeper's timing (docs/design.md §5.4): after a loss, no placement before the backoff is
  over (10 s doubling to 60 s per loss before ready, none after a loss of a ready instance),
  and a placement no later than the backoff, the unplaceable retry after the keeper's last
  failed attempt, and the one-placement-per-step queue allow. Where a new master's memory makes
  the backoff ambiguous (an instance it adopted is lost), it accepts either reading.
- ``AvailabilityMeter`` measures how much of the time deployed models were serving.
- ``settled_problems`` says what is wrong with a cluster that should have settled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sim_cluster import SimCluster, instances_of, is_ready

from keeper import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    PLACEMENT_TIMEOUT,
    STARTUP_GRACE,
    UNPLACEABLE_RETRY,
    deployment_status,
)
from keeper.events import (
    AnyEvent,
    DeploymentDeleted,
    DeploymentPlaced,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.state import State

# A placement may come this much earlier than the backoff says: a loss happens between two
# steps, and which step "noticed" it is a matter of one second.
EARLY_TOLERANCE_S = 1.0
# Steps of slack on top of the deployments queued ahead (one placement per step) before a
# deployment counts as starved.
LATE_SLACK_STEPS = 2


def backoff_after(failures: int) -> float:
    """The wait after `failures` placements in a row lost before ready (docs/design.md §5.4)."""
    if failures <= 0:
        return 0.0
    return min(FIRST_BACKOFF * 2 ** (failures - 1), MAX_BACKOFF)


def _duplicates(state: State) -> tuple[list[str], list[str]]:
    instances = Counter(i.shard_assignments.model_id for i in state.instances.values())
    deployments = Counter(d.model_card.model_id for d in state.deployments.values())
    return (
        sorted(m for m, n in instances.items() if n > 1),
        sorted(m for m, n in deployments.items() if n > 1),
    )


class SafetyChecks:
    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.violations: list[str] = []
        # deployment id -> every instance any keeper incarnation placed for it
        self.placed_for: dict[str, set[str]] = {}
        self.deleting: set[str] = set()
        self.keeper_placements = 0
        self.events_checked = 0
        sim.observers.on_event.append(self._on_event)
        sim.observers.on_step.append(self._on_step)
        sim.observers.on_delete.append(self._on_delete)

    def _fail(self, what: str) -> None:
        self.violations.append(f"t={self.sim.now:.0f}s: {what}")

    def _on_event(self, event: AnyEvent, before: State, after: State) -> None:
        self.events_checked += 1
        instances, deployments = _duplicates(after)
        if instances:
            self._fail(f"two instances of {instances} after {type(event).__name__}")
        if deployments:
            self._fail(f"two deployments of {deployments} after {type(event).__name__}")

    def _on_step(self, view: State, now: float, events: list[AnyEvent]) -> None:
        if events and now < self.sim.grace_ends_at:
            self._fail(f"the keeper acted during the startup grace: {events}")
        if events and not view.deployments:
            self._fail(f"the keeper acted with no deployment: {events}")
        created = [e for e in events if isinstance(e, InstanceCreated)]
        if len(created) > 1:
            self._fail(f"{len(created)} placements in one step")
        for event in events:
            if isinstance(event, InstanceDeleted | DeploymentDeleted):
                self._fail(f"the keeper's step removed something: {event}")
        placed = {e.instance_id: e.deployment_id for e in events if isinstance(e, DeploymentPlaced)}
        for event in created:
            instance = event.instance
            model_id = instance.shard_assignments.model_id
            deployment_id = placed.get(instance.instance_id)
            self.keeper_placements += 1
            if deployment_id is None:
                self._fail(f"instance {instance.instance_id} placed without DeploymentPlaced")
                continue
            self.placed_for.setdefault(deployment_id, set()).add(instance.instance_id)
            if deployment_id in self.deleting:
                self._fail(f"placed {instance.instance_id} for {deployment_id} being deleted")
            if instances_of(view, model_id):
                self._fail(f"placed {model_id} although its view already runs it")

    def _on_delete(
        self, deployment_id: str, view: State, now: float, events: list[AnyEvent]
    ) -> None:
        mine = self.placed_for.get(deployment_id, set())
        deleted = {e.instance_id for e in events if isinstance(e, InstanceDeleted)}
        for instance_id in sorted(deleted - mine):
            self._fail(
                f"deleting {deployment_id} deleted {instance_id}, "
                "which the keeper did not place for it"
            )
        if any(isinstance(e, DeploymentDeleted) for e in events):
            self.deleting.add(deployment_id)
            # Everything it placed for the deployment that the cluster still has, or will have
            # (an InstanceCreated already in the log), must go with it.
            left = sorted((mine & set(self.sim.true_state.instances)) - deleted)
            if left:
                self._fail(f"deleting {deployment_id} left its instances {left} running")
        for event in events:
            if isinstance(event, DeploymentDeleted) and event.deployment_id != deployment_id:
                self._fail(f"deleting {deployment_id} emitted {event}")


@dataclass
class _Watch:
    deployment_id: str
    model_id: str
    in_flight: str | None = None
    in_flight_at: float = 0.0
    # When the keeper's view started needing a placement for it (None: it does not).
    awaiting_since: float | None = None
    awaiting_kind: str = "new"
    # The keeper's failures in a row lie in [fail_lo, fail_hi] (a new master's ambiguity).
    fail_lo: int = 0
    fail_hi: int = 0
    earliest_lo: float = 0.0
    earliest_hi: float = 0.0
    ready_seen: set[str] = field(default_factory=set)
    accounted: set[str] = field(default_factory=set)
    adopted: set[str] = field(default_factory=set)
    starved_reported: bool = False


@dataclass
class LivenessStats:
    # kind of wait -> delays (s) from the keeper's view needing a placement to the placement
    delays: dict[str, list[float]] = field(default_factory=dict)
    max_failures_in_a_row: int = 0
    failed_attempts: int = 0

    def summary(self) -> str:
        parts = [
            f"{kind}: n={len(values)} max={max(values):.0f}s mean={sum(values) / len(values):.1f}s"
            for kind, values in sorted(self.delays.items())
            if values
        ]
        return "; ".join(parts) + f"; max failures in a row {self.max_failures_in_a_row}"


class LivenessReferee:
    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.violations: list[str] = []
        self.stats = LivenessStats()
        self._watches: dict[str, _Watch] = {}
        self._deleting: set[str] = set()
        # model id -> when the keeper last tried to place it and could not
        self._last_failed_attempt: dict[str, float] = {}
        sim.observers.on_step.append(self._on_step)
        sim.observers.on_delete.append(self._on_delete)
        sim.observers.on_restart.append(self._on_restart)
        sim.observers.on_place.append(self._on_place)

    def _fail(self, what: str) -> None:
        self.violations.append(f"t={self.sim.now:.0f}s: {what}")

    def _on_place(self, model_id: str, now: float, error: str | None) -> None:
        if error is not None:
            self._last_failed_attempt[model_id] = now
            self.stats.failed_attempts += 1

    def _on_delete(self, deployment_id: str, view: State, now: float, events: object) -> None:
        self._deleting.add(deployment_id)
        self._watches.pop(deployment_id, None)

    def _on_restart(self, now: float, view: State) -> None:
        for watch in self._watches.values():
            deployment = view.deployments.get(watch.deployment_id)
            watch.in_flight = None
            watch.awaiting_since = None
            watch.fail_lo = watch.fail_hi = 0
            watch.ready_seen.clear()
            watch.adopted = (
                {deployment.instance_id} if deployment and deployment.instance_id else set()
            )
            watch.starved_reported = False

    def _await(self, watch: _Watch, now: float, kind: str) -> None:
        watch.awaiting_since = now
        watch.awaiting_kind = kind
        watch.earliest_lo = now + backoff_after(watch.fail_lo)
        watch.earliest_hi = now + backoff_after(watch.fail_hi)
        watch.starved_reported = False

    def _lost(self, watch: _Watch, instance_id: str, now: float) -> None:
        watch.accounted.add(instance_id)
        if instance_id in watch.ready_seen:
            watch.fail_lo = watch.fail_hi = 0
            kind = "lost_after_ready"
        elif instance_id in watch.adopted:
            watch.fail_lo, watch.fail_hi = 0, watch.fail_hi + 1
            kind = "adopted_lost"
        else:
            watch.fail_lo += 1
            watch.fail_hi += 1
            kind = "lost_before_ready"
        self.stats.max_failures_in_a_row = max(self.stats.max_failures_in_a_row, watch.fail_lo)
        self._await(watch, now, kind)

    def _observe(self, view: State, now: float) -> None:
        for deployment_id in [d for d in self._watches if d not in view.deployments]:
            del self._watches[deployment_id]
        self._deleting &= set(view.deployments)
        for deployment_id, deployment in sorted(view.deployments.items()):
            if deployment_id in self._deleting:
                continue
            model_id = deployment.model_card.model_id
            watch = self._watches.setdefault(deployment_id, _Watch(deployment_id, model_id))
            running = instances_of(view, model_id)
            for instance in running:
                # A keeper sees readiness at its steps; during the grace it may not look.
                if now >= self.sim.grace_ends_at and is_ready(instance, view):
                    watch.ready_seen.add(instance.instance_id)
            if running:
                watch.awaiting_since = None
                if watch.in_flight in view.instances:
                    watch.in_flight = None
                continue
            if watch.in_flight is not None:
                if deployment.instance_id == watch.in_flight:
                    lost, watch.in_flight = watch.in_flight, None
                    self._lost(watch, lost, now)
                elif now - watch.in_flight_at >= PLACEMENT_TIMEOUT:
                    watch.in_flight = None
                    self._await(watch, now, "in_flight_timeout")
                continue
            if watch.awaiting_since is None:
                named = deployment.instance_id
                if named is not None and named not in watch.accounted:
                    self._lost(watch, named, now)
                else:
                    self._await(watch, now, "new")

    def _on_step(self, view: State, now: float, events: list[AnyEvent]) -> None:
        self._observe(view, now)
        grace_end = self.sim.keeper_started_at + STARTUP_GRACE
        for event in events:
            if not isinstance(event, DeploymentPlaced):
                continue
            watch = self._watches.get(event.deployment_id)
            if watch is None:
                continue  # SafetyChecks reports placements for deployments being deleted
            if watch.awaiting_since is None:
                self._fail(f"placed for {watch.model_id} while not needed (in flight or running)")
            elif now < watch.earliest_lo - EARLY_TOLERANCE_S:
                self._fail(
                    f"placed {watch.model_id} at {now:.0f}s, before its backoff ended at "
                    f"{watch.earliest_lo:.0f}s ({watch.fail_lo} failures in a row)"
                )
            else:
                delay = now - watch.awaiting_since
                last_failed = self._last_failed_attempt.get(watch.model_id, -1.0)
                # Waits that included failed attempts are bounded by the retry, not the loss.
                kind = "retried" if last_failed >= watch.awaiting_since else watch.awaiting_kind
                self.stats.delays.setdefault(kind, []).append(delay)
            watch.in_flight = event.instance_id
            watch.in_flight_at = now
            watch.awaiting_since = None
        queue = len(view.deployments) + LATE_SLACK_STEPS
        for watch in self._watches.values():
            if watch.awaiting_since is None or watch.starved_reported:
                continue
            due = max(watch.earliest_hi, grace_end)
            last_failed = self._last_failed_attempt.get(watch.model_id)
            if last_failed is not None:
                due = max(due, last_failed + UNPLACEABLE_RETRY)
            if now > due + queue:
                watch.starved_reported = True
                self._fail(
                    f"{watch.model_id} waiting since {watch.awaiting_since:.0f}s "
                    f"({watch.awaiting_kind}) was neither placed nor tried again by "
                    f"{due + queue:.0f}s"
                )


class AvailabilityMeter:
    """The share of deployment-seconds (after the startup grace) in which the deployment's
    model was serving on the true state: what users of the cluster would have seen."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.deployment_seconds = 0
        self.serving_seconds = 0
        sim.observers.on_step.append(self._on_step)

    def _on_step(self, view: State, now: float, events: list[AnyEvent]) -> None:
        if now < self.sim.grace_ends_at:
            return
        state = self.sim.true_state
        for deployment in state.deployments.values():
            self.deployment_seconds += 1
            self.serving_seconds += deployment_status(deployment, state) == "serving"

    @property
    def availability(self) -> float:
        return self.serving_seconds / max(1, self.deployment_seconds)


def settled_problems(sim: SimCluster, unplaceable: frozenset[str] = frozenset()) -> list[str]:
    """What is wrong with a cluster that has had time to settle: every deployed model (except
    those that cannot fit) runs exactly one serving instance, and nothing else runs."""
    state = sim.true_state
    problems: list[str] = []
    deployed = {d.model_card.model_id for d in state.deployments.values()}
    for deployment in state.deployments.values():
        model_id = deployment.model_card.model_id
        count = len(instances_of(state, model_id))
        status = deployment_status(deployment, state)
        if model_id in unplaceable:
            if count or status != "cant_place" or not deployment.placement_error:
                problems.append(f"{model_id}: {count} instances, {status}; expected cant_place")
        elif count != 1 or status != "serving":
            problems.append(f"{model_id}: {count} instances, {status}; expected 1, serving")
    for instance in state.instances.values():
        if instance.shard_assignments.model_id not in deployed:
            problems.append(
                f"{instance.instance_id} runs undeployed {instance.shard_assignments.model_id}"
            )
    owned = {
        r for i in state.instances.values() for r in i.shard_assignments.node_to_runner.values()
    }
    stray = sorted(set(state.runners) - owned)
    if stray:
        problems.append(f"runners without an instance: {stray[:5]}")
    return problems
