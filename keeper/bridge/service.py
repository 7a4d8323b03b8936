"""The bridge: our keeper beside a stock exo master, acting only through exo's HTTP API.

Once a second (``poll_interval_s``) it reads exo's State (``GET /state``). Then, under one lock
that deployment deletion also takes, it settles what the last steps sent, and steps the keeper
on exo's State with the bridge's own deployments merged in. The pieces it owns, each behind a
narrow interface:

- ``keeper.bridge.following``: which exo URL is read (failover) and whether its State may be
  acted on. Nothing is decided on a stale State, nor on one that lacks what the keeper decides
  on: the keeper is not stepped and the deployments say why; the next good read brings
  everything back by itself;
- ``keeper.bridge.placing``: exo places, not the bridge. Before each step the bridge asks exo
  where it would place what the keeper's timers say the step will try, and steps the keeper
  with those answers, as one value for that step only (docs/bridge.md, "Placement");
- ``keeper.bridge.creating``: the keeper's ``InstanceCreated`` posted to exo as exo gave it, kept
  in flight through elections, its ``DeploymentPlaced`` recorded once exo's State shows it;
- ``keeper.bridge.exo_models``: exo's model list and the full model cards exo showed;
- ``InstanceDeleted`` (from a deletion or a scale-down) dooms the instance:
  ``DELETE {exo}/instance/{id}`` until exo's State shows it gone (``keeper.bridge.doomed``);
- a recorded instance (``placedInstanceIds``) that exo's readable States stop showing, for a
  while and not on an older State, gets ``InstanceDeleted`` in the bridge's log
  (``keeper.bridge.vanished``), so the record follows exo's own deletions;
- ``keeper.bridge.health``: whether the steps go through. A step that raises is retried the
  next second and never stops the bridge, but ``/healthz`` and every deployment say so
  (``step failing since 12:03:04: ...``) until a step goes through;
- ``keeper.bridge.acting``: with a shared store (``--store``, ``keeper.bridge.etcd_store``),
  whether this bridge acts or stands by (a standby reads exo and serves the API, the acting one
  steps and calls exo, each call fenced by the store's leader key); commands go through
  ``_command``, which validates again when another bridge wrote first;
- deployment events are the bridge's own: committed to the same event store the master uses
  (``keeper.runtime.event_store``: numbered, logged durably, applied, snapshotted, compacted)
  for a State that holds only deployments. While that log cannot be written (disk full,
  read-only) commands get a 503 naming the cause and the keeper is not stepped, as in the master.

The keeper's startup grace runs from the bridge's own start, so after a restart exo's State
(which still holds the instances) is read before anything is placed; deployments come back from
the log.

``Bridge`` is the assembly: it builds the pieces, hands each part the ones it needs, and is
the one surface the HTTP layer (``keeper.bridge.api``) and the process (``keeper.bridge.server``)
see. Its three parts, each holding only what it is given:

- ``keeper.bridge.views`` (``BridgeView``): the read side, exo's State with our deployments,
  the deployments' views, what-if's State, ``/healthz`` and what ``/metrics`` reads; no lock;
- ``keeper.bridge.commands`` (``BridgeCommands``): the deployments and node commands, each
  validated and recorded under the log's lock;
- ``keeper.bridge.ticking`` (``BridgeTicks``): the tick, in its order (settle, record what exo
  deleted, delete the doomed, resend, ask, step, act);

and the log both write, ``keeper.bridge.own_log`` (``OwnLog``). The surface's methods only pass
calls on, so what a command or the tick does is read in one module.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import anyio
import httpx
from anyio.abc import TaskStatus

from keeper.bridge.acting import SharedActing
from keeper.bridge.commands import BridgeCommands
from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import EtcdStore
from keeper.bridge.exo_client import ExoApi
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.following import (
    STATE_UNREADABLE,
    UNREACHABLE,
    ExoDownError,
    ExoFollower,
    Outage,
)
from keeper.bridge.health import BridgeHealth, StepFailures
from keeper.bridge.in_flight import Creation
from keeper.bridge.metrics import ExoCollector
from keeper.bridge.node_liveness import BridgeLiveness
from keeper.bridge.node_probes import NodeProbes
from keeper.bridge.own_log import OwnLog
from keeper.bridge.placing import StepPlacement
from keeper.bridge.staging_calls import StagingCalls
from keeper.bridge.ticking import BridgeTicks
from keeper.bridge.vanished import VanishedInstances
from keeper.bridge.views import BridgeView, Role
from keeper.core.whatif import service_thresholds
from keeper.model.api_models import (
    CommandResponse,
    DeploymentHistoryResponse,
    DeploymentsResponse,
    NodesResponse,
    WhatIfThresholds,
)
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import AnyEvent
from keeper.model.liveness import OFF, LivenessConfig, ProbeAnswer
from keeper.model.state import (
    DEFAULT_PRIORITY,
    InstanceMeta,
    ModelCard,
    NodeId,
    RepairMode,
    Sharding,
    State,
)
from keeper.model.wire import JsonObject
from keeper.runtime.clock import Clock
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.event_log import FileOps
from keeper.runtime.event_store import EventStore
from keeper.runtime.front_door import FrontDoor, FrontDoorConfig
from keeper.runtime.hosted_keeper import (
    KeeperFactory,
    KeeperLike,
    KeeperWrapper,
    Started,
    default_keeper,
    start_keeper,
)
from keeper.runtime.metrics import MetricsSnapshot, ServiceMetrics, WebhookCollector
from keeper.runtime.webhooks import WebhookConfig, Webhooks

# Named here too: the bridge's callers and tests import them from the bridge's service.
__all__ = ["STATE_UNREADABLE", "UNREACHABLE", "Bridge", "BridgeConfig", "ExoDownError", "Outage"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BridgeConfig:
    # How often exo's State is read and the keeper stepped (docs/design.md §6.6: the keeper
    # steps once a second; a step on an older State would place against what exo no longer holds).
    poll_interval_s: float = 1.0
    # Before this long after the bridge starts nothing is placed (docs/design.md §5.6): exo's
    # State must be read first, or a restarted bridge would duplicate what exo already runs.
    startup_grace_s: float = STARTUP_GRACE
    # exo's model list changes only when someone adds a model card; re-read it this often (and
    # at once when a model it did not list is asked for).
    models_max_age_s: float = 60.0
    # Cards for the deployments of models exo has not shown its own card of yet (exo's
    # GET /models has no layer count): the built-in catalog and ``--model-cards DIR``.
    model_cards: tuple[ModelCard, ...] = BUILTIN_MODEL_CARDS
    # exo's own card files (``--model-cards DIR``) as exo's JSON spells the card it loads from
    # each (``keeper.bridge.exo_wire.file_card``), by model id: the full cards the bridge may
    # place with when exo cannot place for it (docs/bridge.md, "Placement").
    exo_card_files: Mapping[str, JsonObject] = field(default_factory=dict[str, JsonObject])
    # The bridge logs only deployment events (a few a minute): a snapshot, and the compaction
    # after it, every thousand keep restart instant and the log small.
    snapshot_every_events: int = 1_000
    # Deployments kept at most (``--max-deployments``; keeper.runtime.deployments).
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS
    # Build GET /metrics off the event loop (keeper.runtime.metrics.ServiceMetrics); off under
    # a virtual clock, which would jump while the thread works; ``exo-deploy bridge`` turns it on.
    metrics_in_thread: bool = False
    # Alert webhooks (``--webhook``), as on the master (keeper.runtime.webhooks): notices are
    # computed from the merged State the keeper steps on.
    webhooks: WebhookConfig = field(default_factory=WebhookConfig)
    # Fast failover (``--suspect-after-s`` / ``--dead-after-s``; docs/design.md §5.18). Off by
    # default here, so a bridge built in a test keeps exo's rule; ``exo-deploy bridge`` passes
    # the flags, 3 / 8 unless told otherwise.
    liveness: LivenessConfig = OFF
    # The front door's chats (``--hold-s``, ``--migrations``, ``--max-inflight``;
    # keeper.runtime.front_door, docs/design.md §8.6).
    front_door: FrontDoorConfig = field(default_factory=FrontDoorConfig)


class Bridge:
    """The bridge service. Construct anywhere; ``run`` inside an event loop (module doc)."""

    def __init__(
        self,
        exo: ExoApi | Sequence[ExoApi],
        data_dir: Path | None,
        clock: Clock | None = None,
        config: BridgeConfig | None = None,
        *,
        keeper_factory: KeeperFactory = default_keeper,
        file_ops: FileOps | None = None,
        store: EtcdStore | None = None,
        name: str = "bridge",
    ) -> None:
        self.name = name  # named in /healthz (with a store, the store's name for it)
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.config = config if config is not None else BridgeConfig()
        self.catalog = catalog_by_id(self.config.model_cards)
        self._started = Started("bridge", clock)
        self._keeper_factory = keeper_factory
        steps = StepFailures()  # whether the steps go through (``/healthz``)
        # The bridge's deployments: the log's State, local or shared (etcd, with one acting
        # bridge among several; keeper.bridge.etcd_store).
        self._shared = store
        self._log = OwnLog(
            store
            if store is not None
            else EventStore(
                self.data_dir, snapshot_every=self.config.snapshot_every_events, file_ops=file_ops
            ),
            store,
        )
        self._doomed = DoomedInstances(
            self.data_dir, persist=self._persist_doomed if store is not None else None
        )
        vanished = VanishedInstances()
        self._follow = ExoFollower(
            tuple(exo) if isinstance(exo, Sequence) else (exo,),
            wall=self._wall,
            on_switch=vanished.restart_counts,
        )
        cards = ExoCards(
            lambda: self.exo,
            self._monotonic,
            catalog=self.catalog,
            card_files=self.config.exo_card_files,
            models_max_age_s=self.config.models_max_age_s,
        )
        # The keeper's placement function: the answers asked of exo before the step under way.
        self._placement = StepPlacement()
        self._staging = StagingCalls(cards.full, guard=self._fence_call)
        self._creations = Creations(
            exo=lambda: self.exo,
            deployments=lambda: self._log.state.deployments,
            record=self._log.record,
            fail=self._log.fail,
            doomed=self._doomed,
            cards=cards,
            monotonic=self._monotonic,
            guard=self._fence_creation,
        )
        self.webhooks = Webhooks(
            self.config.webhooks,
            self.data_dir,
            wall=lambda: self._wall().timestamp(),
            sleep=self._sleep,  # the clock exists once the service runs
        )
        self._running = False
        # With a shared store: whether this bridge acts, and what acting takes there.
        self._acting = (
            SharedActing(
                store,
                own=lambda: self._log.state,
                creations=lambda: self._creations,
                doomed=lambda: self._doomed,
                monotonic=self._monotonic,
                new_keeper=self._new_keeper,
            )
            if store is not None
            else None
        )
        self._liveness = BridgeLiveness(self.config.liveness)
        # A suspect node's own API, when a --exo URL is that node's: the second sign (§5.18).
        self._probes = NodeProbes(self._follow.apis)
        self._view = BridgeView(
            name=name,
            log=self._log,
            follow=self._follow,
            started=self._started,
            creations=self._creations,
            doomed=self._doomed,
            steps=steps,
            webhooks=self.webhooks,
            acting=self._acting,
            running=lambda: self._running,
            role=lambda: self.role,
            liveness=self._liveness,
        )
        self._commands = BridgeCommands(
            log=self._log,
            view=self._view,
            started=self._started,
            follow=self._follow,
            cards=cards,
            creations=self._creations,
            doomed=self._doomed,
            staging=self._staging,
            max_deployments=self.config.max_deployments,
        )
        self._ticks = BridgeTicks(
            log=self._log,
            view=self._view,
            started=self._started,
            follow=self._follow,
            cards=cards,
            acting=self._acting,
            creations=self._creations,
            vanished=vanished,
            doomed=self._doomed,
            placement=self._placement,
            staging=self._staging,
            steps=steps,
            poll_interval_s=self.config.poll_interval_s,
            liveness=self._liveness,
        )
        # GET /metrics: the families every service exports, and the bridge's view of exo.
        self.metrics = ServiceMetrics(
            self._view.metrics_snapshot,
            self._monotonic,
            build_in_thread=self.config.metrics_in_thread,
        )
        self.metrics.add(ExoCollector(self._view.exo_facts))
        self.metrics.add(WebhookCollector(self.webhooks.health))
        # Chats through the bridge to exo (keeper.runtime.front_door), counted in /metrics and
        # in each deployment's view.
        self.front_door = FrontDoor(
            self._exo_in_order,
            self._view.model_deployment,
            self._monotonic,
            self._sleep,
            config=self.config.front_door,
            registry=self.metrics.registry,
        )
        self._view.requests = lambda deployment_id: self.front_door.counts.view(
            deployment_id, self._monotonic(), self._wall().timestamp(), self._started.started_at
        )
        # Its failing chats as webhooks (§6.9), its notable ones in the history (§3.5).
        self.webhooks.watch_chats(self.front_door.counts)
        self._view.chats = lambda deployment_id: self.front_door.counts.kept(
            deployment_id, self._monotonic(), self._wall().timestamp(), self._started.started_at
        )

    # --- what it holds -----------------------------------------------------------------------

    @property
    def write_error(self) -> str | None:
        """Why the bridge's log cannot be written now (its commands are refused), or None."""
        return self._log.write_error

    @property
    def exo_apis(self) -> tuple[ExoApi, ...]:
        """One exo API per URL given, in order of preference."""
        return self._follow.apis

    @property
    def exo(self) -> ExoApi:
        """The exo API in use: the State of each step is read from it, commands go to it."""
        return self._follow.exo

    def _exo_in_order(self) -> list[httpx.AsyncClient]:
        """exo's APIs for a chat: the one followed first, then the others in order."""
        first = self.exo
        return [first.http, *(api.http for api in self.exo_apis if api is not first)]

    @property
    def clock(self) -> Clock:
        return self._started.clock

    def _monotonic(self) -> float:
        return self.clock.monotonic()

    async def _sleep(self, seconds: float) -> None:
        await self.clock.sleep(seconds)

    def _wall(self) -> datetime:
        return self.clock.wall()

    @property
    def keeper(self) -> KeeperLike:
        return self._started.keeper

    @property
    def running(self) -> bool:
        return self._running

    @property
    def outage(self) -> Outage | None:
        """Why exo's State is not being followed right now, or None when it is."""
        return self._follow.outage

    @property
    def doomed_instances(self) -> list[str]:
        return self._doomed.ids()

    # --- the read side (keeper.bridge.views) -------------------------------------------------

    @property
    def state(self) -> State:
        """exo's State as last read, with the bridge's deployments in it."""
        return self._view.state

    def state_json(self) -> bytes:
        return self._view.state_json()

    def deployments_view(self) -> DeploymentsResponse:
        return self._view.deployments_view()

    def deployments_json(self) -> bytes:
        return self._view.deployments_json()

    def history(self, deployment_id: str, hours: float) -> DeploymentHistoryResponse:
        return self._view.history(deployment_id, hours)

    def what_if_state(self) -> State:
        return self._view.what_if_state()

    def what_if_thresholds(self) -> WhatIfThresholds:
        """What ``GET /whatif``'s seconds count from: fast failover's flags while it is on for
        the State last read (an exo without lastSeen turns it off), and exo's own timeout and
        sweep at exo's defaults, as the bridge cannot read the flags exo runs with."""
        on = self._liveness.off_why is None
        return service_thresholds(self.config.liveness if on else OFF)

    def nodes_view(self) -> NodesResponse:
        return self._commands.nodes_view()

    @property
    def degraded(self) -> bool:
        return self._view.degraded

    def health(self) -> BridgeHealth:
        return self._view.health()

    def metrics_snapshot(self) -> MetricsSnapshot:
        return self._view.metrics_snapshot()

    # --- the commands (keeper.bridge.commands) -------------------------------------------------

    async def models_body(self) -> bytes:
        return await self._commands.models_body()

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
        return await self._commands.create_deployment(
            model_id,
            sharding,
            instance_meta,
            min_nodes,
            replicas,
            standby,
            priority,
            preempt,
            repair,
        )

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        return await self._commands.delete_deployment(deployment_id)

    async def set_standby(self, deployment_id: str, standby: int) -> CommandResponse:
        return await self._commands.set_standby(deployment_id, standby)

    async def set_priority(
        self, deployment_id: str, priority: int | None = None, preempt: bool | None = None
    ) -> CommandResponse:
        return await self._commands.set_priority(deployment_id, priority, preempt)

    async def set_repair(self, deployment_id: str, repair: RepairMode) -> CommandResponse:
        return await self._commands.set_repair(deployment_id, repair)

    async def repair_instance(self, instance_id: str) -> CommandResponse:
        return await self._commands.repair_instance(instance_id)

    async def delete_instance(self, instance_id: str) -> CommandResponse:
        return await self._commands.delete_instance(instance_id)

    async def set_options(
        self,
        deployment_id: str,
        sharding: Sharding | None = None,
        instance_meta: InstanceMeta | None = None,
        min_nodes: int | None = None,
    ) -> CommandResponse:
        return await self._commands.set_options(deployment_id, sharding, instance_meta, min_nodes)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        return await self._commands.scale_deployment(deployment_id, replicas)

    async def cordon_node(self, node: str) -> CommandResponse:
        return await self._commands.cordon_node(node)

    async def uncordon_node(self, node: str) -> CommandResponse:
        return await self._commands.uncordon_node(node)

    async def drain_node(self, node: str, force: bool) -> CommandResponse:
        return await self._commands.drain_node(node, force)

    # --- running -------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rebuild the deployments from the log, then follow exo until cancelled."""
        if self._running:
            raise RuntimeError("this bridge is already running")
        clock = self._started.start_clock()
        self._log.store.open()
        now = clock.monotonic()
        self._doomed.load(now)
        self.webhooks.open()
        self._start_keeper(now, self.config.startup_grace_s)
        self._running = True
        log.info(
            "following exo at %s (of %s): %d deployment(s), %d instance(s) to delete",
            self.exo.url,
            ", ".join(api.url for api in self.exo_apis),
            len(self._log.state.deployments),
            len(self._doomed),
        )
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self.webhooks.run)  # deliveries: never in the tick's way
                if self.config.liveness.enabled:  # probes: never in the tick's way either
                    group.start_soon(
                        self._probes.run,
                        clock,
                        lambda: self._liveness.verdicts,
                        self._liveness.silences,
                        self._probed,
                    )
                    # Its own pauses timed by its loop, not by the ticks' waits on exo (§5.18).
                    group.start_soon(self._liveness.heartbeat, clock)
                if self._shared is not None:
                    # The live view and the leadership run beside the ticks.
                    group.start_soon(self._shared.watch)
                    group.start_soon(self._shared.campaign)
                task_status.started()
                await self._ticks.run(clock)
        finally:
            self._running = False
            if self._acting is None or self._acting.was_acting:
                self._creations.drop_all(clock.monotonic())
            self.webhooks.close()
            self._log.store.close()

    def _probed(self, node_id: NodeId, answer: ProbeAnswer) -> None:
        """A probe's answer to the liveness rule; a refusal (a node dead at once) wakes the
        ticks, so its instances go and their replacements are placed without waiting out the
        poll."""
        self._liveness.probed(node_id, answer)
        if answer == "refused":
            self._ticks.wake()

    async def tick(self) -> None:
        """One tick (``keeper.bridge.ticking``): read exo's State and act on it."""
        await self._ticks.tick()

    # --- one acting bridge among several (a shared store) ----------------------------------

    @property
    def role(self) -> Role:
        if self._acting is None:
            return "acting"
        return "acting" if self._acting.acting else "standby"

    def _new_keeper(self, now: float) -> None:
        """A keeper of this bridge's own from ``now``, with no startup grace (a takeover:
        ``keeper.bridge.acting``)."""
        self._start_keeper(now, 0.0)

    def _start_keeper(self, now: float, startup_grace_s: float) -> None:
        """The bridge's keeper from ``now``: paused while the log is unwritable, its steps
        timed for ``GET /metrics`` and shown to the webhooks."""
        self._started.keeper_or_none = _PausedWhileUnwritable(
            start_keeper(
                self._keeper_factory,
                now,
                startup_grace_s,
                self._placement.place,
                self.metrics.step,
                self.webhooks if self.webhooks.enabled else None,
                wall_offset=self._started.clock.wall().timestamp() - now,
            ),
            self._log.store,
        )

    def _fence_creation(self, instance_id: str, creation: Creation) -> bool:
        return self._acting is None or self._acting.fence_creation(instance_id, creation)

    def _fence_call(self, what: str) -> bool:
        return self._acting is None or self._acting.fence_call(what)

    def _persist_doomed(self, ids: list[str]) -> None:
        if self._acting is not None:
            self._acting.persist_doomed(ids)


class _PausedWhileUnwritable(KeeperWrapper):
    """The keeper, not stepped while the log cannot be written: the bridge sends a placement to
    exo BEFORE it records it, so every step first probes the disk (one small fsync a second),
    and stepping resumes by itself once a probe succeeds."""

    def __init__(self, keeper: KeeperLike, store: EventStore | EtcdStore) -> None:
        super().__init__(keeper)
        self._store = store

    def step(self, state: State, now: float) -> list[AnyEvent]:
        if not self._store.probe(always=True):
            return []
        return self.inner.step(state, now)
