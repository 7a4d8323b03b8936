"""How one streamed chat ended for the client that sent it (docs/design.md §8.6): the one rule
for every test that counts chats, so that a count means the same in each tier. It counts the
chats through our master's front door while a replica's node is killed, in virtual time
(tests/virtual/test_chat_replicas.py) and as processes
(tests/processes/test_master_front_door_process.py); the clients through the bridge's front
door and straight to exo, in virtual time and as processes (tests/front_door_clients.py); and
those on a real exo cluster (tests/exo_clients.py).
Every chat is one of:

- *ok*: answered whole: a 200 whose text is the answer (the simulated node's up to
  ``max_tokens``; any text from a real model), nothing repeated, nothing dropped, however many
  instances wrote it, under one completion id, with its ``finish_reason`` and one ``[DONE]`` at
  the end;
- *failed*: an error status (no connection at all counts so too), an error event, an event that
  is not a JSON object, or a whole answer whose text or ids are wrong;
- *cut*: a 200 that ended with neither a ``finish_reason`` nor one ``[DONE]``: neither a result
  nor an error (exo's way of closing a chat whose instance it deleted, or a connection broken
  mid-answer);
- *hung*: no end within the test's deadline (the caller's to tell: this rule reads what came).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from model_ids import QWEN

from keeper.sim.node.sim_node import reply_tokens

Outcome = Literal["ok", "failed", "cut", "hung"]
# In the order a report prints them.
OUTCOMES: tuple[Outcome, ...] = ("ok", "failed", "cut", "hung")


def chat_body(max_tokens: int) -> dict[str, Any]:
    """A streamed chat for Qwen asking for ``max_tokens`` tokens."""
    return {
        "model": QWEN,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": True,
        "max_tokens": max_tokens,
    }


def sse_data(body: bytes) -> list[str]:
    """The ``data:`` of each event of an SSE body, in order (comments left out)."""
    return [
        block.removeprefix("data: ")
        for block in body.decode(errors="replace").split("\n\n")
        if block.startswith("data: ")
    ]


def outcome_of_events(status: int, events: Sequence[str], answer: str | None) -> Outcome:
    """How a streamed chat ended that answered ``status`` (0: no answer began) and the data of
    ``events``, in order; ``answer`` is the text of a whole answer (None: any text will do)."""
    if status != 200:
        return "failed"
    chunks: list[dict[str, Any]] = []
    for event in events:
        if event == "[DONE]":
            continue
        try:
            chunk: Any = json.loads(event)
        except ValueError:
            return "failed"
        if not isinstance(chunk, dict) or "error" in chunk:
            return "failed"
        chunks.append(chunk)
    choices: list[dict[str, Any]] = [
        choice for chunk in chunks for choice in chunk.get("choices") or []
    ]
    finished = any(choice.get("finish_reason") for choice in choices)
    if not finished or events.count("[DONE]") != 1 or events[-1] != "[DONE]":
        return "cut"
    text = "".join((choice.get("delta") or {}).get("content") or "" for choice in choices)
    whole = text == answer if answer is not None else bool(text)
    return "ok" if whole and len({chunk.get("id") for chunk in chunks}) == 1 else "failed"


def outcome_of(status: int, body: bytes, max_tokens: int) -> Outcome:
    """How a streamed chat of ``max_tokens`` to simulated nodes ended that answered ``status``
    (0: no answer began) and ``body``."""
    return outcome_of_events(status, sse_data(body), "".join(reply_tokens()[:max_tokens]))
