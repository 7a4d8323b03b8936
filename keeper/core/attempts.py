"""Placing the deployments that are due: the step's placement attempts, apart from its order.

``DuePlacements`` tries the due deployments (``keeper.core.keeper`` finds them) highest
priority first, at most ``MAX_PLACEMENT_ATTEMPTS_PER_STEP`` of them per step, resuming after the
last one tried, and stops at the first placement, so each placement is made against a State
that holds the previous one. A deployment that cannot be placed and may ``preempt`` has
``keeper.core.preemption`` find the fewest of the keeper's own instances of lower priorities
whose deletion lets it be placed (docs/design.md §5.13).

It reads and writes the keeper's memos and places with the keeper's placement function (both
handed in with each call: the commands note the memos too, and the moves place with the same
function) and keeps what is its own: where the next step resumes, and the
exception of each deployment whose latest placement crashed (a bug in placement, which the
host may log with its traceback; the keeper logs nothing). A crash is recorded as
"<ExceptionType>: <message>" and the other deployments go on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from keeper.core.apart import place_apart
from keeper.core.memo import DeploymentMemo, placed, preempted, reported_error, unplaceable
from keeper.core.placement import PlaceFn
from keeper.core.preemption import Preemption, TrialBudget, candidates, find
from keeper.core.view import ClusterSignature, nodes_serving, without_nodes
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.state import (
    AnyInstance,
    Deployment,
    DeploymentId,
    InstanceId,
    NodeId,
    State,
    cordoned_nodes,
    preempted_by,
)

# Placement attempts per step. An attempt walks the topology's cycles (around a millisecond on
# a large cluster), and the master holds its lock while stepping, so a step stays in the
# milliseconds however many deployments come due together. Stepping once a second, 8 attempts
# per step retry 240 unplaceable deployments per UNPLACEABLE_RETRY, far more than a cluster runs.
MAX_PLACEMENT_ATTEMPTS_PER_STEP = 8


class DuePlacements:
    """The due deployments' placement attempts and what they remember (module doc)."""

    def __init__(self) -> None:
        # The exception of each deployment whose latest placement attempt crashed.
        self._crashes: dict[DeploymentId, Exception] = {}
        # Where the next step resumes its attempts when the last one stopped short of the end,
        # so that deployments past the attempts cap get their turn instead of starving.
        # (No mutation: starting after "" would be the same, as every id sorts after it.)
        self._resume_after: DeploymentId | None = None  # pragma: no mutate

    def in_turn(self, due: list[Deployment]) -> list[Deployment]:
        """The due deployments in id order, starting after the one the last step stopped at."""
        if self._resume_after is None:
            return due
        later = [d for d in due if d.deployment_id > self._resume_after]
        earlier = [d for d in due if d.deployment_id <= self._resume_after]
        return later + earlier

    def attempt(
        self,
        due: Sequence[Deployment],
        state: State,
        signature: ClusterSignature,
        now: float,
        memos: dict[DeploymentId, DeploymentMemo],
        deleting: set[DeploymentId],
        place: PlaceFn,
    ) -> list[AnyEvent]:
        """Try ``due`` in order with ``place`` (the keeper's, which holds it for the moves too)
        until one is placed or the cap is reached; their events. The memos of those tried (and
        of a preemption's victims) are updated in ``memos``."""
        events: list[AnyEvent] = []
        tried = 0
        budget = TrialBudget()  # preemption's placement trials, for the whole step
        for deployment in due:
            if tried == MAX_PLACEMENT_ATTEMPTS_PER_STEP:
                break
            tried += 1
            outcome, succeeded = self._place_one(
                deployment, state, signature, now, budget, memos, deleting, place
            )
            events.extend(outcome)
            if succeeded:
                break  # one placement per step: the next sees this one in the state
        self._resume_after = due[tried - 1].deployment_id if tried < len(due) else None
        return events

    def _place_one(
        self,
        deployment: Deployment,
        state: State,
        signature: ClusterSignature,
        now: float,
        budget: TrialBudget,
        memos: dict[DeploymentId, DeploymentMemo],
        deleting: set[DeploymentId],
        place: PlaceFn,
    ) -> tuple[list[AnyEvent], bool]:
        """Try to place one deployment: its events, and whether an instance was placed."""
        deployment_id = deployment.deployment_id
        memo = memos[deployment_id]
        model_id = deployment.model_card.model_id
        # Anti-affinity: a replica goes only where no other instance of the model has a runner,
        # so that one node fault costs at most one replica. (With no such node, the view equals
        # the state.)
        serving = nodes_serving(state, model_id)
        cordoned = cordoned_nodes(state)
        # Nodes with a verdict (suspect, dead) get nothing new (docs/design.md §5.18).
        watched = frozenset(state.node_watch)
        try:
            instance = place_apart(place, state, deployment, serving, cordoned, watched)
        except ValueError as reason:
            error = str(reason)
            self._forget_crash(deployment_id)
            if deployment.preempt:  # docs/design.md §5.13
                left_out = serving | cordoned | watched
                preemption = _preemption(
                    deployment, state, left_out, budget, memos, deleting, place
                )
                if preemption is not None:
                    events = _preempting(deployment, preemption, state, signature, now, memos)
                    return events, True
        except Exception as crash:  # a bug in placement must not stop the other deployments
            error = f"{type(crash).__name__}: {crash}"
            self._crashes[deployment_id] = crash
        else:
            self._forget_crash(deployment_id)
            memos[deployment_id] = placed(memo, instance.instance_id, now)
            created = InstanceCreated(instance=instance)
            assigned = DeploymentPlaced(
                deployment_id=deployment_id, instance_id=instance.instance_id
            )
            return [created, assigned], True
        if memo.preempted is not None:  # it lost an instance to a higher priority: say so first
            error = f"{memo.preempted}: {error}"
        already_reported = error == reported_error(memo, deployment)
        memos[deployment_id] = unplaceable(memo, deployment, signature, error, now)
        if already_reported:
            return [], False
        return [DeploymentPlacementFailed(deployment_id=deployment_id, error=error)], False

    def _forget_crash(self, deployment_id: DeploymentId) -> None:
        if deployment_id in self._crashes:
            del self._crashes[deployment_id]

    def forget_departed(self, live: Mapping[DeploymentId, Deployment]) -> None:
        """Drop the crashes of deployments the State no longer holds."""
        self._crashes = {d: crash for d, crash in self._crashes.items() if d in live}

    def crashes(self) -> Mapping[DeploymentId, Exception]:
        """The exception of each deployment whose latest placement attempt crashed."""
        return dict(self._crashes)


