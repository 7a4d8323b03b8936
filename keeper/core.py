"""The keeper: places an instance of a deployment's model whenever the cluster has none (the
rules are in docs/design.md).

It is a pure function of the State plus a small memory per deployment (``keeper.memo``):
``step`` reads no clock, does no I/O and returns the events to emit; the master applies them.
The State trails the keeper's events (they go round the router first), so the memory holds
exactly what the State cannot yet show: the placement on its way, whether the instance it
watches was ever ready, the waits that follow failures, and the error already reported.

A step does a bounded amount of work however many deployments wait: every deployment is
observed (cheap dictionary lookups), but placement is attempted for at most
``MAX_PLACEMENT_ATTEMPTS_PER_STEP`` of them, resuming after the last one tried, and at most one
placement succeeds, so each placement is made against a state holding the previous one.

A placement that raises something other than ValueError is a bug in placement, not a reason:
the deployment records it as "<ExceptionType>: <message>" and the keeper goes on with the
others. The exception itself is kept too (``placement_crashes``, one per deployment at most),
so that the host, which may do I/O, can log its traceback; the keeper logs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from keeper.api_models import WaitReason
from keeper.cluster_view import ClusterSignature, cluster_signature, models_with_instances
from keeper.constants import STARTUP_GRACE
from keeper.events import (
    AnyEvent,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.memo import (
    FRESH,
    DeploymentMemo,
    observe,
    placed,
    reported_error,
    unplaceable,
    waiting,
)
from keeper.placement import place_instance
from keeper.readiness import deployment_status
from keeper.state import (
    AnyInstance,
    Deployment,
    DeploymentId,
    InstanceId,
    InstanceMeta,
    ModelCard,
    Sharding,
    State,
)

# The status rule lives with the data model (``keeper.readiness``) so that the TUI shares it;
# it is re-exported here, where ``keeper.deployment_status`` has always come from.
__all__ = [
    "MAX_PLACEMENT_ATTEMPTS_PER_STEP",
    "DeploymentTimer",
    "Keeper",
    "PlaceFn",
    "deployment_status",
    "has_instance",
]

PlaceFn = Callable[[State, ModelCard, Sharding, InstanceMeta, int], AnyInstance]

# Placement attempts per step. An attempt walks the topology's cycles (around a millisecond on
# a large cluster), and the master holds its lock while stepping, so a step stays in the
# milliseconds however many deployments come due together. Stepping once a second, 8 attempts
# per step retry 240 unplaceable deployments per UNPLACEABLE_RETRY, far more than a cluster runs.
MAX_PLACEMENT_ATTEMPTS_PER_STEP = 8


@dataclass(frozen=True)
class DeploymentTimer:
    """A read-only view of the keeper's memory of one deployment, for the API and the TUI."""

    failures: int  # placements lost before ready, in a row
    next_attempt_at: float | None  # on the caller's monotonic clock (the `now` of step)
    waiting: WaitReason | None


