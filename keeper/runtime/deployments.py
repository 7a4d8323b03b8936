"""The deployments API's rules (docs/design.md §7.2), written once for both services that
serve it: the master (``keeper.sim.master.service``) and the bridge (``keeper.bridge.service``).

The two differ in where a model's card comes from (the master's catalog, exo's model list) and
where a deployment's events go (the master's router, the bridge's own log). What a request may
ask, when it conflicts, what a new deployment holds, what the answer says and how a deployment
is shown with the keeper's timers are the same, so a client cannot tell them apart. Refusals
raise a ``keeper.model.refusals`` type with a message for the operator (the API's 4xx).

How many deployments a service keeps is bounded too (``DEFAULT_MAX_DEPLOYMENTS``, or its
``--max-deployments``; ``keeper.runtime.deployment_limit``): every one is in every ``GET
/deployments`` answer, every dashboard's snapshot and every keeper step, so their number is the
operator's to choose, not any client's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from keeper.core.failover import failover_picture
from keeper.core.keeper import DeploymentTimer
from keeper.model.api_models import (
    CommandResponse,
    DeploymentHistoryResponse,
    DeploymentView,
    FailoverView,
    HealthView,
    IncidentView,
    StagedCopyView,
    UpdateView,
    create_problems,
)
from keeper.model.events import (
    AnyEvent,
    DeploymentOptionsChanged,
    DeploymentPriorityChanged,
    DeploymentRepairChanged,
    DeploymentStandbyChanged,
)
from keeper.model.history import summarize
from keeper.model.ids import IdFactory, new_id
from keeper.model.incident_chats import KeptChats, incident_chats
from keeper.model.instance_health import Verdict
from keeper.model.readiness import deployment_at_risk, deployment_status, ready_replicas
from keeper.model.refusals import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    RefusalError,
    UnprocessableError,
)
from keeper.model.rollout import options_words, outdated_instances, update_progress
from keeper.model.state import (
    DEFAULT_PRIORITY,
    Deployment,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    InstanceMeta,
    ModelCard,
    RepairMode,
    Sharding,
    State,
    download_entry,
    download_fraction,
    node_name,
)
from keeper.runtime.clock import Clock, iso_utc
from keeper.runtime.deployment_limit import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.hosted_keeper import (
    KeeperLike,
    ReportsFailovers,
    ReportsHealth,
    ReportsStaging,
    ReportsUpdates,
)

# Errors quote what the client sent, cut to this many characters: a megabyte-long id need not
# come back in full.
SHOWN_MAX_CHARS = 120


class DeploymentLimitError(RefusalError):
    """The service keeps as many deployments as it is allowed to; the request itself was fine,
    hence 422 rather than 400."""

    status_code = 422


def shown(value: str) -> str:
    """``value`` quoted for an error message, cut if it is long."""
    return repr(value if len(value) <= SHOWN_MAX_CHARS else value[:SHOWN_MAX_CHARS] + "...")


def placement_enums(
    sharding: Sharding | str, instance_meta: InstanceMeta | str
) -> tuple[Sharding, InstanceMeta]:
    """The request's sharding and instance type as enums; BadRequestError naming a bad one."""
    try:
        sharding_ = Sharding(sharding)
    except ValueError:
        choices = ", ".join(s.value for s in Sharding)
        raise BadRequestError(
            f"Unknown sharding {sharding!r}: expected one of {choices}", param="sharding"
        ) from None
    try:
        meta = InstanceMeta(instance_meta)
    except ValueError:
        choices = ", ".join(m.value for m in InstanceMeta)
        raise BadRequestError(
            f"Unknown instance_meta {instance_meta!r}: expected one of {choices}",
            param="instance_meta",
        ) from None
    return sharding_, meta


