"""``GET /events``: the live stream a dashboard follows, as server-sent events.

``event: snapshot`` first (a ``StreamSnapshot``: the State and the deployments view), then one
``event: event`` per ``IndexedEvent`` in the master's order, so a client that applies them with
``keeper.apply`` holds the master's State. The keeper's timers are not events, so ``event:
deployments`` (a ``DeploymentsResponse``) is sent whenever the view changed, checked once a
second; the countdown itself (``next_attempt_in_s``) is left out of the comparison, since the
client can count down from ``next_attempt_at``. A comment line every ``KEEPALIVE_S`` keeps
proxies and SSH tunnels from closing a quiet stream. A client that falls too far behind gets
``event: error`` and the stream ends; it reconnects and starts from a new snapshot.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import anyio

from keeper.api_models import DeploymentsResponse, StreamSnapshot, error_body
from keeper.master.service import Master
from keeper.master.subscriptions import Subscription, SubscriptionLaggedError

# Often enough for the TUI's countdowns to stay right, rarely enough to cost nothing.
DEPLOYMENTS_CHECK_S = 1.0
# Below the 30-60 s idle timeouts common in proxies and load balancers.
KEEPALIVE_S = 15.0


def sse(event: str, data: str) -> str:
    return f"event: {event}\ndata: {data}\n\n"


def _comparable(view: DeploymentsResponse) -> str:
    return json.dumps(
        [item.model_dump(mode="json", exclude={"next_attempt_in_s"}) for item in view.deployments],
        sort_keys=True,
    )


async def dashboard_events(master: Master, subscription: Subscription) -> AsyncIterator[str]:
    async with subscription:
        view = master.deployments_view()
        snapshot = StreamSnapshot(state=subscription.state, deployments=view.deployments)
        yield sse("snapshot", snapshot.model_dump_json())
        last_view = _comparable(view)
        now = anyio.current_time()
        next_check = now + DEPLOYMENTS_CHECK_S
        last_sent = now
        while True:
            wait = max(0.0, min(next_check, last_sent + KEEPALIVE_S) - anyio.current_time())
            message: str | None = None
            ended = False
            with anyio.move_on_after(wait):
                try:
                    indexed = await subscription.receive()
                    message = sse("event", indexed.model_dump_json())
                except StopAsyncIteration:
                    ended = True
                except SubscriptionLaggedError as exc:
                    error = json.dumps(error_body(str(exc), 503, "Service Unavailable"))
                    message = sse("error", error)
                    ended = True
            if message is not None:
                yield message
                last_sent = anyio.current_time()
            if ended:
                return
            now = anyio.current_time()
            if now >= next_check:
                next_check = now + DEPLOYMENTS_CHECK_S
                view = master.deployments_view()
                comparable = _comparable(view)
                if comparable != last_view:
                    last_view = comparable
                    yield sse("deployments", view.model_dump_json())
                    last_sent = anyio.current_time()
            if anyio.current_time() - last_sent >= KEEPALIVE_S:
                yield ": keepalive\n\n"
                last_sent = anyio.current_time()
