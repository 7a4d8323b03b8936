"""exo's ``POST /v1/cancel/{command_id}`` on the stand-in: a streamed chat cancelled by the id its
chunks carry (docs/design.md §8.6).

exo runs each chat as a command whose id is its chunks' ``id``; cancelling it closes the chat's
stream (its answer just ends: no ``finish_reason``, no ``[DONE]``) and tells the workers to stop
(``TaskCancelled``), and answers ``{"message": "Command cancelled.", "command_id"}``; a command it
does not know, or one already completed, is a 404 "Command not found or already completed". The
front door sends it when its client leaves mid-answer.

The stand-in's chats are our master's (``keeper.sim.master.openai_chat``), which know nothing of
command ids, so this is a layer of its own around the app: it notes each streamed chat's id from
its first chunk as the response goes out, with a cancel scope around that response; a cancel
ends the scope, which closes the chat's stream as exo's does (the master then cancels the chat
on its node), and the response ends there. A non-streamed chat shows its id only in its answer,
so it is never found in flight, as on exo no client can know it sooner.
"""

from __future__ import annotations

import json
from typing import Any, cast

import anyio
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keeper.httpapi.contract import refusals
from keeper.model.refusals import NotFoundError

CHAT_PATH = "/v1/chat/completions"
CANCEL_PATH = "/v1/cancel/{command_id}"


def install_chat_cancels(app: FastAPI) -> None:
    """exo's cancel route on ``app``, and the layer that finds the chats it cancels."""
    in_flight: dict[str, anyio.CancelScope] = {}

    @app.post(CANCEL_PATH, responses=refusals((404, "Command not found or already completed")))
    async def cancel_command(command_id: str) -> JSONResponse:
        scope = in_flight.pop(command_id, None)
        if scope is None:
            raise NotFoundError("Command not found or already completed")
        scope.cancel()
        return JSONResponse({"message": "Command cancelled.", "command_id": command_id})

    app.add_middleware(_CancellableChats, in_flight=in_flight)


class _CancellableChats:
    """Each streamed chat's response in a cancel scope, found by its chunks' id (module doc)."""

    def __init__(self, app: ASGIApp, in_flight: dict[str, anyio.CancelScope]) -> None:
        self._app = app
        self._in_flight = in_flight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"], scope["path"]) != ("POST", CHAT_PATH):
            await self._app(scope, receive, send)
            return
        noted: list[str] = []
        ended = False

        async def noting(message: Message) -> None:
            nonlocal ended
            if message["type"] == "http.response.body":
                if not noted:
                    found = _chunk_id(message.get("body", b""))
                    if found is not None:
                        noted.append(found)
                        self._in_flight[found] = cancel
                ended = not message.get("more_body", False)
            await send(message)

        with anyio.CancelScope() as cancel:
            try:
                await self._app(scope, receive, noting)
            finally:
                if noted:
                    self._in_flight.pop(noted[0], None)
        if cancel.cancel_called and noted and not ended:
            # As exo's cancel closes the stream: the answer just ends.
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def _chunk_id(body: bytes) -> str | None:
    """The ``id`` of the first chunk in a piece of an SSE answer, if it has one."""
    for line in body.decode(errors="replace").splitlines():
        if not line.startswith("data:"):
            continue
        try:
            chunk: Any = json.loads(line[5:])
        except ValueError:
            return None
        found = cast(dict[str, Any], chunk).get("id") if isinstance(chunk, dict) else None
        return found if isinstance(found, str) else None
    return None
