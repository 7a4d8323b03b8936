"""The bridge: our keeper beside a stock exo master, acting only through exo's HTTP API.

Once a second (``poll_interval_s``) it reads exo's State (``GET /state``). Then, under one lock
that deployment deletion also takes, it settles what the last steps sent, and steps the keeper
on exo's State with the bridge's own deployments merged in:

- the keeper's ``InstanceCreated`` becomes ``POST {exo}/instance`` with exactly that instance
  (``keeper.bridge.exo_wire``), so the bridge knows its id before exo does and the keeper's
  in-flight rules work unchanged. Its ``DeploymentPlaced`` is held back and recorded only when
  exo's State shows the instance: in our master both arrive in the State together, and the
  keeper reads "named by the deployment but not in the State" as "placed and already lost";
- exo refusing the instance (400 "Insufficient memory ...") becomes the deployment's placement
  error; the keeper's placement timeout then paces the next try;
- ``InstanceDeleted`` (from a deletion) dooms the instance: ``DELETE {exo}/instance/{id}`` until
  exo's State shows it gone (``keeper.bridge.doomed``);
- deployment events are the bridge's own: committed to the same event store the master uses
  (``keeper.master.event_store``: numbered, logged durably, applied, snapshotted, compacted) for
  a State that holds only deployments. While that log cannot be written (disk full, read-only)
  commands get a 503 naming the cause and the keeper is not stepped, as in the master.

Nothing is decided on a stale State: if the read fails (no answer, a 5xx, unreadable JSON), the
keeper is not stepped and the deployments say why ("exo unreachable since 12:03:04: ..."); the
next good read brings everything back by itself. The keeper's startup grace runs from the
bridge's own start, so after a restart exo's State (which still holds the instances) is read
before anything is placed; deployments come back from the log.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskStatus

from keeper.api_models import CommandResponse, DeploymentsResponse, DeploymentView
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.exo_client import (
    ExoApi,
    ExoModels,
    ExoRefusedError,
    ExoState,
    ExoUnavailableError,
)
from keeper.bridge.exo_wire import JsonObject, create_instance_body, deployment_card, exo_card
from keeper.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.constants import PLACEMENT_TIMEOUT, STARTUP_GRACE
from keeper.core import DeploymentTimer
from keeper.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.master.clock import AnyioClock, Clock, iso_utc
from keeper.master.deployments import (
    created_response,
    deleted_response,
    deployment_views,
    existing_deployment,
    new_deployment,
    shown,
)
from keeper.master.errors import (
    BadRequestError,
    MasterError,
    NotFoundError,
    NotRunningError,
)
from keeper.master.event_log import FileOps
from keeper.master.event_store import EventStore
from keeper.master.hosted_keeper import KeeperFactory, KeeperLike, default_keeper, start_keeper
from keeper.placement import place_instance
from keeper.state import (
    AnyInstance,
    Deployment,
    InstanceMeta,
    ModelCard,
    Sharding,
    State,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BridgeConfig:
    # How often exo's State is read and the keeper stepped (SPEC §3: the keeper steps once a
    # second; a step on an older State would place against what exo no longer holds).
    poll_interval_s: float = 1.0
    # Before this long after the bridge starts nothing is placed (SPEC §3 "New master"): exo's
    # State must be read first, or a restarted bridge would duplicate what exo already runs.
    startup_grace_s: float = STARTUP_GRACE
    # exo's model list changes only when someone adds a model card; re-read it this often (and
    # at once when a model it did not list is asked for).
    models_max_age_s: float = 60.0
    # Layer counts and sizes for models exo lists without them (exo's GET /models has none).
    model_cards: tuple[ModelCard, ...] = BUILTIN_MODEL_CARDS
    # exo's own card files (``--model-cards DIR``) in exo's JSON spelling, by model id: what
    # exo knows of a model beyond its list entry (see ``keeper.bridge.exo_wire``).
    exo_card_files: Mapping[str, JsonObject] = field(default_factory=dict[str, JsonObject])
    # The bridge logs only deployment events (a few a minute): a snapshot, and the compaction
    # after it, every thousand keep restart instant and the log small.
    snapshot_every_events: int = 1_000


class ExoDownError(MasterError):
    """A request that needs exo's answer while exo does not give one."""

    status_code = 503