def new_deployment(
    deployments: Mapping[str, Deployment],
    card: ModelCard,
    sharding: Sharding | str,
    instance_meta: InstanceMeta | str,
    min_nodes: int,
    *,
    replicas: int = 1,
    standby: int = 1,
    priority: int = DEFAULT_PRIORITY,
    preempt: bool = False,
    repair: RepairMode = "auto",
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS,
    new_id: IdFactory = new_id,
) -> Deployment:
    """A new deployment of ``card`` as the request asks, if the request can work, none of
    ``deployments`` already keeps that model and there are fewer than ``max_deployments``.

    Call it under the lock the deployment's event is recorded under, so two requests cannot
    both pass the check."""
    sharding_, meta = placement_enums(sharding, instance_meta)
    problems = create_problems(card.model_id, card, sharding_, min_nodes)
    if problems:
        raise BadRequestError(problems[0].message, param=problems[0].field)
    model_id = card.model_id
    for existing in deployments.values():
        if existing.model_card.model_id == model_id:
            raise ConflictError(
                f"Model {model_id} already has deployment {existing.deployment_id}; "
                "delete it first to change its settings",
                param="model_id",
            )
    check_room(deployments, max_deployments)
    return Deployment(
        deployment_id=new_id(),
        model_card=card,
        sharding=sharding_,
        instance_meta=meta,
        min_nodes=min_nodes,
        replicas=replicas,
        standby=standby,
        priority=priority,
        preempt=preempt,
        repair=repair,
    )


def check_room(deployments: Mapping[str, Deployment], max_deployments: int) -> None:
    """DeploymentLimitError unless one more deployment fits under ``max_deployments``."""
    if len(deployments) >= max_deployments:
        raise DeploymentLimitError(
            f"This service keeps at most {max_deployments} deployments and has "
            f"{len(deployments)}: delete one first, or raise the limit by restarting it with "
            "--max-deployments N"
        )


def history_response(
    state: State,
    deployment_id: str,
    hours: float,
    now: datetime,
    chats: KeptChats | None = None,
) -> DeploymentHistoryResponse:
    """``GET /deployments/{id}/history``: the last ``hours`` before ``now`` of the deployment's
    serving records (``keeper.model.history.summarize``), times as ISO-8601 UTC; each incident
    with the chats that ended during it (``keeper.model.incident_chats``) when the service keeps
    them (``chats``: its front door's, in memory only)."""
    existing_deployment(state.deployments, deployment_id)
    end = now.timestamp()
    history = summarize(
        deployment_id,
        state.serving_history.get(deployment_id, ()),
        window_start=end - hours * 3600.0,
        window_end=end,
    )
    annotated = (
        incident_chats(history.incidents, chats)
        if chats is not None
        else [None] * len(history.incidents)
    )
    return DeploymentHistoryResponse(
        deployment_id=deployment_id,
        window_hours=hours,
        availability=history.availability,
        incidents=[
            IncidentView(
                start=_iso(incident.start),
                end=_iso(incident.end) if incident.end is not None else None,
                downtime_s=round(incident.downtime_s, 3),
                cause=incident.cause,
                phases=incident.phases,
                problem=incident.problem,
                chats=annotation,
            )
            for incident, annotation in zip(history.incidents, annotated, strict=True)
        ],
        mttr_s=round(history.mttr_s, 3) if history.mttr_s is not None else None,
        complete_from=_iso(history.complete_from) if history.complete_from is not None else None,
    )


def _iso(seconds: float) -> str:
    return iso_utc(datetime.fromtimestamp(seconds, UTC))


def existing_deployment(deployments: Mapping[str, Deployment], deployment_id: str) -> Deployment:
    deployment = deployments.get(deployment_id)
    if deployment is None:
        raise NotFoundError(f"Deployment {shown(deployment_id)} not found", param="deployment_id")
    return deployment


def scale_events(
    keeper: KeeperLike, deployment_id: str, replicas: int, state: State
) -> list[AnyEvent]:
    """The keeper's events for scaling the deployment; a count it refuses is a 400."""
    try:
        return keeper.scale(deployment_id, replicas, state)
    except ValueError as exc:
        raise BadRequestError(str(exc), param="replicas") from None


def standby_events(deployment: Deployment, standby: int) -> list[AnyEvent]:
    """The event that sets the deployment's standby count; none when it already is."""
    if standby == deployment.standby:
        return []
    return [DeploymentStandbyChanged(deployment_id=deployment.deployment_id, standby=standby)]


def standby_response(
    deployment: Deployment, standby: int, new_id: IdFactory = new_id
) -> CommandResponse:
    model_id = deployment.model_card.model_id
    message = (
        f"Deployment of {model_id} already keeps {standby} standby set(s)"
        if standby == deployment.standby
        else f"Deployment of {model_id} keeps {standby} standby set(s), was {deployment.standby}"
    )
    return CommandResponse(
        message=message, command_id=new_id(), deployment_id=deployment.deployment_id
    )


