"""The front door: OpenAI's ``POST /v1/chat/completions`` and ``GET /v1/models``, forwarded to
exo, so that a chat outlives the loss of the instance it was on (docs/design.md §8.6).

On a stock exo a chat sent while a model fails over is a 404, and one whose instance is deleted
under it ends with neither a result nor an error (an empty 200, or a stream that stops without
``finish_reason`` or ``[DONE]``). The front door sits between the client and exo's API and asks
one pure rule (``keeper.model.request_rule``) what to do after each thing that happens: hold the
request while its deployment is not serving, send it again while the client has seen nothing,
continue it after a cut (exo continues a chat whose last message is the assistant's), or end it
with an error the client can read. This module is the shell around that rule: it reads the
clock, the service's view of the deployments and exo's answers, and counts every request.

Shaped so for three reasons:

- *The client's response starts at its first token.* Until then the status can still be a
  503 (held too long), a 502 (exo's answer unreadable) or exo's own refusal; after it, trouble
  can only be an error event on the stream. So a streamed request is one async generator: it
  yields nothing until an attempt brings its first chunk, and the route (``keeper.httpapi.
  front_door_routes``) answers the error instead when the generator ends without one.
- *It belongs to no one service.* It takes exo's API as httpx clients in order of preference
  and the deployments as a lookup by model, so our master can mount the same door later;
  the bridge passes the exo URL it follows first, then the others.
- *Upstream is read as exo writes it*: SSE events one per ``data:`` line, keep-alive comments
  every 10 s; each event forwarded as it comes (with the first attempt's ``id`` on a
  continuation's chunks, so the client sees one completion). A non-streamed chat is passed on
  whole once exo's answer shows its ``finish_reason``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast

import anyio
import httpx
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keeper.model.api_models import error_body
from keeper.model.request_rule import (
    OUTCOMES,
    Done,
    Fail,
    Happened,
    Hold,
    Outcome,
    PassOn,
    Send,
    SoFar,
    next_action,
)
from keeper.runtime.request_counts import RequestCounts

log = logging.getLogger(__name__)

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"

# How long a request may wait for its deployment to serve (``--hold-s``): a fast failover
# serves again in 6.4-6.6 s on a real cluster, a staged one (a load) in about 40 s; 30 s
# covers the first several times over and a client's usual minute-long timeout still holds.
DEFAULT_HOLD_S = 30.0
# Continuations of one chat at most (``--migrations``): two losses in one answer is already
# rare; more would let a chat that breaks every instance wander the cluster.
DEFAULT_MIGRATIONS = 2
# Requests in the front door at once, held ones included (``--max-inflight``): exo serves a
# few chats at a time per instance; 256 waiting is far more than a cluster drains in a hold,
# and bounds the memory and connections a burst can take.
DEFAULT_MAX_INFLIGHT = 256
# While held, the view is looked at again this often: the bridge's view changes once a second
# (its poll), so half of that sends a held request within half a second of serving.
RECHECK_S = 0.5
# What a 503 or a 429 tells the client to wait: about one fast failover.
RETRY_AFTER_S = 5
# exo answers a chat's head at once (its body streams), but holds it through an election
# (measured up to 6 s): past this an attempt counts as exo unreachable.
HEAD_TIMEOUT_S = 10.0
# exo writes a keep-alive comment every 10 s on a stream: three missed means the stream is dead
# (a node frozen under it), and it is treated as cut.
STREAM_SILENCE_S = 30.0
# A non-streamed answer comes whole at the end: a long answer (4,096 tokens at 10 tok/s) fits.
ANSWER_TIMEOUT_S = 600.0
# The most of a non-streamed answer read, and of one SSE event: exo's answers are text.
ANSWER_MAX_BYTES = 16 * 2**20
SSE = "text/event-stream"
# The most of an error's text quoted from exo.
QUOTED_CHARS = 300


@dataclass(frozen=True)
class FrontDoorConfig:
    hold_s: float = DEFAULT_HOLD_S
    migrations: int = DEFAULT_MIGRATIONS
    max_inflight: int = DEFAULT_MAX_INFLIGHT


@dataclass(frozen=True)
class ModelDeployment:
    """What the front door needs of a model's deployment: its id, whether it serves in the
    service's view, and its status in words for a refusal."""

    deployment_id: str
    serving: bool
    words: str


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat the front door reads; every other is passed on as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    n: int | None = None
    logprobs: bool | None = None