class Keeper:
    def __init__(
        self,
        started_at: float,
        place: PlaceFn = place_instance,
        *,
        startup_grace: float = STARTUP_GRACE,
    ) -> None:
        """A keeper that places nothing before ``started_at + startup_grace`` (a new master
        first waits for its nodes to report the instances they already run)."""
        self.started_at = started_at
        self.startup_grace = startup_grace
        self._place = place
        self._memos: dict[DeploymentId, DeploymentMemo] = {}
        # Deployments whose DeploymentDeleted was emitted but is not yet in the state.
        self._deleting: set[DeploymentId] = set()
        # The exception of each deployment whose latest placement attempt crashed.
        self._crashes: dict[DeploymentId, Exception] = {}
        # Where the next step resumes its attempts when the last one stopped short of the end,
        # so that deployments past the attempts cap get their turn instead of starving.
        # (No mutation: starting after "" would be the same, as every id sorts after it.)
        self._resume_after: DeploymentId | None = None  # pragma: no mutate

    # --- stepping -------------------------------------------------------------------------

    def step(self, state: State, now: float) -> list[AnyEvent]:
        if now < self.started_at + self.startup_grace:
            return []
        self._forget_departed(state)
        if not state.deployments:
            return []
        served = models_with_instances(state)
        signature = cluster_signature(state)
        due: list[Deployment] = []
        for deployment_id in sorted(state.deployments):
            if deployment_id in self._deleting:
                continue
            deployment = state.deployments[deployment_id]
            memo = observe(self._memos.get(deployment_id, FRESH), deployment, state, now)
            self._memos[deployment_id] = memo
            if deployment.model_card.model_id in served:
                continue
            if waiting(memo, signature, now) is None:
                due.append(deployment)
        return self._attempt(self._in_turn(due), state, signature, now)

    def _in_turn(self, due: list[Deployment]) -> list[Deployment]:
        """The due deployments in id order, starting after the one the last step stopped at."""
        if self._resume_after is None:
            return due
        later = [d for d in due if d.deployment_id > self._resume_after]
        earlier = [d for d in due if d.deployment_id <= self._resume_after]
        return later + earlier

    def _attempt(
        self,
        due: Sequence[Deployment],
        state: State,
        signature: ClusterSignature,
        now: float,
    ) -> list[AnyEvent]:
        events: list[AnyEvent] = []
        tried = 0
        for deployment in due:
            if tried == MAX_PLACEMENT_ATTEMPTS_PER_STEP:
                break
            tried += 1
            outcome, succeeded = self._place_one(deployment, state, signature, now)
            events.extend(outcome)
            if succeeded:
                break  # one placement per step: the next sees this one in the state
        self._resume_after = due[tried - 1].deployment_id if tried < len(due) else None
        return events

    def _place_one(
        self, deployment: Deployment, state: State, signature: ClusterSignature, now: float
    ) -> tuple[list[AnyEvent], bool]:
        """Try to place one deployment: its events, and whether an instance was placed."""
        deployment_id = deployment.deployment_id
        memo = self._memos[deployment_id]
        try:
            instance = self._place(
                state,
                deployment.model_card,
                deployment.sharding,
                deployment.instance_meta,
                deployment.min_nodes,
            )
        except ValueError as reason:
            error = str(reason)
            self._forget_crash(deployment_id)
        except Exception as crash:  # a bug in placement must not stop the other deployments
            error = f"{type(crash).__name__}: {crash}"
            self._crashes[deployment_id] = crash
        else:
            self._forget_crash(deployment_id)
            self._memos[deployment_id] = placed(memo, instance.instance_id, now)
            created = InstanceCreated(instance=instance)
            assigned = DeploymentPlaced(
                deployment_id=deployment_id, instance_id=instance.instance_id
            )
            return [created, assigned], True
        already_reported = error == reported_error(memo, deployment)
        self._memos[deployment_id] = unplaceable(memo, signature, error, now)
        if already_reported:
            return [], False
        return [DeploymentPlacementFailed(deployment_id=deployment_id, error=error)], False

    def _forget_crash(self, deployment_id: DeploymentId) -> None:
        if deployment_id in self._crashes:
            del self._crashes[deployment_id]

    def _forget_departed(self, state: State) -> None:
        """Drop the memory of deployments the state no longer holds, so it cannot grow."""
        live = state.deployments
        self._memos = {d: memo for d, memo in self._memos.items() if d in live}
        self._deleting = {d for d in self._deleting if d in live}
        self._crashes = {d: crash for d, crash in self._crashes.items() if d in live}

    def placement_crashes(self) -> Mapping[DeploymentId, Exception]:
        """The exception (with its traceback) of each deployment whose latest placement attempt
        raised something other than ValueError; its event carries only "<Type>: <message>"."""
        return dict(self._crashes)

    # --- deletion -------------------------------------------------------------------------

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        deployment = state.deployments.get(deployment_id)
        memo = self._memos.get(deployment_id)
        if deployment_id in self._deleting or (deployment is None and memo is None):
            return []
        self._deleting.add(deployment_id)
        events: list[AnyEvent] = [DeploymentDeleted(deployment_id=deployment_id)]
        events.extend(
            InstanceDeleted(instance_id=instance_id)
            for instance_id in _own_instances(deployment, memo or FRESH, state)
        )
        return events

    # --- the operator's view --------------------------------------------------------------

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        """What the next step would wait for, per deployment; never changes the keeper."""
        grace_ends = self.started_at + self.startup_grace
        served = models_with_instances(state)
        signature = cluster_signature(state)
        views: dict[str, DeploymentTimer] = {}
        for deployment_id, deployment in state.deployments.items():
            memo = observe(self._memos.get(deployment_id, FRESH), deployment, state, now)
            wait: tuple[WaitReason, float] | None
            if deployment_id in self._deleting or deployment.model_card.model_id in served:
                wait = None
            elif now < grace_ends:
                wait = ("grace", grace_ends)
            else:
                wait = waiting(memo, signature, now)
            views[deployment_id] = DeploymentTimer(
                failures=memo.failures,
                next_attempt_at=None if wait is None else wait[1],
                waiting=None if wait is None else wait[0],
            )
        return views


def _own_instances(
    deployment: Deployment | None, memo: DeploymentMemo, state: State
) -> list[InstanceId]:
    """The instances this keeper placed for a deployment that still exist or are on their way.

    The one in flight counts even if the state does not show it yet (the InstanceDeleted is
    emitted after its InstanceCreated), unless the state shows it already came and went.
    """
    named = deployment.instance_id if deployment is not None else None
    own: list[InstanceId] = []
    if memo.in_flight is not None and (
        memo.in_flight in state.instances or named != memo.in_flight
    ):
        own.append(memo.in_flight)
    watched = memo.watched.instance_id if memo.watched is not None else None
    for candidate in (watched, named):
        if candidate is not None and candidate in state.instances and candidate not in own:
            own.append(candidate)
    return own


def has_instance(state: State, model_id: str) -> bool:
    """Whether any instance of the model exists, however it was placed."""
    return any(
        instance.shard_assignments.model_id == model_id for instance in state.instances.values()
    )
