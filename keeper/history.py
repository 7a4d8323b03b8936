"""A deployment's recovery history, computed from the event log: availability, incidents and why
(docs/design.md, 3.5 "Deployment history").

The history is a pure function of the events and their times, so it lives in the data model:
a service hands it the events it reads from its log, and a test writes an event sequence by
hand. It replays the events with ``keeper.apply`` and asks of every State what ``GET
/deployments`` asks (``keeper.readiness``: serving while an instance of the model has every
runner Ready or Running), adding only that a node gone from the topology serves nothing.

Times are plain seconds (the Unix epoch in the shell, anything monotonic in a test): the data
model reads no clock and formats no dates. An event logged without a time (a log written before
the store recorded one) takes the time of the last event before it that had one; events before
any timed event are treated as older than every window.

An incident is a stretch in which an existing deployment was not serving, once it had served
(the first start-up is not an incident, unless placement said why it could not start: then it
is "unplaceable"). Its cause is the event that ended serving, in plain words. The log continues
across master restarts, so an incident that spans one is a single stretch here: nothing in the
events marks the restart, and the time the master was away counts as down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from keeper.apply import apply
from keeper.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlacementFailed,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.readiness import instances_of, ready_on_present_nodes
from keeper.state import AnyInstance, DeploymentId, NodeId, RunnerFailed, RunnerId, State

# Whatever else made an instance stop serving: a runner of a ready instance went back to
# loading, shut down, or the instance was replaced, with no event that says more.
UNKNOWN_CAUSE = "stopped serving"


@dataclass(frozen=True)
class TimedEvent:
    """An event of the log with its index and the time its batch was written (None: unknown)."""

    idx: int
    at: float | None
    event: AnyEvent


@dataclass(frozen=True)
class Incident:
    start: float
    end: float | None  # None while ongoing at the end of the window
    downtime_s: float
    cause: str


@dataclass(frozen=True)
class History:
    deployment_id: DeploymentId
    window_start: float
    window_end: float
    availability: float | None  # None: the deployment did not exist in the known window
    incidents: tuple[Incident, ...]
    mttr_s: float | None  # mean time to recover over the incidents that ended; None if none
    complete_from: float | None  # set when the events start later than the window


def _node_name(names: Mapping[NodeId, str], node_id: NodeId) -> str:
    return names.get(node_id) or node_id


def _cause_of(
    event: AnyEvent, state: State, deployment_id: DeploymentId, names: Mapping[NodeId, str]
) -> str | None:
    """What this event, about to be applied to ``state``, would say about losing the deployment's
    service; None when it names nothing of the deployment's."""
    deployment = state.deployments.get(deployment_id)
    if deployment is None:
        return None
    ready = _serving_instances(state, deployment_id)
    match event:
        case NodeTimedOut(node_id=node_id):
            return f"node {_node_name(names, node_id)} timed out"
        case InstanceDeleted(instance_id=instance_id):
            instance = state.instances.get(instance_id)
            if instance is None:
                return None
            missing = [
                node
                for node in instance.shard_assignments.node_to_runner
                if node not in state.topology.nodes
            ]
            if missing:
                return f"node {', '.join(_node_name(names, n) for n in missing)} timed out"
            return "instance deleted by a user"
        case RunnerStatusUpdated(runner_id=runner_id, runner_status=status):
            for instance in ready:
                for node, runner in instance.shard_assignments.node_to_runner.items():
                    if runner == runner_id:
                        where = _node_name(names, node)
                        if isinstance(status, RunnerFailed):
                            return (
                                f"runner failed on {where}: {status.error_message or 'no message'}"
                            )
                        return f"runner on {where} went {type(status).__name__}"
            return None
        case DeploymentPlacementFailed(error=error):
            return f"unplaceable: {error}"
        case _:
            return None


def _serving_instances(state: State, deployment_id: DeploymentId) -> list[AnyInstance]:
    """The deployment's ready instances (``keeper.readiness``) whose nodes are all still in the
    topology: a node that timed out serves nothing, though its runners read Ready until the
    sweep deletes its instances (docs/design.md 6.3), so its loss starts the incident."""
    deployment = state.deployments.get(deployment_id)
    if deployment is None:
        return []
    return [
        instance
        for instance in instances_of(state, deployment.model_card.model_id)
        if ready_on_present_nodes(instance, state)
    ]


def _serving(state: State, deployment_id: DeploymentId) -> bool:
    return bool(_serving_instances(state, deployment_id))


def _runners_of(state: State, deployment_id: DeploymentId) -> frozenset[RunnerId] | None:
    """The runners of the deployment's model's instances; None before the deployment exists
    (its model is not known yet, so every runner may matter)."""
    deployment = state.deployments.get(deployment_id)
    if deployment is None:
        return None
    return frozenset(
        runner
        for instance in instances_of(state, deployment.model_card.model_id)
        for runner in instance.shard_assignments.node_to_runner.values()
    )


