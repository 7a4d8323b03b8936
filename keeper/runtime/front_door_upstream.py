"""exo's side of the front door's wire (docs/design.md §8.6): a chat sent to the first exo URL
that answers, and exo's answer read as exo writes it, every way of it going wrong said in words.

exo writes a streamed answer as SSE events, one per ``data:`` line, with a keep-alive comment
every 10 s; a refusal as its error envelope or FastAPI's ``detail``. Each read here is bounded
(in time and in bytes) and ends by saying what happened in an ``Attempt`` rather than by
raising, so the front door's rule (``keeper.model.request_rule``) sees every trouble as one of
its ``Happened`` and the client never sees a traceback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import quote
from weakref import WeakKeyDictionary

import anyio
import httpx

from keeper.model.request_rule import Happened
from keeper.runtime.front_door_sse import SseDecoder
from keeper.runtime.front_door_wire import CHAT_PATH

# exo answers a chat's head at once (its body streams), but holds it through an election
# (measured up to 6 s): past this an attempt counts as exo unreachable.
HEAD_TIMEOUT_S = 10.0
# exo writes a keep-alive comment every 10 s on a stream: three missed means the stream is dead
# (a node frozen under it), and it is treated as cut.
STREAM_SILENCE_S = 30.0
# A non-streamed answer comes whole at the end, its head with it: a long answer (4,096 tokens at
# 10 tok/s) fits. A chat on a dead node's instance does not wait this long: exo closes it when
# the instance is deleted (the bridge deletes it within seconds of the node's death).
ANSWER_TIMEOUT_S = 600.0
# Per chat request, httpx's own deadlines: connecting and sending within the head's bound; the
# reading is bounded by this module's own (the head, the stream's silence, the whole answer),
# not by the exo client's 8 s, which cut every stream that only got exo's 10 s keep-alive.
CHAT_HTTP_TIMEOUT = httpx.Timeout(HEAD_TIMEOUT_S, read=None)
# The most of a non-streamed answer read, and of one SSE event: exo's answers are text.
ANSWER_MAX_BYTES = 16 * 2**20
# exo ends a stream right after its ``[DONE]``; the end is read (so httpx keeps the connection
# for the next chat, rather than opening one a chat) for at most this long, the client's answer
# already ended (the route ends it with the door's last piece): an exo that keeps the stream
# open past it has its connection closed instead. Long beside exo's end coming at once, short
# beside a chat: the chat's slot (``--max-inflight``) is held meanwhile.
AFTER_DONE_S = 1.0
# The most of an error's text quoted from exo.
QUOTED_CHARS = 300
# exo's own cancel of a chat whose client left (``POST /v1/cancel/{command_id}``) is answered
# from its API's memory at once; it is best effort (closing the connection also ends exo's
# stream), so a client's slot is not held longer than this for it.
CANCEL_TIMEOUT_S = 2.0
CANCEL_PATH = "/v1/cancel/"


# The chat route's URL on each exo client (``_chat_url``), until the client is gone.
_CHAT_URLS: WeakKeyDictionary[httpx.AsyncClient, tuple[httpx.URL, httpx.URL]] = WeakKeyDictionary()


@dataclass
class Attempt:
    """What the current attempt has brought."""

    happened: Happened | None = None
    why: str = ""  # exo's words, when it refused or failed
    status: int = 0  # exo's status, when it refused
    command_id: str | None = None  # exo's id of this attempt (its chunks' ``id``), once seen


@dataclass
class Opened:
    """The response an attempt opened, and the exo URL that answered it, closed however the
    attempt ends."""

    response: httpx.Response | None = None
    client: httpx.AsyncClient | None = None

    async def close(self) -> None:
        if self.response is not None:
            with anyio.CancelScope(shield=True):
                await self.response.aclose()


async def open_chat(
    clients: Sequence[httpx.AsyncClient], body: dict[str, Any], attempt: Attempt, opened: Opened
) -> httpx.Response | None:
    """The head of exo's answer from the first URL that answers; None with ``attempt`` saying
    why when there is none to read on."""
    content = json.dumps(body).encode()
    # exo sends a stream's head at once, a whole answer's with the answer.
    head_s = HEAD_TIMEOUT_S if body.get("stream") else ANSWER_TIMEOUT_S
    attempt.happened, attempt.why = "unreachable", "no exo URL to send it to"
    for client in clients:
        try:
            with anyio.fail_after(head_s):
                request = client.build_request(
                    "POST",
                    _chat_url(client),
                    content=content,
                    headers={"Content-Type": "application/json"},
                    timeout=CHAT_HTTP_TIMEOUT,
                )
                response = await client.send(request, stream=True)
        except (httpx.HTTPError, TimeoutError) as exc:
            attempt.happened = "unreachable"
            attempt.why = f"{client.base_url}: {type(exc).__name__} {exc}".strip()
            continue
        opened.response, opened.client = response, client
        if response.status_code >= 400:
            raw = await read_capped(response, QUOTED_CHARS * 16)
            attempt.why = exo_words(raw, response.reason_phrase)
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


def _chat_url(client: httpx.AsyncClient) -> httpx.URL:
    """The chat route's URL on ``client``'s exo, as httpx joins it to the base URL, worked out
    once per client (joining parses both URLs again: measured, 0.1 ms of each chat)."""
    kept = _CHAT_URLS.get(client)
    if kept is None or kept[0] is not client.base_url:
        kept = _CHAT_URLS[client] = (client.base_url, client.build_request("POST", CHAT_PATH).url)
    return kept[1]


async def cancel_chat(client: httpx.AsyncClient, command_id: str) -> str:
    """Ask exo to cancel the chat it runs as ``command_id`` (its chunks' ``id``): what exo
    answered, in words. Best effort, within ``CANCEL_TIMEOUT_S``, even while being cancelled."""
    with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_TIMEOUT_S):
        try:
            answer = await client.post(CANCEL_PATH + quote(command_id, safe=""))
        except httpx.HTTPError as exc:
            return f"{client.base_url}: {type(exc).__name__} {exc}".strip()
        if answer.status_code < 400:
            return f"HTTP {answer.status_code}"
        return f"HTTP {answer.status_code} {exo_words(answer.content, answer.reason_phrase)}"
    return f"no answer within {CANCEL_TIMEOUT_S:g} s"


async def sse_events(
    chunks: AsyncIterator[bytes],
    attempt: Attempt,
    stranded: Callable[[], str | None] = lambda: None,
) -> AsyncIterator[list[str | None]]:
    """exo's SSE stream as its events' data (None for a comment), those one read of the socket
    completed in one list (``keeper.runtime.front_door_sse``); ends, with ``attempt`` saying
    why, when the stream breaks, is not SSE, is silent for ``STREAM_SILENCE_S``, or is
    ``stranded`` (asked at each read: exo writes a keep-alive every 10 s)."""
    decoder = SseDecoder(ANSWER_MAX_BYTES)
    while True:
        # A cancel scope of its own, not ``fail_after``: this is once a chunk, and half the
        # cost (``fail_after`` wraps the same scope in a generator).
        chunk = b""
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + STREAM_SILENCE_S) as silence:
                chunk = await anext(chunks)
        except StopAsyncIteration:
            events = decoder.end()
            if events:
                yield events
            return
        except httpx.HTTPError as exc:
            attempt.happened = "cut"
            attempt.why = f"exo's stream broke off ({type(exc).__name__})"
            return
        if silence.cancelled_caught:
            attempt.happened = "cut"
            attempt.why = f"exo's stream was silent for {STREAM_SILENCE_S:g} s"
            return
        events = decoder.feed(chunk)
        if all(event is None for event in events):  # keep-alives, or part of an event: no token
            why = stranded()
            if why is not None:
                attempt.happened, attempt.why = "cut", why
                return
        if events:
            yield events
        if decoder.trouble is not None:
            attempt.happened, attempt.why = "garbage", decoder.trouble
            return


async def read_to_end(chunks: AsyncIterator[bytes]) -> bool:
    """Read what is left of exo's stream after its ``[DONE]``, within ``AFTER_DONE_S`` and
    ``ANSWER_MAX_BYTES``: whether it ended (its connection then kept for another chat)."""
    size = 0
    with anyio.move_on_after(AFTER_DONE_S):
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > ANSWER_MAX_BYTES:
                    return False
        except httpx.HTTPError:
            return False
        return True
    return False


def json_event(text: str, attempt: Attempt) -> dict[str, Any] | None:
    """The JSON object ``text`` holds; None with ``attempt`` saying why when it is not one."""
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


async def read_capped(response: httpx.Response, cap: int) -> bytes:
    """At most ``cap`` bytes of the response's body."""
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk[: cap - len(body)]
        if len(body) >= cap:
            break
    return bytes(body)


def exo_words(raw: bytes, fallback: str) -> str:
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
