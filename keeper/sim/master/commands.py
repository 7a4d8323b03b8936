"""The master's commands: deployments, cordons and drains, instances and downloads.

Each validates, then emits under the master's lock and waits until its events are logged,
applied and published, so an answer is only sent for events that are durable and visible in
``GET /state``; refusals raise ``keeper.model.refusals`` types that the API maps to 4xx. The
keeper's commands (delete, scale, drain) run inside ``taken_back_unless_recorded``: a write that
fails takes the keeper's notes back, so the same command asked again is written again.

``MasterCommands`` is ``Master``'s base class (``keeper.sim.master.service``), so the API calls
``master.create_deployment(...)`` with one signature; it declares what it acts on (the State,
the keeper, the lock, the router's wait, the keeper loop, membership), which ``Master`` provides.
The rules every command applies are the hosts' shared ones (``keeper.runtime.deployments``,
``keeper.runtime.nodes``): the bridge runs the same through exo's API.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio

from keeper.core.placement import PlaceFn
from keeper.model.api_models import CommandResponse, NodesResponse
from keeper.model.events import AnyEvent, DeploymentCreated, InstanceCreated, InstanceDeleted
from keeper.model.ids import IdFactory
from keeper.model.refusals import BadRequestError, NotFoundError, NotRunningError
from keeper.model.state import (
    DEFAULT_PRIORITY,
    AnyShard,
    InstanceMeta,
    ModelCard,
    ModelId,
    NodeId,
    RepairMode,
    Sharding,
    State,
)
from keeper.runtime.clock import Clock, iso_utc
from keeper.runtime.deployments import (
    created_response,
    deleted_response,
    existing_deployment,
    new_deployment,
    options_events,
    options_response,
    placement_enums,
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
from keeper.runtime.hosted_keeper import KeeperLike, Started, taken_back_unless_recorded
from keeper.runtime.nodes import node_command_response, node_name_for, nodes_response
from keeper.sim.link.protocol import AnyMasterMessage, CancelDownload, DeleteDownload, StartDownload
from keeper.sim.master.membership import Membership
from keeper.sim.master.stepping import KeeperLoop

log = logging.getLogger(__name__)


class MasterCommands:
    """The master's commands (module doc); ``Master`` is one and sets what they act on."""

    # What the commands act on, set by ``Master.__init__``.
    catalog: dict[str, ModelCard]
    new_id: IdFactory
    _lock: anyio.Lock
    _stepping: KeeperLoop
    _place: PlaceFn
    _membership: Membership
    _started: Started

    @property
    def state(self) -> State:
        raise NotImplementedError

    @property
    def keeper(self) -> KeeperLike:
        raise NotImplementedError

    @property
    def clock(self) -> Clock:
        raise NotImplementedError

    @property
    def running(self) -> bool:
        raise NotImplementedError

    @property
    def max_deployments(self) -> int:
        raise NotImplementedError

    async def _emit_and_wait(self, events: Sequence[AnyEvent]) -> None:
        raise NotImplementedError

    def _card(self, model_id: str) -> ModelCard:
        card = self.catalog.get(model_id)
        if card is None:
            raise NotFoundError(
                f"Unknown model {shown(model_id)}: it is not in the model catalog (GET /models)",
                param="model_id",
            )
        return card

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
        card = self._card(model_id)
        async with self._lock:
            deployment = new_deployment(
                self.state.deployments,
                card,
                sharding,
                instance_meta,
                min_nodes,
                replicas=replicas,
                standby=standby,
                priority=priority,
                preempt=preempt,
                repair=repair,
                max_deployments=self.max_deployments,
                new_id=self.new_id,
            )
            await self._emit_and_wait([DeploymentCreated(deployment=deployment)])
        log.info("deployment %s of %s created", deployment.deployment_id, model_id)
        return created_response(deployment, self.new_id)

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            with taken_back_unless_recorded(self.keeper):
                events = self.keeper.delete(deployment_id, self.state)
                self._stepping.keeper_changed()
                await self._emit_and_wait(events)
        log.info("deployment %s of %s deleted", deployment_id, deployment.model_card.model_id)
        return deleted_response(deployment, self.new_id)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        """Keep ``replicas`` instances of the deployment's model (docs/design.md §5.11): the
        keeper's DeploymentScaled, and the InstanceDeleted of its own instances beyond them,
        under the lock the steps and deletion take; answered once they are durable."""
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            with taken_back_unless_recorded(self.keeper):
                events = scale_events(self.keeper, deployment_id, replicas, self.state)
                self._stepping.keeper_changed()
                await self._emit_and_wait(events)
        log.info(
            "deployment %s of %s scaled from %d to %d replica(s)",
            deployment_id,
            deployment.model_card.model_id,
            deployment.replicas,
            replicas,
        )
        return scaled_response(deployment, replicas, self.new_id)

    async def set_standby(self, deployment_id: str, standby: int) -> CommandResponse:
        """Keep ``standby`` node sets with the deployment's model downloaded (docs/design.md
        §5.12); answered once the change is durable."""
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            await self._emit_and_wait(standby_events(deployment, standby))
        return standby_response(deployment, standby, self.new_id)

    async def set_priority(
        self, deployment_id: str, priority: int | None = None, preempt: bool | None = None
    ) -> CommandResponse:
        """Set the deployment's priority and whether it may preempt (docs/design.md §5.13), each
        left as it is when None; answered once the change is durable."""
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            await self._emit_and_wait(priority_events(deployment, priority, preempt))
        return priority_response(deployment, priority, preempt, self.new_id)

    async def set_repair(self, deployment_id: str, repair: RepairMode) -> CommandResponse:
        """What the keeper does with a broken instance of the deployment (docs/design.md
        §5.19); answered once the change is durable."""
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            await self._emit_and_wait(repair_events(deployment, repair))
        return repair_response(deployment, repair, self.new_id)

    async def repair_instance(self, instance_id: str) -> CommandResponse:
        """Have the keeper replace ``instance_id`` at its next steps (the operator said so)."""
        async with self._lock:
            answer = repaired_response(self.keeper, instance_id, self.state, self.new_id)
            self._stepping.keeper_changed()
        return answer

    async def set_options(
        self,
        deployment_id: str,
        sharding: Sharding | None = None,
        instance_meta: InstanceMeta | None = None,
        min_nodes: int | None = None,
    ) -> CommandResponse:
        """A rolling change of the deployment's placement options (docs/design.md §5.16): the
        instances placed with other options are named now, on the State, and the keeper's
        steps replace them one at a time; answered once the change is durable."""
        async with self._lock:
            deployment = existing_deployment(self.state.deployments, deployment_id)
            events = options_events(deployment, sharding, instance_meta, min_nodes, self.state)
            self._stepping.keeper_changed()
            await self._emit_and_wait(events)
        if events:
            log.info(
                "deployment %s of %s: options changed",
                deployment_id,
                deployment.model_card.model_id,
            )
        return options_response(deployment, events, self.new_id)

    # --- cordons and drains (docs/design.md §5.15) ----------------------------------------

    def nodes_view(self) -> NodesResponse:
        return nodes_response(self.state, self._drains_keeper(), self._membership.silent_s)

    async def cordon_node(self, node: str) -> CommandResponse:
        """No new placement on the node; answered once that is durable."""
        async with self._lock:
            name = node_name_for(self.state, node)
            events = self._drains_keeper().cordon(name, self.state)
            await self._emit_and_wait(events)
        return node_command_response(name, "cordoned", "is cordoned already", events, self.new_id)

    async def uncordon_node(self, node: str) -> CommandResponse:
        async with self._lock:
            name = node_name_for(self.state, node)
            events = self._drains_keeper().uncordon(name, self.state)
            self._stepping.keeper_changed()
            await self._emit_and_wait(events)
        return node_command_response(name, "uncordoned", "is not cordoned", events, self.new_id)

    async def drain_node(self, node: str, force: bool) -> CommandResponse:
        """Cordon the node and move the keeper's instances off it (the steps do the moving)."""
        async with self._lock:
            name = node_name_for(self.state, node)
            when = iso_utc(self.clock.wall())
            keeper = self._drains_keeper()
            with taken_back_unless_recorded(keeper):
                events = keeper.drain(name, force, when, self.state)
                self._stepping.keeper_changed()
                await self._emit_and_wait(events)
        log.info("node %s: drain%s started", name, " (forced)" if force else "")
        return node_command_response(name, "draining", "is draining already", events, self.new_id)

    def _drains_keeper(self) -> KeeperLike:
        keeper = self._started.keeper_or_none
        if keeper is None:
            raise NotRunningError("the master is not running")
        return keeper

    async def place_instance(
        self,
        model_id: str,
        sharding: Sharding | str = Sharding.PIPELINE,
        instance_meta: InstanceMeta | str = InstanceMeta.MLX_RING,
        min_nodes: int = 1,
    ) -> CommandResponse:
        card = self._card(model_id)
        sharding_, meta = placement_enums(sharding, instance_meta)
        async with self._lock:
            try:
                instance = self._place(self.state, card, sharding_, meta, min_nodes)
            except ValueError as exc:
                raise BadRequestError(str(exc)) from None
            await self._emit_and_wait([InstanceCreated(instance=instance)])
        return CommandResponse(
            message=f"Instance of {model_id} placed",
            command_id=self.new_id(),
            instance_id=instance.instance_id,
        )

    async def delete_instance(self, instance_id: str) -> CommandResponse:
        async with self._lock:
            if instance_id not in self.state.instances:
                raise NotFoundError(f"Instance {shown(instance_id)} not found", param="instance_id")
            await self._emit_and_wait([InstanceDeleted(instance_id=instance_id)])
        return CommandResponse(
            message=f"Instance {instance_id} deleted",
            command_id=self.new_id(),
            instance_id=instance_id,
        )

    # --- downloads: exo's commands, passed on to the node ---------------------------------

    async def start_download(self, node_id: NodeId, shard: AnyShard) -> CommandResponse:
        """The node downloads the shard's whole model unless it is on disk (one download at a
        time; later ones wait their turn); its entry in ``downloads`` follows."""
        model_id = shard.model_card.model_id
        return self._to_node(
            node_id,
            StartDownload(shard_metadata=shard),
            f"Download of {model_id} on {node_id} asked for",
        )

    async def delete_download(self, node_id: NodeId, model_id: ModelId) -> CommandResponse:
        """The node deletes the model's files (unless a runner of it uses them)."""
        return self._to_node(
            node_id,
            DeleteDownload(model_id=model_id),
            f"Deletion of {model_id} on {node_id} asked for",
        )

    async def cancel_download(self, node_id: NodeId, model_id: ModelId) -> CommandResponse:
        """The node stops downloading the model, keeping what it has."""
        return self._to_node(
            node_id,
            CancelDownload(model_id=model_id),
            f"Cancellation of the download of {model_id} on {node_id} asked for",
        )

    def _to_node(self, node_id: NodeId, message: AnyMasterMessage, said: str) -> CommandResponse:
        if not self.running:
            raise NotRunningError("the master is not running")
        self._membership.send(node_id, message)  # NotFoundError naming a node not connected
        return CommandResponse(message=said, command_id=self.new_id())
