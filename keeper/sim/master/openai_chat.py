"""``POST /v1/chat/completions`` in OpenAI's shapes, on top of ``Master.chat``.

The request keeps OpenAI's field names and ignores the sampling fields we do not model
(temperature, top_p, ...), so stock OpenAI clients work unchanged. ``stream: false`` collects the
reply into one ``chat.completion``; ``stream: true`` sends ``chat.completion.chunk`` SSE
messages and ``data: [DONE]``. A failure before the first byte is an HTTP error in exo's body
(404 no ready instance, 503 the node went away); a failure mid-stream is sent as a final
``data: {"error": {...}}`` message without ``[DONE]``, so a client can tell the reply is cut.

A master with ``exo_chats`` (``master --exo-compat``) answers as a stock exo does instead
(docs/design.md §7.5): a stream opens with a keep-alive comment and writes one every 10 s while
it waits (for a held chat's instance, say); a chat whose stream exo closed (its instance deleted)
ends with nothing more: a streamed one with no ``finish_reason`` and no ``[DONE]``, a
non-streamed one as a 200 with an empty body.

Shaped around ``OpenedChat`` (one chat the master's routing took, and the shapes it is written
in) because two readers write the same bytes from it: the raw route exo's stand-in serves
(``chat_completion``) and the transport our own API's front door reads the master through
(``keeper.sim.master.chat_upstream``, docs/design.md §8.6). What it needs of the master is a
``ChatSource`` of callables, not the master itself, so that the master can build its front
door's transport without this module importing the master.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from keeper.model.api_models import error_body
from keeper.model.refusals import ChatFailedError
from keeper.sim.link.protocol import ChatMessage
from keeper.sim.master.chat import ChatStream

# Used when the request names no limit: enough for a demo answer, cheap on a fake node.
DEFAULT_MAX_TOKENS = 128
# A ceiling on one reply, so a typo cannot occupy an instance for hours.
MAX_TOKENS_LIMIT = 8192
# exo's stream writes this comment first and after every 10 s without an event (its
# ``with_sse_keepalive``; the stream's empty text says when), so a client can tell a waiting
# stream from a dead one.
EXO_KEEPALIVE = ": keep-alive\n\n"
SSE = "text/event-stream"
JSON = "application/json"
# A stream must reach the client as it is written: no cache, no proxy buffering.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChatCompletionMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: str = Field(min_length=1, max_length=64)
    content: str


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1, max_length=512)
    messages: list[ChatCompletionMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_TOKENS_LIMIT)
    stream: bool = False

    def token_limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class ChatSource:
    """What a chat in OpenAI's shapes needs of the master: its routing (``Master.chat``), an id
    for the completion, the wall clock's seconds for ``created``, and whether chats end as a
    stock exo's do (``MasterConfig.exo_chats``)."""

    chat: Callable[[str, Sequence[ChatMessage], int], Awaitable[ChatStream]]
    new_id: Callable[[], str]
    wall_s: Callable[[], float]
    exo: bool = False


@dataclass(frozen=True)
class OpenedChat:
    """One chat the master's routing took, and what its answer is written with."""

    stream: ChatStream
    completion_id: str
    created: int
    model: str
    messages: tuple[ChatMessage, ...]
    exo: bool

    async def sse(self) -> AsyncGenerator[str, None]:
        """The reply as OpenAI's chunks, each as it comes (module doc); ``exo``: as exo writes
        them, each text with the role and no role-only chunk first (a held chat then shows
        nothing but keep-alives until its text)."""
        stream = self.stream
        try:
            yield EXO_KEEPALIVE if self.exo else self._chunk({"role": "assistant"}, None)
            try:
                async for text in stream:
                    if not text:
                        yield EXO_KEEPALIVE  # still waiting (only with exo's chats)
                        continue
                    delta = (
                        {"role": "assistant", "content": text} if self.exo else {"content": text}
                    )
                    yield self._chunk(delta, None)
            except ChatFailedError as exc:
                failed = error_body(exc.message, 503, "Service Unavailable")
                yield f"data: {json.dumps(failed)}\n\n"
                return
            if stream.finish_reason is None:
                # Closed under its reader: exo closed it (its instance deleted) or it was
                # cancelled (``keeper.sim.master.chat_upstream``). It just ends, as exo's does.
                return
            yield self._chunk({}, stream.finish_reason or "stop")
            yield "data: [DONE]\n\n"
        finally:
            await stream.aclose()

    async def whole(self) -> bytes:
        """The reply as one ``chat.completion`` once it has ended; with ``exo``, nothing (an
        empty body) when exo closed its stream. ``ChatFailedError`` when it failed."""
        stream = self.stream
        pieces: list[str] = []
        try:
            async for text in stream:
                if text:  # an empty one: still waiting
                    pieces.append(text)
        finally:
            await stream.aclose()
        if self.exo and stream.finish_reason is None:
            return b""  # exo closed it: nothing to say
        prompt_tokens = sum(len(m.content.split()) for m in self.messages)
        completion = {
            "id": self.completion_id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(pieces)},
                    "finish_reason": stream.finish_reason or "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": len(pieces),
                "total_tokens": prompt_tokens + len(pieces),
            },
        }
        return json.dumps(completion, separators=(",", ":")).encode()

    def _chunk(self, delta: dict[str, str], finish_reason: str | None) -> str:
        body = {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(body)}\n\n"


async def open_chat(source: ChatSource, request: ChatCompletionRequest) -> OpenedChat:
    """The chat sent by the master's routing; its refusals (``keeper.model.refusals``: no
    ready instance, no node able to take it, the master not running) raised before any byte."""
    messages = tuple(ChatMessage(role=m.role, content=m.content) for m in request.messages)
    stream = await source.chat(request.model, messages, request.token_limit())
    return OpenedChat(
        stream,
        f"chatcmpl-{source.new_id()}",
        int(source.wall_s()),
        request.model,
        messages,
        source.exo,
    )


async def chat_completion(source: ChatSource, request: ChatCompletionRequest) -> Any:
    """The raw route's answer (exo's stand-in serves it, docs/design.md §7.5): a stream, or the
    whole completion; a refusal or a failure before the answer is raised for the app's error
    handlers (``keeper.httpapi.errors``)."""
    opened = await open_chat(source, request)
    if request.stream:
        return StreamingResponse(opened.sse(), media_type=SSE, headers=STREAM_HEADERS)
    return Response(await opened.whole(), media_type=JSON)
