"""One attempt of a chat at exo, streamed or whole, read into the request's progress
(docs/design.md §8.6).

The front door's loop (``keeper.runtime.front_door``) decides whether to send; an attempt sends
once and reads exo's answer to its end, yielding the bytes the client gets as they come and
leaving in its ``Attempt`` what it came to (answered, cut, garbage, refused...), and in the
request's ``Progress`` what the client now has (the text, for a continuation; the first
completion id, which every later chunk carries). Apart from the loop so that each reads in one
screen: the loop is the rule's shell, this is exo's answer read.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx

from keeper.model.chat_continuation import (
    as_one_completion,
    client_usage,
    finish_reason,
    read_chunk,
)
from keeper.runtime.front_door_upstream import (
    ANSWER_MAX_BYTES,
    ANSWER_TIMEOUT_S,
    Attempt,
    Opened,
    cancel_chat,
    exo_words,
    json_event,
    open_chat,
    read_capped,
    read_to_end,
    sse_events,
)
from keeper.runtime.front_door_wire import SSE, LastPiece, sse_event

log = logging.getLogger(__name__)

# How often a non-streamed attempt asks whether it is stranded while exo writes nothing: a tenth
# of the time it takes to be (``STRANDED_AFTER_S``), and nothing to a service's CPU.
STRANDED_CHECK_S = 0.5


@dataclass
class Progress:
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
    usage_sent: bool = False  # the client has had its one ``usage``
    # The instances of its model the current attempt may have been routed to when it was sent
    # (``keeper.model.request_rule.stranded``).
    sent_on: frozenset[str] = frozenset()


async def stream_attempt(
    clients: Sequence[httpx.AsyncClient],
    body: dict[str, Any],
    progress: Progress,
    attempt: Attempt,
    monotonic: Callable[[], float],
    carried: int = 0,
    stranded: Callable[[], str | None] = lambda: None,
) -> AsyncGenerator[bytes, None]:
    """A streamed attempt: the client's SSE bytes as exo's chunks come, those that came in one
    read in one piece. ``carried``: the tokens of the answer so far that this attempt, a
    continuation, sent back in its prompt (its usage is counted over the whole answer).
    ``stranded``: why exo will never answer it (asked at each read: exo's keep-alives come
    every 10 s), which cuts it. When it is left before exo ends it (the client gone), exo is
    asked to cancel the chat."""
    opened = Opened()
    try:
        response = await open_chat(clients, {**body, "stream": True}, attempt, opened)
        if response is None:
            return
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != SSE:
            attempt.happened = "garbage"
            attempt.why = f"a stream was asked, exo answered {kind or 'no content type'}"
            return
        reading = _Reading(progress, attempt, monotonic, carried)
        chunks = response.aiter_bytes()
        async for events in sse_events(chunks, attempt, stranded):
            piece = reading.pass_on(events)
            if reading.done and reading.finished:
                # The answer is whole: the client's [DONE] goes with its last chunk.
                attempt.happened = "answered"
                yield LastPiece(piece + b"data: [DONE]\n\n")
                await read_to_end(chunks)  # its connection kept for the next chat
                return
            if piece:
                yield piece
            if reading.done or attempt.happened is not None:
                break
        if attempt.happened is not None:
            return  # cut or garbage, said in attempt
        if reading.finished:
            # Its finish_reason came: the answer is whole, whether or not [DONE] followed
            # (exo writes a stats comment between them), so the client gets one [DONE].
            attempt.happened = "answered"
            yield LastPiece(b"data: [DONE]\n\n")
            return
        attempt.happened = "cut"
        attempt.why = "exo ended the stream without a finish_reason"
    finally:
        if attempt.happened is None and attempt.command_id and opened.client is not None:
            # Left mid-answer (every end of exo's sets ``happened``): exo would go on writing
            # an answer nobody reads, holding a place on its instance.
            said = await cancel_chat(opened.client, attempt.command_id)
            log.info("chat %s left mid-answer; exo's cancel: %s", attempt.command_id, said)
        await opened.close()


async def whole_attempt(
    clients: Sequence[httpx.AsyncClient],
    body: dict[str, Any],
    progress: Progress,
    attempt: Attempt,
    stranded: Callable[[], str | None] = lambda: None,
) -> AsyncGenerator[bytes, None]:
    """A non-streamed attempt: exo's answer, passed on whole once it shows its finish_reason.
    ``stranded`` is asked every ``STRANDED_CHECK_S`` while exo writes nothing (its answer
    comes whole at the end): why exo will never answer it, which cuts it."""
    opened = Opened()
    try:
        response = await open_chat(clients, {**body, "stream": False}, attempt, opened)
        if response is None:
            return
        raw = b""
        broke: Exception | None = None  # raised in the task: caught there, not in a group
        try:
            with anyio.fail_after(ANSWER_TIMEOUT_S):
                async with anyio.create_task_group() as group:  # no yield inside it

                    async def read() -> None:
                        nonlocal raw, broke
                        try:
                            raw = await read_capped(response, ANSWER_MAX_BYTES)
                        except httpx.HTTPError as exc:
                            broke = exc
                        group.cancel_scope.cancel()

                    group.start_soon(read)
                    while (why := stranded()) is None:
                        await anyio.sleep(STRANDED_CHECK_S)
                    attempt.happened, attempt.why = "cut", why
                    group.cancel_scope.cancel()
        except TimeoutError as exc:
            broke = exc
        if broke is not None:
            attempt.happened = "cut"
            attempt.why = f"exo's answer broke off ({type(broke).__name__})"
            return
        if attempt.happened is not None:
            return  # stranded, said in attempt
        if not raw.strip():
            attempt.happened = "cut"
            attempt.why = "exo answered 200 with an empty body"
            return
        answer = json_event(raw.decode("utf-8", errors="replace"), attempt)
        if answer is None:
            return
        if not finish_reason(answer):
            attempt.happened = "cut"
            attempt.why = "exo's answer has no finish_reason"
            return
        attempt.happened = "answered"
        yield raw
    finally:
        await opened.close()


@dataclass
class _Reading:
    """One streamed attempt's events read into the client's bytes."""

    progress: Progress
    attempt: Attempt
    monotonic: Callable[[], float]
    carried: int
    finished: bool = False  # the answer's finish_reason came
    done: bool = False  # exo's [DONE] came

    def pass_on(self, events: list[str | None]) -> bytes:
        """The client's bytes for ``events`` (one read's), up to exo's [DONE] or the first
        that ends the attempt (``attempt`` then says how)."""
        progress, attempt = self.progress, self.attempt
        piece = bytearray()
        for event in events:
            if event is None:  # a comment: keep-alive, once the client has a token
                if progress.first_token_at is not None or piece:
                    piece += b": keep-alive\n\n"
                continue
            if event == "[DONE]":
                self.done = True
                break
            chunk = json_event(event, attempt)
            if chunk is None:
                break  # garbage, said in attempt
            if "error" in chunk:
                attempt.happened = "cut"
                attempt.why = exo_words(json.dumps(chunk).encode(), "an error event")
                break
            if attempt.command_id is None and isinstance(chunk.get("id"), str):
                attempt.command_id = chunk["id"]
            self.finished = _note(chunk, progress) or self.finished
            progress.since = self.monotonic()
            sent = client_usage(
                chunk, at_end=self.finished, carried=self.carried, sent=progress.usage_sent
            )
            progress.usage_sent = progress.usage_sent or sent.get("usage") is not None
            sent = as_one_completion(sent, progress.completion_id)
            if sent is chunk and "\n" not in event:
                piece += b"data: %s\n\n" % event.encode()  # as exo wrote it: nothing to change
            else:
                piece += sse_event(sent)
        return bytes(piece)


def _note(chunk: dict[str, Any], progress: Progress) -> bool:
    """Take a chunk's text and what makes a continuation inexact; whether it finishes."""
    reading = read_chunk(chunk)
    if progress.completion_id is None:
        progress.completion_id = reading.completion_id
    progress.text.extend(reading.texts)
    if progress.inexact is None:
        progress.inexact = reading.inexact
    return reading.finished
