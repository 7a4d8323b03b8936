"""What the keeper simulations check, as observers of a SimCluster.

Why it is shaped this way: the simulator only produces a world; these classes judge it, so the
same checks serve the long randomized runs and the hypothesis state machine.

- ``SafetyChecks`` watches every event applied to the true state and every keeper call: no
  placement ever leaves a model with more instances than its deployment's replicas (one for a
  model nobody deploys), nor two instances of a model on one node; no model has two
  deployments; the keeper only adds (its step never deletes), places at most once per step and
  never during the startup grace, never places for a deployment whose view already holds its
  replicas, or while its previous placement for it is still on its way, or for a deployment
  being deleted, and does nothing when there is no deployment. Deleting a deployment removes
  exactly the instances it placed for it that the cluster still has (even one still on its way
  to the keeper's view), nothing else; scaling down removes only instances the keeper placed for
  it, newest first, and leaves no more instances than the count (unless others placed them).
- ``LivenessReferee`` follows each deployment through the keeper's own view and holds it to
  the keeper's timing (docs/design.md §5.4, §5.11): whenever the view holds fewer instances of
  the model than the deployment's replicas and nothing of the keeper's is on its way, a
  placement comes no sooner than the backoff (10 s doubling to 60 s per own instance lost
  before ready; none after a loss of a ready one; a replica becoming ready ends the failures in
  a row) and no later than the backoff, the unplaceable retry after the keeper's last failed
  attempt, and the one-placement-per-step queue allow. Where a new master's memory makes the
  backoff ambiguous (an instance it adopted is lost), it accepts either reading.
- ``AvailabilityMeter`` measures how much of the time deployed models were serving.
- ``settled_problems`` says what is wrong with a cluster that should have settled.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from sim_cluster import SimCluster, instance_nodes, instances_of, is_ready

from keeper import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    PLACEMENT_TIMEOUT,
    STARTUP_GRACE,
    UNPLACEABLE_RETRY,
    deployment_status,
)
from keeper.core.keeper import ready_replicas
from keeper.model.events import (
    AnyEvent,
    DeploymentDeleted,
    DeploymentPlaced,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.state import State

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


def _duplicate_deployments(state: State) -> list[str]:
    deployments = Counter(d.model_card.model_id for d in state.deployments.values())
    return sorted(m for m, n in deployments.items() if n > 1)


def allowed_instances(state: State, model_id: str) -> int:
    """How many instances of the model the state allows: its deployment's replicas, or one for a
    model nobody deploys (placed by hand)."""
    for deployment in state.deployments.values():
        if deployment.model_card.model_id == model_id:
            return deployment.replicas
    return 1


class Referee:
    """Watches a simulation and records what it breaks, each stamped with the simulated time."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim
        self.violations: list[str] = []

    def _fail(self, what: str) -> None:
        self.violations.append(f"t={self.sim.now:.0f}s: {what}")


