"""The master's serving records, read for the dashboard: each deployment's day, and the incidents
the timeline has not told yet.

What happened before the dashboard connected (or while it was away) it cannot have seen; the
master's serving records (``State.serving_history``) say it. On the first snapshot the timeline
is seeded with the last 24 hours' incidents; on every later one (a reconnection, a resync, or
every poll of a bridge) only with what came after the newest record it has told, since the
records of one deployment grow at the end. A record the dashboard saw happen, as an event or as
a status change between two States, is told live (``tracking.py``, ``outages.py``) and marked
told here, so no incident is told twice. The day's summary (``keeper.model.history``) is kept
while the records and the window's end stay the same: the deployments tab asks for every
deployment's availability every frame. Pure: the time comes in as ``now``.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from exo_deploy_tui.model.availability import on_our_clock, summarize_day, window_end
from exo_deploy_tui.model.timeline import TimelineEntry, incident_entries
from exo_deploy_tui.model.tracking import StatusTracking
from keeper.model.history import History
from keeper.model.readiness import deployment_statuses
from keeper.model.state import DeploymentId, ServingRecord, State

# The most history entries one snapshot seeds the timeline with (the newest): screens of a
# night's incidents, while a cluster that flapped all day cannot fill the timeline's capacity
# with the past and push out what happens next.
HISTORY_SEEDED_MAX = 200


def _untold(moment: float | None, told: float | None, live: float | None) -> bool:
    """Whether a record's ``moment`` is for the timeline to seed: after what it has told
    (``told``) and not the change the live view tells (``live``)."""
    return moment is not None and (told is None or moment > told) and moment != live


class ServingHistory:
    """Per deployment: the newest serving record told, and its day's summary."""

    def __init__(self) -> None:
        # The time (master's clock) of the newest serving record the timeline has told, seen
        # live or seeded: later snapshots seed only what came after it.
        self._told: dict[DeploymentId, float] = {}
        # Its last day's summary (master's clock) and what it was made from: the records
        # (compared by identity, the State's tuples are immutable) and the window's end.
        self._days: dict[DeploymentId, tuple[tuple[ServingRecord, ...], float, History]] = {}

    def told_live(self, deployment_id: DeploymentId, at: float) -> None:
        """A serving record (at ``at``, master's clock) came as an event: the live view tells
        the change it records as it happens."""
        self._told[deployment_id] = at

    def keep(self, deployments: Collection[DeploymentId]) -> None:
        """Forget deployments the State no longer has."""
        for kept in (self._told, self._days):
            for d_id in [d for d in kept if d not in deployments]:
                del kept[d_id]

    def seed(
        self,
        before: State | None,
        after: State,
        now: float,
        offset_s: float,
        statuses: StatusTracking,
    ) -> list[TimelineEntry]:
        """History entries for the incidents of the last 24 h in ``after``'s serving records
        that the timeline has not told, oldest first, on our clock (``offset_s``: the master's
        minus ours). On the first snapshot (``before`` None) that is all of them. On a later
        one, the live view tells at once what changed between ``before`` and ``after``, so a
        deployment's newest record is left to it when its status changed across the two (as
        ``statuses`` last settled it) or the deployment is new to us; what came in between is
        history."""
        entries: list[TimelineEntry] = []
        if not after.serving_history:
            return entries
        now_statuses = deployment_statuses(after) if before is not None else {}
        end = window_end(now, offset_s)
        for d_id, records in after.serving_history.items():
            deployment = after.deployments.get(d_id)
            if deployment is None or not records:
                continue
            told = self._told.get(d_id)
            newest = records[-1].at
            self._told[d_id] = newest if told is None else max(told, newest)
            if told is not None and newest <= told:
                continue
            live: float | None = None
            if before is not None:
                tracked = statuses.get(d_id)
                serving = now_statuses.get(d_id) == "serving"
                if tracked is None or (tracked.status == "serving") != serving:
                    live = newest
            began = records[0].at
            for incident in self.day(d_id, records, end).incidents:
                entries += incident_entries(
                    deployment.model_card.model_id,
                    incident,
                    had_served=incident.start > began,
                    start=_untold(incident.start, told, live),
                    end=_untold(incident.end, told, live),
                )
        entries.sort(key=lambda e: e.at)
        return [replace(e, at=e.at - offset_s) for e in entries[-HISTORY_SEEDED_MAX:]]

    def day(
        self, deployment_id: DeploymentId, records: tuple[ServingRecord, ...], end: float
    ) -> History:
        """``summarize_day`` on the master's clock, kept while the records and the window's end
        are the same."""
        kept = self._days.get(deployment_id)
        if kept is not None and kept[0] is records and kept[1] == end:
            return kept[2]
        history = summarize_day(deployment_id, records, end)
        self._days[deployment_id] = (records, end, history)
        return history

    def day_on_our_clock(
        self, deployment_id: DeploymentId, state: State, now: float, offset_s: float
    ) -> History:
        """The deployment's last 24 h from ``state``'s serving records, on our clock
        (``availability`` None when the master keeps no records of it)."""
        records = state.serving_history.get(deployment_id, ())
        history = self.day(deployment_id, records, window_end(now, offset_s))
        return on_our_clock(history, offset_s)
