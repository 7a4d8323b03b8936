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
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from keeper.model.api_models import error_body
from keeper.model.refusals import ChatFailedError
from keeper.sim.link.protocol import ChatMessage
from keeper.sim.master.service import ChatStream, Master

# Used when the request names no limit: enough for a demo answer, cheap on a fake node.
DEFAULT_MAX_TOKENS = 128
# A ceiling on one reply, so a typo cannot occupy an instance for hours.
MAX_TOKENS_LIMIT = 8192
# exo's stream writes this comment first and after every 10 s without an event (its
# ``with_sse_keepalive``; the stream's empty text says when), so a client can tell a waiting
# stream from a dead one.
EXO_KEEPALIVE = ": keep-alive\n\n"


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


async def chat_completion(master: Master, request: ChatCompletionRequest) -> Any:
    messages = [ChatMessage(role=m.role, content=m.content) for m in request.messages]
    stream = await master.chat(request.model, messages, request.token_limit())
    completion_id = f"chatcmpl-{master.new_id()}"
    created = int(master.clock.wall().timestamp())
    exo = master.config.exo_chats
    if request.stream:
        return StreamingResponse(
            _sse_chunks(stream, completion_id, created, request.model, exo),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    pieces: list[str] = []
    try:
        async for text in stream:
            if text:  # an empty one: still waiting
                pieces.append(text)
    finally:
        await stream.aclose()
    content = "".join(pieces)
    if exo and stream.finish_reason is None:
        return Response(b"", media_type="application/json")  # exo closed it: nothing to say
    return JSONResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": request.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": stream.finish_reason or "stop",
                }
            ],
            "usage": {
                "prompt_tokens": sum(len(m.content.split()) for m in messages),
                "completion_tokens": len(pieces),
                "total_tokens": sum(len(m.content.split()) for m in messages) + len(pieces),
            },
        }
    )


async def _sse_chunks(
    stream: ChatStream, completion_id: str, created: int, model: str, exo: bool = False
) -> AsyncIterator[str]:
    """The reply as OpenAI's chunks; ``exo``: as exo writes them, each text with the role and
    no role-only chunk first (a held chat then shows nothing but keep-alives until its text)."""

    def chunk(delta: dict[str, str], finish_reason: str | None) -> str:
        body = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }
        return f"data: {json.dumps(body)}\n\n"

    try:
        yield EXO_KEEPALIVE if exo else chunk({"role": "assistant"}, None)
        try:
            async for text in stream:
                if not text:
                    yield EXO_KEEPALIVE  # still waiting (only with exo's chats)
                    continue
                yield chunk(
                    {"role": "assistant", "content": text} if exo else {"content": text}, None
                )
        except ChatFailedError as exc:
            yield f"data: {json.dumps(error_body(exc.message, 503, 'Service Unavailable'))}\n\n"
            return
        if stream.finish_reason is None and stream.closed:
            return  # exo closed the stream (its instance deleted): it just ends
        yield chunk({}, stream.finish_reason or "stop")
        yield "data: [DONE]\n\n"
    finally:
        await stream.aclose()