def priority_events(
    deployment: Deployment, priority: int | None, preempt: bool | None
) -> list[AnyEvent]:
    """The event that sets the deployment's priority and preempt flag (each as it is when not
    given); none when neither changes."""
    new_priority = deployment.priority if priority is None else priority
    new_preempt = deployment.preempt if preempt is None else preempt
    if (new_priority, new_preempt) == (deployment.priority, deployment.preempt):
        return []
    return [
        DeploymentPriorityChanged(
            deployment_id=deployment.deployment_id, priority=new_priority, preempt=new_preempt
        )
    ]


def repair_events(deployment: Deployment, repair: RepairMode) -> list[AnyEvent]:
    """The event that sets what the keeper does with a broken instance of the deployment
    (docs/design.md §5.19); none when it is so already."""
    if repair == deployment.repair:
        return []
    return [DeploymentRepairChanged(deployment_id=deployment.deployment_id, repair=repair)]


def repair_response(
    deployment: Deployment, repair: RepairMode, new_id: IdFactory = new_id
) -> CommandResponse:
    """The answer to setting ``deployment`` (as it was) to ``repair``."""
    model_id = deployment.model_card.model_id
    message = (
        f"Deployment of {model_id} already has repair {repair}"
        if repair == deployment.repair
        else f"Deployment of {model_id} now has repair {repair}, was {deployment.repair}"
    )
    return CommandResponse(
        message=message, command_id=new_id(), deployment_id=deployment.deployment_id
    )


def repaired_response(
    keeper: KeeperLike, instance_id: str, state: State, new_id: IdFactory = new_id
) -> CommandResponse:
    """Ask the keeper to replace ``instance_id`` now (``exo-deploy repair ID``): the operator
    said so, whatever its deployment's ``repair`` and whoever placed it. An unknown instance,
    or one of a model no deployment keeps, is a 404 naming it."""
    refused = (
        keeper.repair(instance_id, state)
        if isinstance(keeper, ReportsHealth)
        else ("this keeper does not repair instances")
    )
    if refused is not None:
        raise NotFoundError(refused, param="instance_id")
    return CommandResponse(
        message=f"Instance {instance_id} will be replaced, then deleted once its replacement "
        "is ready",
        command_id=new_id(),
        instance_id=instance_id,
    )


def options_events(
    deployment: Deployment,
    sharding: Sharding | None,
    instance_meta: InstanceMeta | None,
    min_nodes: int | None,
    state: State,
) -> list[AnyEvent]:
    """The rolling change to the options asked (each as it is when None): the event that sets
    them and names the instances placed with other options, judged on ``state``
    (docs/design.md §5.16); none when nothing changes. Options the model cannot take are a
    400 naming the field, as on create, and change nothing."""
    changed = deployment.model_copy(
        update={
            "sharding": deployment.sharding if sharding is None else sharding,
            "instance_meta": deployment.instance_meta if instance_meta is None else instance_meta,
            "min_nodes": deployment.min_nodes if min_nodes is None else min_nodes,
        }
    )
    problems = create_problems(
        deployment.model_card.model_id, deployment.model_card, changed.sharding, changed.min_nodes
    )
    if problems:
        raise UnprocessableError(problems[0].message, param=problems[0].field)
    if options_words(changed) == options_words(deployment):
        return []
    return [
        DeploymentOptionsChanged(
            deployment_id=deployment.deployment_id,
            sharding=changed.sharding,
            instance_meta=changed.instance_meta,
            min_nodes=changed.min_nodes,
            replace=outdated_instances(state, changed),
        )
    ]


def options_response(
    deployment: Deployment, events: Sequence[AnyEvent], new_id: IdFactory = new_id
) -> CommandResponse:
    """The answer to a change of ``deployment``'s (as it was) options: what it changed to and
    how many instances it replaces, one at a time."""
    model_id = deployment.model_card.model_id
    change = next((e for e in events if isinstance(e, DeploymentOptionsChanged)), None)
    if change is None:
        message = f"Deployment of {model_id} already has {options_words(deployment)}"
    else:
        after = deployment.model_copy(
            update={
                "sharding": change.sharding,
                "instance_meta": change.instance_meta,
                "min_nodes": change.min_nodes,
            }
        )
        count = len(change.replace)
        replaced = (
            f"replacing {count} instance(s), one at a time" if count else "no instance to replace"
        )
        message = (
            f"Deployment of {model_id} now has {options_words(after)}, "
            f"was {options_words(deployment)}: {replaced}"
        )
    return CommandResponse(
        message=message, command_id=new_id(), deployment_id=deployment.deployment_id
    )


