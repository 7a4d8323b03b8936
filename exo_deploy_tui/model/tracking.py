"""Since when each deployment has been in its status: the changes the timeline and the ages tell.

A State says each deployment's status now (``keeper.model.readiness``), not since when; the
deployments tab's age ("serving 3m") and the timeline's "stopped serving" and "serving again"
need the moment it changed, so the model compares each State's statuses with the last and keeps
the moment of every change it sees. A deployment already in its status when the dashboard first
looked is marked not ``known`` (its age is how long we have watched, and says so); one that
appears later has just been created. ``settle`` hands back the changes, so what they mean (an
outage beginning or ending, ``outages.py``) is another part's to say. Pure: the time comes in
as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keeper.model.api_models import DeploymentStatus
from keeper.model.state import DeploymentId


@dataclass(frozen=True)
class Tracked:
    """A deployment's status and since when (our clock)."""

    status: DeploymentStatus
    since: float
    known: bool  # False when it was already in this status as we began watching


@dataclass(frozen=True)
class StatusChange:
    deployment_id: DeploymentId
    old: DeploymentStatus
    new: DeploymentStatus


class StatusTracking:
    """Each deployment's status as last settled, and since when."""

    def __init__(self) -> None:
        self._tracked: dict[DeploymentId, Tracked] = {}
        # True once the first snapshot has been taken in: from then on we see statuses begin.
        self._watching = False

    def get(self, deployment_id: DeploymentId) -> Tracked | None:
        return self._tracked.get(deployment_id)

    def settle(
        self, statuses: Mapping[DeploymentId, DeploymentStatus], now: float
    ) -> list[StatusChange]:
        """Take in the statuses of a State: forget deployments it no longer has, date the new
        ones and every change, and return the changes in ``statuses``' order."""
        tracked = self._tracked
        for d_id in [d for d in tracked if d not in statuses]:
            del tracked[d_id]
        changes: list[StatusChange] = []
        for d_id, status in statuses.items():
            known = tracked.get(d_id)
            if known is None:
                # Seen from the start of a watch we cannot know how long it has been so; one
                # that appears later has just been created.
                tracked[d_id] = Tracked(status, now, known=self._watching)
            elif known.status != status:
                changes.append(StatusChange(d_id, known.status, status))
                tracked[d_id] = Tracked(status, now, known=True)
        return changes

    def watch(self) -> None:
        """The first State is in: deployments that appear from now on are new."""
        self._watching = True
