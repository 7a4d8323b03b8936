"""The bridge: our keeper beside a stock exo master, acting only through exo's HTTP API.

Once a second (``poll_interval_s``) it reads exo's State (``GET /state``). Then, under one lock
that deployment deletion also takes, it settles what the last steps sent, and steps the keeper
on exo's State with the bridge's own deployments merged in:

- exo places, not the bridge (docs/bridge.md, "Placement"). The keeper stays the pure, unchanged
  one of our master; its placement function is the only seam. Before each step the bridge asks
  exo where it would place each deployment the step will try (the keeper's own timers say
  which: fewer instances than replicas, nothing to wait for): ``GET {exo}/instance/placement``,
  or for a model that already has an instance a preview on other nodes
  (``keeper.bridge.exo_placement``), else our placement on exo's State without the nodes
  serving it, with exo's full card. The step's synchronous placement function then returns
  that answer (refused if it uses a node the keeper left out), read into our model, or raises
  ``ValueError(<exo's reason>)``, so the keeper's in-flight, backoff and unplaceable
  rules (an error event only when the reason changes; a retry when the usable cluster changes
  and every 30 s) apply exactly as on our master. An exo without that endpoint (404/405) gets
  our placement, with exo's full model card only (never one rebuilt with exo's sampling and
  reasoning dialect left out): one exo showed, or its card file (``--model-cards``);
- the keeper's ``InstanceCreated`` becomes ``POST {exo}/instance`` with exo's JSON of that
  instance as exo gave it, its id included, so the id the keeper remembers is the one exo's
  State will show and the in-flight rules work unchanged. Its ``DeploymentPlaced`` is held back
  and recorded only when exo's State shows the instance: in our master both arrive in the State
  together, and the keeper reads "named by the deployment but not in the State" as "placed and
  already lost";
- exo refusing the instance anyway (400 "Insufficient memory ...": the cluster changed between
  the two calls) becomes the deployment's placement error; the keeper's placement timeout then
  paces the next try;
- ``InstanceDeleted`` (from a deletion or a scale-down) dooms the instance:
  ``DELETE {exo}/instance/{id}`` until exo's State shows it gone (``keeper.bridge.doomed``);
- a recorded instance (``placedInstanceIds``) that exo's readable States stop showing, for a
  while and not on an older State, gets ``InstanceDeleted`` in the bridge's log
  (``keeper.bridge.vanished``), so the record follows exo's own deletions;
- deployment events are the bridge's own: committed to the same event store the master uses
  (``keeper.runtime.event_store``: numbered, logged durably, applied, snapshotted, compacted)
  for a State that holds only deployments. While that log cannot be written (disk full,
  read-only) commands get a 503 naming the cause and the keeper is not stepped, as in the master.

Nothing is decided on a stale State: if the read fails (no answer, a 5xx, unreadable JSON), the
keeper is not stepped and the deployments say why ("exo unreachable since 12:03:04: ..."); the
next good read brings everything back by itself. The keeper's startup grace runs from the
bridge's own start, so after a restart exo's State (which still holds the instances) is read
before anything is placed; deployments come back from the log.

Nothing is decided on a State that lacks what the keeper decides on either. Our State model is
tolerant (a missing key reads as empty), which against someone else's exo fails open: a renamed
``instances`` reads as "every model lost". exo's State is read strictly (``keeper.exo_state``);
one that lacks ``instances``, ``runners``, ``topology`` or ``nodeMemory``, or has an instance
that does not parse, places nothing and deletes nothing, and the deployments say
"exo state unreadable since 12:03:04: <what was wrong>".

Elections (``keeper.bridge.in_flight``): exo holds commands while its nodes elect a master, so a
``POST /instance`` without an answer is not a failure. It stays in flight, is resent with the
same instance id (exo keys instances by id, so that is idempotent) and no other instance is sent
for its deployment until exo's State shows it or exo, answering again, has clearly dropped it;
one given up is doomed, so if it lands late after all, the extra is deleted.

Failover: the bridge may be given several exo URLs (any node's API serves exo's State and takes
its commands). It follows the first that answers and moves to the next when the one in use stops
answering; each step uses only the State read in that tick from the URL in use.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import anyio
from anyio.abc import TaskStatus

from keeper.api_models import CommandResponse, DeploymentsResponse, DeploymentView
from keeper.bridge import in_flight
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.exo_client import (
    NO_SUCH_ENDPOINT,
    ExoApi,
    ExoModels,
    ExoRefusedError,
    ExoState,
    ExoStateUnreadableError,
    ExoUnavailableError,
)
from keeper.bridge.exo_placement import (
    ExoPlacement,
    choose_apart,
    nodes_serving,
    preview_card,
    read_placement,
    read_previews,
)
from keeper.bridge.exo_wire import (
    JsonObject,
    exo_model_card,
    instance_json,
    listed_card,
)
from keeper.bridge.in_flight import LATE_LANDING_WATCH_S, Creation
from keeper.bridge.vanished import VanishedInstances
from keeper.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.cluster_view import models_instance_counts, node_names, without_nodes
from keeper.constants import STARTUP_GRACE
from keeper.core import DeploymentTimer
from keeper.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.placement import place_instance
from keeper.runtime.clock import AnyioClock, Clock, iso_utc
from keeper.runtime.deployments import (
    created_response,
    deleted_response,
    deployment_views,
    existing_deployment,
    new_deployment,
    scaled_response,
    shown,
)
from keeper.runtime.errors import (
    BadRequestError,
    MasterError,
    NotFoundError,
    NotRunningError,
)
from keeper.runtime.event_log import FileOps
from keeper.runtime.event_store import EventStore
from keeper.runtime.hosted_keeper import KeeperFactory, KeeperLike, default_keeper, start_keeper
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


class ExoDownError(MasterError):
    """A request that needs exo's answer while exo does not give one."""

    status_code = 503


