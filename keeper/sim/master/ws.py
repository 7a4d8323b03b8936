"""The node WebSocket (``/node/ws``): a Starlette WebSocket adapted to ``MasterSide``.

One JSON text frame per protocol message (``keeper.sim.link.protocol``), so the master's session
logic is the same over a socket as over the in-memory channel the virtual-time tests use. A
frame that is not a protocol message ends that session with close code 1007 and a reason that
names the problem; it never reaches the master as an exception. With a token configured the
upgrade request must carry ``Authorization: Bearer <token>`` (a header, not a first message): a
missing or wrong one is answered 401 with the error envelope instead of the upgrade, so an
unauthenticated peer never gets a WebSocket at all. Who the node is, is proven after the upgrade
(``keeper.sim.link.identity``); a Hello that does not prove it is closed with 1008 and the reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import MutableMapping
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from keeper.httpapi.auth import bearer_matches
from keeper.model.api_models import error_body
from keeper.model.wire import first_validation_error
from keeper.sim.link.channel import ChannelClosedError
from keeper.sim.link.protocol import (
    MASTER_MESSAGE,
    NODE_MESSAGE,
    AnyMasterMessage,
    AnyNodeMessage,
)
from keeper.sim.master.service import Master

NODE_WS_PATH = "/node/ws"
# WebSocket close codes (RFC 6455): 1007 invalid payload data, 1008 policy violation.
CLOSE_MALFORMED = 1007
CLOSE_POLICY = 1008
CLOSE_NORMAL = 1000
# RFC 6455 caps a close reason at 123 bytes.
_MAX_REASON_BYTES = 123


class WebSocketChannel:
    """``MasterSide`` over a Starlette WebSocket that has been accepted."""

    def __init__(self, websocket: WebSocket) -> None:
        self._ws = websocket

    async def send(self, message: AnyMasterMessage) -> None:
        try:
            await self._ws.send_text(MASTER_MESSAGE.dump_json(message).decode())
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise ChannelClosedError from exc

    async def receive(self) -> AnyNodeMessage:
        try:
            frame: MutableMapping[str, Any] = await self._ws.receive()
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise ChannelClosedError from exc
        if frame["type"] == "websocket.disconnect":
            raise ChannelClosedError
        text = frame.get("text")
        if text is None:
            await self.close_with(
                CLOSE_MALFORMED, "binary frames are not part of the node protocol"
            )
            raise ChannelClosedError
        try:
            return NODE_MESSAGE.validate_json(text)
        except ValidationError as exc:
            await self.close_with(
                CLOSE_MALFORMED, f"malformed node message: {first_validation_error(exc)}"
            )
            raise ChannelClosedError from None

    async def aclose(self) -> None:
        await self.close_with(CLOSE_NORMAL, "session ended")

    async def refuse(self, reason: str) -> None:
        await self.close_with(CLOSE_POLICY, reason)

    async def close_with(self, code: int, reason: str) -> None:
        if self._ws.application_state == WebSocketState.DISCONNECTED:
            return
        if self._ws.client_state == WebSocketState.DISCONNECTED:
            return
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await self._ws.close(code=code, reason=_truncate(reason))


async def serve_node_websocket(master: Master, websocket: WebSocket, token: str | None) -> None:
    """The ``/node/ws`` endpoint body: authenticate, accept, then serve the node's session."""
    if token is not None and not bearer_matches(websocket.scope["headers"], token):
        # Refused before the upgrade: the peer never gets a WebSocket to send anything on.
        await websocket.send_denial_response(
            JSONResponse(
                error_body(
                    "Missing or wrong bearer token: nodes need 'Authorization: Bearer <token>' "
                    "(the --token this master was started with)",
                    401,
                    "Unauthorized",
                ),
                status_code=401,
            )
        )
        return
    await websocket.accept()
    await master.serve_node(WebSocketChannel(websocket))


def _truncate(reason: str) -> str:
    encoded = reason.encode()
    if len(encoded) <= _MAX_REASON_BYTES:
        return reason
    return encoded[: _MAX_REASON_BYTES - 3].decode(errors="ignore") + "..."
