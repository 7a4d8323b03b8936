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

The module runs to about 900 lines because what stays needs the lock and every piece at once:
the tick's order (settle, record what exo deleted, delete the doomed, resend, ask, step, act),
the deployment commands (each touches the log, the keeper, the creations and the doomed
instances under the lock), and the read side (exo's State with our deployments, the
deployments' views, health), which reads them all.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal, TypeVar

import anyio
from anyio.abc import TaskStatus

from keeper.bridge.acting import SharedActing
from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import (
    COMMAND_TRIES,
    EtcdStore,
    EtcdUnavailableError,
    NotActingError,
    StoreError,
    StoreMovedOnError,
)
from keeper.bridge.exo_client import ExoApi, ExoRefusedError, ExoState, ExoUnavailableError
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.following import (
    STATE_UNREADABLE,
    UNREACHABLE,
    ExoDownError,
    ExoFollower,
    Outage,
)
from keeper.bridge.health import (
    BridgeHealth,
    EventLogHealth,
    ExoHealth,
    HealthStatus,
    StepFailures,
    StepHealth,
    StoreHealth,
)
from keeper.bridge.in_flight import LATE_LANDING_WATCH_S, Creation
from keeper.bridge.metrics import ExoCollector, ExoFacts
from keeper.bridge.placing import PlacementAnswers, StepPlacement, ask_exo, due_for_placement
from keeper.bridge.staging_calls import StagingCalls
from keeper.bridge.vanished import VanishedInstances
from keeper.model.api_models import (
    CommandResponse,
    DeploymentHistoryResponse,
    DeploymentsResponse,
    DeploymentView,
    NodesResponse,
)
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DownloadDeletionRequested,
    DownloadRequested,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.history import serving_changes
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.state import (
    DEFAULT_PRIORITY,
    Deployment,
    InstanceMeta,
    ModelCard,
    Sharding,
    State,
)
from keeper.model.wire import JsonObject
from keeper.runtime.built import LastBuilt
from keeper.runtime.clock import Clock, iso_utc
from keeper.runtime.deployments import (
    DEFAULT_MAX_DEPLOYMENTS,
    created_response,
    deleted_response,
    deployment_views,
    existing_deployment,
    history_response,
    new_deployment,
    options_events,
    options_response,
    priority_events,
    priority_response,
    scale_events,
    scaled_response,
    standby_events,
    standby_response,
)
from keeper.runtime.event_log import FileOps
from keeper.runtime.event_store import EventStore, LogNotWritableError
from keeper.runtime.hosted_keeper import (
    KeeperFactory,
    KeeperLike,
    KeeperWrapper,
    Started,
    default_keeper,
    start_keeper,
)
from keeper.runtime.metrics import MetricsSnapshot, ServiceMetrics, WebhookCollector
from keeper.runtime.nodes import node_command_response, node_name_for, nodes_response
from keeper.runtime.webhooks import WebhookConfig, Webhooks

# Named here too: the bridge's callers and tests import them from the bridge's service.
__all__ = ["STATE_UNREADABLE", "UNREACHABLE", "Bridge", "BridgeConfig", "ExoDownError", "Outage"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
Role = Literal["acting", "standby"]


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
    # Fast failover (``--suspect-after-s`` / ``--dead-after-s``; docs/design.md §5.17). Off by
    # default here, so a bridge built in a test keeps exo's rule; ``exo-deploy bridge`` passes
    # the flags, 3 / 8 unless told otherwise.
    liveness: LivenessConfig = OFF


# What the bridge's own State adds to exo's: its deployments and their serving records.
_OWN_STATE_KEYS: set[str] = {"deployments", "serving_history"}


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
        self._steps = StepFailures()  # whether the steps go through (``/healthz``)
        self._served: State | None = None  # the merged State serving was last judged on
        # The bridge's deployments: the log's State (``_own``), local or shared (``_shared``:
        # etcd, with one acting bridge among several; keeper.bridge.etcd_store).
        self._shared = store
        self._store: EventStore | EtcdStore = (
            store
            if store is not None
            else EventStore(
                self.data_dir, snapshot_every=self.config.snapshot_every_events, file_ops=file_ops
            )
        )
        self._lock = anyio.Lock()
        self._merged = LastBuilt[State]()  # exo's State with our deployments
        self._state_body = LastBuilt[bytes]()  # exo's State JSON with our deployments
        self._doomed = DoomedInstances(
            self.data_dir, persist=self._persist_doomed if store is not None else None
        )
        self._vanished = VanishedInstances()
        self._follow = ExoFollower(
            tuple(exo) if isinstance(exo, Sequence) else (exo,),
            wall=self._wall,
            on_switch=self._vanished.restart_counts,
        )
        self._cards = ExoCards(
            lambda: self.exo,
            self._monotonic,
            catalog=self.catalog,
            card_files=self.config.exo_card_files,
            models_max_age_s=self.config.models_max_age_s,
        )
        # The keeper's placement function: the answers asked of exo before the step under way.
        self._placement = StepPlacement()
        self._staging = StagingCalls(self._cards.full, guard=self._fence_call)
        self._creations = Creations(
            exo=lambda: self.exo,
            deployments=lambda: self._own.deployments,
            record=self._record,
            fail=self._fail,
            doomed=self._doomed,
            cards=self._cards,
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
        # GET /metrics: the families every service exports, and the bridge's view of exo.
        self.metrics = ServiceMetrics(
            self.metrics_snapshot,
            self._monotonic,
            build_in_thread=self.config.metrics_in_thread,
        )
        self.metrics.add(ExoCollector(self._exo_facts))
        self.metrics.add(WebhookCollector(self.webhooks.health))
        # With a shared store: whether this bridge acts, and what acting takes there.
        self._acting = (
            SharedActing(
                store,
                own=lambda: self._own,
                creations=lambda: self._creations,
                doomed=lambda: self._doomed,
                monotonic=self._monotonic,
                new_keeper=self._new_keeper,
            )
            if store is not None
            else None
        )

    # --- read side -------------------------------------------------------------------------

    @property
    def _own(self) -> State:
        return self._store.state

    @property
    def write_error(self) -> str | None:
        """Why the bridge's log cannot be written now (its commands are refused), or None."""
        return self._store.write_error

    @property
    def exo_apis(self) -> tuple[ExoApi, ...]:
        """One exo API per URL given, in order of preference."""
        return self._follow.apis

    @property
    def exo(self) -> ExoApi:
        """The exo API in use: the State of each step is read from it, commands go to it."""
        return self._follow.exo

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

    @property
    def state(self) -> State:
        """exo's State as last read, with the bridge's deployments in it."""
        exo = self._follow.last
        return self._merged.get(
            (exo, self._own),
            lambda: (exo.state if exo is not None else State()).model_copy(
                update={
                    "deployments": self._own.deployments,
                    "serving_history": self._own.serving_history,
                    "cordoned": self._own.cordoned,
                    "drains": self._own.drains,
                }
            ),
        )

    def state_json(self) -> bytes:
        """exo's State JSON as exo sent it (every key kept), with ``deployments`` set to ours."""
        exo = self._follow.last
        if exo is None:
            reason = self._not_followed_why()
            raise ExoDownError(f"exo at {self.exo.url} has not answered yet: {reason}")
        return self._state_body.get((exo, self._own), lambda: self._exo_json_with_ours(exo))

    def _exo_json_with_ours(self, exo: ExoState) -> bytes:
        document: dict[str, Any] = dict(exo.raw)
        # The bridge's own keys, in the State's camelCase ("deployments", "servingHistory").
        document.update(self._own.model_dump(mode="json", include=_OWN_STATE_KEYS))
        return json.dumps(document, separators=(",", ":")).encode()

    def deployments_view(self) -> DeploymentsResponse:
        views = deployment_views(
            self.state, self._started.keeper_or_none, self._started.clock_or_none, self._detail
        )
        return DeploymentsResponse(deployments=[self._with_refusal(view) for view in views])

    def history(self, deployment_id: str, hours: float) -> DeploymentHistoryResponse:
        """``GET /deployments/{id}/history``: the deployment's serving records summarised."""
        return history_response(self.state, deployment_id, hours, self._wall())

    def what_if_state(self) -> State:
        """The State ``GET /whatif`` reads (``keeper.httpapi.whatif_routes``): exo's with the
        bridge's deployments, placed as the keeper previews (our placement, exo's cards); a 503
        while exo's State is not followed, as an answer on a stale one would mislead."""
        if not self._follow.following:
            raise ExoDownError(
                f"exo's State is not followed now ({self._not_followed_why()}): what-if reads it"
            )
        return self.state

    def _not_followed_why(self) -> str:
        """Why exo's State is not followed now, in the words refusals quote."""
        outage = self._follow.outage
        return outage.reason if outage is not None else "no answer yet"

    def deployments_json(self) -> bytes:
        """``deployments_view()`` as JSON, the ``GET /deployments`` body."""
        return self.deployments_view().model_dump_json().encode()

    def _with_refusal(self, view: DeploymentView) -> DeploymentView:
        # exo said no to the keeper's placement; the keeper tries again after this wait.
        if view.waiting == "placement_in_flight" and self._creations.was_refused(
            view.deployment.deployment_id
        ):
            return view.model_copy(update={"waiting": "unplaceable_retry"})
        return view

    def _detail(self, deployment_id: str) -> str | None:
        store = self._shared
        if store is not None:
            if store.write_error is not None:
                return f"{store.write_error}: not acting; this view may be stale"
            if self._acting is not None and self._acting.foreign is not None:
                return self._acting.foreign
        failing = self._steps.detail()
        if failing is not None:
            return failing  # the last step raised: nothing below it is being kept up to date
        outage = self._follow.outage
        if outage is not None:
            since = outage.since.astimezone().strftime("%H:%M:%S")
            return f"exo {outage.kind} since {since}: {outage.reason}"
        if self._follow.last is None:
            return "waiting for exo's first answer"
        in_flight = self._creations.detail(deployment_id, self.clock.monotonic())
        if in_flight is not None:
            return in_flight
        if self._creations.was_refused(deployment_id):
            return "exo refused the last placement (see the placement error)"
        return None

    @property
    def degraded(self) -> bool:
        """Whether the bridge cannot do its job now: its log refuses writes (so it accepts no
        change) or its steps fail (so it keeps nothing). ``/healthz`` is a 503 then."""
        return (
            self._store.write_error is not None
            or self._steps.failing
            or (self._acting is not None and self._acting.foreign is not None)
        )

    def _exo_reachable(self) -> bool:
        """exo answered the last read, whatever its State held (``/healthz``, ``/metrics``)."""
        outage = self._follow.outage
        return self._follow.last is not None and (outage is None or outage.kind != UNREACHABLE)

    def _exo_readable(self) -> bool:
        """exo's last State can be acted on (``/healthz``, ``/metrics``)."""
        return self._follow.last is not None and self._follow.outage is None

    def metrics_snapshot(self) -> MetricsSnapshot:
        """What ``GET /metrics`` reads: exo's State with the bridge's deployments and their
        views, as ``GET /state`` and ``GET /deployments`` serve them (no lock)."""
        now = self.clock.wall().timestamp()  # NotRunningError (a 503) before it runs
        started_at = self._started.started_at
        return MetricsSnapshot(
            state=self.state,
            deployments=self.deployments_view().deployments,
            now=now,
            started_at=started_at if started_at is not None else now,
        )

    def _exo_facts(self) -> ExoFacts:
        now = self.clock.wall().timestamp()
        started_at = self._started.started_at
        answered, readable = self._follow.answered_at, self._follow.readable_at
        return ExoFacts(
            reachable=self._exo_reachable(),
            state_readable=self._exo_readable(),
            answered_at=answered.timestamp() if answered is not None else None,
            readable_at=readable.timestamp() if readable is not None else None,
            now=now,
            started_at=started_at if started_at is not None else now,
        )

    def health(self) -> BridgeHealth:
        outage = self._follow.outage
        status: HealthStatus = "degraded" if self.degraded else "ok"
        since = self._steps.since
        store = self._shared
        return BridgeHealth(
            status=status if self._running else "stopped",
            role=self.role,
            name=store.name if store is not None else self.name,
            leader=(store.leader if store is not None else self.name) if self._running else None,
            store=self._store_health(store) if store is not None else None,
            exo=ExoHealth(
                url=self.exo.url,
                urls=[api.url for api in self.exo_apis],
                reachable=self._exo_reachable(),
                state_readable=self._exo_readable(),
                unreachable_since=iso_utc(outage.since) if outage is not None else None,
                reason=outage.reason if outage is not None else None,
                outage=outage.kind if outage is not None else None,
            ),
            deployments=len(self._own.deployments),
            instances_to_delete=len(self._doomed),
            event_log=EventLogHealth(
                writable=self._store.write_error is None, error=self._store.write_error
            ),
            step=StepHealth(
                ok=since is None,
                failing_since=iso_utc(since) if since is not None else None,
                error=self._steps.error,
            ),
            webhooks=self.webhooks.health(),
        )

    def _store_health(self, store: EtcdStore) -> StoreHealth:
        since = store.unreachable_since
        return StoreHealth(
            url=store.address.url,
            prefix=store.prefix,
            reachable=since is None,
            stale=store.stale,
            unreachable_since=(
                iso_utc(self._wall() - timedelta(seconds=self._monotonic() - since))
                if since is not None
                else None
            ),
            error=store.write_error
            if store.write_error is not None
            else (self._acting.foreign if self._acting is not None else None),
        )

    # --- commands --------------------------------------------------------------------------

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
    ) -> CommandResponse:
        card = await self._cards.deployment_card(model_id)

        def create() -> Deployment:
            deployment = new_deployment(
                self._own.deployments,
                card,
                sharding,
                instance_meta,
                min_nodes,
                replicas=replicas,
                standby=standby,
                priority=priority,
                preempt=preempt,
                max_deployments=self.config.max_deployments,
            )
            self._record_change([DeploymentCreated(deployment=deployment)])
            return deployment

        deployment = await self._command(create)
        log.info("deployment %s of %s created", deployment.deployment_id, model_id)
        return created_response(deployment)

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        def delete() -> Deployment:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            now = self.clock.monotonic()
            events = self.keeper.delete(deployment_id, self.state)
            # Recorded first: if the log refuses it (503), no instance is doomed either. With a
            # shared store the doomed ids go in the same write, for whichever bridge acts.
            self._record_change(
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

        deployment = await self._command(delete)
        log.info("deployment %s of %s deleted", deployment_id, deployment.model_card.model_id)
        return deleted_response(deployment)

    async def set_standby(self, deployment_id: str, standby: int) -> CommandResponse:
        """Keep ``standby`` node sets with the deployment's model downloaded, in the bridge's
        log; the keeper's next staging acts on it."""

        def set_it() -> Deployment:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            self._record_change(standby_events(deployment, standby))
            return deployment

        return standby_response(await self._command(set_it), standby)

    async def set_priority(
        self, deployment_id: str, priority: int | None = None, preempt: bool | None = None
    ) -> CommandResponse:
        """Set the deployment's priority and whether it may preempt, in the bridge's log; the
        keeper's next steps order and preempt by it (docs/design.md §5.13)."""

        def set_it() -> Deployment:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            self._record_change(priority_events(deployment, priority, preempt))
            return deployment

        return priority_response(await self._command(set_it), priority, preempt)

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
        async with self._lock:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            if not self._follow.following:
                # Which instances are replaced is read from exo's State: not from a stale one.
                why = self._not_followed_why()
                raise ExoDownError(
                    f"Cannot change the options of {deployment.model_card.model_id} while exo's "
                    f"State is not followed ({why}): the instances to replace are chosen on it",
                    param="sharding",
                )
            events = options_events(deployment, sharding, instance_meta, min_nodes, self.state)
            self._record(events)
        return options_response(deployment, events)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        """Keep ``replicas`` instances of the deployment's model: DeploymentScaled in the
        bridge's log, and the instances the keeper removes doomed (deleted through exo's
        ``DELETE /instance/{id}`` from the next tick), as deletion does."""

        def scale() -> Deployment:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            if replicas < deployment.replicas and not self._follow.following:
                # Which instances go is read from exo's State: not from one that may be stale.
                why = self._not_followed_why()
                raise ExoDownError(
                    f"Cannot scale {deployment.model_card.model_id} down while exo's State is "
                    f"not followed ({why}): the instances to delete are chosen on it",
                    param="replicas",
                )
            events = scale_events(self.keeper, deployment_id, replicas, self.state)
            deletions = [event for event in events if isinstance(event, InstanceDeleted)]
            # Recorded first: if the log refuses it (503), no instance is doomed either.
            self._record_change(
                [event for event in events if not isinstance(event, InstanceDeleted)],
                doomed=[event.instance_id for event in deletions],
            )
            self._doom(deletions)
            self._creations.forget_refusal(deployment_id)
            return deployment

        deployment = await self._command(scale)
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
        return nodes_response(self.state, self.keeper)

    async def cordon_node(self, node: str) -> CommandResponse:
        """No new placement on the node: NodeCordoned in the bridge's log."""

        def cordon() -> tuple[str, list[AnyEvent]]:
            name = node_name_for(self.state, node)
            events = self.keeper.cordon(name, self.state)
            self._record_change(events)
            return name, events

        name, events = await self._command(cordon)
        return node_command_response(name, "cordoned", "is cordoned already", events)

    async def uncordon_node(self, node: str) -> CommandResponse:
        """NodeUncordoned in the log; a move under way is abandoned, its replacement doomed."""

        def uncordon() -> tuple[str, list[AnyEvent]]:
            name = node_name_for(self.state, node)
            events = self.keeper.uncordon(name, self.state)
            deletions = [e for e in events if isinstance(e, InstanceDeleted)]
            self._record_change(
                [e for e in events if not isinstance(e, InstanceDeleted)],
                doomed=[e.instance_id for e in deletions],
            )
            self._doom(deletions)
            return name, events

        name, events = await self._command(uncordon)
        return node_command_response(name, "uncordoned", "is not cordoned", events)

    async def drain_node(self, node: str, force: bool) -> CommandResponse:
        """NodeDrainStarted in the log; the ticks do the moving, through exo."""

        def drain() -> tuple[str, list[AnyEvent]]:
            name = node_name_for(self.state, node)
            events = self.keeper.drain(name, force, iso_utc(self._wall()), self.state)
            self._record_change(events)
            return name, events

        name, events = await self._command(drain)
        log.info("node %s: drain%s started", name, " (forced)" if force else "")
        return node_command_response(name, "draining", "is draining already", events)

    def _doom(self, deletions: Sequence[InstanceDeleted]) -> None:
        now = self.clock.monotonic()
        for event in deletions:
            # One still in flight to exo may land later: watched, and deleted if it does.
            if self._creations.drop(event.instance_id):
                self._doomed.add(event.instance_id, now, LATE_LANDING_WATCH_S)
            else:
                self._doomed.add(event.instance_id, now)

    # --- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rebuild the deployments from the log, then follow exo until cancelled."""
        if self._running:
            raise RuntimeError("this bridge is already running")
        clock = self._started.start_clock()
        self._store.open()
        now = clock.monotonic()
        self._doomed.load(now)
        self.webhooks.open()
        self._start_keeper(now, self.config.startup_grace_s)
        self._running = True
        log.info(
            "following exo at %s (of %s): %d deployment(s), %d instance(s) to delete",
            self.exo.url,
            ", ".join(api.url for api in self.exo_apis),
            len(self._own.deployments),
            len(self._doomed),
        )
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self.webhooks.run)  # deliveries: never in the tick's way
                if self._shared is not None:
                    # The live view and the leadership run beside the ticks.
                    group.start_soon(self._shared.watch)
                    group.start_soon(self._shared.campaign)
                task_status.started()
                await self._ticks(clock)
        finally:
            self._running = False
            if self._acting is None or self._acting.was_acting:
                self._creations.drop_all(clock.monotonic())
            self.webhooks.close()
            self._store.close()

    async def _ticks(self, clock: Clock) -> None:
        while True:
            started = clock.monotonic()
            try:
                await self.tick()
            except Exception as exc:  # a bug must not stop the deployments being kept
                self._step_failed(exc)
            else:
                self._steps.succeeded()
            await clock.sleep(max(0.0, self.config.poll_interval_s - (clock.monotonic() - started)))

    async def tick(self) -> None:
        """Read exo's State; if it answered, settle, delete what is doomed and step the keeper."""
        exo = await self._follow.read()
        if exo is None:
            return
        self._follow.available(exo)
        self._cards.saw_all(exo.cards)
        if self._acting is not None:
            try:
                if not self._acting.may_act(exo):
                    return
                await self._acting_tick(exo)
                self._acting.forget_settled_intents()
            except (NotActingError, StoreError) as exc:
                log.warning("step stopped: %s", exc)
            except EtcdUnavailableError as exc:
                # Not a failing step: the store's outage, which every deployment already names.
                self._acting.store.unreachable(str(exc))
            return
        await self._acting_tick(exo)

    async def _acting_tick(self, exo: ExoState) -> None:
        async with self._lock:
            now = self.clock.monotonic()
            self._creations.settle(exo, now)
            self._record_vanished(exo, now)
            self._record_serving()
            await self._delete_doomed(exo, now)
            if self._follow.outage is not None:
                return  # exo stopped answering meanwhile: this State may already be stale
            await self._creations.resend(exo, now)
            # The step's plan: what it will try to place, exo's answers for exactly those, then
            # the step placing from those answers only (keeper.bridge.placing).
            state = self.state
            due = due_for_placement(state, self.keeper.timers(state, now))
            try:
                answers = await ask_exo(self.exo, self._cards, state, due)
            except ExoUnavailableError as exc:
                self._follow.unavailable(str(exc))
                return
            if self._follow.outage is not None:
                return
            events = self._placement.step(self.keeper, answers, state, now)
            await self._act(events, answers, now)

    def _step_failed(self, exc: Exception) -> None:
        # /healthz and every deployment say so until a step goes through; each distinct error
        # is logged once, with its traceback, not once a second.
        if self._steps.failed(exc, self._wall()):
            log.error(
                "a step of the bridge failed (every deployment says so); retrying every poll",
                exc_info=exc,
            )

    def _record_vanished(self, exo: ExoState, now: float) -> None:
        """InstanceDeleted in the bridge's log for each recorded instance exo deleted (only
        believed from a readable State, and once it lasts: ``keeper.bridge.vanished``)."""
        recorded = [
            instance_id
            for _, deployment in sorted(self._own.deployments.items())
            for instance_id in deployment.placed_instance_ids
        ]
        gone = self._vanished.gone(recorded, exo.state, now)
        if gone:
            log.info("exo no longer runs instance(s) %s: recorded as deleted", ", ".join(gone))
            self._record([InstanceDeleted(instance_id=instance_id) for instance_id in gone])
            self._vanished.forget(gone)

    def _record_serving(self) -> None:
        """The serving records exo's new State calls for (``keeper.model.history``), in the bridge's
        log: its own State holds only the deployments, so it judges serving on the merged one,
        read only from a State exo answered in full. A record the log refuses is not lost: the
        next poll finds the same difference and records it then."""
        state = self.state
        changes = serving_changes(self._served, state, self._wall().timestamp())
        if changes:
            try:
                self._record(changes)
            except LogNotWritableError:
                return
        self._served = state

    async def _delete_doomed(self, exo: ExoState, now: float) -> None:
        for instance_id in self._doomed.due(frozenset(exo.state.instances), now):
            if self._acting is not None and not self._acting.fence_delete(instance_id):
                return  # no longer acting: the next acting bridge deletes it
            try:
                await self.exo.delete_instance(instance_id)
            except ExoUnavailableError as exc:
                self._follow.unavailable(str(exc))
                return
            except ExoRefusedError as exc:
                log.warning("exo refused to delete instance %s: %s", instance_id, exc.message)
            else:
                log.info("instance %s: deletion sent to exo", instance_id)
            self._doomed.accepted(instance_id, now)

    async def _act(self, events: Sequence[AnyEvent], answers: PlacementAnswers, now: float) -> None:
        """Turn the keeper's events into exo calls and the bridge's own records; an instance
        the keeper placed is posted as exo gave it in the step's ``answers``."""
        placed_for = {
            event.instance_id: event.deployment_id
            for event in events
            if isinstance(event, DeploymentPlaced)
        }
        staged = await self._staging.carry(self.exo, events)
        if staged:
            self._record(staged)
        for event in events:
            if isinstance(event, DownloadRequested | DownloadDeletionRequested):
                continue  # carried to exo above, recorded once exo took them
            if isinstance(event, InstanceCreated):
                instance_id = event.instance.instance_id
                deployment_id = placed_for.get(instance_id)
                if deployment_id is not None and not self._creations.held_back(deployment_id):
                    raw = answers.raw(instance_id)
                    await self._creations.create(instance_id, deployment_id, raw, now)
            elif isinstance(event, InstanceDeleted):
                self._doomed.add(event.instance_id, now)
            elif not isinstance(event, DeploymentPlaced):  # recorded once exo shows it
                if isinstance(event, DeploymentPlacementFailed):
                    # our placement's own reason
                    self._creations.forget_refusal(event.deployment_id)
                self._record([event])

    # --- the bridge's own log --------------------------------------------------------------

    def _fail(self, deployment: Deployment, error: str) -> None:
        current = self._own.deployments.get(deployment.deployment_id)
        if current is not None and current.placement_error != error:
            self._record(
                [DeploymentPlacementFailed(deployment_id=deployment.deployment_id, error=error)]
            )

    def _record(self, events: Sequence[AnyEvent]) -> None:
        """Number, log (durably) and apply the bridge's own events: the tick's records.

        Raises ``LogNotWritableError`` (a 503) with nothing applied if the log cannot take them.
        With a shared store they are fenced (written only while this bridge acts, else
        ``NotActingError``) and written after whatever another bridge wrote first.
        """
        if self._shared is not None:
            # A creation recorded as placed is no longer an intent: both in one write, so a
            # takeover never resumes (re-creates) an instance that landed and went since.
            placed = [f"intent/{e.instance_id}" for e in events if isinstance(e, DeploymentPlaced)]
            self._shared.commit_retrying(events, fenced=True, drop=placed)
            self._shared.snapshot_now_if_due()
            return
        self._store.commit_now(events)
        self._store.snapshot_now_if_due()

    def _record_change(self, events: Sequence[AnyEvent], doomed: Sequence[str] = ()) -> None:
        """A command's events (and, with a shared store, the instances it dooms, in the same
        write). Any bridge takes commands; with a shared store ``StoreMovedOnError`` means
        another wrote first: ``_command`` validates again on the newer State."""
        if self._shared is not None:
            self._shared.commit_now(events, doomed=doomed)
            return
        self._store.commit_now(events)
        self._store.snapshot_now_if_due()

    async def _command(self, body: Callable[[], _T]) -> _T:
        """Run a command's validate-and-record ``body`` under the lock, again on the newer
        State each time another bridge wrote first (a shared store's optimistic concurrency)."""
        async with self._lock:
            for _ in range(COMMAND_TRIES):
                try:
                    return body()
                except StoreMovedOnError:
                    continue
        raise StoreError("too many bridges wrote at once; nothing was changed, try again")

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
            ),
            self._store,
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