@dataclass(frozen=True)
class Outage:
    since: datetime  # wall clock, UTC
    reason: str


@dataclass(frozen=True)
class _Pending:
    """An instance exo accepted (or may have) that its State does not show yet."""

    deployment_id: str
    posted_at: float


class Bridge:
    """The bridge service. Construct anywhere; ``run`` inside an event loop (module doc)."""

    def __init__(
        self,
        exo: ExoApi,
        data_dir: Path | None,
        clock: Clock | None = None,
        config: BridgeConfig | None = None,
        *,
        keeper_factory: KeeperFactory = default_keeper,
        file_ops: FileOps | None = None,
    ) -> None:
        self.exo = exo
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.config = config if config is not None else BridgeConfig()
        self.catalog = catalog_by_id(self.config.model_cards)
        self._clock = clock
        self._keeper_factory = keeper_factory
        self._keeper: KeeperLike | None = None
        self._last_error: str | None = None
        # The bridge's deployments: the log's State (``_own``).
        self._store = EventStore(
            self.data_dir, snapshot_every=self.config.snapshot_every_events, file_ops=file_ops
        )
        self._lock = anyio.Lock()
        self._exo: ExoState | None = None  # the last good read of exo's State
        self._outage: Outage | None = None
        self._merged: tuple[ExoState | None, State, State] | None = None
        self._state_body: tuple[ExoState, State, bytes] | None = None
        self._cards_seen: dict[str, JsonObject] = {}
        self._models: ExoModels | None = None
        self._models_at = 0.0
        self._pending: dict[str, _Pending] = {}
        self._refused: dict[str, str] = {}  # deployment id -> the instance exo refused last
        self._doomed = DoomedInstances(self.data_dir)
        self._running = False

    # --- read side -------------------------------------------------------------------------

    @property
    def _own(self) -> State:
        return self._store.state

    @property
    def write_error(self) -> str | None:
        """Why the bridge's log cannot be written now (its commands are refused), or None."""
        return self._store.write_error

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            raise NotRunningError("the bridge is not running yet")
        return self._clock

    @property
    def keeper(self) -> KeeperLike:
        if self._keeper is None:
            raise NotRunningError("the bridge is not running yet")
        return self._keeper

    @property
    def running(self) -> bool:
        return self._running

    @property
    def outage(self) -> Outage | None:
        """Why exo's State is not being followed right now, or None when it is."""
        return self._outage

    @property
    def doomed_instances(self) -> list[str]:
        return self._doomed.ids()

    @property
    def state(self) -> State:
        """exo's State as last read, with the bridge's deployments in it."""
        cached = self._merged
        if cached is not None and cached[0] is self._exo and cached[1] is self._own:
            return cached[2]
        base = self._exo.state if self._exo is not None else State()
        merged = base.model_copy(update={"deployments": self._own.deployments})
        self._merged = (self._exo, self._own, merged)
        return merged

    def state_json(self) -> bytes:
        """exo's State JSON as exo sent it (every key kept), with ``deployments`` set to ours."""
        exo = self._exo
        if exo is None:
            reason = self._outage.reason if self._outage is not None else "no answer yet"
            raise ExoDownError(f"exo at {self.exo.url} has not answered yet: {reason}")
        cached = self._state_body
        if cached is not None and cached[0] is exo and cached[1] is self._own:
            return cached[2]
        document: dict[str, Any] = dict(exo.raw)
        document["deployments"] = {
            deployment_id: deployment.model_dump(mode="json")
            for deployment_id, deployment in self._own.deployments.items()
        }
        body = json.dumps(document, separators=(",", ":")).encode()
        self._state_body = (exo, self._own, body)
        return body

    def deployments_view(self) -> DeploymentsResponse:
        views = deployment_views(self.state, self._keeper, self._clock, self._detail)
        return DeploymentsResponse(deployments=[self._with_refusal(view) for view in views])

    def deployments_json(self) -> bytes:
        """``deployments_view()`` as JSON, the ``GET /deployments`` body."""
        return self.deployments_view().model_dump_json().encode()

    def _with_refusal(self, view: DeploymentView) -> DeploymentView:
        # exo said no to the keeper's placement; the keeper tries again after this wait.
        if view.waiting == "placement_in_flight" and view.deployment.deployment_id in self._refused:
            return view.model_copy(update={"waiting": "unplaceable_retry"})
        return view

    def _detail(self, deployment_id: str) -> str | None:
        if self._outage is not None:
            since = self._outage.since.astimezone().strftime("%H:%M:%S")
            return f"exo unreachable since {since}: {self._outage.reason}"
        if self._exo is None:
            return "waiting for exo's first answer"
        for instance_id, pending in self._pending.items():
            if pending.deployment_id == deployment_id:
                return f"instance {instance_id[:8]} sent to exo; waiting for exo's State to show it"
        if deployment_id in self._refused:
            return "exo refused the last placement (see the placement error)"
        return None

    def health(self) -> dict[str, Any]:
        outage = self._outage
        status = "degraded" if self._store.write_error is not None else "ok"
        return {
            "status": status if self._running else "stopped",
            "exo": {
                "url": self.exo.url,
                "reachable": self._exo is not None and outage is None,
                "unreachable_since": iso_utc(outage.since) if outage is not None else None,
                "reason": outage.reason if outage is not None else None,
            },
            "deployments": len(self._own.deployments),
            "instances_to_delete": len(self._doomed),
            "event_log": {
                "writable": self._store.write_error is None,
                "error": self._store.write_error,
            },
        }

    # --- commands --------------------------------------------------------------------------

    async def models_body(self) -> bytes:
        """exo's ``GET /models`` answer, passed on (the last one read if exo is down now)."""
        try:
            models = await self.exo.models()
        except ExoUnavailableError as exc:
            if self._models is None:
                raise ExoDownError(f"exo's model list is not available: {exc}") from None
            return self._models.body
        self._models, self._models_at = models, self.clock.monotonic()
        return models.body

    async def create_deployment(
        self,
        model_id: str,
        sharding: Sharding | str = Sharding.PIPELINE,
        instance_meta: InstanceMeta | str = InstanceMeta.MLX_RING,
        min_nodes: int = 1,
    ) -> CommandResponse:
        card = await self._deployment_card(model_id)
        async with self._lock:
            deployment = new_deployment(
                self._own.deployments, card, sharding, instance_meta, min_nodes
            )
            self._record([DeploymentCreated(deployment=deployment)])
        log.info("deployment %s of %s created", deployment.deployment_id, model_id)
        return created_response(deployment)

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        async with self._lock:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            now = self.clock.monotonic()
            events = self.keeper.delete(deployment_id, self.state)
            # Recorded first: if the log refuses it (503), no instance is doomed either.
            self._record([event for event in events if not isinstance(event, InstanceDeleted)])
            # Instances sent to exo for it that exo may still apply are deleted too.
            for instance_id, pending in list(self._pending.items()):
                if pending.deployment_id == deployment_id:
                    self._doomed.add(instance_id, now)
                    del self._pending[instance_id]
            for event in events:
                if isinstance(event, InstanceDeleted):
                    self._doomed.add(event.instance_id, now)
            self._refused.pop(deployment_id, None)
            if self._exo is not None and self._outage is None:
                await self._delete_doomed(self._exo, now)
        log.info("deployment %s of %s deleted", deployment_id, deployment.model_card.model_id)
        return deleted_response(deployment)

    async def _deployment_card(self, model_id: str) -> ModelCard:
        try:
            models = await self._exo_models(need=model_id)
        except ExoUnavailableError as exc:
            raise ExoDownError(
                f"Cannot check {shown(model_id)} against exo's model list: {exc}",
                param="model_id",
            ) from None
        listed = models.listed.get(model_id)
        if listed is None:
            raise NotFoundError(
                f"Unknown model {shown(model_id)}: exo's GET /models does not list it",
                param="model_id",
            )
        try:
            return deployment_card(model_id, listed, self.catalog.get(model_id))
        except ValueError as exc:
            raise BadRequestError(str(exc), param="model_id") from None

    async def _exo_models(self, need: str | None = None) -> ExoModels:
        now = self.clock.monotonic()
        models = self._models
        if (
            models is None
            or now - self._models_at >= self.config.models_max_age_s
            or (need is not None and need not in models.listed)
        ):
            models = await self.exo.models()
            self._models, self._models_at = models, now
        return models

    # --- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Rebuild the deployments from the log, then follow exo until cancelled."""
        if self._running:
            raise RuntimeError("this bridge is already running")
        if self._clock is None:
            self._clock = AnyioClock()
        clock = self._clock
        self._store.open()
        now = clock.monotonic()
        self._doomed.load(now)
        self._keeper = _PausedWhileUnwritable(
            start_keeper(self._keeper_factory, now, self.config.startup_grace_s, place_instance),
            self._store,
        )
        self._running = True
        log.info(
            "following exo at %s: %d deployment(s), %d instance(s) to delete",
            self.exo.url,
            len(self._own.deployments),
            len(self._doomed),
        )
        try:
            task_status.started()
            while True:
                started = clock.monotonic()
                try:
                    await self.tick()
                except Exception as exc:  # a bug must not stop the deployments being kept
                    self._report_error(exc)
                await clock.sleep(
                    max(0.0, self.config.poll_interval_s - (clock.monotonic() - started))
                )
        finally:
            self._running = False
            self._store.close()

    async def tick(self) -> None:
        """Read exo's State; if it answered, settle, delete what is doomed and step the keeper."""
        try:
            exo = await self.exo.state()
        except ExoUnavailableError as exc:
            self._exo_unavailable(str(exc))
            return
        self._exo_available(exo)
        async with self._lock:
            now = self.clock.monotonic()
            self._settle_placements(exo, now)
            await self._delete_doomed(exo, now)
            if self._outage is not None:
                return  # exo stopped answering meanwhile: this State may already be stale
            events = self.keeper.step(self.state, now)
            self._last_error = None
            await self._act(events, now)

    def _exo_available(self, exo: ExoState) -> None:
        if self._outage is not None:
            log.info("exo answers again (unreachable since %s)", iso_utc(self._outage.since))
            self._outage = None
        self._exo = exo
        self._cards_seen.update(exo.cards)

    def _exo_unavailable(self, reason: str) -> None:
        if self._outage is None:
            log.warning("exo unavailable, placing nothing until it answers: %s", reason)
            self._outage = Outage(self.clock.wall(), reason)
        else:
            self._outage = replace(self._outage, reason=reason)

    def _report_error(self, exc: Exception) -> None:
        # Each distinct error is logged once, with its trace, not once a second.
        described = f"{type(exc).__name__}: {exc}"
        if described != self._last_error:
            log.error("a step of the bridge failed; retrying every poll", exc_info=exc)
            self._last_error = described

    def _settle_placements(self, exo: ExoState, now: float) -> None:
        """Record DeploymentPlaced for instances exo now shows; forget ones it never will."""
        for instance_id, pending in list(self._pending.items()):
            deployment = self._own.deployments.get(pending.deployment_id)
            if deployment is None:
                del self._pending[instance_id]
            elif instance_id in exo.state.instances:
                del self._pending[instance_id]
                if deployment.instance_id != instance_id:
                    self._record(
                        [
                            DeploymentPlaced(
                                deployment_id=pending.deployment_id, instance_id=instance_id
                            )
                        ]
                    )
            elif now >= pending.posted_at + PLACEMENT_TIMEOUT:
                del self._pending[instance_id]
                log.warning(
                    "exo never showed instance %s of deployment %s; the keeper places again",
                    instance_id,
                    pending.deployment_id,
                )

    async def _delete_doomed(self, exo: ExoState, now: float) -> None:
        for instance_id in self._doomed.due(frozenset(exo.state.instances), now):
            try:
                await self.exo.delete_instance(instance_id)
            except ExoUnavailableError as exc:
                self._exo_unavailable(str(exc))
                return
            except ExoRefusedError as exc:
                log.warning("exo refused to delete instance %s: %s", instance_id, exc.message)
            else:
                log.info("instance %s: deletion sent to exo", instance_id)
            self._doomed.accepted(instance_id, now)

    async def _act(self, events: Sequence[AnyEvent], now: float) -> None:
        """Turn the keeper's events into exo calls and the bridge's own records."""
        placed_for = {
            event.instance_id: event.deployment_id
            for event in events
            if isinstance(event, DeploymentPlaced)
        }
        for event in events:
            if isinstance(event, InstanceCreated):
                deployment_id = placed_for.get(event.instance.instance_id)
                if deployment_id is not None:
                    await self._create(event.instance, deployment_id, now)
            elif isinstance(event, InstanceDeleted):
                self._doomed.add(event.instance_id, now)
            elif not isinstance(event, DeploymentPlaced):  # recorded once exo shows it
                if isinstance(event, DeploymentPlacementFailed):
                    self._refused.pop(event.deployment_id, None)  # our placement's own reason
                self._record([event])

    async def _create(self, instance: AnyInstance, deployment_id: str, now: float) -> None:
        deployment = self._own.deployments.get(deployment_id)
        if deployment is None:
            return
        try:
            card = await self._exo_card(deployment)
        except ValueError as exc:
            self._fail(deployment, str(exc))
            return
        except ExoUnavailableError as exc:
            self._exo_unavailable(str(exc))
            return
        instance_id = instance.instance_id
        # Pending before the call: if the answer is lost, exo may still have taken it.
        self._pending[instance_id] = _Pending(deployment_id, now)
        try:
            await self.exo.create_instance(create_instance_body(instance, card))
        except ExoRefusedError as exc:
            del self._pending[instance_id]
            self._refused[deployment_id] = instance_id
            log.warning(
                "exo refused instance %s of %s: %s",
                instance_id,
                deployment.model_card.model_id,
                exc.message,
            )
            self._fail(deployment, exc.message)
        except ExoUnavailableError as exc:
            self._exo_unavailable(str(exc))
        else:
            self._refused.pop(deployment_id, None)
            log.info(
                "placing %s (deployment %s): instance %s sent to exo",
                deployment.model_card.model_id,
                deployment_id,
                instance_id,
            )

    async def _exo_card(self, deployment: Deployment) -> JsonObject:
        card = deployment.model_card
        seen = self._cards_seen.get(card.model_id)
        if seen is not None and seen.get("nLayers") == card.n_layers:
            return exo_card(card, None, seen)
        models = await self._exo_models(need=card.model_id)
        from_file = self.config.exo_card_files.get(card.model_id)
        return exo_card(card, models.listed.get(card.model_id), seen, from_file)

    def _fail(self, deployment: Deployment, error: str) -> None:
        current = self._own.deployments.get(deployment.deployment_id)
        if current is not None and current.placement_error != error:
            self._record(
                [DeploymentPlacementFailed(deployment_id=deployment.deployment_id, error=error)]
            )

    def _record(self, events: Sequence[AnyEvent]) -> None:
        """Number, log (durably) and apply the bridge's own events.

        Raises ``LogNotWritableError`` (a 503) with nothing applied if the log cannot take them.
        """
        self._store.commit_now(events)
        self._store.snapshot_now_if_due()


class _PausedWhileUnwritable:
    """The keeper, not stepped while the log cannot be written: the bridge sends a placement to
    exo BEFORE it records it, so every step first probes the disk (one small fsync a second),
    and stepping resumes by itself once a probe succeeds."""

    def __init__(self, keeper: KeeperLike, store: EventStore) -> None:
        self._keeper = keeper
        self._store = store

    def step(self, state: State, now: float) -> list[AnyEvent]:
        if not self._store.probe(always=True):
            return []
        return self._keeper.step(state, now)

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        return self._keeper.delete(deployment_id, state)

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        return self._keeper.timers(state, now)