def _touches(
    event: AnyEvent,
    state: State,
    deployment_id: DeploymentId,
    ours: frozenset[RunnerId] | None,
) -> bool:
    """Whether applying ``event`` can change anything the history reads (the deployment, its
    model's instances and their runners, which nodes are in the topology). Skipping the rest
    (node reports of known nodes, links, other models' runners) is what keeps a day's history
    within its cost (docs/design.md 3.5)."""
    match event:
        case TopologyEdgeCreated() | TopologyEdgeDeleted():
            return False
        case NodeGatheredInfo(node_id=node_id):
            return node_id not in state.topology.nodes
        case RunnerStatusUpdated(runner_id=runner_id):
            return ours is None or runner_id in ours
        case InstanceCreated(instance=instance):
            deployment = state.deployments.get(deployment_id)
            return (
                deployment is None
                or instance.shard_assignments.model_id == deployment.model_card.model_id
            )
        case _:
            return True


@dataclass
class _Stretch:
    start: float
    cause: str | None
    after_serving: bool


def deployment_history(
    deployment_id: DeploymentId,
    events: Iterable[TimedEvent],
    *,
    window_start: float,
    window_end: float,
    initial: State | None = None,
) -> History:
    """The deployment's history over ``[window_start, window_end]``, replaying ``events`` (in the
    log's order) on ``initial`` (the empty State: a log from its first event)."""
    state = initial if initial is not None else State()
    now = float("-inf")
    first_at: float | None = None
    # Node names outlive the node's entry in the State, so a cause can name a node that left.
    names: dict[NodeId, str] = {
        node: identity.friendly_name for node, identity in state.node_identities.items()
    }
    exists = deployment_id in state.deployments
    serving = _serving(state, deployment_id)
    ours = _runners_of(state, deployment_id)
    # Time the deployment existed inside the window, and of it the time it served.
    existed_s = 0.0
    served_s = 0.0
    down: _Stretch | None = None
    if exists and not serving:
        error = state.deployments[deployment_id].placement_error
        down = _Stretch(window_start, f"unplaceable: {error}" if error else None, False)
    closed: list[Incident] = []

    def account(until: float) -> None:
        nonlocal existed_s, served_s
        lo, hi = max(now, window_start), min(until, window_end)
        if exists and hi > lo:
            existed_s += hi - lo
            if serving:
                served_s += hi - lo

    def close(stretch: _Stretch, end: float | None) -> None:
        is_incident = stretch.after_serving or (
            stretch.cause is not None and stretch.cause.startswith("unplaceable")
        )
        stop = end if end is not None else window_end
        if is_incident and stop > window_start and stretch.start < window_end:
            closed.append(
                Incident(
                    start=stretch.start,
                    end=end,
                    downtime_s=max(0.0, stop - stretch.start),
                    cause=stretch.cause or UNKNOWN_CAUSE,
                )
            )

    for timed in events:
        at = timed.at if timed.at is not None else now
        if timed.at is not None and first_at is None:
            first_at = timed.at
        account(at)
        now = max(now, at)
        event = timed.event
        if isinstance(event, NodeGatheredInfo) and event.identity is not None:
            names[event.node_id] = event.identity.friendly_name
        if not _touches(event, state, deployment_id, ours):
            continue
        before, state = state, apply(state, event)
        if isinstance(event, (InstanceCreated, InstanceDeleted, DeploymentCreated)):
            ours = _runners_of(state, deployment_id)
        if isinstance(event, DeploymentCreated) and not exists:
            exists = deployment_id in state.deployments
            if exists:
                down = _Stretch(now, None, False)
        now_serving = _serving(state, deployment_id)
        if isinstance(event, DeploymentDeleted) and deployment_id not in state.deployments:
            if down is not None:
                close(down, now)
            exists, serving, down = False, False, None
            continue
        if serving and not now_serving:
            down = _Stretch(now, _cause_of(event, before, deployment_id, names), True)
        elif not serving and now_serving and down is not None:
            close(down, now)
            down = None
        elif down is not None and down.cause is None:
            cause = _cause_of(event, before, deployment_id, names)
            if cause is not None and (cause.startswith("unplaceable") or down.after_serving):
                # A start-up (or a stretch with no stated reason) that placement explains.
                down.cause = cause
        serving = now_serving
    account(window_end)
    if down is not None and exists:
        close(down, None)

    incidents = tuple(closed)
    ended = [i.downtime_s for i in incidents if i.end is not None]
    complete_from = first_at if first_at is not None and first_at > window_start else None
    return History(
        deployment_id=deployment_id,
        window_start=window_start,
        window_end=window_end,
        availability=served_s / existed_s if existed_s > 0 else None,
        incidents=incidents,
        mttr_s=sum(ended) / len(ended) if ended else None,
        complete_from=complete_from,
    )
