"""Which alert notices a change of the cluster produces (docs/design.md, "Alert webhooks").

A pure function of what the service saw before and what it sees now (``Observed``: the State it
steps the keeper on, and the keeper's notes on stuck drains), and of a small ``AlertMemory``
that it hands back changed. The master and the bridge call it at the one place both see the
State they act on, right after each keeper step (``keeper.runtime.hosted_keeper``): the master's
whole State, the bridge's exo State with its own deployments merged in. Nothing here reads a
clock: the times in a notice come from the State (serving records, a drain's start); only ``at``,
when the service saw the change, is given by the caller, as ``serving_changes`` is given its.

The rules, each reusing the one that already says it:

- incidents are ``keeper.model.history``'s, from the serving records: an incident that the
  records of ``after`` hold and those of ``before`` do not is opened; one that has ended in
  ``after`` and had not in ``before`` is resolved (both, when it came and went between two
  looks). Keyed by its start, which a record fixes, so its ids are the same on every look;
- ``cant_place`` is ``keeper.model.readiness``'s status: announced when a deployment takes it,
  once until it serves again (a deployment that is tried again flips between ``placing`` and
  ``cant_place``; one notice says it), and ``serving_again`` when an announced one serves. That
  "announced, not serving since" is the memory;
- a drain finished when it leaves the State with its node still cordoned (what
  ``NodeDrainEnded`` does; an uncordon ends a drain too, but lifts the cordon), stuck when the
  keeper starts giving a reason it cannot move an instance (``keeper.core.draining.stuck_note``).

The memory also holds, per deployment, the time of the last serving record looked at, so that a
service that restarts (with its memory from disk) still notices the incidents recorded in the
moment before it stopped: ``first_look`` treats records after that time as new.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from keeper.model.history import Incident, summarize
from keeper.model.notices import (
    AnyNotice,
    CantPlace,
    DrainFinished,
    DrainStuck,
    IncidentOpened,
    IncidentResolved,
    InstanceUnhealthy,
    ServingAgain,
    clock_utc_of,
    duration_words,
    iso_utc_of,
    phases_words,
)
from keeper.model.readiness import deployment_statuses
from keeper.model.state import Deployment, DeploymentId, ServingRecord, State

# Every notice's text starts with this, so a shared channel says where it came from.
TEXT_PREFIX = "exo-deploy: "


@dataclass(frozen=True)
class Observed:
    """What a service sees at one look: the State it steps the keeper on, and why each drain
    cannot move an instance, by node (the keeper's ``drain_note``; only the stuck ones)."""

    state: State
    drain_notes: Mapping[str, str] = field(default_factory=dict[str, str])
    # Per deployment, its broken instance (docs/design.md §5.19): (instance, problem, why).
    unhealthy: Mapping[DeploymentId, tuple[str, str, str]] = field(
        default_factory=dict[DeploymentId, tuple[str, str, str]]
    )


@dataclass(frozen=True)
class AlertMemory:
    """What the notices so far leave to remember: the deployments announced ``cant_place`` that
    have not served since, and per deployment the time of the newest serving record looked at."""

    cant_place: frozenset[DeploymentId] = frozenset()
    records_seen_until: Mapping[DeploymentId, float] = field(
        default_factory=dict[DeploymentId, float]
    )


def first_look(after: Observed, memory: AlertMemory | None) -> Observed:
    """The ``before`` of a service's first look (it just started): what ``after`` shows, less
    the serving records newer than ``memory`` says were looked at (they came in the moment before
    the last stop, and no notice said them yet), and without stuck drains (the keeper is new). A
    deployment the memory does not know is taken as looked at."""
    seen: Mapping[DeploymentId, float] = memory.records_seen_until if memory is not None else {}
    history = dict(after.state.serving_history)
    for deployment_id, until in seen.items():
        records = history.get(deployment_id)
        if records is not None:
            history[deployment_id] = tuple(r for r in records if r.at <= until)
    return Observed(after.state.model_copy(update={"serving_history": history}))


def first_memory(after: Observed, memory: AlertMemory | None) -> AlertMemory:
    """The memory to start from: the one kept (if any), and every deployment ``cant_place`` now
    counted as announced (said before the stop, or unknowable: it serves again is then said)."""
    kept = memory if memory is not None else AlertMemory()
    statuses = deployment_statuses(after.state)
    cant = {d for d, status in statuses.items() if status == "cant_place"}
    return AlertMemory(
        cant_place=frozenset((kept.cant_place & set(statuses)) | cant),
        records_seen_until=_records_seen(after.state),
    )


def notices(
    before: Observed, after: Observed, at: float, memory: AlertMemory
) -> tuple[list[AnyNotice], AlertMemory]:
    """The notices that going from ``before`` to ``after`` calls for, seen at ``at`` (Unix
    seconds), and the memory after them."""
    if (
        before.state is after.state
        and before.drain_notes == after.drain_notes
        and before.unhealthy == after.unhealthy
    ):
        return [], memory
    seen_at = iso_utc_of(at)
    status_notices, cant_place = _status_notices(before.state, after.state, seen_at, memory)
    found = [
        *_incident_notices(before.state, after.state, seen_at),
        *status_notices,
        *_drain_notices(before, after, seen_at),
        *_health_notices(before, after, seen_at),
    ]
    return found, AlertMemory(cant_place=cant_place, records_seen_until=_records_seen(after.state))


# --- incidents ------------------------------------------------------------------------------


def incidents_of(records: tuple[ServingRecord, ...] | None) -> list[Incident]:
    """Every incident of a deployment's records (``keeper.model.history.summarize``, over all of
    them); none for no records."""
    if not records:
        return []
    summary = summarize(
        "",  # pragma: no mutate (the deployment id only labels a summary; not read here)
        records,
        window_start=-math.inf,
        window_end=records[-1].at,
    )
    return list(summary.incidents)


def _incident_notices(before: State, after: State, seen_at: str) -> list[AnyNotice]:
    if before.serving_history is after.serving_history:
        return []
    found: list[AnyNotice] = []
    # ``apply`` keeps records only of deployments that exist.
    for deployment_id, records in after.serving_history.items():
        earlier = before.serving_history.get(deployment_id)
        if records == earlier:
            continue
        deployment = after.deployments[deployment_id]
        known = {incident.start: incident for incident in incidents_of(earlier)}
        for incident in incidents_of(records):
            old = known.get(incident.start)
            if old is None:
                found.append(_opened(deployment, incident, seen_at))
            if incident.end is not None and (old is None or old.end is None):
                found.append(_resolved(deployment, incident, incident.end, seen_at))
    return found


def _open_incident(state: State, deployment_id: DeploymentId) -> Incident | None:
    """The deployment's incident under way, if any."""
    incidents = incidents_of(state.serving_history.get(deployment_id))
    return incidents[-1] if incidents and incidents[-1].end is None else None


def _opened(deployment: Deployment, incident: Incident, seen_at: str) -> IncidentOpened:
    model_id = deployment.model_card.model_id
    start = iso_utc_of(incident.start)
    return IncidentOpened(
        id=f"incident_opened:{deployment.deployment_id}:{start}",
        at=seen_at,
        text=f"{TEXT_PREFIX}{model_id} not serving since {clock_utc_of(incident.start)} UTC "
        f"({incident.cause})",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        cause=incident.cause,
        start=start,
    )


def _resolved(
    deployment: Deployment, incident: Incident, end: float, seen_at: str
) -> IncidentResolved:
    model_id = deployment.model_card.model_id
    start = iso_utc_of(incident.start)
    phases = incident.phases
    went = f": {phases_words(phases)}" if phases is not None else ""
    return IncidentResolved(
        id=f"incident_resolved:{deployment.deployment_id}:{start}",
        at=seen_at,
        text=f"{TEXT_PREFIX}{model_id} serving again since {clock_utc_of(end)} UTC, after "
        f"{duration_words(incident.downtime_s)} down ({incident.cause}){went}",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        cause=incident.cause,
        start=start,
        end=iso_utc_of(end),
        downtime_s=round(incident.downtime_s, 3),
        phases=phases,
        problem=incident.problem,
    )


def _records_seen(state: State) -> Mapping[DeploymentId, float]:
    """The newest serving record's time of each deployment that has one."""
    return {
        deployment_id: records[-1].at
        for deployment_id, records in state.serving_history.items()
        if records
    }


# --- cant_place and serving again ------------------------------------------------------------


def _status_notices(
    before: State, after: State, seen_at: str, memory: AlertMemory
) -> tuple[list[AnyNotice], frozenset[DeploymentId]]:
    """``serving_again`` for each announced deployment whose newest serving record says it
    serves; ``cant_place`` for each deployment taking that status not announced yet. Whether a
    deployment is ``cant_place`` depends on its record and its model's instances only (not on
    runners), so a look at a State where neither changed (a node's report, a runner's progress:
    most of them) does not read the statuses."""
    announced = set(memory.cant_place & set(after.deployments))
    found: list[AnyNotice] = []
    for deployment_id in sorted(announced):
        records = after.serving_history.get(deployment_id)
        if records and records[-1].serving:
            found.append(_serving_again(after.deployments[deployment_id], records[-1].at, seen_at))
            announced.discard(deployment_id)
    if before.deployments is after.deployments and before.instances is after.instances:
        return found, frozenset(announced)
    for deployment_id, status in deployment_statuses(after).items():
        if status == "cant_place" and deployment_id not in announced:
            found.append(_cant_place(after.deployments[deployment_id], after, seen_at))
            announced.add(deployment_id)
    return found, frozenset(announced)


def _cant_place(deployment: Deployment, state: State, seen_at: str) -> CantPlace:
    model_id = deployment.model_card.model_id
    incident = _open_incident(state, deployment.deployment_id)
    reason = str(deployment.placement_error)  # set: the status is cant_place
    since = iso_utc_of(incident.start) if incident is not None else None
    when = f" (not serving since {clock_utc_of(incident.start)} UTC)" if incident else ""
    return CantPlace(
        id=f"cant_place:{deployment.deployment_id}:{since or _digest(reason)}",
        at=seen_at,
        text=f"{TEXT_PREFIX}{model_id} cannot be placed{when}: {reason}",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        reason=reason,
        down_since=since,
    )


def _serving_again(deployment: Deployment, served: float, seen_at: str) -> ServingAgain:
    model_id = deployment.model_card.model_id
    since = iso_utc_of(served)
    return ServingAgain(
        id=f"serving_again:{deployment.deployment_id}:{since}",
        at=seen_at,
        text=f"{TEXT_PREFIX}{model_id} placed and serving again since {clock_utc_of(served)} UTC",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        since=since,
    )


# --- drains ---------------------------------------------------------------------------------


def _drain_notices(before: Observed, after: Observed, seen_at: str) -> list[AnyNotice]:
    found: list[AnyNotice] = []
    old, new = before.state, after.state
    if old.drains is not new.drains:
        for name, drain in old.drains.items():
            if name not in new.drains and name in new.cordoned:
                found.append(
                    DrainFinished(
                        id=f"drain_finished:{name}:{drain.started}",
                        at=seen_at,
                        text=f"{TEXT_PREFIX}drain of {name} finished: nothing runs there "
                        "(it stays cordoned)",
                        node=name,
                        started=drain.started,
                    )
                )
    for name, drain in sorted(new.drains.items()):
        note = after.drain_notes.get(name)
        if note is None or name in before.drain_notes:
            continue
        found.append(
            DrainStuck(
                id=f"drain_stuck:{name}:{drain.started}:{_digest(note)}",
                at=seen_at,
                text=f"{TEXT_PREFIX}drain of {name} stuck: {note}",
                node=name,
                started=drain.started,
                reason=note,
            )
        )
    return found


def _health_notices(before: Observed, after: Observed, seen_at: str) -> list[AnyNotice]:
    """A deployment's instance newly broken, or broken another way, is said once."""
    found: list[AnyNotice] = []
    for deployment_id, (instance_id, problem, why) in sorted(after.unhealthy.items()):
        was = before.unhealthy.get(deployment_id)
        deployment = after.state.deployments.get(deployment_id)
        if deployment is None or (was is not None and was[:2] == (instance_id, problem)):
            continue
        model_id = deployment.model_card.model_id
        found.append(
            InstanceUnhealthy(
                id=f"instance_unhealthy:{instance_id}:{problem}",
                at=seen_at,
                text=f"{TEXT_PREFIX}{model_id}: instance {instance_id} {problem}: {why}",
                deployment_id=deployment_id,
                model_id=model_id,
                instance_id=instance_id,
                problem=problem,
                why=why,
            )
        )
    return found


def _digest(text: str) -> str:
    """A short, stable digest of ``text`` for an id (the same text, the same id)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]
