"""The master's own chat routing as the upstream of its front door (docs/design.md §8.6): an
httpx transport that answers in this process, and streams.

The front door (``keeper.runtime.front_door``) is one implementation for every service: it
reads its upstream as httpx clients that speak OpenAI's chat as exo serves it. On the bridge
they reach exo's URLs; on our master the chats are routed by the master itself (``Master.chat``:
ready instances only, §6.8, or exo's way under ``exo_chats``, §7.5). So the master's door has one
client, whose transport is ``ChatUpstream``: it routes the chat with ``Master.chat`` and answers
with an ``httpx.Response`` whose body is the chat's SSE bytes as the node sends them, written by
the very code of the raw route exo's stand-in serves (``keeper.sim.master.openai_chat``). The
door then reads exactly what a client of that raw route would read, with nothing in between.

Why a transport of our own, and not the two other ways to reach the master's routing:

- *httpx's ``ASGITransport`` over the master's own app* awaits the whole app and buffers every
  body part before it returns the response (httpx 0.29, ``ASGITransport.handle_async_request``):
  the door would see a streamed chat only once it had ended, so no first token until the last,
  a cut found only at the end, and a client's stream delivered in one piece.
- *A loopback client to a raw chat route on the master's own port* streams, but costs a second
  HTTP hop and connection per chat (counted against the server's connection bound), needs the
  bound port and the token, reaches nothing when the master binds one outside address, leaves a
  second, unguarded chat route open to every client, and cannot run without sockets, so not in
  the virtual-time tests (tests/virtual) that drive the master in-process.

The raw route's refusals keep their status and exo's error body (a field out of bounds 422
naming it, no ready instance 404, the master not running or no node able to take it 503), so
the door tells them apart as it tells exo's. The head of a chat's answer comes at once, as
exo's does; a non-streamed answer that fails after it is a body broken off (``httpx.ReadError``,
what a dropped connection would raise), a streamed one ends with the raw route's error event.
exo's ``POST /v1/cancel/{command_id}`` (the door's word that its client left) ends the streamed
chat whose completion id it names on its node, and its answer just ends, as exo's; one not in
flight is exo's 404.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable

import httpx
from pydantic import ValidationError

from keeper.httpapi.errors import describe_validation, phrase
from keeper.model.api_models import ModelList, error_body, model_entry
from keeper.model.refusals import ChatFailedError, RefusalError
from keeper.model.state import ModelCard
from keeper.sim.master.chat import ChatStream
from keeper.sim.master.openai_chat import (
    JSON,
    SSE,
    ChatCompletionRequest,
    ChatSource,
    OpenedChat,
    open_chat,
)

# OpenAI's paths, and exo's cancel, which the front door asks its upstream for.
CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
CANCEL_PATH = "/v1/cancel/"
# The one client's base URL: nothing is dialled, it only names the master in the door's words.
BASE_URL = "http://this-master"


def model_list_json(cards: Iterable[ModelCard]) -> bytes:
    """The master's catalog as ``GET /models`` (and OpenAI's ``GET /v1/models``) lists it."""
    return ModelList(data=[model_entry(card) for card in cards]).model_dump_json().encode()


class ChatUpstream(httpx.AsyncBaseTransport):
    """``POST /v1/chat/completions``, ``GET /v1/models`` and ``POST /v1/cancel/{id}`` answered
    by the master in this process (module doc); any other request is a 404."""

    def __init__(self, source: ChatSource, cards: Callable[[], Iterable[ModelCard]]) -> None:
        self._source = source
        self._cards = cards
        # The chats whose answer is open, by completion id (exo's command id), for a cancel.
        self._open: dict[str, ChatStream] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        asked = (request.method, request.url.path)
        if asked == ("GET", MODELS_PATH):
            return httpx.Response(
                200, content=model_list_json(self._cards()), headers={"content-type": JSON}
            )
        if request.method == "POST" and request.url.path.startswith(CANCEL_PATH):
            return await self._cancel(request.url.path.removeprefix(CANCEL_PATH))
        if asked != ("POST", CHAT_PATH):
            return _refusal(
                404,
                f"{request.method} {request.url.path}: the master's chat routing answers only "
                f"POST {CHAT_PATH}, GET {MODELS_PATH} and POST {CANCEL_PATH}{{command_id}}",
            )
        try:
            chat = ChatCompletionRequest.model_validate_json(await request.aread())
        except ValidationError as exc:
            status, message, param = describe_validation(list(exc.errors()))
            return _refusal(status, message, param)
        try:
            opened = await open_chat(self._source, chat)
        except RefusalError as exc:
            return _refusal(exc.status_code, exc.message, exc.param)

        def closed() -> None:
            self._open.pop(opened.completion_id, None)

        if chat.stream:
            # Only a stream shows its id before its end: as on exo, only it can be cancelled.
            self._open[opened.completion_id] = opened.stream
            body = _Body(_encoded(opened.sse()), opened.stream, closed)
            return httpx.Response(200, headers={"content-type": SSE}, stream=body)
        body = _Body(_whole(opened), opened.stream, closed)
        return httpx.Response(200, headers={"content-type": JSON}, stream=body)

    async def _cancel(self, command_id: str) -> httpx.Response:
        """exo's cancel: the chat ended on its node, its answer just ends; as exo's words."""
        stream = self._open.pop(command_id, None)
        if stream is None:
            return _refusal(404, "Command not found or already completed")
        await stream.aclose()
        return httpx.Response(200, json={"message": "Command cancelled.", "command_id": command_id})


def upstream_client(
    source: ChatSource, cards: Callable[[], Iterable[ModelCard]]
) -> httpx.AsyncClient:
    """The front door's one client of the master: ``ChatUpstream``, nothing dialled."""
    return httpx.AsyncClient(transport=ChatUpstream(source, cards), base_url=BASE_URL)


class _Body(httpx.AsyncByteStream):
    """An answer's bytes as they come; closing it (the door closes every answer it opened, read
    to its end or not) ends the chat on its node."""

    def __init__(
        self, pieces: AsyncGenerator[bytes, None], stream: ChatStream, closed: Callable[[], None]
    ) -> None:
        self._pieces = pieces
        self._stream = stream
        self._closed = closed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for piece in self._pieces:
            yield piece

    async def aclose(self) -> None:
        self._closed()
        await self._pieces.aclose()
        await self._stream.aclose()


async def _encoded(texts: AsyncGenerator[str, None]) -> AsyncGenerator[bytes, None]:
    try:
        async for text in texts:
            yield text.encode()
    finally:
        await texts.aclose()  # its own finally ends the chat, read to its end or not


async def _whole(opened: OpenedChat) -> AsyncGenerator[bytes, None]:
    try:
        answer = await opened.whole()
    except ChatFailedError as exc:
        raise httpx.ReadError(f"the chat broke off: {exc.message}") from None
    yield answer


def _refusal(status: int, message: str, param: str | None = None) -> httpx.Response:
    return httpx.Response(status, json=error_body(message, status, phrase(status), param))
