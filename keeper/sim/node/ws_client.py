"""A node's connection to a real master: the ``/node/ws`` WebSocket, adapted to ``NodeSide``.

The node logic (``SimNode.run``) serves one channel and returns when it closes; this module is
the loop around it that a node process runs forever: connect, serve, and after the link drops
or the master restarts, reconnect with backoff (0.5 s doubling to 5 s, reset once a session got
as far as the master's Welcome). A master that refuses the node's token (401 instead of the upgrade)
or its identity (close code 1008) is not retried: that is a configuration error, reported as
``NodeRejectedError``.

WebSocket pings (every ``PING_INTERVAL_S``) notice a master that vanished without closing the
connection (a frozen process, a dead host) long before TCP would.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit, urlunsplit

from pydantic import ValidationError
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from keeper.runtime.clock import Clock
from keeper.sim.link.channel import ChannelClosedError
from keeper.sim.link.protocol import MASTER_MESSAGE, NODE_MESSAGE, AnyMasterMessage, AnyNodeMessage
from keeper.sim.node.sim_node import SimNode

log = logging.getLogger(__name__)

NODE_WS_PATH = "/node/ws"  # the master's endpoint (keeper.sim.master.ws)
# Reconnect backoff: quick enough to be back inside a restarted master's 15 s grace, capped so a
# master that is down for long is not hammered.
FIRST_RECONNECT_S = 0.5
MAX_RECONNECT_S = 5.0
# Liveness of the link: a master that stops answering pings for PING_TIMEOUT_S is gone.
PING_INTERVAL_S = 5.0
PING_TIMEOUT_S = 10.0
# Connecting (TCP + upgrade) to a live master takes milliseconds; a hang means it is not there.
OPEN_TIMEOUT_S = 5.0
# A Welcome carries the whole State; exo's states run to megabytes, ours stay well under this.
MAX_FRAME_BYTES = 64 * 1024 * 1024
# RFC 6455 policy-violation close code: the master's answer to a Hello that does not prove
# the node's identity.
CLOSE_POLICY = 1008
# The master's answer, instead of the upgrade, to a missing or wrong token.
REFUSED_STATUSES = frozenset({401, 403})


class NodeRejectedError(Exception):
    """The master refused this node (wrong or missing token, unproven identity); retrying
    cannot help."""


def _refusal_message(body: bytes | bytearray | None) -> str:
    """The master's error message from a refusal's body (its error envelope), else nothing."""
    # Imported here: the API's models (about 30 ms of CPU) are needed only when the master
    # refuses, and a node starts once per simulated node (docs/design.md §10, "Start-up").
    from keeper.model.api_models import ErrorResponse  # noqa: PLC0415

    try:
        envelope = ErrorResponse.model_validate_json(body or b"")
    except ValidationError:
        return ""
    return envelope.error.message


def node_ws_url(master_url: str) -> str:
    """``http://host:port`` (or ``ws://...``) -> ``ws://host:port/node/ws``."""
    parts = urlsplit(master_url if "://" in master_url else f"http://{master_url}")
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"not a master URL: {master_url!r} (expected http://HOST:PORT)")
    path = parts.path.rstrip("/")
    if not path.endswith(NODE_WS_PATH):
        path += NODE_WS_PATH
    return urlunsplit((scheme, parts.netloc, path, "", ""))


class WebSocketNodeChannel:
    """``NodeSide`` over an open client WebSocket: one JSON text frame per message."""

    def __init__(self, websocket: ClientConnection) -> None:
        self._ws = websocket

    async def send(self, message: AnyNodeMessage) -> None:
        try:
            await self._ws.send(NODE_MESSAGE.dump_json(message).decode())
        except ConnectionClosed as exc:
            raise ChannelClosedError from exc

    async def receive(self) -> AnyMasterMessage:
        try:
            frame = await self._ws.recv()
        except ConnectionClosed as exc:
            raise ChannelClosedError from exc
        try:
            return MASTER_MESSAGE.validate_json(frame)
        except ValidationError as exc:
            log.error("the master sent a message this node cannot read; reconnecting: %s", exc)
            await self._ws.close(code=1007, reason="malformed master message")
            raise ChannelClosedError from exc

    async def aclose(self) -> None:
        await self._ws.close()


async def run_node_forever(
    node: SimNode, master_url: str, clock: Clock, token: str | None = None
) -> None:
    """Keep ``node`` joined to the master at ``master_url`` until cancelled."""
    url = node_ws_url(master_url)
    headers = {"Authorization": f"Bearer {token}"} if token else None
    delay = FIRST_RECONNECT_S
    while True:
        welcomed_before = node.welcomed_sessions
        try:
            async with connect(
                url,
                additional_headers=headers,
                open_timeout=OPEN_TIMEOUT_S,
                ping_interval=PING_INTERVAL_S,
                ping_timeout=PING_TIMEOUT_S,
                max_size=MAX_FRAME_BYTES,
                proxy=None,  # the master is reached directly, whatever the environment says
            ) as websocket:
                log.info("node %s connected to %s", node.name, url)
                await node.run(WebSocketNodeChannel(websocket))
                if websocket.close_code == CLOSE_POLICY:
                    raise NodeRejectedError(
                        f"the master at {master_url} refused node {node.name}: "
                        f"{websocket.close_reason or 'policy violation'}"
                    )
                log.info(
                    "node %s lost its session with the master (%s); reconnecting",
                    node.name,
                    websocket.close_reason or "connection closed",
                )
        except InvalidURI as exc:
            raise ValueError(f"not a master URL: {master_url!r}: {exc}") from None
        except InvalidStatus as exc:
            if exc.response.status_code in REFUSED_STATUSES:
                raise NodeRejectedError(
                    f"the master at {master_url} refused node {node.name}: "
                    f"HTTP {exc.response.status_code} {_refusal_message(exc.response.body)}"
                ) from None
            log.info("node %s: the master at %s answered %s", node.name, url, exc)
        except (OSError, InvalidHandshake, TimeoutError, ConnectionClosed) as exc:
            log.info("node %s cannot reach the master at %s (%s)", node.name, url, exc or type(exc))
        if node.welcomed_sessions > welcomed_before:
            delay = FIRST_RECONNECT_S
        await clock.sleep(delay)
        delay = min(delay * 2, MAX_RECONNECT_S)
