"""The front door's routes: ``POST /v1/chat/completions`` and ``GET /v1/models``
(``keeper.runtime.front_door``, docs/design.md §8.6), for any service that has a front door.

The route reads its body itself, so that every field of the client's chat is passed on to exo
as sent (the tools, the sampling, whatever exo adds next), and only what the front door decides
on is checked: a body that is not JSON or lacks ``model`` or ``messages`` is a 400 naming the
field. A streamed chat answers its error as an HTTP status while the client has seen nothing
(the front door's first item), and as its stream otherwise. Changes need the token as every POST
does (``keeper.httpapi.auth``): a chat spends the cluster's time.

Every chat is counted, the refused ones too (``rejected``): the route counts its own 400s and
429s, and a body the app's guard refuses while the route reads it (past 1 MiB, sent chunked).
The guard answers some before any route runs (a ``Content-Length`` over 1 MiB: 413; not JSON:
415), so ``mount_front_door`` also puts a counter around the app that counts a guard's refusal
of a chat the route never saw; a service mounts the door with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keeper.httpapi.app import JSON, ServiceApp
from keeper.httpapi.contract import refusals
from keeper.httpapi.errors import error_response
from keeper.runtime.front_door import (
    CHAT_PATH,
    MODELS_PATH,
    RETRY_AFTER_S,
    SSE,
    ChatDocument,
    FrontDoor,
    LastPiece,
    RequestError,
    parse_chat,
)

_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
# What the app's guard (``keeper.httpapi.errors.RequestGuardMiddleware``) answers before any
# route runs: a Content-Length that is not a number, a body over the bound, a body not JSON.
_GUARD_STATUSES = frozenset({400, 413, 415})
# Set in the request's scope when the chat route runs: a refusal without it is the guard's.
_SEEN = "exo_deploy.front_door"
# After a stream's last piece the door only closes exo's stream (within its own bound,
# ``AFTER_DONE_S``) and counts the chat; this bounds that only against a fault of ours.
_AFTER_LAST_S = 5.0


def mount_front_door(app: ServiceApp, door: FrontDoor) -> None:
    """The front door's routes on ``app``, and the counter of the chats its guard refuses
    before they reach the route (module doc)."""
    app.include_router(front_door_router(door, app.body_ref(ChatDocument)))
    app.add_middleware(_GuardRefusalsCounted, door=door)


class _GuardRefusalsCounted:
    """Counts ``rejected`` a chat the app answered with a guard's refusal before the route ran
    (its body unread: its deployment is '')."""

    def __init__(self, app: ASGIApp, door: FrontDoor) -> None:
        self._app = app
        self._door = door

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) != ("POST", CHAT_PATH):
            await self._app(scope, receive, send)
            return

        async def counting(message: Message) -> None:
            if (
                message["type"] == "http.response.start"
                and message["status"] in _GUARD_STATUSES
                and not scope.get(_SEEN)
            ):
                self._door.rejected(None)
            await send(message)

        await self._app(scope, receive, counting)


class _EndsWithLastPiece(StreamingResponse):
    """A stream that ends the response with the door's ``LastPiece`` rather than after the
    door's generator has ended: the client's answer ends in the same write as its last bytes,
    without waiting while the door reads exo's stream to its end (to keep the connection) and
    counts the chat. That remainder still runs, shielded: the response's end is, to the
    server, the client gone, and would otherwise cancel it and count the chat cancelled."""

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        async for piece in self.body_iterator:
            last = isinstance(piece, LastPiece)
            await send({"type": "http.response.body", "body": piece, "more_body": not last})
            if last:
                with anyio.CancelScope(shield=True) as rest:
                    rest.deadline = anyio.current_time() + _AFTER_LAST_S
                    async for _ in self.body_iterator:
                        pass
                return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _refusal(exc: RequestError) -> Response:
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
    return error_response(exc.status, exc.message, exc.param, headers)


def _retry(status: int) -> dict[str, str] | None:
    # A 503 is the hold spent: worth retrying after about one failover.
    return {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None


def front_door_router(door: FrontDoor, body: dict[str, Any]) -> APIRouter:
    """The routes over ``door``; ``body`` is the ``requestBody`` the document shows for a chat
    (``ServiceApp.body_ref``)."""
    router = APIRouter()

    @router.post(
        CHAT_PATH,
        openapi_extra={"requestBody": body},
        response_class=Response,
        responses={
            200: {
                "description": "The answer: a chat.completion, or its chunks as server-sent "
                "events ending with [DONE] (or an error event, never a silent end)",
                "content": {JSON: {"schema": {"type": "object"}}, SSE: {"schema": {}}},
            },
            **refusals(
                (400, "Not JSON, or no model or messages (the message names the field)"),
                (404, "exo has no instance of a model that has no deployment"),
                (422, "exo refused the request (its words)"),
                (429, "Too many chats in flight here (Retry-After says when to retry)"),
                (502, "exo's answer could not be read, or it cut the answer too often"),
                (503, "The model did not serve within the hold (Retry-After)"),
            ),
        },
    )
    async def chat_completions(request: Request) -> Response:
        request.scope[_SEEN] = True
        try:
            raw = await request.body()
        except StarletteHTTPException:
            door.rejected(None)  # the guard's 413: a body sent chunked past the bound
            raise
        try:
            chat, sent = parse_chat(raw)
        except RequestError as exc:
            door.rejected(exc.model)
            return _refusal(exc)
        try:
            door.admit(chat.model)  # counts its own 429
        except RequestError as exc:
            return _refusal(exc)
        if not chat.stream:
            try:
                status, answer = await door.answer(chat, sent)
            finally:
                door.release()
            return Response(answer, status_code=status, media_type=JSON, headers=_retry(status))
        pieces = door.stream(chat, sent)
        try:
            first = await anext(pieces, b"")
        except BaseException:
            door.release()
            raise
        if isinstance(first, int):
            rest = b"".join([piece async for piece in pieces if isinstance(piece, bytes)])
            door.release()
            return Response(rest, status_code=first, media_type=JSON, headers=_retry(first))

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield first
                async for piece in pieces:
                    if isinstance(piece, bytes):
                        yield piece
            finally:
                await pieces.aclose()
                door.release()

        return _EndsWithLastPiece(stream(), media_type=SSE, headers=_STREAM_HEADERS)

    @router.get(
        MODELS_PATH,
        response_class=Response,
        responses={
            200: {"description": "exo's model list, as exo answers it"},
            **refusals((503, "No exo URL answers")),
        },
    )
    async def models() -> Response:
        try:
            status, answer = await door.models()
        except RequestError as exc:
            return _refusal(exc)
        return Response(answer, status_code=status, media_type=JSON)

    return router
