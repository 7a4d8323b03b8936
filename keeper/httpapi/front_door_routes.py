"""The front door's routes: ``POST /v1/chat/completions`` and ``GET /v1/models``
(``keeper.runtime.front_door``, docs/design.md §8.6), for any service that has a front door.

The route reads its body itself, so that every field of the client's chat is passed on to exo
as sent (the tools, the sampling, whatever exo adds next), and only what the front door decides
on is checked: a body that is not JSON or lacks ``model`` or ``messages`` is a 400 naming the
field (the app's guard has already answered 413 for a body over 1 MiB). A streamed chat answers
its error as an HTTP status while the client has seen nothing (the front door's first item),
and as its stream otherwise. Changes need the token as every POST does
(``keeper.httpapi.auth``): a chat spends the cluster's time.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from keeper.httpapi.app import JSON
from keeper.httpapi.contract import refusals
from keeper.httpapi.errors import error_response
from keeper.runtime.front_door import (
    CHAT_PATH,
    MODELS_PATH,
    RETRY_AFTER_S,
    SSE,
    FrontDoor,
    RequestError,
    parse_chat,
)

_STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


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
        try:
            chat, sent = parse_chat(await request.body())
            door.admit()
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

        return StreamingResponse(stream(), media_type=SSE, headers=_STREAM_HEADERS)

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