def _ranking(priority: int, preempt: bool) -> str:
    return f"priority {priority}, {'preempting' if preempt else 'not preempting'}"


def priority_response(
    deployment: Deployment,
    priority: int | None,
    preempt: bool | None,
    new_id: IdFactory = new_id,
) -> CommandResponse:
    """The answer to setting ``deployment`` (as it was) to ``priority`` and ``preempt`` (each
    unchanged when None); the same settings again are said to change nothing."""
    model_id = deployment.model_card.model_id
    was = _ranking(deployment.priority, deployment.preempt)
    now = _ranking(
        deployment.priority if priority is None else priority,
        deployment.preempt if preempt is None else preempt,
    )
    message = (
        f"Deployment of {model_id} already has {now}"
        if now == was
        else f"Deployment of {model_id} now has {now}, was {was}"
    )
    return CommandResponse(
        message=message, command_id=new_id(), deployment_id=deployment.deployment_id
    )


def staged_copies(deployment: Deployment, state: State) -> list[StagedCopyView]:
    """Each copy the deployment staged, read from the node's download entry."""
    model_id = deployment.model_card.model_id
    copies: list[StagedCopyView] = []
    for node_id in deployment.staged_on:
        entry = download_entry(state, node_id, model_id)
        match entry:
            case DownloadCompleted():
                copies.append(StagedCopyView(node_id=node_id, state="completed", fraction=1.0))
            case DownloadOngoing():
                done = float(download_fraction([entry], model_id))
                copies.append(StagedCopyView(node_id=node_id, state="downloading", fraction=done))
            case DownloadPending():
                copies.append(StagedCopyView(node_id=node_id, state="pending"))
            case DownloadFailed(error_message=error):
                copies.append(StagedCopyView(node_id=node_id, state="failed", error=error))
            case None:
                copies.append(StagedCopyView(node_id=node_id, state="missing"))
    return copies


def staging_summary(deployment: Deployment, state: State, note: str | None) -> str | None:
    """The staging in words: the keeper's note when it planned fewer sets than asked for, else
    how many of the planned copies are on disk."""
    if deployment.standby == 0:
        return None
    if note is not None:
        return note
    model_id = deployment.model_card.model_id
    held = {
        node_id
        for node_id in state.topology.nodes
        if isinstance(download_entry(state, node_id, model_id), DownloadCompleted)
    }
    serving = {
        node_id
        for instance in state.instances.values()
        if instance.shard_assignments.model_id == model_id
        for node_id in instance.shard_assignments.node_to_runner
    }
    # Every copy exo's State shows counts, whoever fetched it (an operator, exo's dashboard, an
    # earlier instance): a failover lands on any of them without a download (§5.12).
    spare = len(held - serving)
    done = sum(1 for node_id in deployment.staged_on if node_id in held)
    asked = len(deployment.staged_on)
    nodes = "node" if spare == 1 else "nodes"
    return (
        f"standby {deployment.standby}: on disk on {spare} {nodes} besides those serving; "
        f"{done} of {asked} copies the keeper asked for staged"
    )


def created_response(deployment: Deployment, new_id: IdFactory = new_id) -> CommandResponse:
    return CommandResponse(
        message=f"Deployment of {deployment.model_card.model_id} created",
        command_id=new_id(),
        deployment_id=deployment.deployment_id,
    )


def deleted_response(deployment: Deployment, new_id: IdFactory = new_id) -> CommandResponse:
    return CommandResponse(
        message=f"Deployment of {deployment.model_card.model_id} deleted",
        command_id=new_id(),
        deployment_id=deployment.deployment_id,
    )