class ChatDocumentMessage(BaseModel):
    """A message as the API's document shows it: what every exo reads (exo reads more: content
    as parts, tool calls; the front door passes on whatever is sent)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=64)
    content: str


class ChatDocument(BaseModel):
    """A chat as the API's document shows it (``ChatRequest`` is what is checked)."""

    model_config = ConfigDict(extra="allow", title="ChatCompletionRequest")

    model: str = Field(min_length=1, max_length=512)
    messages: list[ChatDocumentMessage] = Field(min_length=1)
    stream: bool = False


class RequestError(Exception):
    """A request the front door answers with an error before anything is sent upstream."""

    def __init__(
        self, status: int, message: str, param: str | None = None, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after


def parse_chat(raw: bytes) -> tuple[ChatRequest, dict[str, Any]]:
    """The request and its JSON as sent; ``RequestError`` 400 naming the field otherwise."""
    try:
        body: Any = json.loads(raw)
    except ValueError as exc:
        raise RequestError(400, f"Malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object")
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestError(400, f"{where}: {first['msg']}", where or None) from None
    return request, cast(dict[str, Any], body)


@dataclass
class _Attempt:
    """What the current attempt has brought."""

    happened: Happened | None = None
    why: str = ""  # exo's words, when it refused or failed
    status: int = 0  # exo's status, when it refused


@dataclass
class _Progress:
    """One request as it goes (the rule's ``SoFar`` is built from it)."""

    started: float
    since: float  # the last progress: the request's arrival, or its last chunk
    sends: int = 0
    cuts: int = 0
    continuations: int = 0
    held: bool = False
    paused: bool = False  # waited since the last attempt
    first_token_at: float | None = None
    text: list[str] = field(default_factory=list[str])
    inexact: str | None = None  # why a continuation could not be exact
    completion_id: str | None = None


class FrontDoor:
    """The front door of one service (module doc)."""

    def __init__(
        self,
        upstreams: Callable[[], Sequence[httpx.AsyncClient]],
        deployment_of: Callable[[str], ModelDeployment | None],
        monotonic: Callable[[], float],
        sleep: Callable[[float], Any],
        *,
        config: FrontDoorConfig | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._upstreams = upstreams
        self._deployment_of = deployment_of
        self._monotonic = monotonic
        self._sleep = sleep
        self.config = config if config is not None else FrontDoorConfig()
        self.counts = RequestCounts(registry)
        self.inflight = 0

    # --- the requests ------------------------------------------------------------------------

    def admit(self) -> None:
        """Take one request in; ``RequestError`` 429 past ``max_inflight``."""
        if self.inflight >= self.config.max_inflight:
            raise RequestError(
                429,
                f"{self.inflight} chat requests in flight here, the most this front door "
                f"takes (--max-inflight {self.config.max_inflight}); retry shortly",
                retry_after=RETRY_AFTER_S,
            )
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1

    async def models(self) -> tuple[int, bytes]:
        """exo's ``GET /v1/models`` (status, body) from the first exo that answers."""
        why = "no exo URL"
        for client in self._upstreams():
            try:
                with anyio.fail_after(HEAD_TIMEOUT_S):
                    answer = await client.get(MODELS_PATH)
            except (httpx.HTTPError, TimeoutError) as exc:
                why = f"{client.base_url}: {type(exc).__name__} {exc}".strip()
                continue
            if answer.status_code >= 500:
                why = f"{client.base_url}: HTTP {answer.status_code}"
                continue
            return answer.status_code, answer.content
        raise RequestError(503, f"exo's model list is not available ({why})", retry_after=5)

    def stream(
        self, request: ChatRequest, body: dict[str, Any]
    ) -> AsyncGenerator[bytes | int, None]:
        """A streamed chat: yields the SSE bytes for the client, or, before any of them, one
        int: the HTTP status of the error the route answers instead (its body in ``failure``)."""
        return self._run(request, body, streamed=True)

    async def answer(self, request: ChatRequest, body: dict[str, Any]) -> tuple[int, bytes]:
        """A non-streamed chat: (status, body) to answer with."""
        chunks = [piece async for piece in self._run(request, body, streamed=False)]
        status = next((piece for piece in chunks if isinstance(piece, int)), 200)
        return status, b"".join(piece for piece in chunks if isinstance(piece, bytes))

    # --- the loop ----------------------------------------------------------------------------

    async def _run(
        self, request: ChatRequest, body: dict[str, Any], *, streamed: bool
    ) -> AsyncGenerator[bytes | int, None]:
        now = self._monotonic()
        progress = _Progress(started=now, since=now)
        if (request.n or 1) > 1:
            progress.inexact = f"n = {request.n}"
        elif request.logprobs:
            progress.inexact = "logprobs"
        attempt = _Attempt()
        found = self._deployment_of(request.model)
        deployment = found.deployment_id if found is not None else ""
        outcome: Outcome = "failed"
        try:
            while True:
                found = self._deployment_of(request.model)
                so_far = SoFar(
                    last=attempt.happened,
                    deployed=found is not None,
                    serving=found is not None and found.serving,
                    first_token_sent=progress.first_token_at is not None,
                    exact=progress.inexact is None,
                    cuts=progress.cuts,
                    held_s=self._monotonic() - progress.since,
                    hold_s=self.config.hold_s,
                    max_migrations=self.config.migrations,
                    held=progress.held,
                    sends=progress.sends,
                    continuations=progress.continuations,
                    paused=progress.paused,
                )
                action = next_action(so_far)
                if isinstance(action, Done):
                    outcome = action.outcome
                    return
                if isinstance(action, Hold):
                    progress.held = progress.paused = True
                    await self._sleep(min(RECHECK_S, max(0.0, self.config.hold_s - so_far.held_s)))
                    continue
                if isinstance(action, PassOn):
                    yield attempt.status
                    yield _error(attempt.status, attempt.why)
                    return
                if isinstance(action, Fail):
                    words = self._failure(action, request.model, found, progress, attempt)
                    if progress.first_token_at is not None:
                        yield _event(error_body(words, 502, "Bad Gateway"))
                        return
                    status = 503 if action.why == "not_serving" else 502
                    yield status
                    yield _error(status, words)
                    return
                assert isinstance(action, Send)
                progress.sends += 1
                progress.continuations += action.continuation
                progress.paused = False
                attempt = _Attempt()
                upstream = _with_continuation(body, progress.text) if action.continuation else body
                pieces = (
                    self._stream_attempt(upstream, progress, attempt)
                    if streamed
                    else self._whole_attempt(upstream, progress, attempt)
                )
                async for piece in pieces:
                    if progress.first_token_at is None:
                        progress.first_token_at = self._monotonic()
                    yield piece
                if attempt.happened == "cut":
                    progress.cuts += 1
        except BaseException:
            outcome = "cancelled"  # the client left (the route closes us), or we are stopped
            raise
        finally:
            ended = self._monotonic()
            ttft = (
                progress.first_token_at - progress.started
                if progress.first_token_at is not None
                else None
            )
            self.counts.count(deployment, outcome, ttft, ended)

    def _failure(
        self,
        fail: Fail,
        model: str,
        found: ModelDeployment | None,
        progress: _Progress,
        attempt: _Attempt,
    ) -> str:
        last = f" (last: {attempt.why})" if attempt.why else ""
        match fail.why:
            case "not_serving":
                state = found.words if found is not None else "no deployment"
                return (
                    f"{model} is not serving ({state}); held "
                    f"{self._monotonic() - progress.since:.0f} s, the most this front door "
                    f"waits (--hold-s {self.config.hold_s:g}){last}; retry shortly"
                )
            case "cuts":
                return (
                    f"exo cut this answer {progress.cuts} times; no more continuations "
                    f"(--migrations {self.config.migrations}){last}"
                )
            case "inexact":
                return (
                    f"exo cut this answer and it cannot be continued exactly "
                    f"({progress.inexact}){last}; the answer so far is incomplete"
                )
            case "garbage":
                return f"exo's answer cannot be read: {attempt.why}"
            case "refused_mid_stream":
                return f"exo refused to continue this answer: HTTP {attempt.status}{last}"

    # --- one attempt -------------------------------------------------------------------------

    async def _open(
        self, body: dict[str, Any], attempt: _Attempt, stack: _Opened
    ) -> httpx.Response | None:
        """The head of exo's answer from the first URL that answers; None with ``attempt``
        saying why when there is none to read on."""
        content = json.dumps(body).encode()
        attempt.happened, attempt.why = "unreachable", "no exo URL to send it to"
        for client in self._upstreams():
            try:
                with anyio.fail_after(HEAD_TIMEOUT_S):
                    request = client.build_request(
                        "POST",
                        CHAT_PATH,
                        content=content,
                        headers={"Content-Type": "application/json"},
                    )
                    response = await client.send(request, stream=True)
            except (httpx.HTTPError, TimeoutError) as exc:
                attempt.happened = "unreachable"
                attempt.why = f"{client.base_url}: {type(exc).__name__} {exc}".strip()
                continue
            stack.response = response
            if response.status_code >= 400:
                raw = await _read_capped(response, QUOTED_CHARS * 16)
                attempt.why = _exo_words(raw, response.reason_phrase)
                attempt.status = response.status_code
                if response.status_code >= 500:
                    attempt.happened = "upstream_error"
                elif response.status_code == 404 and "no instance" in attempt.why.lower():
                    attempt.happened = "no_instance"
                else:
                    attempt.happened = "refused"
                return None
            attempt.happened, attempt.why = None, ""
            return response
        return None

    async def _stream_attempt(
        self, body: dict[str, Any], progress: _Progress, attempt: _Attempt
    ) -> AsyncIterator[bytes]:
        opened = _Opened()
        try:
            response = await self._open({**body, "stream": True}, attempt, opened)
            if response is None:
                return
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != SSE:
                attempt.happened = "garbage"
                attempt.why = f"a stream was asked, exo answered {kind or 'no content type'}"
                return
            finished = False
            async for event in _sse_events(response.aiter_lines(), attempt):
                if event is None:  # a comment: keep-alive
                    if progress.first_token_at is not None:
                        yield b": keep-alive\n\n"
                    continue
                if event == "[DONE]":
                    break
                chunk = _json_event(event, attempt)
                if chunk is None:
                    return  # garbage, said in attempt
                if "error" in chunk:
                    attempt.happened = "cut"
                    attempt.why = _exo_words(json.dumps(chunk).encode(), "an error event")
                    return
                finished = self._note(chunk, progress) or finished
                progress.since = self._monotonic()
                yield _event(_as_one_completion(chunk, progress))
            if attempt.happened is not None:
                return  # cut or garbage, said in attempt
            if finished:
                # Its finish_reason came: the answer is whole, whether or not [DONE] followed
                # (exo writes a stats comment between them), so the client gets one [DONE].
                attempt.happened = "answered"
                yield b"data: [DONE]\n\n"
                return
            attempt.happened = "cut"
            attempt.why = "exo ended the stream without a finish_reason"
        finally:
            await opened.close()

    async def _whole_attempt(
        self, body: dict[str, Any], progress: _Progress, attempt: _Attempt
    ) -> AsyncIterator[bytes]:
        opened = _Opened()
        try:
            response = await self._open({**body, "stream": False}, attempt, opened)
            if response is None:
                return
            try:
                with anyio.fail_after(ANSWER_TIMEOUT_S):
                    raw = await _read_capped(response, ANSWER_MAX_BYTES)
            except (httpx.HTTPError, TimeoutError) as exc:
                attempt.happened = "cut"
                attempt.why = f"exo's answer broke off ({type(exc).__name__})"
                return
            if not raw.strip():
                attempt.happened = "cut"
                attempt.why = "exo answered 200 with an empty body"
                return
            answer = _json_event(raw.decode("utf-8", errors="replace"), attempt)
            if answer is None:
                return
            if not _finish_reason(answer):
                attempt.happened = "cut"
                attempt.why = "exo's answer has no finish_reason"
                return
            attempt.happened = "answered"
            yield raw
        finally:
            await opened.close()

    def _note(self, chunk: dict[str, Any], progress: _Progress) -> bool:
        """Take a chunk's text and what makes a continuation inexact; whether it finishes."""
        if progress.completion_id is None and isinstance(chunk.get("id"), str):
            progress.completion_id = chunk["id"]
        for choice in _choices(chunk):
            delta = choice.get("delta")
            if isinstance(delta, dict):
                delta = cast(dict[str, Any], delta)
                content = delta.get("content")
                if isinstance(content, str):
                    progress.text.append(content)
                for key, why in (("tool_calls", "tool calls"), ("reasoning_content", "reasoning")):
                    if delta.get(key) and progress.inexact is None:
                        progress.inexact = why
            if choice.get("logprobs") and progress.inexact is None:
                progress.inexact = "logprobs"
        return _finish_reason(chunk)


@dataclass
class _Opened:
    response: httpx.Response | None = None

    async def close(self) -> None:
        if self.response is not None:
            with anyio.CancelScope(shield=True):
                await self.response.aclose()


def _with_continuation(body: dict[str, Any], text: list[str]) -> dict[str, Any]:
    """The chat with the answer so far as a trailing assistant message (exo appends the model's
    continuation after it), its token limit what is left of the client's (exo streams a token
    per chunk, so each piece of text counts one); as sent when there is no text yet."""
    so_far = "".join(text)
    if not so_far:
        return body
    messages = [*cast(list[Any], body["messages"]), {"role": "assistant", "content": so_far}]
    continued = {**body, "messages": messages}
    for limit in ("max_tokens", "max_completion_tokens"):
        asked = body.get(limit)
        if isinstance(asked, int) and not isinstance(asked, bool):
            continued[limit] = max(1, asked - len(text))
    return continued


def _as_one_completion(chunk: dict[str, Any], progress: _Progress) -> dict[str, Any]:
    # A continuation's chunks carry exo's new id: the client sees the first attempt's.
    if progress.completion_id is not None and chunk.get("id") != progress.completion_id:
        return {**chunk, "id": progress.completion_id}
    return chunk


def _choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    choices = chunk.get("choices")
    if not isinstance(choices, list):
        return []
    return [cast(dict[str, Any], c) for c in cast(list[Any], choices) if isinstance(c, dict)]


def _finish_reason(chunk: dict[str, Any]) -> bool:
    return any(choice.get("finish_reason") for choice in _choices(chunk))


async def _sse_events(lines: AsyncIterator[str], attempt: _Attempt) -> AsyncIterator[str | None]:
    """exo's SSE stream as its events' data (None for a comment); ends, with ``attempt`` saying
    why, when the stream breaks or is silent for ``STREAM_SILENCE_S``."""
    data: list[str] = []
    size = 0
    while True:
        try:
            with anyio.fail_after(STREAM_SILENCE_S):
                line = await anext(lines)
        except StopAsyncIteration:
            return
        except TimeoutError:
            attempt.happened = "cut"
            attempt.why = f"exo's stream was silent for {STREAM_SILENCE_S:g} s"
            return
        except httpx.HTTPError as exc:
            attempt.happened = "cut"
            attempt.why = f"exo's stream broke off ({type(exc).__name__})"
            return
        size += len(line)
        if size > ANSWER_MAX_BYTES:
            attempt.happened = "garbage"
            attempt.why = "an event of exo's stream is over 16 MiB"
            return
        if line.startswith(":"):
            yield None
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            yield "\n".join(data)
            data, size = [], 0
        elif line and not line.startswith(("event:", "id:", "retry:")):
            attempt.happened = "garbage"
            attempt.why = f"exo's stream is not SSE: {line[:80]!r}"
            return


def _json_event(text: str, attempt: _Attempt) -> dict[str, Any] | None:
    try:
        value: Any = json.loads(text)
    except ValueError:
        attempt.happened = "garbage"
        attempt.why = f"not JSON: {text[:80]!r}"
        return None
    if not isinstance(value, dict):
        attempt.happened = "garbage"
        attempt.why = f"not a JSON object: {text[:80]!r}"
        return None
    return cast(dict[str, Any], value)


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: cap - len(body)]
        if len(body) >= cap:
            break
    return bytes(body)


def _exo_words(raw: bytes, fallback: str) -> str:
    """exo's reason in an error body (its envelope or FastAPI's ``detail``), else its start."""
    try:
        value: Any = json.loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        value = cast(dict[str, Any], value)
        error = value.get("error")
        if isinstance(error, dict) and isinstance(cast(dict[str, Any], error).get("message"), str):
            return str(cast(dict[str, Any], error)["message"])[:QUOTED_CHARS]
        detail = value.get("detail")
        if detail is not None:
            return (detail if isinstance(detail, str) else json.dumps(detail))[:QUOTED_CHARS]
    text = raw.decode("utf-8", errors="replace").strip()
    return text[:QUOTED_CHARS] or fallback


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def _error(status: int, message: str) -> bytes:
    """The error envelope's JSON (``keeper.httpapi.errors``' shape, OpenAI's keys)."""
    return json.dumps(error_body(message, status, HTTPStatus(status).phrase)).encode()


__all__ = [
    "CHAT_PATH",
    "MODELS_PATH",
    "OUTCOMES",
    "ChatDocument",
    "ChatRequest",
    "FrontDoor",
    "FrontDoorConfig",
    "ModelDeployment",
    "RequestError",
    "parse_chat",
]