class SafetyChecks(Referee):
    def __init__(self, sim: SimCluster) -> None:
        super().__init__(sim)
        # deployment id -> every instance any keeper incarnation placed for it
        self.placed_for: dict[str, set[str]] = {}
        # instance id -> its number among the keeper's placements (to tell newest from oldest)
        self.placement_order: dict[str, int] = {}
        # deployment id -> (instance, when) of the keeper's placement not yet settled in its view
        self.in_flight: dict[str, tuple[str, float]] = {}
        self.deleting: set[str] = set()
        self.keeper_placements = 0
        self.scale_downs = 0
        self.events_checked = 0
        sim.observers.on_event.append(self._on_event)
        sim.observers.on_step.append(self._on_step)
        sim.observers.on_delete.append(self._on_delete)
        sim.observers.on_scale.append(self._on_scale)
        sim.observers.on_restart.append(self._on_restart)

    def _on_event(self, event: AnyEvent, before: State, after: State) -> None:
        self.events_checked += 1
        deployments = _duplicate_deployments(after)
        if deployments:
            self._fail(f"two deployments of {deployments} after {type(event).__name__}")
        if isinstance(event, InstanceCreated):
            self._check_created(event, after)

    def _check_created(self, event: InstanceCreated, after: State) -> None:
        """However it was placed, a new instance leaves its model within its count and apart
        from the model's other instances."""
        instance = event.instance
        model_id = instance.shard_assignments.model_id
        others = [i for i in instances_of(after, model_id) if i.instance_id != instance.instance_id]
        allowed = allowed_instances(after, model_id)
        if len(others) + 1 > allowed:
            self._fail(f"{len(others) + 1} instances of {model_id} (allowed {allowed})")
        shared = set(instance.shard_assignments.node_to_runner) & {
            node for other in others for node in other.shard_assignments.node_to_runner
        }
        if shared:
            self._fail(f"two instances of {model_id} on {sorted(shared)}")
        for deployment_id, placed in self.placed_for.items():
            deployment = after.deployments.get(deployment_id)
            if instance.instance_id in placed and deployment is not None:
                own = len(placed & set(after.instances))
                if own > deployment.replicas:
                    self._fail(f"{own} keeper instances for {deployment_id} over its count")

    def _on_restart(self, now: float, view: State) -> None:
        self.in_flight.clear()  # a new keeper remembers nothing, and its view is whole

    def _settle_in_flight(self, view: State, now: float) -> None:
        for deployment_id, (instance_id, placed_at) in list(self.in_flight.items()):
            deployment = view.deployments.get(deployment_id)
            named = deployment.instance_id if deployment is not None else None
            if (
                instance_id in view.instances
                or named == instance_id
                or now >= placed_at + PLACEMENT_TIMEOUT
            ):
                del self.in_flight[deployment_id]

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
        if now >= self.sim.grace_ends_at:  # a keeper in its grace does not look at its view
            self._settle_in_flight(view, now)
        for event in created:
            instance = event.instance
            model_id = instance.shard_assignments.model_id
            deployment_id = placed.get(instance.instance_id)
            self.keeper_placements += 1
            if deployment_id is None:
                self._fail(f"instance {instance.instance_id} placed without DeploymentPlaced")
                continue
            self.placed_for.setdefault(deployment_id, set()).add(instance.instance_id)
            self.placement_order[instance.instance_id] = self.keeper_placements
            if deployment_id in self.deleting:
                self._fail(f"placed {instance.instance_id} for {deployment_id} being deleted")
            # The count the keeper holds: the latest it set, which the true state already has.
            deployment = self.sim.true_state.deployments.get(deployment_id)
            wanted = deployment.replicas if deployment is not None else 1
            if len(instances_of(view, model_id)) >= wanted:
                self._fail(f"placed {model_id} although its view already holds {wanted}")
            earlier = self.in_flight.get(deployment_id)
            if earlier is not None:
                self._fail(f"placed for {deployment_id} while {earlier[0]} was still on its way")
            self.in_flight[deployment_id] = (instance.instance_id, now)

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

    def _on_scale(
        self, deployment_id: str, replicas: int, view: State, now: float, events: list[AnyEvent]
    ) -> None:
        mine = self.placed_for.get(deployment_id, set())
        deleted = [e.instance_id for e in events if isinstance(e, InstanceDeleted)]
        if deleted:
            self.scale_downs += 1
        for instance_id in deleted:
            if instance_id not in mine:
                self._fail(f"scaling {deployment_id} deleted {instance_id}, not the keeper's")
        if any(isinstance(e, DeploymentDeleted | InstanceCreated) for e in events):
            self._fail(f"scaling {deployment_id} emitted {events}")
        state = self.sim.true_state
        deployment = state.deployments.get(deployment_id)
        if deployment is None or not events:
            return
        if deployment.replicas != replicas:
            self._fail(f"scaling {deployment_id} to {replicas} left {deployment.replicas}")
        # Newest first: every one of the keeper's instances still there is older than any removed.
        kept = [self.placement_order[i] for i in mine & set(state.instances)]
        gone = [self.placement_order[i] for i in deleted if i in self.placement_order]
        if kept and gone and max(kept) > min(gone):
            self._fail(f"scaling {deployment_id} removed an instance newer than one it kept")
        model_id = deployment.model_card.model_id
        others = [i for i in instances_of(state, model_id) if i.instance_id not in mine]
        count = len(instances_of(state, model_id))
        if count > max(replicas, len(others)):
            self._fail(f"scaling {deployment_id} to {replicas} left {count} instances")