def scaled_response(
    deployment: Deployment, replicas: int, new_id: IdFactory = new_id
) -> CommandResponse:
    """The answer to scaling ``deployment`` (as it was) to ``replicas``; the same count again
    is said to change nothing."""
    model_id = deployment.model_card.model_id
    message = (
        f"Deployment of {model_id} already keeps {replicas} replica(s)"
        if replicas == deployment.replicas
        else f"Deployment of {model_id} scaled from {deployment.replicas} to {replicas} replica(s)"
    )
    return CommandResponse(
        message=message, command_id=new_id(), deployment_id=deployment.deployment_id
    )


def _deployment_view(
    deployment: Deployment,
    state: State,
    timer: DeploymentTimer | None,
    now: float,
    wall: datetime | None,
    *,
    detail: str | None = None,
    note: str | None = None,
    update_note: str | None = None,
    failover_note: str | None = None,
    health: Verdict | None = None,
) -> DeploymentView:
    """``deployment`` as ``GET /deployments`` shows it: its status in ``state`` and the keeper's
    timer for it (``now`` on the keeper's monotonic clock, ``wall`` the same moment in UTC)."""
    next_at = timer.next_attempt_at if timer is not None else None
    return DeploymentView(
        deployment=deployment,
        status=deployment_status(deployment, state),
        replicas=deployment.replicas,
        ready_replicas=ready_replicas(deployment, state),
        staged=staged_copies(deployment, state),
        staging=staging_summary(deployment, state, note),
        failures=timer.failures if timer is not None else 0,
        next_attempt_at=(
            iso_utc(wall + timedelta(seconds=next_at - now))
            if next_at is not None and wall is not None
            else None
        ),
        next_attempt_in_s=round(max(0.0, next_at - now), 3) if next_at is not None else None,
        waiting=timer.waiting if timer is not None else None,
        detail=detail,
        updating=_update_view(deployment, update_note),
        at_risk=deployment_at_risk(deployment, state),
        failover=_failover_view(deployment, state, failover_note),
        health=_health_view(health, now, wall),
    )


def _failover_view(deployment: Deployment, state: State, note: str | None) -> FailoverView | None:
    picture = failover_picture(deployment, state)
    if picture is None:
        return None
    return FailoverView(
        phase=picture.phase,
        nodes=[node_name(state, n) for n in picture.nodes],
        since=iso_utc(datetime.fromtimestamp(picture.since, UTC)),
        why=note if picture.phase == "suspect" else None,
    )


def _health_view(health: Verdict | None, now: float, wall: datetime | None) -> HealthView | None:
    """A verdict as the API says it: ``since`` from the keeper's clock to UTC."""
    if health is None:
        return None
    since = iso_utc(wall + timedelta(seconds=health.since - now)) if wall is not None else ""
    return HealthView(
        instance=health.instance_id, problem=health.problem, why=health.why, since=since
    )


def _update_view(deployment: Deployment, note: str | None) -> UpdateView | None:
    progress = update_progress(deployment)
    if progress is None:
        return None
    replaced, replicas = progress
    return UpdateView(replaced=replaced, replicas=replicas, note=note)


def deployment_views(
    state: State,
    keeper: KeeperLike | None,
    clock: Clock | None,
    detail: Callable[[str], str | None] | None = None,
) -> list[DeploymentView]:
    """Every deployment of ``state`` as ``GET /deployments`` shows it, in id order, with the
    keeper's timers once it runs; ``detail`` says more of a deployment, in words, by its id."""
    timers: dict[str, DeploymentTimer] = {}
    now = 0.0
    if keeper is not None and clock is not None:
        now = clock.monotonic()
        timers = keeper.timers(state, now)
    wall = clock.wall() if clock is not None else None
    health: Mapping[str, Verdict] = (
        keeper.health(state) if isinstance(keeper, ReportsHealth) else {}
    )
    return [
        _deployment_view(
            state.deployments[deployment_id],
            state,
            timers.get(deployment_id),
            now,
            wall,
            detail=detail(deployment_id) if detail is not None else None,
            note=keeper.staging_note(deployment_id) if isinstance(keeper, ReportsStaging) else None,
            update_note=(
                keeper.update_note(deployment_id) if isinstance(keeper, ReportsUpdates) else None
            ),
            failover_note=(
                keeper.failover_note(deployment_id)
                if isinstance(keeper, ReportsFailovers)
                else None
            ),
            health=health.get(deployment_id),
        )
        for deployment_id in sorted(state.deployments)
    ]