UNREACHABLE = "unreachable"
STATE_UNREADABLE = "state unreadable"


@dataclass(frozen=True)
class Outage:
    since: datetime  # wall clock, UTC
    reason: str
    # UNREACHABLE: no usable answer; STATE_UNREADABLE: a State lacking what the keeper decides on.
    kind: str = UNREACHABLE


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
    ) -> None:
        # One exo API per URL given, in order of preference; ``exo`` is the one in use.
        self.exo_apis: tuple[ExoApi, ...] = tuple(exo) if isinstance(exo, Sequence) else (exo,)
        if not self.exo_apis:
            raise ValueError("the bridge needs at least one exo URL")
        self._in_use = 0
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
        self._pending: dict[str, Creation] = {}  # instance id -> its creation, in flight
        self._refused: dict[str, str] = {}  # deployment id -> the instance exo refused last
        # Where exo would place each model the keeper may try to place in this step (or why it
        # cannot), asked before the step; and the JSON of the instances the keeper took, by id,
        # to be posted exactly as exo gave them.
        self._answers: dict[str, ExoPlacement | str] = {}
        self._to_post: dict[str, JsonObject] = {}
        self._doomed = DoomedInstances(self.data_dir)
        self._vanished = VanishedInstances()
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
    def exo(self) -> ExoApi:
        """The exo API in use: the State of each step is read from it, commands go to it."""
        return self.exo_apis[self._in_use]

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
        outage = self._outage
        if outage is not None:
            since = outage.since.astimezone().strftime("%H:%M:%S")
            return f"exo {outage.kind} since {since}: {outage.reason}"
        if self._exo is None:
            return "waiting for exo's first answer"
        for instance_id, creation in self._pending.items():
            if creation.deployment_id == deployment_id:
                return in_flight.detail(instance_id, creation, self.clock.monotonic())
        if deployment_id in self._refused:
            return "exo refused the last placement (see the placement error)"
        return None

    def health(self) -> dict[str, Any]:
        outage = self._outage
        status = "degraded" if self._store.write_error is not None else "ok"
        return {
            "status": status if self._running else "stopped",
            "exo": {
                "url": self.exo.url,  # the one in use
                "urls": [api.url for api in self.exo_apis],
                "reachable": self._exo is not None
                and (outage is None or outage.kind != UNREACHABLE),
                "state_readable": self._exo is not None and outage is None,
                "unreachable_since": iso_utc(outage.since) if outage is not None else None,
                "reason": outage.reason if outage is not None else None,
                "outage": outage.kind if outage is not None else None,
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
        replicas: int = 1,
    ) -> CommandResponse:
        card = await self._deployment_card(model_id)
        async with self._lock:
            deployment = new_deployment(
                self._own.deployments, card, sharding, instance_meta, min_nodes, replicas=replicas
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
            # Instances sent to exo for it that exo may still apply are deleted too, whenever
            # they land (an unanswered POST may be applied after an election).
            for instance_id, creation in list(self._pending.items()):
                if creation.deployment_id == deployment_id:
                    self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
                    del self._pending[instance_id]
            for event in events:
                if isinstance(event, InstanceDeleted):
                    self._doomed.add(event.instance_id, now)
            self._refused.pop(deployment_id, None)
            # The DELETEs go out with the next tick, on the State it reads: not on an older
            # State, and not while the caller waits (exo may hold commands for seconds).
        log.info("deployment %s of %s deleted", deployment_id, deployment.model_card.model_id)
        return deleted_response(deployment)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        """Keep ``replicas`` instances of the deployment's model: DeploymentScaled in the
        bridge's log, and the instances the keeper removes doomed (deleted through exo's
        ``DELETE /instance/{id}`` from the next tick), as deletion does."""
        async with self._lock:
            deployment = existing_deployment(self._own.deployments, deployment_id)
            if replicas < deployment.replicas and (self._exo is None or self._outage is not None):
                # Which instances go is read from exo's State: not from one that may be stale.
                why = self._outage.reason if self._outage is not None else "no answer yet"
                raise ExoDownError(
                    f"Cannot scale {deployment.model_card.model_id} down while exo's State is "
                    f"not followed ({why}): the instances to delete are chosen on it",
                    param="replicas",
                )
            now = self.clock.monotonic()
            try:
                events = self.keeper.scale(deployment_id, replicas, self.state)
            except ValueError as exc:
                raise BadRequestError(str(exc), param="replicas") from None
            # Recorded first: if the log refuses it (503), no instance is doomed either.
            self._record([event for event in events if not isinstance(event, InstanceDeleted)])
            for event in events:
                if isinstance(event, InstanceDeleted):
                    # One still in flight to exo may land later: watched, and deleted if it does.
                    if self._pending.pop(event.instance_id, None) is not None:
                        self._doomed.add(event.instance_id, now, LATE_LANDING_WATCH_S)
                    else:
                        self._doomed.add(event.instance_id, now)
            self._refused.pop(deployment_id, None)
        log.info(
            "deployment %s of %s scaled from %d to %d replica(s)",
            deployment_id,
            deployment.model_card.model_id,
            deployment.replicas,
            replicas,
        )
        return scaled_response(deployment, replicas)

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
        # exo's own card when the bridge has one, else the catalog's, else exo's card from a
        # preview; else only what exo's list gives, the figures it lacks 0 (unknown): exo places
        # the model with its own card whatever this one says (docs/bridge.md, "Placement").
        for card in (self._known_card(model_id), self.catalog.get(model_id)):
            if card is not None:
                return card
        previewed = await self._previewed_card(model_id)
        return previewed if previewed is not None else listed_card(listed)

    def _known_card(self, model_id: str) -> ModelCard | None:
        card = self._full_card(model_id)
        if card is None:
            return None
        try:
            return exo_model_card(card)
        except ValueError:
            return None

    async def _previewed_card(self, model_id: str) -> ModelCard | None:
        """exo's card of the model from ``GET /instance/previews``, if a preview places it."""
        try:
            card = preview_card(read_previews(await self.exo.previews(model_id)), model_id)
            if card is None:
                return None
            found = exo_model_card(card)
        except (ExoRefusedError, ExoUnavailableError, ValueError) as exc:
            log.info("no model card of %s from exo's placement previews: %s", model_id, exc)
            return None
        self._cards_seen[model_id] = card
        return found

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
            start_keeper(self._keeper_factory, now, self.config.startup_grace_s, self._place),
            self._store,
        )
        self._running = True
        log.info(
            "following exo at %s (of %s): %d deployment(s), %d instance(s) to delete",
            self.exo.url,
            ", ".join(api.url for api in self.exo_apis),
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
            # What exo may still apply is not followed after this: if it lands, delete it (the
            # next run, after its grace, places again if need be).
            for instance_id in list(self._pending):
                self._doomed.add(instance_id, clock.monotonic(), LATE_LANDING_WATCH_S)
            self._pending.clear()
            self._store.close()

    async def tick(self) -> None:
        """Read exo's State; if it answered, settle, delete what is doomed and step the keeper."""
        exo = await self._read_state()
        if exo is None:
            return
        self._exo_available(exo)
        async with self._lock:
            now = self.clock.monotonic()
            self._settle_placements(exo, now)
            self._record_vanished(exo, now)
            await self._delete_doomed(exo, now)
            if self._outage is not None:
                return  # exo stopped answering meanwhile: this State may already be stale
            await self._resend_creations(exo, now)
            await self._ask_where_to_place(now)
            if self._outage is not None:
                return
            events = self.keeper.step(self.state, now)
            self._last_error = None
            await self._act(events, now)

    async def _read_state(self) -> ExoState | None:
        """This tick's State, from the URL in use, or from the next URL that answers (which is
        then in use). None, with the outage recorded, when no URL gives a State to act on."""
        failures: list[str] = []
        count = len(self.exo_apis)
        for offset in range(count):
            index = (self._in_use + offset) % count
            api = self.exo_apis[index]
            try:
                exo = await api.state()
            except ExoStateUnreadableError as exc:
                # exo answers, with a State the keeper cannot act on: no reason to leave it.
                self._switch_to(index)
                self._exo_unavailable(str(exc), STATE_UNREADABLE)
                return None
            except ExoUnavailableError as exc:
                failures.append(str(exc))
                continue
            self._switch_to(index)
            return exo
        self._exo_unavailable("; ".join(failures))
        return None

    def _switch_to(self, index: int) -> None:
        if index != self._in_use:
            log.warning(
                "exo at %s stopped answering; following exo at %s",
                self.exo.url,
                self.exo_apis[index].url,
            )
            self._in_use = index
            self._vanished.restart_counts()

    def _exo_available(self, exo: ExoState) -> None:
        if self._outage is not None:
            log.info(
                "exo at %s gives a State to act on again (%s since %s)",
                self.exo.url,
                self._outage.kind,
                iso_utc(self._outage.since),
            )
            self._outage = None
        self._exo = exo
        self._cards_seen.update(exo.cards)

    def _exo_unavailable(self, reason: str, kind: str = UNREACHABLE) -> None:
        outage = self._outage
        if outage is None or outage.kind != kind:
            log.warning("exo %s, placing and deleting nothing: %s", kind, reason)
            self._outage = Outage(self.clock.wall(), reason, kind)
        else:
            self._outage = replace(outage, reason=reason)

    def _report_error(self, exc: Exception) -> None:
        # Each distinct error is logged once, with its trace, not once a second.
        described = f"{type(exc).__name__}: {exc}"
        if described != self._last_error:
            log.error("a step of the bridge failed; retrying every poll", exc_info=exc)
            self._last_error = described

    def _settle_placements(self, exo: ExoState, now: float) -> None:
        """Record DeploymentPlaced for instances exo now shows; give up on ones it dropped."""
        for instance_id, creation in list(self._pending.items()):
            deployment = self._own.deployments.get(creation.deployment_id)
            if deployment is None:
                del self._pending[instance_id]
                self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
            elif instance_id in exo.state.instances:
                del self._pending[instance_id]
                if deployment.instance_id != instance_id:
                    self._record(
                        [
                            DeploymentPlaced(
                                deployment_id=creation.deployment_id, instance_id=instance_id
                            )
                        ]
                    )
            elif in_flight.given_up(creation, now):
                del self._pending[instance_id]
                # Should it land after all (after the keeper placed another), it is deleted.
                self._doomed.add(instance_id, now, LATE_LANDING_WATCH_S)
                log.warning(
                    "exo never showed instance %s of deployment %s (sent %d time(s)); "
                    "the keeper places again",
                    instance_id,
                    creation.deployment_id,
                    creation.sends,
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

    async def _resend_creations(self, exo: ExoState, now: float) -> None:
        """POST again, same body, each creation exo has not shown for a while (in_flight)."""
        for instance_id, creation in list(self._pending.items()):
            if instance_id not in exo.state.instances and in_flight.resend_due(creation, now):
                self._pending[instance_id] = in_flight.resent(creation, now)
                await self._post_creation(instance_id)

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
                if deployment_id is not None and not self._held_back(deployment_id):
                    await self._create(event.instance, deployment_id, now)
            elif isinstance(event, InstanceDeleted):
                self._doomed.add(event.instance_id, now)
            elif not isinstance(event, DeploymentPlaced):  # recorded once exo shows it
                if isinstance(event, DeploymentPlacementFailed):
                    self._refused.pop(event.deployment_id, None)  # our placement's own reason
                self._record([event])

    async def _create(self, instance: AnyInstance, deployment_id: str, now: float) -> None:
        deployment = self._own.deployments.get(deployment_id)
        raw = self._to_post.pop(instance.instance_id, None)
        if deployment is None or raw is None:
            return
        instance_id = instance.instance_id
        # In flight before the call: if the answer is lost, exo may still have taken it. The body
        # is exo's own placement, exactly as exo gave it (docs/bridge.md, "Placement").
        self._pending[instance_id] = in_flight.first_send(deployment_id, {"instance": raw}, now)
        await self._post_creation(instance_id)

    def _held_back(self, deployment_id: str) -> bool:
        """Whether an instance sent for the deployment may still land: then no other is sent."""
        for instance_id, creation in self._pending.items():
            if creation.deployment_id == deployment_id:
                log.warning(
                    "not sending another instance for deployment %s: instance %s may still land",
                    deployment_id,
                    instance_id,
                )
                return True
        return False

    async def _post_creation(self, instance_id: str) -> None:
        """POST one creation in flight and file exo's answer, or its silence, on it."""
        creation = self._pending[instance_id]
        deployment = self._own.deployments.get(creation.deployment_id)
        model_id = deployment.model_card.model_id if deployment is not None else "?"
        try:
            answer = await self.exo.create_instance(dict(creation.body))
        except ExoRefusedError as exc:
            if creation.sends == 1:  # exo said no to the only POST: nothing of it can land
                del self._pending[instance_id]
                self._refused[creation.deployment_id] = instance_id
                log.warning("exo refused instance %s of %s: %s", instance_id, model_id, exc.message)
                if deployment is not None:
                    self._fail(deployment, exc.message)
                return
            # An earlier POST of it may still be applied: it stays in flight.
            self._settled_answer(instance_id)
            log.warning("exo refused instance %s again: %s", instance_id, exc.message)
        except ExoUnavailableError as exc:
            # Not a failure: exo may be holding it through an election, and apply it after.
            current = self._pending.get(instance_id)
            if current is not None:
                self._pending[instance_id] = in_flight.unanswered(current)
            log.warning(
                "instance %s of %s: no answer to POST /instance (%s); it stays in flight and "
                "is sent again",
                instance_id,
                model_id,
                exc,
            )
        else:
            self._settled_answer(instance_id)
            self._refused.pop(creation.deployment_id, None)
            card: Any = answer.get("model_card")  # exo's full card of the model it took
            if isinstance(card, dict) and cast(JsonObject, card).get("modelId") == model_id:
                self._cards_seen[model_id] = cast(JsonObject, card)
            log.info(
                "placing %s (deployment %s): instance %s sent to exo at %s%s",
                model_id,
                creation.deployment_id,
                instance_id,
                self.exo.url,
                f" (time {creation.sends})" if creation.sends > 1 else "",
            )

    def _settled_answer(self, instance_id: str) -> None:
        current = self._pending.get(instance_id)
        if current is not None:
            self._pending[instance_id] = in_flight.answered(current, self.clock.monotonic())

    # --- placement (docs/bridge.md, "Placement") -------------------------------------------

    async def _ask_where_to_place(self, now: float) -> None:
        """Ask exo where to place each deployment the keeper will try to place in this step:
        those with fewer instances than replicas and nothing to wait for (the keeper's own
        timers say which)."""
        state = self.state
        timers = self.keeper.timers(state, now)
        counts = models_instance_counts(state)
        self._answers.clear()
        self._to_post.clear()
        for deployment_id, deployment in sorted(state.deployments.items()):
            timer = timers.get(deployment_id)
            model_id = deployment.model_card.model_id
            if (
                timer is None
                or timer.waiting is not None
                or counts.get(model_id, 0) >= deployment.replicas
            ):
                continue
            try:
                self._answers[model_id] = await self.where_to_place(deployment, state)
            except ExoUnavailableError as exc:
                self._exo_unavailable(str(exc))
                return

    async def where_to_place(self, deployment: Deployment, state: State) -> ExoPlacement | str:
        """Where exo would place a new instance of the deployment on ``state`` (exo's), or why
        not. With an instance of the model already there, one on other nodes: from exo's
        previews, else ours on exo's State without the nodes serving the model; with none,
        exo's own placement; from an exo without these endpoints, ours."""
        model_id = deployment.model_card.model_id
        sharding, meta = deployment.sharding.value, deployment.instance_meta.value
        serving = nodes_serving(state, model_id)
        apart = without_nodes(state, serving)
        try:
            if serving:
                previews = read_previews(await self.exo.previews(model_id))
                placement = choose_apart(
                    previews, state, model_id, sharding, meta, deployment.min_nodes
                )
                if placement is None:
                    # exo places by its own preference, which knows nothing of replicas: ours,
                    # on the nodes apart, with exo's full card (its previews carry it).
                    card = preview_card(previews, model_id)
                    if card is not None:
                        self._cards_seen[model_id] = card
                    ours = self._place_ourselves(deployment, apart)
                    if isinstance(ours, str):
                        return (
                            f"exo offers no {sharding}/{meta} placement of {model_id} apart "
                            f"from its other instances, nor does ours: {ours}"
                        )
                    return ours
            else:
                answer = await self.exo.placement(model_id, sharding, meta, deployment.min_nodes)
                placement = read_placement(answer, model_id, state)
        except ExoRefusedError as exc:
            if exc.status in NO_SUCH_ENDPOINT:
                return self._place_ourselves(deployment, apart)
            return exc.message
        except ValueError as exc:
            return f"exo's placement of {model_id} cannot be used: {exc}"
        self._cards_seen[model_id] = placement.card
        return placement

    def _place_ourselves(self, deployment: Deployment, state: State) -> ExoPlacement | str:
        """Our placement on ``state`` (exo's, without the nodes serving the model), where exo
        cannot tell where it would place: with exo's full card of the model, never one rebuilt
        with exo's sampling and dialect left out."""
        model_id = deployment.model_card.model_id
        card = self._full_card(model_id)
        if card is None:
            return (
                f"exo at {self.exo.url} does not place for the bridge (no GET /instance/placement "
                f"or /instance/previews answer to use) and has shown no model card of {model_id} "
                "to place it with: start the bridge with --model-cards DIR holding the model's "
                "exo model-card .toml"
            )
        try:
            instance = place_instance(
                state,
                exo_model_card(card),
                deployment.sharding,
                deployment.instance_meta,
                deployment.min_nodes,
            )
        except ValueError as exc:
            return str(exc)
        return ExoPlacement(instance=instance, raw=instance_json(instance, card), card=card)

    def _full_card(self, model_id: str) -> JsonObject | None:
        """exo's full card of the model: one exo showed, else its card file."""
        seen = self._cards_seen.get(model_id)
        return seen if seen is not None else self.config.exo_card_files.get(model_id)

    def _place(
        self,
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        """The keeper's placement: the answer asked of exo before this step (module doc)."""
        answer = self._answers.get(model_card.model_id)
        if answer is None:  # the keeper's timers and its step disagree: a bug, reported as such
            raise RuntimeError(f"no placement of {model_card.model_id} was asked of exo")
        if isinstance(answer, str):
            raise ValueError(answer)
        # The keeper hands placement exo's State without the nodes serving the model; the
        # answer was chosen before, on exo's whole State: it must use none of the nodes left out
        # (a node exo knows and its State does not show yet is exo's to judge).
        whole = self.state.topology.nodes
        left_out = frozenset(whole) - frozenset(state.topology.nodes)
        used = left_out & answer.instance.shard_assignments.node_to_runner.keys()
        if used:
            raise ValueError(
                f"exo's placement of {model_card.model_id} uses {node_names(self.state, used)}, "
                "which the keeper left out (they serve it already)"
            )
        self._to_post[answer.instance.instance_id] = answer.raw
        return answer.instance

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

    def scale(self, deployment_id: str, replicas: int, state: State) -> list[AnyEvent]:
        return self._keeper.scale(deployment_id, replicas, state)

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        return self._keeper.timers(state, now)