def _preempting(
    deployment: Deployment,
    preemption: Preemption,
    state: State,
    signature: ClusterSignature,
    now: float,
    memos: dict[DeploymentId, DeploymentMemo],
) -> list[AnyEvent]:
    """The events of a preemption: each victim's deployment told why (first, so that any State
    that shows an instance gone also shows the reason), the instances deleted, then the
    placement made without them."""
    error = preempted_by(deployment.model_card.model_id)
    events: list[AnyEvent] = []
    for victim_id, instance_ids in preemption.by_deployment().items():
        victim = state.deployments[victim_id]
        memo = memos[victim_id]  # observed in this step: it is not being deleted
        if error != reported_error(memo, victim):
            events.append(DeploymentPlacementFailed(deployment_id=victim_id, error=error))
        memos[victim_id] = preempted(memo, victim, instance_ids, signature, error, now)
    events.extend(InstanceDeleted(instance_id=v.instance_id) for v in preemption.victims)
    instance = preemption.instance
    deployment_id = deployment.deployment_id
    memos[deployment_id] = placed(memos[deployment_id], instance.instance_id, now)
    assigned = DeploymentPlaced(deployment_id=deployment_id, instance_id=instance.instance_id)
    return [*events, InstanceCreated(instance=instance), assigned]


def _preemption(
    deployment: Deployment,
    state: State,
    left_out: frozenset[NodeId],
    budget: TrialBudget,
    memos: Mapping[DeploymentId, DeploymentMemo],
    deleting: set[DeploymentId],
    place_fn: PlaceFn,
) -> Preemption | None:
    """The keeper's instances of lower priorities whose deletion lets ``deployment`` be
    placed, and its instance placed without them (``keeper.core.preemption``) and without the
    nodes its own placement leaves out (``left_out``: those serving its model, the cordoned
    ones); never one of a deployment being deleted nor one already being removed."""
    leaving = frozenset[InstanceId]().union(*(m.retiring for m in memos.values()))
    victims = candidates(state, deployment, spared=deleting, leaving=leaving)

    def place(view: State) -> AnyInstance:
        return place_fn(
            without_nodes(view, left_out),
            deployment.model_card,
            deployment.sharding,
            deployment.instance_meta,
            deployment.min_nodes,
        )

    return find(place, state, victims, budget)
