"""Clients that chat through the bridge's front door and straight to exo side by side, each chat
counted by how it ended for the person who sent it (docs/design.md §8.6).

Shared by the front door's fault tests in virtual time (``tests/virtual/test_front_door_failover
.py``) and as real processes (``tests/processes/test_front_door_faults.py``), so that both count
with one rule (``tests/chat_outcomes.py``: ok, failed, cut, or hung: no end within ``HUNG_S``)
and print one line.

A client chats one chat after another until told to stop; ``CLIENTS`` of them go through the
door and as many straight to exo, started at spread offsets so that a fault finds them at every
point of their answers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup
from chat_outcomes import OUTCOMES, Outcome, chat_body, outcome_of

from keeper.sim.node.sim_node import DEFAULT_TOKENS_PER_S

CHAT = "/v1/chat/completions"
# Clients on each side: a few chats in flight at once, so a fault catches several of them, each
# at a different point of its answer.
CLIENTS = 4
# A chat with no end after this long is hung. Through the door a chat may rightly wait its
# hold (30 s) and, after its first token, a silence of 30 s before it is continued; a failover
# fits well inside. A hung chat costs this much of a run; a run with none pays nothing for it.
HUNG_S = 120.0

# A chat's status and the bytes of its answer that came (status 0: no answer began).
Reply = tuple[int, bytes]


async def streamed_chat(api: httpx.AsyncClient, body: dict[str, Any]) -> Reply:
    """One chat sent to ``api`` and read to its end. A connection that breaks is read as what
    came before it: a refused one is status 0, one broken mid-answer the answer so far."""
    status, received = 0, bytearray()
    try:
        async with api.stream("POST", CHAT, json=body) as answer:
            status = answer.status_code
            async for piece in answer.aiter_bytes():
                received += piece
    except httpx.TransportError:
        pass  # what came is the reply (module doc)
    return status, bytes(received)


async def client(
    send: Callable[[], Awaitable[Reply]],
    max_tokens: int,
    counts: Counter[Outcome],
    stop: anyio.Event,
    offset_s: float,
    pause_s: float,
) -> None:
    """Chat after chat until ``stop``, each counted, the first after ``offset_s``; after a chat
    that was not answered, ``pause_s`` before the next (as a client that retries, not in a
    tight loop that would count one outage hundreds of times)."""
    await anyio.sleep(offset_s)
    while not stop.is_set():
        outcome: Outcome = "hung"
        with anyio.move_on_after(HUNG_S):
            outcome = outcome_of(*await send(), max_tokens)
        counts[outcome] += 1
        if outcome != "ok":
            await anyio.sleep(pause_s)


@dataclass
class Tally:
    """The chats of both sides so far, by outcome."""

    through: Counter[Outcome] = field(default_factory=Counter[Outcome])
    straight: Counter[Outcome] = field(default_factory=Counter[Outcome])

    def line(self, fault: str) -> str:
        """One line for a report: ``kill -9: front door 37 ok / 0 failed / 0 cut / 0 hung;
        straight 31 ok / 2 failed / 4 cut / 0 hung``."""

        def side(counts: Counter[Outcome]) -> str:
            return " / ".join(f"{counts[outcome]} {outcome}" for outcome in OUTCOMES)

        return f"{fault}: front door {side(self.through)}; straight {side(self.straight)}"

    def lost(self, counts: Counter[Outcome]) -> int:
        """The chats of one side that were not answered whole."""
        return sum(counts[outcome] for outcome in OUTCOMES if outcome != "ok")


def start_clients(
    group: TaskGroup,
    tally: Tally,
    door: httpx.AsyncClient,
    exo: httpx.AsyncClient,
    max_tokens: int,
    stop: anyio.Event,
    *,
    pause_s: float = 0.0,
) -> None:
    """``CLIENTS`` clients through ``door`` and as many straight to ``exo`` in ``group``, each
    pair starting a fraction of one answer's time after the last, counting into ``tally``."""
    body = chat_body(max_tokens)
    for index in range(CLIENTS):
        offset_s = index * max_tokens / DEFAULT_TOKENS_PER_S / CLIENTS
        for counts, api in ((tally.through, door), (tally.straight, exo)):

            async def send(api: httpx.AsyncClient = api) -> Reply:
                return await streamed_chat(api, body)

            group.start_soon(client, send, max_tokens, counts, stop, offset_s, pause_s)
