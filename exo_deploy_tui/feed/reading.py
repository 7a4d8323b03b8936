"""Reading what a master answers the dashboard's polls: bounded, and said plainly when it fails.

A poll can reach something that is not the master it expects: a web server or proxy answering
an HTML page, an error status, JSON of another shape, a body far too large or nested too deep.
Each is an ``UnreadableAnswerError`` whose reason is short and specific ("not JSON (text/html)",
"not exo's State: topology.nodes: expected an array", "HTTP 502"), because the dashboard shows
it in its one status line, and it must never read as an empty cluster.

Our ``State`` model is tolerant (a missing key reads as empty), which would make any JSON object
read as a cluster with nothing in it; so a State must at least carry what the dashboard shows
(``SHOWN_KEYS``). JSON nesting is bounded by pydantic's parser itself (it refuses past a depth
of 200 rather than recursing without end), whose refusal is worded here; a ``RecursionError``
is caught all the same, since the bound belongs to a library, not to us.

No Textual, no retry policy: bytes and headers in, a value or a reason out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import httpx
from pydantic import BaseModel, ValidationError

from keeper.model.api_models import DeploymentsResponse
from keeper.model.exo_state import ExoRead, UnreadablePart, read_exo_state
from keeper.model.state import State

MIB = 1024 * 1024
# The most a poll reads of one answer. A State of 64 nodes and 500 deployments is 1.7 MB, its
# deployments 0.3 MB; 32 MiB leaves room for clusters far larger, yet a wrong URL that streams
# a huge file (or never stops) cannot fill the dashboard's memory.
MAX_ANSWER_BYTES = 32 * MIB
# A reason is shown on the one status line (and in the timeline): a longer one, such as pydantic
# listing every tag a union expected, is cut here.
MAX_REASON_CHARS = 100
# What the dashboard shows of a State; JSON without them is something else, not an empty cluster.
SHOWN_KEYS = ("topology", "instances")

# pydantic's error types, in the words of JSON rather than of Python.
_EXPECTED = {
    "model_type": "expected an object",
    "model_attributes_type": "expected an object",
    "dict_type": "expected an object",
    "list_type": "expected an array",
    "tuple_type": "expected an array",
    "string_type": "expected a string",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "missing": "missing",
}

Parsed = TypeVar("Parsed", bound=BaseModel)


class UnreadableAnswerError(Exception):
    """The master answered, but not with anything the dashboard can read; the message says why."""


async def read_capped(response: httpx.Response, limit: int = MAX_ANSWER_BYTES) -> bytes:
    """The body of a streamed ``response``, refused once it is past ``limit`` bytes (at once if
    its Content-Length says so, else as soon as that many have arrived)."""
    too_large = f"larger than {limit // MIB} MiB" if limit >= MIB else f"larger than {limit} bytes"
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise UnreadableAnswerError(too_large)
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise UnreadableAnswerError(too_large)
    return bytes(body)


def media_type(content_type: str | None) -> str:
    """``text/html`` of ``text/html; charset=utf-8``; empty if there is none."""
    return (content_type or "").split(";", 1)[0].strip().casefold()


@dataclass(frozen=True)
class StateRead:
    """A polled State, and the entries of it that did not read and were left out."""

    state: State
    unreadable: tuple[UnreadablePart, ...] = ()


def read_state(body: bytes, content_type: str | None) -> StateRead:
    """A polled ``GET /state`` body as our State, or ``UnreadableAnswerError`` saying why not.

    A State that does not read whole is read entry by entry as the bridge reads exo's
    (``keeper.model.exo_state``): an instance, runner, node report or download entry that does
    not read is left out and named, and the rest is shown. Only what everything hangs on (its
    shape, a key the dashboard or the keeper reads) makes the answer unreadable."""
    try:
        state = _parse(State, body, content_type, shape="not exo's State")
    except UnreadableAnswerError as whole:
        read = _read_by_entry(body)
        if read is None:
            raise whole from None
        state, unreadable = read.state, read.unreadable
    else:
        unreadable = ()
    missing = [key for key in SHOWN_KEYS if key not in state.model_fields_set]
    if missing:
        raise UnreadableAnswerError(f'not exo\'s State: no "{missing[0]}"')
    return StateRead(state, unreadable)


def _read_by_entry(body: bytes) -> ExoRead | None:
    """``body`` read entry by entry, or None when even that fails (not JSON, not an object,
    nested too deep, or lacking what everything hangs on)."""
    try:
        raw: Any = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(raw, dict):
        return None
    read = read_exo_state(cast(dict[str, Any], raw))
    return read if isinstance(read, ExoRead) else None


def read_deployments(body: bytes, content_type: str | None) -> DeploymentsResponse:
    """A polled ``GET /deployments`` body, or ``UnreadableAnswerError`` naming /deployments and
    why not."""
    return _parse(
        DeploymentsResponse,
        body,
        content_type,
        what="/deployments: ",
        shape="not a deployments list",
    )


def read_message(model: type[Parsed], data: str, name: str) -> Parsed:
    """The data of one ``name`` message of the master's event stream, or ``UnreadableAnswerError``
    naming the message and why."""
    return _parse(model, data, None, what=f"{name} message: ")


def _parse(
    model: type[Parsed],
    body: bytes | str,
    content_type: str | None,
    *,
    what: str = "",
    shape: str = "",
) -> Parsed:
    """``body`` as ``model``; else why not, starting with ``what`` (where the body came from),
    and for JSON of the wrong shape ``shape`` (what it is not) and the first field wrong."""
    try:
        return model.model_validate_json(body)
    except RecursionError:
        raise UnreadableAnswerError(f"{what}nested too deep") from None
    except ValidationError as exc:
        raise UnreadableAnswerError(what + _why(exc, content_type, shape)) from None


def _why(exc: ValidationError, content_type: str | None, shape: str) -> str:
    errors = exc.errors()
    if not errors:
        return shape or "unreadable"
    first = errors[0]
    if first["type"] == "json_invalid":
        if "recursion limit" in first["msg"]:
            return "nested too deep"
        media = media_type(content_type)
        if media and "json" not in media:
            return f"not JSON ({media})"
        return "not JSON"
    where = ".".join(str(part) for part in first["loc"])
    wrong = _EXPECTED.get(first["type"], first["msg"])
    tag = (first.get("ctx") or {}).get("tag")
    if first["type"] == "union_tag_invalid" and tag is not None:
        wrong = f"unknown tag {tag}"
    why = ": ".join(part for part in (shape, where, wrong) if part)
    return why if len(why) <= MAX_REASON_CHARS else why[: MAX_REASON_CHARS - 1] + "…"
