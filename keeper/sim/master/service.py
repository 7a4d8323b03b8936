"""The master: one State, one ordered stream of events, and the loops that act on it.

Every change goes round the router (``keeper.sim.master.router``): ONE task commits queued events to
the event store (``keeper.runtime.event_store``: numbered, appended with one fsync per batch,
applied) and this service publishes them to subscribers (node sessions, dashboard streams),
flags the keeper loop when one may call for a placement, and fails the chats of a deleted
instance. So the State trails the events by a trip through the router, as in exo, and every
subscriber sees the same events in the same order as the log.

When the log cannot be written (disk full, read-only), a batch is neither applied nor published:
commands waiting on it get a 503 naming the cause and do not happen; events nobody waits for
(node reports) are held by the router and logged first once the log takes writes; the keeper is
not stepped; reads go on; and everything resumes by itself once a write succeeds.

Around the router run, until cancelled:
- the keeper loop (``keeper.sim.master.stepping``): prompt stepping, from STARTUP_GRACE after
  start, under the lock that deployment deletion and scaling also take;
- membership (``keeper.sim.master.membership``): node sessions, and NodeTimedOut for a node silent
  for ``node_timeout_s``;
- the sweep: every ``sweep_interval_s``, InstanceDeleted for each instance using a node that
  is no longer in the topology;
- snapshots of the State (then log compaction) every ``snapshot_every_events`` events, and once
  more on a clean stop.

Chat requests are routed by ``keeper.sim.master.chat_routing`` (to the least busy ready replica,
once more elsewhere if it goes before the first token) and followed by ``keeper.sim.master.chat``;
on our API they come through the front door the bridge mounts too (``front_door``: held while the
deployment does not serve, sent again, continued after a cut; docs/design.md §8.6), whose
upstream is that routing, in this process (``keeper.sim.master.chat_upstream``). Dashboard
streams subscribe through ``keeper.sim.master.subscriptions``.

Commands (``create_deployment``, ``scale_deployment`` and friends) are
``keeper.sim.master.commands``
(``MasterCommands``, this class's base): they validate, then emit under the lock and wait until
their events are applied, so a response is only sent for events that are durable and visible in
``GET /state``.

Nothing here reads a clock directly: time comes from the injected ``Clock``, so tests run the
whole master (with in-process nodes on memory channels) under trio's MockClock.

What stays here needs the lock, the State and the router together: the sweep, the publish
hooks, and the start and orderly stop of every part; the parts that stand alone live beside it
(commands, router, stepping, membership, chat routing, chat, subscriptions). The alert webhooks
(``keeper.runtime.webhooks``) are shown each State the keeper steps on, and deliver in a task of
their own.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
from anyio.abc import TaskStatus

from keeper.core.failover import instances_on_dead_nodes
from keeper.core.keeper import PlaceFn, calls_for_step
from keeper.core.placement import place_instance
from keeper.core.view import instances_off_topology
from keeper.core.whatif import service_thresholds
from keeper.model.api_models import (
    DeploymentHistoryResponse,
    DeploymentsResponse,
    DeploymentView,
    RequestsView,
    WhatIfThresholds,
)
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    DownloadDeletionRequested,
    DownloadRequested,
    IndexedEvent,
    InstanceDeleted,
    NodeConfirmedDead,
)
from keeper.model.ids import IdFactory, new_id
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.refusals import (
    NotFoundError,
    NotRunningError,
)
from keeper.model.state import (
    ModelCard,
    NodeId,
    State,
)
from keeper.runtime.built import LastBuilt
from keeper.runtime.clock import Clock
from keeper.runtime.deployments import (
    DEFAULT_MAX_DEPLOYMENTS,
    deployment_views,
    history_response,
)
from keeper.runtime.event_log import FileOps, Recovery
from keeper.runtime.event_store import EventStore
from keeper.runtime.front_door import FrontDoor, FrontDoorConfig, ModelDeployment
from keeper.runtime.hosted_keeper import (
    KeeperFactory,
    KeeperLike,
    ReportsHealth,
    Started,
    default_keeper,
    start_keeper,
)
from keeper.runtime.metrics import MetricsSnapshot, ServiceMetrics, WebhookCollector
from keeper.runtime.model_deployment import model_deployment
from keeper.runtime.webhooks import WebhookConfig, Webhooks
from keeper.sim.link.channel import ChannelClosedError, MasterSide
from keeper.sim.link.protocol import (
    AnyMasterMessage,
    ChatMessage,
    DeleteDownload,
    StartDownload,
)
from keeper.sim.master.chat import ChatRouter, ChatStream
from keeper.sim.master.chat_routing import ChatRouting
from keeper.sim.master.chat_upstream import upstream_client
from keeper.sim.master.commands import MasterCommands
from keeper.sim.master.membership import Membership
from keeper.sim.master.metrics import ChatCollector
from keeper.sim.master.openai_chat import ChatSource
from keeper.sim.master.router import Router
from keeper.sim.master.stepping import KeeperLoop
from keeper.sim.master.subscriptions import MAX_DASHBOARD_STREAMS, Fanout, Subscription

log = logging.getLogger(__name__)

# GET /deployments is polled by every dashboard and script. Its JSON (about half a kilobyte per
# deployment) is rebuilt only when the State or the keeper's memory changed, or when the
# countdowns in it are older than this: a tenth of a second is invisible on a display that
# counts whole seconds, and it keeps the answer cheap under many concurrent clients.
DEPLOYMENTS_VIEW_MAX_AGE_S = 0.1


@dataclass(frozen=True)
class MasterConfig:
    # exo's membership rule: a node silent this long is gone.
    node_timeout_s: float = 30.0
    # exo's sweep period for instances that use a node missing from the topology.
    sweep_interval_s: float = 10.0
    # How often the keeper steps (docs/design.md §6.6: once a second).
    keeper_interval_s: float = 1.0
    # How often node silence is checked; a tenth of the timeout would do, a second is cheap.
    membership_check_s: float = 1.0
    # Restart replays at most this many events after the snapshot: about 0.1 s of replay, so a
    # restart after a crash stays under 0.2 s (``make bench``, store section). Each snapshot is
    # followed by a compaction, so this also bounds the log's non-history tail (~1.2 MB).
    snapshot_every_events: int = 5_000
    # Compact the log after each snapshot (keeping deployment and instance events). Off for a
    # test or an audit that wants every event the master ever logged, and always off without
    # the keeper: the stand-in for a stock exo serves its whole log on GET /events, as exo does.
    compact_log: bool = True
    # Before this long after start the keeper places nothing (docs/design.md §5.6); a harness
    # that starts a fresh cluster may shorten it.
    startup_grace_s: float = STARTUP_GRACE
    # A chat request whose node sends nothing for this long is ended with an error.
    chat_chunk_timeout_s: float = 30.0
    # Queued events per subscriber (node session or dashboard stream) before it is dropped as
    # too slow; it reconnects and gets a fresh snapshot. A burst of a few thousand events (a
    # restart's worth of reports) must fit.
    subscriber_buffer: int = 10_000
    # Dashboard streams open at once (keeper.sim.master.subscriptions); one more is refused.
    max_dashboard_streams: int = MAX_DASHBOARD_STREAMS
    # Emits waiting for the router before producers block (backpressure, not loss).
    router_queue: int = 10_000
    model_cards: tuple[ModelCard, ...] = BUILTIN_MODEL_CARDS
    # Write and fsync the log in a worker thread, so the event loop serves requests meanwhile
    # and what arrives during an fsync joins the next batch (group commit). Off by default:
    # under a virtual clock the loop would see every task idle during the real disk wait and
    # jump time ahead, so virtual-time runs keep log I/O in the loop; ``run_master`` turns it on.
    log_io_in_thread: bool = False
    # Deployments kept at most (``--max-deployments``; keeper.runtime.deployments).
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS
    # On for ``master --exo-compat``: chats routed and ended as a stock exo's (docs/design.md
    # §7.5: any instance of the model, ready or not, held until ready; a deleted instance's
    # streams closed with neither text nor error) rather than ours (§6.8: ready ones only).
    exo_chats: bool = False
    # Off for ``master --exo-compat``, a stand-in for a stock exo master, which has no keeper
    # (deployments are then kept by ``exo-deploy bridge``, beside it).
    keeper_enabled: bool = True
    # Build GET /metrics off the event loop (keeper.runtime.metrics.ServiceMetrics). Off by
    # default for the reason log I/O is: a virtual clock would jump while the thread works;
    # ``run_master`` turns it on.
    metrics_in_thread: bool = False
    # Alert webhooks (``--webhook``): the notices of the keeper's changes, POSTed at least once
    # (keeper.runtime.webhooks). None given: no notice is computed at all.
    webhooks: WebhookConfig = field(default_factory=WebhookConfig)
    # Fast failover (``--suspect-after-s`` / ``--dead-after-s``; docs/design.md §5.18): off
    # by default here, so a master built in a test keeps exo's rule alone (the seed's
    # contract); ``exo-deploy master`` passes the flags, 3 / 8 unless told otherwise.
    liveness: LivenessConfig = OFF
    # The front door of our API's chats (``--hold-s``, ``--migrations``, ``--max-inflight``;
    # keeper.runtime.front_door, docs/design.md §8.6), as the bridge's. Unused under
    # ``--exo-compat``, whose API is exo's own, with no door.
    front_door: FrontDoorConfig = field(default_factory=FrontDoorConfig)


class Master(MasterCommands):
    """The master service. Construct anywhere; ``run`` inside an event loop (see module doc)."""

    def __init__(
        self,
        data_dir: Path | None,
        clock: Clock | None = None,
        config: MasterConfig | None = None,
        *,
        place: PlaceFn | None = None,
        keeper_factory: KeeperFactory = default_keeper,
        new_id: IdFactory = new_id,
        file_ops: FileOps | None = None,
    ) -> None:
        """``place`` defaults to exo's rules (``place_instance``) minting ids with ``new_id``;
        every id this master mints (deployments, instances, runners, commands, chats) comes
        from ``new_id``, so a replayable run passes a seeded one."""
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.config = config if config is not None else MasterConfig()
        self.catalog = catalog_by_id(self.config.model_cards)
        self._started = Started("master", clock)
        self.new_id = new_id
        self._place = (
            place if place is not None else functools.partial(place_instance, new_id=new_id)
        )
        self._keeper_factory = keeper_factory
        self._store = EventStore(
            self.data_dir,
            snapshot_every=self.config.snapshot_every_events,
            io_in_thread=self.config.log_io_in_thread,
            compact=self.config.compact_log and self.config.keeper_enabled,
            file_ops=file_ops,
            wall_time=lambda: self.clock.wall().timestamp(),
            # The master's State is the whole cluster's: its deployments' serving records are
            # written with the events that change them (keeper.model.history).
            track_serving=self.config.keeper_enabled,
        )
        self.webhooks = Webhooks(
            self.config.webhooks,
            self.data_dir,
            wall=lambda: self.clock.wall().timestamp(),
            sleep=self._sleep,  # the clock exists once the service runs
        )
        self._lock = anyio.Lock()
        self._router = Router(self._store, self._publish, self.config.router_queue)
        self._fanout = Fanout()
        self._chats = ChatRouter(
            self.config.chat_chunk_timeout_s, new_id, exo_streams=self.config.exo_chats
        )
        self._membership = Membership(
            lambda: self.state,
            self.emit,
            self._fanout,
            self._chats,
            node_timeout_s=self.config.node_timeout_s,
            check_interval_s=self.config.membership_check_s,
            outbox_size=self.config.subscriber_buffer,
            liveness=self.config.liveness,
        )
        # Set when a node is confirmed dead: the sweep runs at once rather than on its period.
        self._sweep_now = anyio.Event()
        self._chat_routing = ChatRouting(
            self._chats, self._membership, lambda: self.state, self._chat_outcome
        )
        self._view_cache = LastBuilt[bytes]()
        self._views_for_metrics = LastBuilt[list[DeploymentView]]()
        self._stepping = KeeperLoop(
            lock=self._lock,
            store=self._store,
            router=self._router,
            started=self._started,
            state=lambda: self.state,
            interval_s=self.config.keeper_interval_s,
            grace_s=self.config.startup_grace_s,
        )
        # GET /metrics: the families every service exports, and the master's chats.
        self.metrics = ServiceMetrics(
            self.metrics_snapshot,
            self._monotonic,
            build_in_thread=self.config.metrics_in_thread,
        )
        self.metrics.add(ChatCollector(self._chat_routing.counts))
        self.metrics.add(WebhookCollector(self.webhooks.health))
        # OpenAI's chat over ``chat``: the raw route of exo's stand-in, and the front door's
        # upstream (keeper.sim.master.openai_chat).
        self.chat_source = ChatSource(self.chat, new_id, self._wall_s, self.config.exo_chats)
        # Our API's chats go through the bridge's front door, its upstream this master's own
        # routing in this process (keeper.sim.master.chat_upstream), counted in /metrics and in
        # each deployment's view as the bridge's (docs/design.md §8.6).
        upstream = (upstream_client(self.chat_source, self.catalog.values),)
        self.front_door = FrontDoor(
            lambda: upstream,
            self.model_deployment,
            self._monotonic,
            self._sleep,
            config=self.config.front_door,
            registry=self.metrics.registry,
        )
        # Its failing chats as webhooks (§6.9); its notable ones in the history (§3.5).
        self.webhooks.watch_chats(self.front_door.counts)

    # --- read side -----------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._store.state

    @property
    def store(self) -> EventStore:
        return self._store

    @property
    def recovery(self) -> Recovery | None:
        return self._store.recovery

    @property
    def events_dropped_unwritable(self) -> int:
        """Held events dropped because the log refused them for too long (past the cap)."""
        return self._router.dropped_while_unwritable

    @property
    def events_held_unwritable(self) -> int:
        """Events nobody waited for, refused by the log and held until it takes them."""
        return self._router.held

    @property
    def write_error(self) -> str | None:
        """Why the event log cannot be written now (mutations are refused), or None."""
        return self._store.write_error

    @property
    def keeper(self) -> KeeperLike:
        return self._started.keeper

    @property
    def clock(self) -> Clock:
        return self._started.clock

    def _monotonic(self) -> float:
        return self.clock.monotonic()

    def _wall_s(self) -> float:
        return self.clock.wall().timestamp()

    def _chat_outcome(self, instance_id: str, failed: str | None) -> None:
        """How a chat went on an instance, for the keeper's failing-chats rule (§5.19)."""
        keeper = self._started.keeper
        if isinstance(keeper, ReportsHealth):
            keeper.note_chat(instance_id, failed, self._monotonic())

    @property
    def max_deployments(self) -> int:
        return self.config.max_deployments

    @property
    def running(self) -> bool:
        return self._router.running

    async def _sleep(self, seconds: float) -> None:
        await self.clock.sleep(seconds)

    def connected_nodes(self) -> list[NodeId]:
        return sorted(self._membership.sessions)

    def membership_refusals(self) -> dict[str, int]:
        """Node messages refused since start, by kind (``keeper.sim.master.membership``)."""
        return dict(sorted(self._membership.refused.items()))

    def deployments_view(self) -> DeploymentsResponse:
        clock = self._started.clock_or_none
        views = deployment_views(self.state, self._started.keeper_or_none, clock)
        if clock is not None:
            now, wall = clock.monotonic(), clock.wall().timestamp()
            started_at = self._started.started_at
            views = [
                _with_requests(
                    view, lambda d: self.front_door.counts.view(d, now, wall, started_at)
                )
                for view in views
            ]
        return DeploymentsResponse(deployments=views)

    def model_deployment(self, model_id: str) -> ModelDeployment | None:
        """The deployment of ``model_id`` as the front door asks (serving, and its status in
        words; ``keeper.runtime.model_deployment``), or None when the model has none."""
        return model_deployment(self._views(), model_id, self.state)

    def history(self, deployment_id: str, hours: float) -> DeploymentHistoryResponse:
        """``GET /deployments/{id}/history``: the deployment's serving records summarised."""
        wall, now = self.clock.wall(), self._monotonic()
        chats = self.front_door.counts.kept(
            deployment_id, now, wall.timestamp(), self._started.started_at
        )
        return history_response(self.state, deployment_id, hours, wall, chats)

    def what_if_state(self) -> State:
        """The State ``GET /whatif`` reads (``keeper.httpapi.whatif_routes``): the master's."""
        return self.state

    def what_if_thresholds(self) -> WhatIfThresholds:
        """What ``GET /whatif``'s seconds count from: the master's fast failover flags, and the
        node timeout and sweep it runs itself (exo's rule, its own values)."""
        config = self.config
        return service_thresholds(config.liveness, config.node_timeout_s, config.sweep_interval_s)

    def deployments_json(self) -> bytes:
        """``deployments_view()`` as JSON, cached (see ``DEPLOYMENTS_VIEW_MAX_AGE_S``)."""
        clock = self._started.clock_or_none
        return self._view_cache.get(
            (self.state, self._stepping.version),
            lambda: self.deployments_view().model_dump_json().encode(),
            now=clock.monotonic() if clock is not None else 0.0,
            max_age=DEPLOYMENTS_VIEW_MAX_AGE_S,
        )

    def metrics_snapshot(self) -> MetricsSnapshot:
        """What ``GET /metrics`` reads: the State and its deployment views, as published (no
        lock); the views are kept as ``GET /deployments`` keeps its body."""
        clock = self.clock  # NotRunningError (a 503) before the master runs
        state = self.state
        views = self._views()
        now = clock.wall().timestamp()
        started_at = self._started.started_at
        return MetricsSnapshot(
            state=state,
            deployments=views,
            now=now,
            started_at=started_at if started_at is not None else now,
        )

    def _views(self) -> list[DeploymentView]:
        """The deployments' views as published (no lock), kept as ``GET /deployments`` keeps
        its body: what ``/metrics`` and the front door read."""
        clock = self.clock  # NotRunningError (a 503) before the master runs
        state = self.state
        keeper = self._started.keeper_or_none
        return self._views_for_metrics.get(
            (state, self._stepping.version),
            lambda: deployment_views(state, keeper, clock),
            now=clock.monotonic(),
            max_age=DEPLOYMENTS_VIEW_MAX_AGE_S,
        )

    def subscribe(self) -> Subscription:
        """The current State and every event after it, for a dashboard stream;
        TooManySubscriptionsError past ``max_dashboard_streams``."""
        return self._fanout.subscribe(
            self.state,
            self.config.subscriber_buffer,
            open_=self.running,
            limit=self.config.max_dashboard_streams,
        )

    def end_streams(self) -> None:
        """End every dashboard subscription (a server shutting down); node sessions stay."""
        self._fanout.end_subscriptions()

    # --- chat ----------------------------------------------------------------------------

    def ready_instances(self, model_id: str) -> list[tuple[str, NodeId]]:
        """(instance id, rank-0 node) of each instance of the model a chat may go to now
        (``keeper.sim.master.chat_routing``)."""
        return self._chat_routing.ready_instances(model_id)

    def chats_in_flight(self, instance_id: str) -> int:
        """Chats open on the instance, held ones included (exo's tasks in flight on it)."""
        return self._chats.load([instance_id])[instance_id]

    async def chat(
        self, model_id: str, messages: Sequence[ChatMessage], max_tokens: int
    ) -> ChatStream:
        """Send a chat to a ready instance of the model (with ``exo_chats``, to any instance, as
        a stock exo does); iterate the result for its text."""
        if not self.running:
            raise NotRunningError("the master is not running")
        if self.config.exo_chats:
            return self._chat_routing.exo_chat(model_id, messages, max_tokens)
        return self._chat_routing.chat(model_id, messages, max_tokens)

    # --- the event router ----------------------------------------------------------------

    async def emit(self, events: Sequence[AnyEvent]) -> None:
        """Queue events for the router; they are applied shortly after (the State trails)."""
        await self._router.emit(events)

    async def _emit_and_wait(self, events: Sequence[AnyEvent]) -> None:
        """Queue events and wait until they are logged, applied and published."""
        await self._router.emit_and_wait(events)

    def _publish(self, indexed: list[IndexedEvent]) -> None:
        # Synchronous from apply (in the store) to publish: a subscriber registered between two
        # batches gets exactly the events after the State it was given.
        for entry in indexed:
            self._fanout.publish(entry)
            if calls_for_step(entry.event):
                self._stepping.want_step()
            if isinstance(entry.event, NodeConfirmedDead):
                self._sweep_now.set()
            if isinstance(entry.event, InstanceDeleted):
                self._chats.instance_deleted(entry.event.instance_id)
            self._carry_staging(entry.event)
        if indexed:
            self._chat_routing.state_changed()

    def _carry_staging(self, event: AnyEvent) -> None:
        """The keeper's staging, once durable, carried to its node as the node's own download
        commands (docs/design.md §5.12). A node not connected misses it; the keeper asks again
        after its retry, and a deletion the node missed leaves a copy its next report shows."""
        match event:
            case DownloadRequested(deployment_id=str(), node_id=node_id, shard_metadata=shard):
                message: AnyMasterMessage = StartDownload(shard_metadata=shard)
            case DownloadDeletionRequested(deployment_id=str(), node_id=node_id, model_id=model):
                message = DeleteDownload(model_id=model)
            case _:
                return
        try:
            self._membership.send(node_id, message)
        except NotFoundError:
            log.info("staging: node %s is not connected; the keeper asks again", node_id)

    # --- running -------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rebuild the State from the log, then run the router and the loops until cancelled."""
        if self.running:
            raise RuntimeError("this master is already running")
        clock = self._started.start_clock()
        recovery = self._store.open()
        self._store.record_serving()
        if recovery.events_replayed or recovery.snapshot_idx is not None:
            log.info(
                "state rebuilt from %s: snapshot at event %s + %d events replayed",
                self.data_dir,
                recovery.snapshot_idx,
                recovery.events_replayed,
            )
        now = clock.monotonic()
        self.webhooks.open()
        self._started.keeper_or_none = start_keeper(
            self._keeper_factory,
            now,
            self.config.startup_grace_s,
            self._place,
            self.metrics.step,
            self.webhooks if self.webhooks.enabled else None,
            wall_offset=clock.wall().timestamp() - now,
        )
        self._membership.start(clock)
        receive = self._router.open()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._router.run, receive)
                if self.config.keeper_enabled:
                    group.start_soon(self._stepping.run, now)
                group.start_soon(self._membership.watch)
                group.start_soon(self._sweep_loop)
                group.start_soon(self.webhooks.run)
                task_status.started()
        finally:
            self._router.close()
            self._stepping.stop()
            self._membership.close_all("the master is stopping")
            self._chats.fail_all("the master is stopping")
            self._fanout.clear()
            self.webhooks.close()
            self._store.close()

    async def _sweep_loop(self) -> None:
        """exo's sweep every ``sweep_interval_s``, and at once when a node is confirmed dead
        (fast failover, docs/design.md §5.18): instances on nodes that left the topology, and
        on nodes confirmed dead, are deleted."""
        while True:
            await self._sweep_wait(self.config.sweep_interval_s)
            self._sweep_now = anyio.Event()
            async with self._lock:
                events: list[AnyEvent] = []
                gone: set[str] = set()
                state = self.state
                for instance_id, missing in instances_off_topology(state).items():
                    log.info(
                        "deleting instance %s: node(s) %s left the topology",
                        instance_id,
                        ", ".join(missing),
                    )
                    events.append(InstanceDeleted(instance_id=instance_id))
                    gone.add(instance_id)
                for instance_id, dead in instances_on_dead_nodes(state).items():
                    if instance_id not in gone:
                        log.info(
                            "deleting instance %s: node(s) %s confirmed dead",
                            instance_id,
                            ", ".join(dead),
                        )
                        events.append(InstanceDeleted(instance_id=instance_id))
                await self.emit(events)

    async def _sweep_wait(self, seconds: float) -> None:
        """Sleep ``seconds`` on the event loop's clock, or less if a sweep is wanted now.

        One wait in this task (a cancel scope's deadline around the event), not a sleeper and a
        waiter racing in a task group: the sweep then runs in the same scheduling round as its
        timer fires, as a plain sleep would, rather than two rounds later among whatever else
        woke at that instant, which made a virtual run's outcome depend on where it started on
        the mock clock (docs/design.md §5.18, a virtual run replays)."""
        wake = self._sweep_now
        if wake.is_set():
            return
        with anyio.move_on_after(seconds):
            await wake.wait()

    # --- node sessions -------------------------------------------------------------------

    async def serve_node(self, channel: MasterSide) -> None:
        """Serve one node connection until it closes (see ``keeper.sim.link.protocol``)."""
        if not self.running:
            with contextlib.suppress(ChannelClosedError):
                await channel.aclose()
            return
        await self._membership.serve(channel)


def _with_requests(
    view: DeploymentView, requests: Callable[[str], RequestsView | None]
) -> DeploymentView:
    """``view`` with the front door's counts of its chats over the last five minutes, when it
    had any (docs/design.md §8.6)."""
    counted = requests(view.deployment.deployment_id)
    return view if counted is None else view.model_copy(update={"requests": counted})
