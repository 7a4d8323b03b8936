"""How one streamed chat ended for the client that sent it (docs/design.md §8.6): one rule for
the tests that chat through our master's front door while a replica's node is killed, in
virtual time (tests/virtual/test_chat_replicas.py) and as processes
(tests/processes/test_master_front_door.py). Every chat is one of:

- *ok*: answered whole: a 200 whose text is the simulated node's answer up to ``max_tokens``
  (nothing repeated, nothing dropped, however many instances wrote it), under one completion
  id, with its ``finish_reason`` and one ``[DONE]`` at the end;
- *failed*: an error status, no answer at all, an error event, or a whole answer whose text or
  ids are wrong;
- *cut*: a 200 that ended with neither a ``finish_reason`` nor one ``[DONE]``: neither a result
  nor an error;
- *hung*: no end within the test's deadline (the caller's to tell: this rule reads what came).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from model_ids import QWEN

from keeper.sim.node.sim_node import reply_tokens

Outcome = Literal["ok", "failed", "cut", "hung"]
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


def outcome_of(status: int, body: bytes, max_tokens: int) -> Outcome:
    """How a streamed chat of ``max_tokens`` that answered ``status`` and ``body`` ended
    (status 0: no answer began)."""
    if status != 200:
        return "failed"
    events = sse_data(body)
    chunks: list[dict[str, Any]] = [json.loads(event) for event in events if event != "[DONE]"]
    if any("error" in chunk for chunk in chunks):
        return "failed"
    choices = [choice for chunk in chunks for choice in chunk.get("choices", [])]
    finished = any(choice.get("finish_reason") for choice in choices)
    if not finished or events.count("[DONE]") != 1 or events[-1] != "[DONE]":
        return "cut"
    text = "".join(choice["delta"].get("content") or "" for choice in choices)
    whole = text == "".join(reply_tokens()[:max_tokens])
    return "ok" if whole and len({chunk["id"] for chunk in chunks}) == 1 else "failed"
