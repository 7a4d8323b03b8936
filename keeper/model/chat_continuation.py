"""A chat's chunks read, and a cut chat continued, for the front door (docs/design.md §8.6).

The front door (``keeper.runtime.front_door``) continues an answer exo cut: the text the client
already has goes back to exo as a trailing assistant message (exo appends the model's
continuation after it) and the continuation's chunks reach the client under the first attempt's
completion id, so the client reads one completion. What a chunk carries (its text, whether it
finishes the answer, what would make a continuation inexact) and how the continued request and
its chunks are written are pure functions of OpenAI's JSON, apart from the shell that sends and
reads, so each is a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

# What in a delta makes a continuation inexact, with the words a refusal gives for it: exo
# continues text only; a half-written tool call or reasoning cannot be sent back as the
# assistant's text.
_INEXACT_DELTAS: tuple[tuple[str, str], ...] = (
    ("tool_calls", "tool calls"),
    ("reasoning_content", "reasoning"),
)


@dataclass(frozen=True)
class ChunkReading:
    """What one streamed chunk brings: its id, its text (one piece per choice that has any),
    why a continuation after it could not be exact (None when it could), and whether it
    finishes the answer."""

    completion_id: str | None
    texts: tuple[str, ...]
    inexact: str | None
    finished: bool


def choices(chunk: dict[str, Any]) -> list[dict[str, Any]]:
    """The chunk's (or answer's) choices that are objects; none when it has no list of them."""
    found = chunk.get("choices")
    if not isinstance(found, list):
        return []
    return [cast(dict[str, Any], c) for c in cast(list[Any], found) if isinstance(c, dict)]


def finish_reason(chunk: dict[str, Any]) -> bool:
    """Whether any choice of the chunk (or answer) has its ``finish_reason``: the answer whole."""
    return any(choice.get("finish_reason") for choice in choices(chunk))


def read_chunk(chunk: dict[str, Any]) -> ChunkReading:
    """One streamed chunk's id, text, inexactness and end (``ChunkReading``)."""
    texts: list[str] = []
    inexact: str | None = None
    for choice in choices(chunk):
        delta = choice.get("delta")
        if isinstance(delta, dict):
            delta = cast(dict[str, Any], delta)
            content = delta.get("content")
            if isinstance(content, str):
                texts.append(content)
            for key, why in _INEXACT_DELTAS:
                if delta.get(key) and inexact is None:
                    inexact = why
        if choice.get("logprobs") and inexact is None:
            inexact = "logprobs"
    found = chunk.get("id")
    return ChunkReading(
        completion_id=found if isinstance(found, str) else None,
        texts=tuple(texts),
        inexact=inexact,
        finished=finish_reason(chunk),
    )


def with_continuation(body: dict[str, Any], text: list[str]) -> dict[str, Any]:
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


def as_one_completion(chunk: dict[str, Any], completion_id: str | None) -> dict[str, Any]:
    """The chunk under the first attempt's ``completion_id``: a continuation's chunks carry
    exo's new id, and the client must see one completion."""
    if completion_id is not None and chunk.get("id") != completion_id:
        return {**chunk, "id": completion_id}
    return chunk


def continued_usage(usage: dict[str, Any], carried: int) -> dict[str, Any]:
    """exo's ``usage`` for a continuation as the client's whole answer counts it: the
    continuation's prompt held the ``carried`` tokens the client already had (exo appends the
    assistant's text to the prompt), so they move from the prompt to the completion: the prompt
    is the first attempt's, the completion every attempt's, the total unchanged. As exo sent it
    when its counts are not whole numbers."""
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if not (_count(prompt) and _count(completion)) or carried <= 0:
        return usage
    assert isinstance(prompt, int) and isinstance(completion, int)
    moved = min(carried, prompt)
    merged = {**usage, "prompt_tokens": prompt - moved, "completion_tokens": completion + moved}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        details = cast(dict[str, Any], details)
        cached = details.get("cached_tokens")
        if _count(cached) and cast(int, cached) > prompt - moved:
            # The carried text was cached too: no more of the first prompt than it holds.
            merged["prompt_tokens_details"] = {**details, "cached_tokens": prompt - moved}
    return merged


def client_usage(
    chunk: dict[str, Any], *, at_end: bool, carried: int, sent: bool
) -> dict[str, Any]:
    """The chunk as the client gets it with regard to ``usage``: exo's usage, counted over the
    whole answer (``continued_usage``), on the first chunk that has one once the answer's
    ``finish_reason`` came (``at_end``: this chunk's or an earlier one's); on any other chunk,
    none. A cut attempt's usage would count only its part, and the client gets one usage."""
    usage = chunk.get("usage")
    if usage is None:
        return chunk
    if not at_end or sent or not isinstance(usage, dict):
        return {key: value for key, value in chunk.items() if key != "usage"}
    return {**chunk, "usage": continued_usage(cast(dict[str, Any], usage), carried)}


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
