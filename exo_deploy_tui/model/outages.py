"""Each deployment's outage, from when it really stopped serving to when it serves again, and the
moments its recovery is made of.

When a deployment stops serving, the outage is dated from when the nodes that served it were
last heard of if one of them fell silent or left (``outage_start``: the master only notices
later), else from the moment it was seen to stop. Meanwhile the model keeps, per model, when
its instances were seen deleted and created (``MOMENTS_KEPT`` of each). When it serves again,
the timeline says after how long, and where the time went (``recovery.recovery_parts``: detected,
placed, downloaded, loaded). A moment that was not seen as it happened (the dashboard was away,
``blind``) is not noted, so a part is left out rather than guessed. Pure: the time and what
liveness and downloads say come in as values.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

from exo_deploy_tui.model.format import precise_duration, short_model
from exo_deploy_tui.model.recovery import NodeDownload, parts_text, recovery_parts
from exo_deploy_tui.model.timeline import TimelineEntry
from keeper.model.events import InstanceCreated, InstanceDeleted
from keeper.model.state import DeploymentId, ModelId, NodeId, State

# The instance deletions and creations kept per model for a recovery's parts: every attempt of
# a recovery that took a few, while a model that flaps all day keeps a handful.
MOMENTS_KEPT = 8


def outage_start(now: float, last_heard: Iterable[float | None]) -> float:
    """When serving really stopped: the earliest time a node it ran on was last heard of
    (``last_heard``, None for a node heard now or never dated), if before ``now``; else now."""
    return min((now, *(t for t in last_heard if t is not None)))


@dataclass
class _Moments:
    """When a model's instances were seen deleted and created (our clock), newest last."""

    deleted: deque[float] = field(default_factory=lambda: deque(maxlen=MOMENTS_KEPT))
    created: deque[float] = field(default_factory=lambda: deque(maxlen=MOMENTS_KEPT))


@dataclass
class _Outage:
    # While serving: the nodes of the instance that serves it, so that when it stops, the
    # outage can be dated from when those nodes were last heard of.
    serving_on: tuple[NodeId, ...] = ()
    since: float | None = None  # when it really stopped serving, while it does not serve
    stopped_at: float | None = None  # when it was seen to stop (None: not seen as it happened)


class Outages:
    """Per deployment: where it serves or since when it does not; per model: its moments."""

    def __init__(self) -> None:
        self._outages: dict[DeploymentId, _Outage] = {}
        self._moments: dict[ModelId, _Moments] = {}

    def note(self, event: object, before: State, now: float) -> None:
        """An instance deleted or created (``before``: the State the event applied to). The
        caller does not call it after a gap: then we know only that they happened."""
        if isinstance(event, InstanceDeleted):
            instance = before.instances.get(event.instance_id)
            if instance is not None:
                self._moments_of(instance.shard_assignments.model_id).deleted.append(now)
        elif (
            isinstance(event, InstanceCreated)
            and event.instance.instance_id not in before.instances
        ):
            self._moments_of(event.instance.shard_assignments.model_id).created.append(now)

    def keep(self, deployments: Collection[DeploymentId], models: Collection[ModelId]) -> None:
        """Forget the deployments the State no longer has, and the moments of models no
        deployment deploys."""
        for d_id in [d for d in self._outages if d not in deployments]:
            del self._outages[d_id]
        for model_id in [m for m in self._moments if m not in models]:
            del self._moments[model_id]

    def serving_on(self, deployment_id: DeploymentId) -> tuple[NodeId, ...]:
        """The nodes that served it when it was last seen serving."""
        outage = self._outages.get(deployment_id)
        return outage.serving_on if outage is not None else ()

    def serving(self, deployment_id: DeploymentId, nodes: tuple[NodeId, ...]) -> None:
        """It serves, on ``nodes``."""
        self._of(deployment_id).serving_on = nodes

    def stopped(
        self, deployment_id: DeploymentId, model: ModelId, since: float, now: float, blind: bool
    ) -> TimelineEntry:
        """It stopped serving, really at ``since`` (``outage_start``), seen at ``now`` unless
        ``blind``."""
        outage = self._of(deployment_id)
        outage.since, outage.stopped_at = since, None if blind else now
        return TimelineEntry(now, "warn", f"{short_model(model)} stopped serving", model)

    def serving_again(
        self,
        deployment_id: DeploymentId,
        model: ModelId,
        now: float,
        downloads: Sequence[NodeDownload],
        blind: bool,
    ) -> TimelineEntry:
        """It serves again: after how long, and where the time went (``downloads``: what was
        seen of the serving instance's nodes' downloads of its model)."""
        outage = self._of(deployment_id)
        name = short_model(model)
        if outage.since is None:
            text = f"{name} serving"  # it had not served since we watched it
        else:
            moments = self._moments.get(model) or _Moments()
            parts = recovery_parts(
                outage_since=outage.since,
                stopped_at=outage.stopped_at,
                deletions=moments.deleted,
                placements=moments.created,
                downloads=downloads,
                ready_at=None if blind else now,
            )
            after = precise_duration(now - outage.since)
            words = parts_text(parts)
            text = f"{name} serving again after {after}" + (f": {words}" if words else "")
        outage.since = outage.stopped_at = None
        return TimelineEntry(now, "good", text, model)

    def _of(self, deployment_id: DeploymentId) -> _Outage:
        outage = self._outages.get(deployment_id)
        if outage is None:
            outage = self._outages[deployment_id] = _Outage()
        return outage

    def _moments_of(self, model: ModelId) -> _Moments:
        moments = self._moments.get(model)
        if moments is None:
            moments = self._moments[model] = _Moments()
        return moments
