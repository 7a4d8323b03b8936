"""A deployment's recovery history: availability, incidents and why (docs/design.md, 3.5
"Deployment history").

Two pure parts, both in the data model so that the master, the bridge and the TUI share them:

- ``serving_changes(before, after, at)``: the service hands it the State before and after what
  it just applied (the master: a logged batch; the bridge: a new State of exo) and its wall
  time; it returns a ``DeploymentServingChanged`` for each deployment whose serving changed,
  with the cause read from the difference ("node studio timed out", "instance deleted by a
  user", "runner failed on mini-a: <message>", "exo's master changed (its State started
  empty)", ``keeper.model.master_change``; "unplaceable: <placement error>"). The service
  logs these like any event, so the records (``State.serving_history``) survive restarts and
  compaction in the snapshot, and reach the dashboard on its stream.
- ``summarize(deployment_id, records, window_start, window_end)``: availability, incidents and
  MTTR over a window, from the records alone. The records are few (one per change), so a
  request costs microseconds whatever the cluster did meanwhile.

Serving means what ``GET /deployments`` means by it (``keeper.model.readiness``: an instance on a
node confirmed dead is not ready), with one addition: a node gone from the topology serves
nothing. A stop caused by lost nodes is dated from their last heartbeat, not from the verdict,
timeout or deletion that showed it (docs/design.md §5.18, "Honest clocks"), and the steps of the
recovery that follows are records too, so the record that ends an incident says where its down
time went (``RecoveryPhases``) and a restart mid-recovery loses none of it.

``deployment_history`` replays an event sequence through both parts: the tests write histories
as events, and the bench times a busy day that way.

Times are plain seconds (the Unix epoch in the shell, anything monotonic in a test): the data
model reads no clock and imports no date library (exo's ``lastSeen`` is read by
``keeper.model.notices.unix_seconds_of``, arithmetic spelled out).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlacementFailed,
    DeploymentRepairPlaced,
    DeploymentScaled,
    DeploymentServingChanged,
    InstanceCreated,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.master_change import MASTER_CHANGED, master_change_words, master_changed
from keeper.model.notices import unix_seconds_of
from keeper.model.readiness import instances_of, ready_on_present_nodes
from keeper.model.runner_failure import failure_words
from keeper.model.state import (
    PREEMPTED_BY,
    SERVING_RUNNER_TYPES,
    AnyInstance,
    Deployment,
    DeploymentId,
    DownloadCompleted,
    InstanceId,
    ModelId,
    NodeId,
    RecoveryPhases,
    RepairNote,
    RunnerFailed,
    ServingRecord,
    State,
    download_entry,
    node_name,
)

# Whatever else made an instance stop serving, with nothing in the State that says more.
UNKNOWN_CAUSE = "stopped serving"
UNPLACEABLE = "unplaceable: "


# --- records: what the services log ------------------------------------------------------


def may_change_serving(event: AnyEvent, before: State) -> bool:
    """Whether applying ``event`` to ``before`` can change whether a deployment serves or why
    not, or date a step of a recovery (a download completed). The master asks it of every
    logged event, so a batch of node reports and links does not cost a look at every
    deployment."""
    match event:
        case NodeGatheredInfo(node_id=node_id):
            return node_id not in before.topology.nodes  # a node (re)joining
        case NodeDownloadProgress(download_progress=entry):
            return isinstance(entry, DownloadCompleted)
        case (
            DeploymentCreated()
            | DeploymentPlacementFailed()
            | DeploymentRepairPlaced()
            | DeploymentScaled()
            | InstanceCreated()
            | InstanceDeleted()
            | RunnerStatusUpdated()
            | NodeTimedOut()
            | NodeConfirmedDead()
            | NodeHeardAgain()
        ):
            return True
        case _:
            return False


def serving_changes(
    before: State | None, after: State, at: float
) -> list[DeploymentServingChanged]:
    """The records to log for ``after``: one per deployment whose serving differs from its last
    record (or that has none yet), one when a deployment that is down learns from placement
    why, and one for each step of a recovery under way (``RecoveryStep``). ``before`` is the
    State the change was applied to, None when the service has none (it just started): causes
    are then unknown."""
    changes: list[DeploymentServingChanged] = []
    for deployment_id, deployment in after.deployments.items():
        # No history yet: () and None read alike where it is read (``not records``).
        records = after.serving_history.get(deployment_id, ())  # pragma: no mutate
        changes.extend(
            DeploymentServingChanged(deployment_id=deployment_id, record=record)
            for record in _next_records(before, after, deployment, records, at)
        )
    return changes


def _next_records(
    before: State | None,
    after: State,
    deployment: Deployment,
    records: tuple[ServingRecord, ...],
    at: float,
) -> list[ServingRecord]:
    """The records ``after`` adds to ``records`` (oldest first): a change of serving; while
    down, the diagnosis of the broken instance that stopped it and a step of the recovery;
    while serving, a failover's replacement covering for a suspect node, or the stop that
    covering hid, once the node is confirmed dead (``_covered_stop``)."""
    deployment_id = deployment.deployment_id
    serving = is_serving(after, deployment_id)
    if not records:
        created = before is not None and deployment_id not in before.deployments
        return [
            ServingRecord(
                at=at,
                serving=serving,
                cause=None if serving else _unplaceable(deployment),
                begins="created" if created else "observed",
            )
        ]
    last = records[-1]
    if last.serving and not serving:
        if before is None:
            return [ServingRecord(at=at, serving=False, cause=UNKNOWN_CAUSE)]
        return [_stopped(before, after, deployment_id, last, at)]
    if serving and not last.serving:
        return [ServingRecord(at=at, serving=True, phases=recovery_phases(records, at))]
    if serving:
        return _covering(before, after, deployment_id, records, at)
    if last.cause is None and deployment.placement_error is not None:
        return [ServingRecord(at=at, serving=False, cause=_unplaceable(deployment))]
    explained = _master_change_explains(before, after, records, at)
    if explained is not None:
        return [explained]
    diagnosis = _diagnosis(before, after, deployment, records, at)
    step = _recovery_step(before, after, deployment, records, at)
    if diagnosis is not None and step is not None:
        step = step.model_copy(update={"cause": diagnosis.cause})
    return [record for record in (diagnosis, step) if record is not None]


def is_serving(state: State, deployment_id: DeploymentId) -> bool:
    return bool(_serving_instances(state, deployment_id))


def serving_since(records: Sequence[ServingRecord]) -> float | None:
    """When the deployment's current stretch of serving began (its newest record, when that
    one says serving); None while it is not serving or has no record."""
    if not records or not records[-1].serving:
        return None
    return records[-1].at


def _serving_instances(state: State, deployment_id: DeploymentId) -> list[AnyInstance]:
    deployment = state.deployments.get(deployment_id)
    if deployment is None:
        return []
    return [
        instance
        for instance in instances_of(state, deployment.model_card.model_id)
        if ready_on_present_nodes(instance, state)
    ]


def _unplaceable(deployment: Deployment) -> str | None:
    error = deployment.placement_error
    return f"{UNPLACEABLE}{error}" if error is not None else None


# --- a stop, dated from the last heartbeat of the node that caused it -----------------------


def _stopped(
    before: State, after: State, deployment_id: DeploymentId, last: ServingRecord, at: float
) -> ServingRecord:
    """The record of a deployment that served in ``before`` and serves nothing in ``after``,
    seen at ``at``. When nodes made every serving instance stop (confirmed dead, or gone), the
    stop is dated from when the deployment really stopped: the last instance's lost node's last
    heartbeat (``stopped_at``); when exo's master changed, every instance stopped with the old
    master, and the stop is dated from its last heartbeat (``master_changed``). Never before
    ``last`` (records stay in order; a heartbeat older than the newest record, as when the
    deployment came up on a node already quiet, dates the stop at that record) nor after
    ``at``; ``noticed`` keeps ``at``."""
    served = _serving_instances(before, deployment_id)
    stopped = [stopped_at(before, after, instance, at) for instance in served] or [at]
    cause = _why_stopped(before, after, deployment_id)
    change = master_changed(before, after)
    if change is not None:
        # exo's master changed: everything stopped with the old master (docs/design.md 3.5).
        stopped = [change.last_heard if change.last_heard is not None else at]
        cause = master_change_words(change, before)
    start = min(at, max(last.at, *stopped))
    return ServingRecord(
        at=start,
        serving=False,
        cause=cause,
        noticed=at if start < at else None,
        instance_id=_under_way(before, after, deployment_id),
    )


def stopped_at(before: State, after: State, instance: AnyInstance, at: float) -> float:
    """When ``instance``, ready in ``before``, stopped serving: the earliest last heartbeat of
    its nodes that ``after`` shows confirmed dead or gone (``last_heard``), else ``at`` (a
    deletion, a runner failing: seen when it happened). A lost node whose heartbeat cannot be
    dated leaves ``at``."""
    heard = [
        last_heard(before, node_id, after)
        for node_id in instance.shard_assignments.node_to_runner
        if node_id not in after.topology.nodes or _is_dead(after, node_id)
    ]
    dated = [moment for moment in heard if moment is not None]
    return min(dated) if dated else at


def last_heard(before: State, node_id: NodeId, after: State) -> float | None:
    """The node's last heartbeat as the service saw it: the verdict's ``last_heard`` (in
    ``after``, else in ``before``: a timeout clears it), else the State's ``lastSeen`` of the
    node before it went (exo's own timeout, with no verdict), parsed; None if neither says."""
    for state in (after, before):
        verdict = state.node_watch.get(node_id)
        if verdict is not None:
            return verdict.last_heard
    return unix_seconds_of(before.last_seen.get(node_id))


def _is_dead(state: State, node_id: NodeId) -> bool:
    verdict = state.node_watch.get(node_id)
    return verdict is not None and verdict.phase == "dead"


def _why_stopped(before: State, after: State, deployment_id: DeploymentId) -> str:
    """Why the instances that served in ``before`` serve nothing in ``after``, in plain words;
    names come from ``before``, where a node that just left is still described."""
    for instance in _serving_instances(before, deployment_id):
        nodes = instance.shard_assignments.node_to_runner
        gone = [node for node in nodes if node not in after.topology.nodes]
        if gone:
            return f"node {', '.join(node_name(before, node) for node in gone)} timed out"
        dead = [node for node in nodes if _is_dead(after, node)]
        if dead:
            signs = sorted({after.node_watch[node].why for node in dead} - {""})
            why = f" ({'; '.join(signs)})" if signs else ""
            return f"node {', '.join(node_name(before, node) for node in dead)} confirmed dead{why}"
        if instance.instance_id not in after.instances:
            return _deleted_by(after, deployment_id)
        statuses = [(node, after.runners.get(runner)) for node, runner in nodes.items()]
        for node, status in statuses:
            if isinstance(status, RunnerFailed):
                # The error's own line, not exo's whole traceback (docs/design.md §5.19).
                return f"runner failed on {node_name(before, node)}: {failure_words(status)}"
        for node, status in statuses:
            if not isinstance(status, SERVING_RUNNER_TYPES):
                went = type(status).__name__ if status is not None else "away"
                return f"runner on {node_name(before, node)} went {went}"
    return UNKNOWN_CAUSE


def _deleted_by(after: State, deployment_id: DeploymentId) -> str:
    """Who deleted a serving instance whose nodes are still there: the keeper, to make room for
    a higher priority, when the deployment says it was preempted (docs/design.md §5.13, it is
    told before its instance goes); else a user."""
    error = after.deployments[deployment_id].placement_error  # it serves in ``before``: it exists
    if error is not None and error.startswith(PREEMPTED_BY):
        return error
    return "instance deleted by a user"


# --- a single replica's failover: the stop its make-before-break replacement hid -------------


def _covering(
    before: State | None,
    after: State,
    deployment_id: DeploymentId,
    records: tuple[ServingRecord, ...],
    at: float,
) -> list[ServingRecord]:
    """While the deployment serves: the "covered" record when a replacement is ready and every
    instance that served in ``before`` was on a suspect node (``_covered``); and once such a
    node is confirmed dead or gone, the stop that covering hid, dated back to the node's last
    heartbeat (``_covered_stop``). A node heard again leaves the "covered" record alone: it
    changes nothing about serving, and no incident is written (docs/design.md 3.5)."""
    if before is None:
        return []
    last = records[-1]
    if last.step == "covered":
        stop = _covered_stop(before, after, deployment_id, records)
        return [stop] if stop is not None else []
    covered = _covered(before, after, deployment_id, last, at)
    return [covered] if covered is not None else []


def _suspect_nodes(state: State, instance: AnyInstance) -> list[NodeId]:
    return [
        node
        for node in instance.shard_assignments.node_to_runner
        if (verdict := state.node_watch.get(node)) is not None and verdict.phase == "suspect"
    ]


def _covered(
    before: State, after: State, deployment_id: DeploymentId, last: ServingRecord, at: float
) -> ServingRecord | None:
    """The record of a replacement ready at ``at`` while every instance that served in
    ``before`` had a suspect node: the phases of the incident it would end, should a node be
    confirmed dead — from the last heartbeat (of the last instance to go quiet, never before
    ``last``) to the suspicion, to the failover's placement, to now — so the stop written on
    confirmation needs nothing the State will no longer hold."""
    served = _serving_instances(before, deployment_id)
    quiet = [(instance, _suspect_nodes(before, instance)) for instance in served]
    if not served or any(not nodes for _, nodes in quiet):
        return None  # something served with no suspect node: no stop to hide
    served_ids = {instance.instance_id for instance in served}
    trusted = [
        instance
        for instance in _serving_instances(after, deployment_id)
        if not _suspect_nodes(after, instance) and instance.instance_id not in served_ids
    ]
    if not trusted:
        return None
    heard: list[float] = []
    suspected: list[float] = []
    for _, nodes in quiet:
        first = min(nodes, key=lambda node: before.node_watch[node].last_heard)
        heard.append(before.node_watch[first].last_heard)
        suspected.append(before.node_watch[first].since)
    start = min(at, max(last.at, *heard))
    noticed = min(at, max(start, *suspected))
    placed_at = after.deployments[deployment_id].failover_since  # it serves: it exists
    placed = min(at, max(noticed, placed_at if placed_at is not None else noticed))
    return ServingRecord(
        at=at,
        serving=True,
        step="covered",
        instance_id=trusted[0].instance_id,
        phases=RecoveryPhases(
            detected=round(noticed - start, 3),
            placed=round(placed - noticed, 3),
            downloaded=0.0,  # a failover goes to a node that holds the model first (§5.18)
            loaded=round(at - placed, 3),
        ),
    )


def _covered_stop(
    before: State, after: State, deployment_id: DeploymentId, records: tuple[ServingRecord, ...]
) -> ServingRecord | None:
    """The stop a "covered" record hid, once ``after`` shows a node of an instance that served
    in ``before`` newly confirmed dead or gone: dated back by the covered record's phases (they
    add up to the down time), written once (the record before the covered one then is it)."""
    covered = records[-1]
    phases = covered.phases
    if phases is None or (len(records) > 1 and not records[-2].serving):
        return None
    # Newly lost: an instance serving in ``before`` has no node confirmed dead there (one on a
    # dead node is not ready, docs/design.md 3.4), so a node dead in ``after`` just died.
    lost = [
        node
        for instance in _serving_instances(before, deployment_id)
        for node in instance.shard_assignments.node_to_runner
        if _is_dead(after, node)
        or (node in before.topology.nodes and node not in after.topology.nodes)
    ]
    if not lost:
        return None
    down_s = phases.detected + phases.placed + phases.downloaded + phases.loaded
    before_covered = records[-2].at if len(records) > 1 else -math.inf
    start = max(before_covered, round(covered.at - down_s, 3))
    return ServingRecord(
        at=start,
        serving=False,
        cause=_why_stopped(before, after, deployment_id),
        noticed=round(start + phases.detected, 3) if phases.detected > 0 else None,
        instance_id=covered.instance_id,
    )


# --- the steps of a recovery, and its phases ------------------------------------------------


def _under_way(before: State, after: State, deployment_id: DeploymentId) -> InstanceId | None:
    """A replacement already under way when the deployment stops (placed while its node was
    only suspect, make-before-break): the first instance of the model in ``after`` that did not
    serve in ``before`` and has no node lost (dead, or gone); None if there is none."""
    served = {i.instance_id for i in _serving_instances(before, deployment_id)}
    model_id = after.deployments[deployment_id].model_card.model_id  # it is in ``after``
    for instance in instances_of(after, model_id):
        nodes = instance.shard_assignments.node_to_runner
        lost = any(node not in after.topology.nodes or _is_dead(after, node) for node in nodes)
        if instance.instance_id not in served and not lost:
            return instance.instance_id
    return None


def _recovery_step(
    before: State | None,
    after: State,
    deployment: Deployment,
    records: tuple[ServingRecord, ...],
    at: float,
) -> ServingRecord | None:
    """The record of a step of the recovery under way that ``after`` shows, if any: the first
    replacement placed (an instance of the model new since ``before``), then its download done
    (each of its nodes holds the model completely in ``after``, not in ``before``). Only in an
    incident (the deployment served before it stopped), once each: a placement retried after
    the first replacement failed, or one already on disk, adds no step."""
    if before is None or (
        before.instances is after.instances and before.downloads is after.downloads
    ):
        return None  # nothing to compare, or nothing a step is made of changed (States share)
    stretch = down_stretch(records)
    if stretch is None:
        return None
    last = records[-1]
    model_id = deployment.model_card.model_id
    placed = next((r.instance_id for r in stretch if r.instance_id is not None), None)
    if placed is None:
        new = [i for i in instances_of(after, model_id) if i.instance_id not in before.instances]
        if not new:
            return None
        return ServingRecord(
            at=at, serving=False, cause=last.cause, step="placed", instance_id=new[0].instance_id
        )
    if any(record.step == "downloaded" for record in stretch):
        return None
    if _downloaded(after, placed, model_id) and not _downloaded(before, placed, model_id):
        return ServingRecord(at=at, serving=False, cause=last.cause, step="downloaded")
    return None


def _diagnosis(
    before: State | None,
    after: State,
    deployment: Deployment,
    records: tuple[ServingRecord, ...],
    at: float,
) -> ServingRecord | None:
    """The record naming the broken instance that stopped the deployment, when ``after`` shows a
    repair newly placed for it (``State.repair_notes``, docs/design.md §5.19) during an
    incident: ``instance 1a2b3c4d hollow on mini-b: <why>``, with the problem kind. Not for a
    replacement of this incident that broke in turn (the stretch names it): the incident's cause
    is what stopped it, not what kept it down."""
    note = after.repair_notes.get(deployment.deployment_id)
    stretch = down_stretch(records)
    if before is None or note is None or stretch is None:
        return None
    if before.repair_notes.get(deployment.deployment_id) == note:
        return None
    if any(record.instance_id == note.instance_id for record in stretch):
        return None
    return ServingRecord(
        at=at,
        serving=False,
        cause=broken_instance_cause(before, after, note),
        step="diagnosed",
        problem=note.problem,
    )


def _master_change_explains(
    before: State | None, after: State, records: tuple[ServingRecord, ...], at: float
) -> ServingRecord | None:
    """The record saying exo's master changed, when it changes during an incident whose stop
    named something else: exo's master killed with the deployment's instance on it is first a
    node confirmed dead (its API refuses at once), and exo elects another master seconds later,
    whose State starts empty; the incident's cause then says both (docs/design.md §3.5).
    Once an incident."""
    stretch = down_stretch(records)
    if before is None or stretch is None:
        return None
    change = master_changed(before, after)
    if change is None or any(record.step == "explained" for record in stretch):
        return None
    first = stretch[0].cause
    if first is None or first.startswith(MASTER_CHANGED[:-1]):
        return None  # the stop was the master change itself
    cause = f"{first}; then {master_change_words(change, before)}"
    return ServingRecord(at=at, serving=False, cause=cause, step="explained")


def broken_instance_cause(before: State, after: State, note: RepairNote) -> str:
    """``instance <id8> <problem> on <nodes>: <why>``: the nodes from whichever State still holds
    the instance (a hollow one is often deleted as its repair is placed), left out if neither."""
    instance = before.instances.get(note.instance_id) or after.instances.get(note.instance_id)
    nodes = instance.shard_assignments.node_to_runner if instance is not None else {}
    where = f" on {', '.join(node_name(before, node) for node in nodes)}" if nodes else ""
    # An id's first 8 characters, as every table shows instances.
    return f"instance {note.instance_id[:8]} {note.problem}{where}: {note.why}"


def _downloaded(state: State, instance_id: InstanceId, model_id: ModelId) -> bool:
    """Every node of the instance holds the model completely (it exists in ``state``)."""
    instance = state.instances.get(instance_id)
    return instance is not None and all(
        isinstance(download_entry(state, node_id, model_id), DownloadCompleted)
        for node_id in instance.shard_assignments.node_to_runner
    )


def down_stretch(records: Sequence[ServingRecord]) -> Sequence[ServingRecord] | None:
    """The records after the newest that says serving, when the deployment is down after having
    served (an incident under way; its stop first); None otherwise."""
    for index in range(len(records) - 1, -1, -1):
        if records[index].serving:
            return records[index + 1 :] or None
    return None


def recovery_phases(records: Sequence[ServingRecord], at: float) -> RecoveryPhases | None:
    """Where the down time of the incident that ``records`` end with went, it serving again at
    ``at``: from its stop (``at`` of the stop, the last heartbeat for a node) to ``noticed``
    (detected), to the replacement's placement (placed; 0 when one was under way already, or
    it came back with none), to that replacement's download done (downloaded; 0 with no such
    step), to ``at`` (loaded), in seconds to the millisecond. Each phase is taken from the end
    of the one before it, so they add up to the down time; None outside an incident (a first
    start-up)."""
    stretch = down_stretch(records)
    if stretch is None:
        return None
    stop = stretch[0]
    # Detected when the service saw it (a node's stop, dated back), else when a broken instance
    # was recognised (its diagnosis), else at once.
    diagnosed = next((r.at for r in stretch if r.step == "diagnosed"), stop.at)
    noticed = stop.noticed if stop.noticed is not None else diagnosed
    placed = next((r.at for r in stretch if r.step == "placed"), noticed)
    downloaded = next((r.at for r in stretch if r.step == "downloaded"), placed)
    moments: list[float] = [stop.at]
    for moment in (noticed, placed, downloaded, at):
        moments.append(max(moments[-1], moment))
    # To the millisecond, as every duration the API gives: a month of records is in every
    # snapshot, and a float's seventeen digits would be most of a record.
    detected_s, placed_s, downloaded_s, loaded_s = (
        round(moments[index + 1] - moments[index], 3) for index in range(4)
    )
    return RecoveryPhases(
        detected=detected_s, placed=placed_s, downloaded=downloaded_s, loaded=loaded_s
    )


# --- the summary: what GET /deployments/{id}/history answers ------------------------------


@dataclass(frozen=True)
class Incident:
    start: float
    end: float | None  # None while ongoing at the end of the window
    downtime_s: float
    cause: str
    phases: RecoveryPhases | None = None  # where the down time went, once it ended (a recovery)
    problem: str | None = None  # a broken instance's problem, when one caused it (§5.19)


@dataclass(frozen=True)
class History:
    deployment_id: DeploymentId
    window_start: float
    window_end: float
    availability: float | None  # None: no record of the deployment inside the window
    incidents: tuple[Incident, ...]
    mttr_s: float | None  # mean time to recover over the incidents that ended; None if none
    complete_from: float | None  # set when what is known starts later than the window


@dataclass
class _Down:
    start: float
    cause: str | None
    after_serving: bool
    in_window_s: float = 0.0  # how much of it lies inside the window
    problem: str | None = None

    def is_incident(self) -> bool:
        # The first start-up is no incident, unless placement said why it could not start.
        return self.after_serving or (self.cause is not None and self.cause.startswith(UNPLACEABLE))


def summarize(
    deployment_id: DeploymentId,
    records: Sequence[ServingRecord],
    *,
    window_start: float,
    window_end: float,
) -> History:
    """Availability, incidents and MTTR of a deployment over ``[window_start, window_end]`` from
    its serving records (oldest first; those after the window are ignored).

    - ``availability``: the fraction of the window that it served, out of the time it served
      and the time of its incidents: a start-up is no outage, so a deployment is measured from
      when it first served (or from its creation when placement said why it could not start);
      None until then.
    - ``incidents``: each stretch in which it was not serving after having served, or that
      placement explained; one that began before the window keeps its real start, and its
      ``downtime_s`` is its whole length (to the window's end while ongoing).
    - ``complete_from``: the first record's time, when it is later than the window's start and
      is not the deployment's creation (what came before it is unknown)."""
    known = [record for record in records if record.at <= window_end]
    known_s = 0.0
    served_s = 0.0
    down: _Down | None = None
    incidents: list[Incident] = []

    def close(stretch: _Down, end: float | None, phases: RecoveryPhases | None = None) -> None:
        nonlocal known_s
        stop = end if end is not None else window_end
        if stretch.is_incident():
            known_s += stretch.in_window_s
        if stretch.is_incident() and stop > window_start:
            incidents.append(
                Incident(
                    start=stretch.start,
                    end=end,
                    downtime_s=stop - stretch.start,
                    cause=stretch.cause or UNKNOWN_CAUSE,
                    phases=phases,
                    problem=stretch.problem,
                )
            )

    for index, record in enumerate(known):
        until = known[index + 1].at if index + 1 < len(known) else window_end
        span = max(0.0, min(until, window_end) - max(record.at, window_start))
        if record.serving:
            known_s += span
            served_s += span
            if down is not None:
                close(down, record.at, record.phases)
                down = None
            continue
        if down is None:
            down = _Down(record.at, record.cause, after_serving=index > 0)
        elif record.step == "explained":
            down.cause = record.cause  # the stop's own words, with the master change after
        elif record.step == "diagnosed" and down.problem is None:
            # The broken instance recognised names the cause better than the runner seen going.
            down.cause, down.problem = record.cause, record.problem
        elif down.cause is None:
            down.cause = record.cause
        down.in_window_s += span
    if down is not None:
        close(down, None)

    ended = [incident.downtime_s for incident in incidents if incident.end is not None]
    first = known[0] if known else None
    incomplete = first is not None and first.begins != "created" and first.at > window_start
    return History(
        deployment_id=deployment_id,
        window_start=window_start,
        window_end=window_end,
        availability=served_s / known_s if known_s > 0 else None,
        incidents=tuple(incidents),
        mttr_s=sum(ended) / len(ended) if ended else None,
        complete_from=first.at if incomplete and first is not None else None,
    )


# --- a replay, for tests and the bench ----------------------------------------------------


@dataclass(frozen=True)
class TimedEvent:
    """An event of a log with its index and the time it was applied (None: unknown)."""

    idx: int
    at: float | None
    event: AnyEvent


def replay(events: Iterable[TimedEvent], initial: State | None = None) -> State:
    """Apply ``events`` as a service would, logging the serving records it would log after each
    one. An event without a time takes the last known time before it."""
    state = initial if initial is not None else State()
    now = -math.inf
    # The first look also records the deployments ``initial`` holds. Looking at every event
    # would give the same records, only slower: no test can tell, hence no mutation.
    first = True  # pragma: no mutate
    for timed in events:
        now = timed.at if timed.at is not None else now
        before, state = state, apply(state, timed.event)
        if first or may_change_serving(timed.event, before):
            for change in serving_changes(before, state, now):
                state = apply(state, change)
        first = False  # pragma: no mutate
    return state


def deployment_history(
    deployment_id: DeploymentId,
    events: Iterable[TimedEvent],
    *,
    window_start: float,
    window_end: float,
    initial: State | None = None,
) -> History:
    """``summarize`` over the records a service would have logged replaying ``events``."""
    records: Mapping[DeploymentId, tuple[ServingRecord, ...]] = replay(
        events, initial
    ).serving_history
    return summarize(
        deployment_id,
        records.get(deployment_id, ()),
        window_start=window_start,
        window_end=window_end,
    )
