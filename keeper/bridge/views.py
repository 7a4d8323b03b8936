"""The bridge's read side: exo's State with the bridge's deployments in it, the deployments'
views, what-if's State, ``/healthz`` and what ``/metrics`` reads.

It reads every other piece (the exo follower, the log, the creations in flight, the steps'
failures, the shared store) and changes none, so the HTTP layer's reads take no lock: each
answer is built from what the pieces hold at that moment, the merged State cached per pair of
exo's State and the log's (``keeper.runtime.built.LastBuilt``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

from keeper.bridge.acting import SharedActing
from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import EtcdStore
from keeper.bridge.exo_client import ExoState
from keeper.bridge.following import UNREACHABLE, ExoDownError, ExoFollower
from keeper.bridge.health import (
    BridgeHealth,
    EventLogHealth,
    ExoHealth,
    HealthStatus,
    StepFailures,
    StepHealth,
    StoreHealth,
)
from keeper.bridge.metrics import ExoFacts
from keeper.bridge.node_liveness import BridgeLiveness
from keeper.bridge.own_log import OwnLog
from keeper.model.api_models import (
    DeploymentHistoryResponse,
    DeploymentsResponse,
    DeploymentView,
    RequestsView,
)
from keeper.model.exo_state import touched_deployments
from keeper.model.incident_chats import KeptChats
from keeper.model.state import State
from keeper.runtime.built import LastBuilt
from keeper.runtime.clock import iso_utc
from keeper.runtime.deployments import deployment_views, history_response
from keeper.runtime.front_door import ModelDeployment
from keeper.runtime.hosted_keeper import Started
from keeper.runtime.metrics import MetricsSnapshot
from keeper.runtime.model_deployment import model_deployment
from keeper.runtime.webhooks import Webhooks

Role = Literal["acting", "standby"]

# What the bridge's own State adds to exo's: its deployments and their serving records.
# The bridge's own keys in the State it serves: its deployments and their history from its log,
# and its verdicts on exo's nodes (suspect, dead: docs/design.md §5.18), cordons and drains, so
# that a TUI pointed at the bridge shows what the bridge acts on, as it does on our master.
_OWN_STATE_KEYS: set[str] = {"deployments", "serving_history", "node_watch", "cordoned", "drains"}


class BridgeView:
    """What the bridge answers reads with (module doc)."""

    def __init__(
        self,
        *,
        name: str,
        log: OwnLog,
        follow: ExoFollower,
        started: Started,
        creations: Creations,
        doomed: DoomedInstances,
        steps: StepFailures,
        webhooks: Webhooks,
        acting: SharedActing | None,
        running: Callable[[], bool],
        role: Callable[[], Role],
        liveness: BridgeLiveness,
    ) -> None:
        self._name = name
        self._log = log
        self._follow = follow
        self._started = started
        self._creations = creations
        self._doomed = doomed
        self._steps = steps
        self._webhooks = webhooks
        self._acting = acting
        self._running = running
        self._role = role
        self._liveness = liveness
        self._merged = LastBuilt[State]()  # exo's State with our deployments
        self._state_body = LastBuilt[bytes]()  # exo's State JSON with our deployments
        self._door_views = LastBuilt[list[DeploymentView]]()  # what the front door reads
        self._touched = LastBuilt[dict[str, str]]()  # deployments exo's unread parts concern
        # A deployment's chats through the front door (set by the bridge once it has one).
        self.requests: Callable[[str], RequestsView | None] = lambda _: None
        # And its notable chats for the history's incidents (docs/design.md §3.5), likewise.
        self.chats: Callable[[str], KeptChats | None] = lambda _: None

    @property
    def state(self) -> State:
        """exo's State as last read, with the bridge's deployments in it."""
        exo = self._follow.last
        own = self._log.state
        verdicts = self._liveness.verdicts
        return self._merged.get(
            (exo, own, verdicts),
            lambda: (exo.state if exo is not None else State()).model_copy(
                update={
                    "deployments": own.deployments,
                    "serving_history": own.serving_history,
                    "cordoned": own.cordoned,
                    "drains": own.drains,
                    "node_watch": verdicts,
                    "repair_incidents": own.repair_incidents,
                }
            ),
        )

    @property
    def acting_state(self) -> State:
        """The State the keeper steps on and serving is judged on: ``state`` without the
        deployments a part of exo's State that did not read concerns (``touched``). An
        unreadable instance or runner of a model may be serving it: nothing is placed or deleted
        for it, and its records wait, until exo's State reads again (docs/design.md §8.2)."""
        state = self.state
        touched = self.touched()
        if not touched:
            return state
        kept = {i: d for i, d in state.deployments.items() if i not in touched}
        return state.model_copy(update={"deployments": kept})

    def touched(self) -> dict[str, str]:
        """Each deployment a part of exo's last State that did not read concerns, with that
        part in words (``keeper.model.exo_state.touched_deployments``)."""
        exo = self._follow.last
        if exo is None or not exo.unreadable:
            return {}
        return self._touched.get(
            (exo, self._log.state),
            lambda: touched_deployments(self._log.state, exo.unreadable),
        )

    def state_json(self) -> bytes:
        """exo's State JSON as exo sent it (every key kept), with ``deployments`` set to ours."""
        exo = self._follow.last
        if exo is None:
            reason = self.not_followed_why()
            raise ExoDownError(f"exo at {self._follow.exo.url} has not answered yet: {reason}")
        key = (exo, self._log.state, self._liveness.verdicts)
        return self._state_body.get(key, lambda: self._exo_json_with_ours(exo))

    def _exo_json_with_ours(self, exo: ExoState) -> bytes:
        document: dict[str, Any] = dict(exo.raw)
        # The bridge's own keys, in the State's camelCase ("deployments", "servingHistory").
        document.update(self.state.model_dump(mode="json", include=_OWN_STATE_KEYS))
        return json.dumps(document, separators=(",", ":")).encode()

    def deployments_view(self) -> DeploymentsResponse:
        views = deployment_views(
            self.state, self._started.keeper_or_none, self._started.clock_or_none, self._detail
        )
        return DeploymentsResponse(
            deployments=[self._with_requests(self._with_refusal(view)) for view in views]
        )

    def _with_requests(self, view: DeploymentView) -> DeploymentView:
        requests = self.requests(view.deployment.deployment_id)
        return view if requests is None else view.model_copy(update={"requests": requests})

    def model_deployment(self, model_id: str) -> ModelDeployment | None:
        """The deployment of ``model_id`` as the front door asks (serving, and its status in
        words; ``keeper.runtime.model_deployment``), or None when the model has none.

        Asked two or three times a chat: the views it reads are built once per State (a poll,
        or a change of the bridge's own), not with each deployment's chats summed every time
        (measured: a quarter of the bridge's CPU under chats)."""
        state = self.state
        views = self._door_views.get(
            (state,),
            lambda: deployment_views(
                state, self._started.keeper_or_none, self._started.clock_or_none, self._detail
            ),
        )
        return model_deployment(views, model_id, state)

    def history(self, deployment_id: str, hours: float) -> DeploymentHistoryResponse:
        """``GET /deployments/{id}/history``: the deployment's serving records summarised."""
        return history_response(
            self.state, deployment_id, hours, self._started.clock.wall(), self.chats(deployment_id)
        )

    def what_if_state(self) -> State:
        """The State ``GET /whatif`` reads (``keeper.httpapi.whatif_routes``): exo's with the
        bridge's deployments, placed as the keeper previews (our placement, exo's cards); a 503
        while exo's State is not followed, as an answer on a stale one would mislead."""
        if not self._follow.following:
            raise ExoDownError(
                f"exo's State is not followed now ({self.not_followed_why()}): what-if reads it"
            )
        return self.state

    def not_followed_why(self) -> str:
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
        store = self._log.shared
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
        touched = self.touched().get(deployment_id)
        if touched is not None:
            return f"{touched}; placing and deleting nothing for this deployment until it reads"
        in_flight = self._creations.detail(deployment_id, self._started.clock.monotonic())
        if in_flight is not None:
            return in_flight
        if self._creations.was_refused(deployment_id):
            return "exo refused the last placement (see the placement error)"
        return None

    # --- health and metrics ----------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        """Whether the bridge cannot do its job now: its log refuses writes (so it accepts no
        change) or its steps fail (so it keeps nothing). ``/healthz`` is a 503 then."""
        return (
            self._log.write_error is not None
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
        now = self._started.clock.wall().timestamp()  # NotRunningError (a 503) before it runs
        started_at = self._started.started_at
        return MetricsSnapshot(
            state=self.state,
            deployments=self.deployments_view().deployments,
            now=now,
            started_at=started_at if started_at is not None else now,
        )

    def exo_facts(self) -> ExoFacts:
        now = self._started.clock.wall().timestamp()
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

    def silent_s(self, node_id: str) -> float | None:
        """How long exo's ``lastSeen`` of the node has not moved, on the bridge's running
        clock (None: fast failover off, or not seen yet)."""
        clock = self._started.clock_or_none
        return self._liveness.silent_s(node_id, clock.monotonic()) if clock is not None else None

    def health(self) -> BridgeHealth:
        outage = self._follow.outage
        status: HealthStatus = "degraded" if self.degraded else "ok"
        since = self._steps.since
        store = self._log.shared
        running = self._running()
        exo = self._follow.exo
        return BridgeHealth(
            status=status if running else "stopped",
            role=self._role(),
            name=store.name if store is not None else self._name,
            leader=(store.leader if store is not None else self._name) if running else None,
            store=self._store_health(store) if store is not None else None,
            exo=ExoHealth(
                url=exo.url,
                urls=[api.url for api in self._follow.apis],
                reachable=self._exo_reachable(),
                state_readable=self._exo_readable(),
                unreachable_since=iso_utc(outage.since) if outage is not None else None,
                reason=outage.reason if outage is not None else None,
                outage=outage.kind if outage is not None else None,
            ),
            deployments=len(self._log.state.deployments),
            instances_to_delete=len(self._doomed),
            event_log=EventLogHealth(
                writable=self._log.write_error is None, error=self._log.write_error
            ),
            step=StepHealth(
                ok=since is None,
                failing_since=iso_utc(since) if since is not None else None,
                error=self._steps.error,
            ),
            webhooks=self._webhooks.health(),
            fast_failover=self._liveness.off_why or self._liveness.stale or "on",
        )

    def _store_health(self, store: EtcdStore) -> StoreHealth:
        since = store.unreachable_since
        clock = self._started.clock
        return StoreHealth(
            url=store.address.url,
            prefix=store.prefix,
            reachable=since is None,
            stale=store.stale,
            unreachable_since=(
                iso_utc(clock.wall() - timedelta(seconds=clock.monotonic() - since))
                if since is not None
                else None
            ),
            error=store.write_error
            if store.write_error is not None
            else (self._acting.foreign if self._acting is not None else None),
        )
