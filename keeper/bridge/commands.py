"""The bridge's commands: what the HTTP layer's deployments and node routes call (create,
delete, scale, standby, priority, a rolling change; cordon, uncordon, drain).

Each validates on the bridge's log and exo's State, then records its events in the bridge's
own log (``keeper.bridge.own_log``, under its lock, validated again if another bridge wrote
first). None calls exo while the caller waits: exo may hold a command for seconds. What a
command takes away from exo (the instances of a deleted deployment, a scale-down's, an
abandoned move's replacement) is doomed, and the tick (``keeper.bridge.ticking``) sends the
``DELETE``s on the next State it reads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.following import ExoDownError, ExoFollower
from keeper.bridge.in_flight import LATE_LANDING_WATCH_S
from keeper.bridge.own_log import OwnLog
from keeper.bridge.staging_calls import StagingCalls
from keeper.bridge.views import BridgeView
from keeper.model.api_models import CommandResponse, NodesResponse
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DownloadDeletionRequested,
    InstanceDeleted,
)
from keeper.model.ids import new_id
from keeper.model.refusals import NotFoundError
from keeper.model.state import DEFAULT_PRIORITY, Deployment, InstanceMeta, RepairMode, Sharding
from keeper.runtime.clock import iso_utc
from keeper.runtime.deployments import (
    created_response,
    deleted_response,
    existing_deployment,
    new_deployment,
    options_events,
    options_response,
    priority_events,
    priority_response,
    repair_events,
    repair_response,
    repaired_response,
    scale_events,
    scaled_response,
    shown,
    standby_events,
    standby_response,
)
from keeper.runtime.hosted_keeper import Started, taken_back_unless_recorded
from keeper.runtime.nodes import node_command_response, node_name_for, nodes_response

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class BridgeCommands:
    """The bridge's commands (module doc)."""

    def __init__(
        self,
        *,
        log: OwnLog,
        view: BridgeView,
        started: Started,
        follow: ExoFollower,
        cards: ExoCards,
        creations: Creations,
        doomed: DoomedInstances,
        staging: StagingCalls,
        max_deployments: int,
    ) -> None:
        self._log = log
        self._view = view
        self._started = started
        self._follow = follow
        self._cards = cards
        self._creations = creations
        self._doomed = doomed
        self._staging = staging
        self._max_deployments = max_deployments

    @property
    def _deployments(self) -> dict[str, Deployment]:
        return self._log.state.deployments

    async def models_body(self) -> bytes:
        """exo's ``GET /models`` answer, passed on (the last one read if exo is down now)."""
        return await self._cards.models_body()

    async def create_deployment(
        self,
        model_id: str,
        sharding: Sharding | str = Sharding.PIPELINE,
        instance_meta: InstanceMeta | str = InstanceMeta.MLX_RING,
        min_nodes: int = 1,
        replicas: int = 1,
        standby: int = 1,
        priority: int = DEFAULT_PRIORITY,
        preempt: bool = False,
        repair: RepairMode = "auto",
    ) -> CommandResponse:
        card = await self._cards.deployment_card(model_id)

        def create() -> Deployment:
            deployment = new_deployment(
                self._deployments,
                card,
                sharding,
                instance_meta,
                min_nodes,
                replicas=replicas,
                standby=standby,
                priority=priority,
                preempt=preempt,
                repair=repair,
                max_deployments=self._max_deployments,
            )
            self._log.record_change([DeploymentCreated(deployment=deployment)])
            return deployment

        deployment = await self._log.command(create)
        log.info("deployment %s of %s created", deployment.deployment_id, model_id)
        return created_response(deployment)

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        def delete() -> Deployment:
            deployment = existing_deployment(self._deployments, deployment_id)
            now = self._started.clock.monotonic()
            events = self._started.keeper.delete(deployment_id, self._view.state)
            # Recorded first: if the log refuses it (503), no instance is doomed either. With a
            # shared store the doomed ids go in the same write, for whichever bridge acts.
            self._log.record_change(
                [
                    event
                    for event in events
                    if not isinstance(event, InstanceDeleted | DownloadDeletionRequested)
                ],
                doomed=[e.instance_id for e in events if isinstance(e, InstanceDeleted)],
            )
            # Its staged copies are deleted through exo at the next tick (recorded then).
            self._staging.owe(
                [event for event in events if isinstance(event, DownloadDeletionRequested)]
            )
            # Instances sent to exo for it that exo may still apply are deleted too, whenever
            # they land (an unanswered POST may be applied after an election).
            self._creations.drop_deployment(deployment_id, now)
            for event in events:
                if isinstance(event, InstanceDeleted):
                    self._doomed.add(event.instance_id, now)
            # The DELETEs go out with the next tick, on the State it reads: not on an older
            # State, and not while the caller waits (exo may hold commands for seconds).
            return deployment

        deployment = await self._log.command(self._taken_back(delete))
        log.info("deployment %s of %s deleted", deployment_id, deployment.model_card.model_id)
        return deleted_response(deployment)

    async def set_standby(self, deployment_id: str, standby: int) -> CommandResponse:
        """Keep ``standby`` node sets with the deployment's model downloaded, in the bridge's
        log; the keeper's next staging acts on it."""

        def set_it() -> Deployment:
            deployment = existing_deployment(self._deployments, deployment_id)
            self._log.record_change(standby_events(deployment, standby))
            return deployment

        return standby_response(await self._log.command(set_it), standby)

    async def set_priority(
        self, deployment_id: str, priority: int | None = None, preempt: bool | None = None
    ) -> CommandResponse:
        """Set the deployment's priority and whether it may preempt, in the bridge's log; the
        keeper's next steps order and preempt by it (docs/design.md §5.13)."""

        def set_it() -> Deployment:
            deployment = existing_deployment(self._deployments, deployment_id)
            self._log.record_change(priority_events(deployment, priority, preempt))
            return deployment

        return priority_response(await self._log.command(set_it), priority, preempt)

    async def set_repair(self, deployment_id: str, repair: RepairMode) -> CommandResponse:
        """What the keeper does with a broken instance of the deployment, in the bridge's log
        (docs/design.md §5.19)."""

        def set_it() -> Deployment:
            deployment = existing_deployment(self._deployments, deployment_id)
            self._log.record_change(repair_events(deployment, repair))
            return deployment

        return repair_response(await self._log.command(set_it), repair)

    async def repair_instance(self, instance_id: str) -> CommandResponse:
        """Have the keeper replace ``instance_id`` at its next ticks (the operator said so)."""
        return repaired_response(self._started.keeper, instance_id, self._view.state)

    async def delete_instance(self, instance_id: str) -> CommandResponse:
        """exo's own ``DELETE /instance/{id}``, as the dashboard's ctrl+k sends it: the instance
        is doomed like one the keeper deletes (sent with the next tick, fenced, again until exo
        shows it gone; with a shared store recorded there for whichever bridge acts). If a
        deployment keeps it, the keeper places another once exo shows it gone. One exo's State
        does not show (or shows unreadable) is a 404 naming it."""
        exo = self._follow.last
        known = exo is not None and (
            instance_id in exo.state.instances or instance_id in exo.unreadable_instances
        )
        if not known:
            raise NotFoundError(
                f"Instance {shown(instance_id)} is not in exo's State", param="instance_id"
            )

        def doom() -> None:
            self._log.record_change([], doomed=[instance_id])
            self._doomed.add(instance_id, self._started.clock.monotonic())

        await self._log.command(doom)
        log.info("instance %s: deletion asked for (DELETE /instance)", instance_id)
        return CommandResponse(
            message=f"Instance {instance_id} will be deleted: exo is sent its deletion at the "
            "next tick",
            command_id=new_id(),
            instance_id=instance_id,
        )

    async def set_options(
        self,
        deployment_id: str,
        sharding: Sharding | None = None,
        instance_meta: InstanceMeta | None = None,
        min_nodes: int | None = None,
    ) -> CommandResponse:
        """A rolling change of the deployment's placement options, in the bridge's log
        (docs/design.md §5.16); the keeper's steps replace the instances it names, through
        exo, one at a time."""
        async with self._log.lock:
            deployment = existing_deployment(self._deployments, deployment_id)
            if not self._follow.following:
                # Which instances are replaced is read from exo's State: not from a stale one.
                why = self._view.not_followed_why()
                raise ExoDownError(
                    f"Cannot change the options of {deployment.model_card.model_id} while exo's "
                    f"State is not followed ({why}): the instances to replace are chosen on it",
                    param="sharding",
                )
            state = self._view.state
            events = options_events(deployment, sharding, instance_meta, min_nodes, state)
            self._log.record(events)
        return options_response(deployment, events)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        """Keep ``replicas`` instances of the deployment's model: DeploymentScaled in the
        bridge's log, and the instances the keeper removes doomed (deleted through exo's
        ``DELETE /instance/{id}`` from the next tick), as deletion does."""

        def scale() -> Deployment:
            deployment = existing_deployment(self._deployments, deployment_id)
            if replicas < deployment.replicas and not self._follow.following:
                # Which instances go is read from exo's State: not from one that may be stale.
                why = self._view.not_followed_why()
                raise ExoDownError(
                    f"Cannot scale {deployment.model_card.model_id} down while exo's State is "
                    f"not followed ({why}): the instances to delete are chosen on it",
                    param="replicas",
                )
            events = scale_events(self._started.keeper, deployment_id, replicas, self._view.state)
            deletions = [event for event in events if isinstance(event, InstanceDeleted)]
            # Recorded first: if the log refuses it (503), no instance is doomed either.
            self._log.record_change(
                [event for event in events if not isinstance(event, InstanceDeleted)],
                doomed=[event.instance_id for event in deletions],
            )
            self._doom(deletions)
            self._creations.forget_refusal(deployment_id)
            return deployment

        deployment = await self._log.command(self._taken_back(scale))
        log.info(
            "deployment %s of %s scaled from %d to %d replica(s)",
            deployment_id,
            deployment.model_card.model_id,
            deployment.replicas,
            replicas,
        )
        return scaled_response(deployment, replicas)

    # --- cordons and drains (docs/design.md §5.15) ----------------------------------------

    def nodes_view(self) -> NodesResponse:
        return nodes_response(self._view.state, self._started.keeper, self._view.silent_s)

    async def cordon_node(self, node: str) -> CommandResponse:
        """No new placement on the node: NodeCordoned in the bridge's log."""

        def cordon() -> tuple[str, list[AnyEvent]]:
            state = self._view.state
            name = node_name_for(state, node)
            events = self._started.keeper.cordon(name, state)
            self._log.record_change(events)
            return name, events

        name, events = await self._log.command(self._taken_back(cordon))
        return node_command_response(name, "cordoned", "is cordoned already", events)

    async def uncordon_node(self, node: str) -> CommandResponse:
        """NodeUncordoned in the log; a move under way is abandoned, its replacement doomed."""

        def uncordon() -> tuple[str, list[AnyEvent]]:
            state = self._view.state
            name = node_name_for(state, node)
            events = self._started.keeper.uncordon(name, state)
            deletions = [e for e in events if isinstance(e, InstanceDeleted)]
            self._log.record_change(
                [e for e in events if not isinstance(e, InstanceDeleted)],
                doomed=[e.instance_id for e in deletions],
            )
            self._doom(deletions)
            return name, events

        name, events = await self._log.command(self._taken_back(uncordon))
        return node_command_response(name, "uncordoned", "is not cordoned", events)

    async def drain_node(self, node: str, force: bool) -> CommandResponse:
        """NodeDrainStarted in the log; the ticks do the moving, through exo."""

        def drain() -> tuple[str, list[AnyEvent]]:
            state = self._view.state
            name = node_name_for(state, node)
            when = iso_utc(self._started.clock.wall())
            events = self._started.keeper.drain(name, force, when, state)
            self._log.record_change(events)
            return name, events

        name, events = await self._log.command(self._taken_back(drain))
        log.info("node %s: drain%s started", name, " (forced)" if force else "")
        return node_command_response(name, "draining", "is draining already", events)

    def _taken_back(self, body: Callable[[], _T]) -> Callable[[], _T]:
        """``body`` (a command's keeper calls and its write) with the keeper's notes of it taken
        back when the write raises (``taken_back_unless_recorded``)."""

        def guarded() -> _T:
            with taken_back_unless_recorded(self._started.keeper):
                return body()

        return guarded

    def _doom(self, deletions: Sequence[InstanceDeleted]) -> None:
        now = self._started.clock.monotonic()
        for event in deletions:
            # One still in flight to exo may land later: watched, and deleted if it does.
            if self._creations.drop(event.instance_id):
                self._doomed.add(event.instance_id, now, LATE_LANDING_WATCH_S)
            else:
                self._doomed.add(event.instance_id, now)
