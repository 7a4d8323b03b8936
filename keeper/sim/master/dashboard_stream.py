"""``GET /events``: the live stream a dashboard follows, as server-sent events.

``event: snapshot`` first (a ``StreamSnapshot``: the State and the deployments view), then one
``event: event`` per ``IndexedEvent`` in the master's order, so a client that applies them with
``keeper.model.apply`` holds the master's State. The keeper's timers are not events, so ``event:
deployments`` (a ``DeploymentsResponse``) is sent whenever the view changed, checked once a
second; the countdown itself (``next_attempt_in_s``) is left out of the comparison, since the
client can count down from ``next_attempt_at``. A client that falls too far behind gets
``event: error`` and the stream ends; it reconnects and starts from a new snapshot.

The framing, the keepalive comment every ``KEEPALIVE_S`` (it keeps proxies and SSH tunnels
from closing a quiet stream) and noticing a client that went away are sse-starlette's
``EventSourceResponse``; this module only says what to send. Each event carries its index as
its ``id`` (the snapshot the index of the last event applied to it), and the snapshot carries
``retry``, the reconnect delay a client should start from. A reconnecting client is served a
new snapshot, not a resumption from ``Last-Event-ID``: see docs/design.md §7.4.

A master streams to at most ``MasterConfig.max_dashboard_streams`` dashboards at once; one more
is a 503 naming the limit (``StreamLimitError``). A stream's slot is freed when its response ends,
whatever ended it: the client leaving, the master stopping, or the client not reading, which the
server's send deadline (``keeper.httpapi.connection_deadlines``) turns into a disconnect.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.types import Receive, Scope, Send

from keeper.model.api_models import DeploymentsResponse, StreamSnapshot, error_body
from keeper.model.refusals import RefusalError
from keeper.sim.master.service import Master
from keeper.sim.master.subscriptions import (
    Subscription,
    SubscriptionLaggedError,
    TooManySubscriptionsError,
)

# Often enough for the TUI's countdowns to stay right, rarely enough to cost nothing.
DEPLOYMENTS_CHECK_S = 1.0
# Every second, as nodes report: a dashboard judges the cluster as of the master's last word
# (exo_deploy_tui.model.master_clock), so a master with nothing to say still says that it is alive,
# and a quiet one is told from quiet nodes within seconds. Far below the 30-60 s idle timeouts
# of proxies and load balancers; a comment line a second per dashboard costs nothing.
KEEPALIVE_S = 1.0
# What a client should wait before reconnecting (SSE's ``retry``, in ms): a master restart
# takes about a second, so half of one finds it back soon without hammering it.
RECONNECT_MS = 500
# Lines end in "\n" alone, as they always have on this stream (sse-starlette's default is CRLF).
LINE_END = "\n"


class StreamLimitError(RefusalError):
    """The master streams to as many dashboards as it may; a 503, as the client may retry."""

    status_code = 503


class _DashboardResponse(EventSourceResponse):
    """The stream, with its subscription closed (its slot freed) as the response ends."""

    def __init__(self, master: Master, subscription: Subscription) -> None:
        # sse-starlette types its content with a bare dict: partially unknown to pyright.
        super().__init__(  # pyright: ignore[reportUnknownMemberType]
            dashboard_events(master, subscription),
            ping=KEEPALIVE_S,
            sep=LINE_END,
            ping_message_factory=lambda: ServerSentEvent(comment="keepalive", sep=LINE_END),
            headers={"Cache-Control": "no-cache"},
        )
        self._subscription = subscription

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._subscription.close()


def _comparable(view: DeploymentsResponse) -> str:
    return json.dumps(
        [item.model_dump(mode="json", exclude={"next_attempt_in_s"}) for item in view.deployments],
        sort_keys=True,
    )


def _message(
    event: str, data: str, event_id: int | None = None, retry_ms: int | None = None
) -> ServerSentEvent:
    shown_id = None if event_id is None else str(event_id)
    return ServerSentEvent(data, event=event, id=shown_id, retry=retry_ms, sep=LINE_END)


def dashboard_response(master: Master) -> EventSourceResponse:
    """The stream for one dashboard, from the State current at this moment; StreamLimitError
    when the master streams to as many as it may already."""
    try:
        subscription = master.subscribe()
    except TooManySubscriptionsError as exc:
        raise StreamLimitError(
            f"This master already streams to {exc.limit} dashboards, as many as it serves at "
            "once (GET /events); try again when one has closed"
        ) from None
    return _DashboardResponse(master, subscription)


async def dashboard_events(
    master: Master, subscription: Subscription
) -> AsyncIterator[ServerSentEvent]:
    async with subscription:
        view = master.deployments_view()
        snapshot = StreamSnapshot(state=subscription.state, deployments=view.deployments)
        applied = subscription.state.last_event_applied_idx
        yield _message("snapshot", snapshot.model_dump_json(), applied, RECONNECT_MS)
        last_view = _comparable(view)
        next_check = anyio.current_time() + DEPLOYMENTS_CHECK_S
        while True:
            message: ServerSentEvent | None = None
            ended = False
            # The wait ends at the next timers check; nothing is yielded inside the scope, so
            # its cancellation never reaches the response writing a message.
            with anyio.move_on_after(max(0.0, next_check - anyio.current_time())):
                try:
                    indexed = await subscription.receive()
                    message = _message("event", indexed.model_dump_json(), indexed.idx)
                except StopAsyncIteration:
                    ended = True
                except SubscriptionLaggedError as exc:
                    error = json.dumps(error_body(str(exc), 503, "Service Unavailable"))
                    message = _message("error", error)
                    ended = True
            if message is not None:
                yield message
            if ended:
                return
            now = anyio.current_time()
            if now >= next_check:
                next_check = now + DEPLOYMENTS_CHECK_S
                view = master.deployments_view()
                comparable = _comparable(view)
                if comparable != last_view:
                    last_view = comparable
                    yield _message("deployments", view.model_dump_json())