@dataclass
class _Watch:
    deployment_id: str
    model_id: str
    in_flight: str | None = None
    in_flight_at: float = 0.0
    # When the keeper's view started needing a placement for it (None: it does not).
    awaiting_since: float | None = None
    awaiting_kind: str = "new"
    # The keeper's failures in a row lie in [fail_lo, fail_hi] (a new master's ambiguity), and
    # so does the end of its backoff.
    fail_lo: int = 0
    fail_hi: int = 0
    backoff_lo: float = 0.0
    backoff_hi: float = 0.0
    # The keeper's own instances its view has shown (placed by it, or adopted by a new master).
    seen: set[str] = field(default_factory=set)
    ready_seen: set[str] = field(default_factory=set)
    adopted: set[str] = field(default_factory=set)
    # Removed by scaling down: their loss is no failure.
    retired: set[str] = field(default_factory=set)
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


class LivenessReferee(Referee):
    def __init__(self, sim: SimCluster) -> None:
        super().__init__(sim)
        self.stats = LivenessStats()
        self._watches: dict[str, _Watch] = {}
        self._deleting: set[str] = set()
        # model id -> when the keeper last tried to place it and could not
        self._last_failed_attempt: dict[str, float] = {}
        sim.observers.on_step.append(self._on_step)
        sim.observers.on_delete.append(self._on_delete)
        sim.observers.on_scale.append(self._on_scale)
        sim.observers.on_restart.append(self._on_restart)
        sim.observers.on_place.append(self._on_place)

    def _on_place(self, model_id: str, now: float, error: str | None) -> None:
        if error is not None:
            self._last_failed_attempt[model_id] = now
            self.stats.failed_attempts += 1

    def _on_delete(self, deployment_id: str, view: State, now: float, events: object) -> None:
        self._deleting.add(deployment_id)
        self._watches.pop(deployment_id, None)

    def _on_scale(
        self, deployment_id: str, replicas: int, view: State, now: float, events: list[AnyEvent]
    ) -> None:
        watch = self._watches.get(deployment_id)
        if watch is None:
            return
        removed = {e.instance_id for e in events if isinstance(e, InstanceDeleted)}
        watch.retired |= removed
        watch.seen -= removed

    def _on_restart(self, now: float, view: State) -> None:
        for watch in self._watches.values():
            deployment = view.deployments.get(watch.deployment_id)
            watch.in_flight = None
            watch.awaiting_since = None
            watch.fail_lo = watch.fail_hi = 0
            watch.backoff_lo = watch.backoff_hi = 0.0
            watch.ready_seen.clear()
            watch.retired.clear()
            recorded: set[str] = set()
            if deployment is not None:
                recorded = set(deployment.placed_instance_ids)
                if deployment.instance_id is not None:
                    recorded.add(deployment.instance_id)
            watch.adopted = recorded & set(view.instances)
            watch.seen = set(watch.adopted)
            watch.starved_reported = False

    def _await(self, watch: _Watch, now: float, kind: str) -> None:
        watch.awaiting_since = now
        watch.awaiting_kind = kind
        watch.starved_reported = False

    def _lost(self, watch: _Watch, instance_id: str, now: float) -> str:
        """Account for one of the keeper's instances gone from its view; the kind of loss."""
        if instance_id in watch.retired:
            return "retired"
        if instance_id in watch.ready_seen:
            kind = "lost_after_ready"
        elif instance_id in watch.adopted:
            watch.fail_hi += 1
            watch.backoff_hi = now + backoff_after(watch.fail_hi)
            kind = "adopted_lost"
        else:
            watch.fail_lo += 1
            watch.fail_hi += 1
            watch.backoff_lo = now + backoff_after(watch.fail_lo)
            watch.backoff_hi = now + backoff_after(watch.fail_hi)
            kind = "lost_before_ready"
        self.stats.max_failures_in_a_row = max(self.stats.max_failures_in_a_row, watch.fail_lo)
        return kind

    def _observe(self, view: State, now: float) -> None:
        for deployment_id in [d for d in self._watches if d not in view.deployments]:
            del self._watches[deployment_id]
        self._deleting &= set(view.deployments)
        looking = now >= self.sim.grace_ends_at  # a keeper in its grace does not look
        for deployment_id, deployment in sorted(view.deployments.items()):
            if deployment_id in self._deleting:
                continue
            model_id = deployment.model_card.model_id
            watch = self._watches.setdefault(deployment_id, _Watch(deployment_id, model_id))
            losses: list[str] = []
            timed_out = False
            # The keeper's placement on its way: arrived, arrived and gone, or given up on.
            if watch.in_flight is not None:
                if watch.in_flight in view.instances:
                    if watch.in_flight not in watch.retired:
                        watch.seen.add(watch.in_flight)
                    watch.in_flight = None
                elif deployment.instance_id == watch.in_flight:
                    losses.append(self._lost(watch, watch.in_flight, now))
                    watch.in_flight = None
                elif now - watch.in_flight_at >= PLACEMENT_TIMEOUT:
                    watch.in_flight = None
                    timed_out = True
            # Its instances gone from the view, then those that became ready (which ends the
            # failures in a row, as the keeper sees it at its steps).
            for instance_id in sorted(watch.seen - set(view.instances)):
                watch.seen.discard(instance_id)
                losses.append(self._lost(watch, instance_id, now))
            if looking:
                for instance_id in sorted(watch.seen - watch.ready_seen):
                    if is_ready(view.instances[instance_id], view):
                        watch.ready_seen.add(instance_id)
                        watch.fail_lo = watch.fail_hi = 0
            # The count the keeper holds is the latest it set, which the true state already has.
            true_deployment = self.sim.true_state.deployments.get(deployment_id)
            wanted = (true_deployment or deployment).replicas
            if len(instances_of(view, model_id)) >= wanted:
                watch.awaiting_since = None
                continue
            if watch.in_flight is not None:
                continue
            if watch.awaiting_since is None:
                kind = "in_flight_timeout" if timed_out else "new"
                for loss in losses:
                    if loss != "retired":
                        kind = loss
                self._await(watch, now, kind)

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
                self._fail(f"placed for {watch.model_id} while not needed (in flight or enough)")
            elif now < watch.backoff_lo - EARLY_TOLERANCE_S:
                self._fail(
                    f"placed {watch.model_id} at {now:.0f}s, before its backoff ended at "
                    f"{watch.backoff_lo:.0f}s ({watch.fail_lo} failures in a row)"
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
            due = max(watch.awaiting_since, watch.backoff_hi, grace_end)
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
    those that cannot fit) runs exactly its replicas, each serving and on nodes of its own, and
    nothing else runs."""
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
        elif count != deployment.replicas or ready_replicas(deployment, state) != count:
            ready = ready_replicas(deployment, state)
            problems.append(
                f"{model_id}: {count} instances ({ready} ready), {status}; "
                f"expected {deployment.replicas}, all ready"
            )
        nodes = [n for i in instances_of(state, model_id) for n in instance_nodes(i)]
        if len(nodes) != len(set(nodes)):
            problems.append(f"{model_id}: two instances share a node ({sorted(nodes)})")
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
