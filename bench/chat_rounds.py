"""Chats sent straight to an upstream and through the bridge's front door, interleaved, and
their figures side by side, for ``python -m bench requests`` (docs/design.md §8.6).

Shaped so the difference between the two ways is the front door's and not the machine's:

- *Interleaved and paired.* Each round sends every kind of chat once each way, in an order
  shuffled anew each round (seeded, so a rerun sends the same order), one chat at a time; a
  burst of machine noise (the two cores are shared) then lands on both ways alike, and the i-th
  chat of one way has a partner sent moments apart on the other.
- *Warm first.* The first rounds are sent and not counted: connections opened, caches filled,
  as a bridge that has served for a while.
- *A deadline per chat, when asked.* Beside held streams a chat through the door may wait (for
  a connection to exo, say); a chat past its deadline is counted as such and its connection
  opened anew, so a stuck way costs the bench seconds, not the hold's 30 s a chat.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio

from bench.chat_client import ChatConnection, Timed

# The two ways a chat goes, in the order the figures print them.
STRAIGHT, THROUGH = 0, 1


@dataclass
class Kind:
    """One kind of chat (streamed or not, for one model), sent both ways each round."""

    label: str
    body: bytes
    streamed: bool
    straight: list[Timed] = field(default_factory=list[Timed])
    through: list[Timed] = field(default_factory=list[Timed])
    late: list[int] = field(default_factory=lambda: [0, 0])  # past the deadline, by way


async def interleaved(
    ports: tuple[int, int],
    kinds: Sequence[Kind],
    rounds: int,
    warmup: int,
    seed: int,
    deadline_s: float | None = None,
    max_late: int = 3,
) -> None:
    """``warmup + rounds`` rounds of every kind both ways (``ports``: straight, through),
    the counted chats appended to each kind; with ``deadline_s``, the rounds end early once
    ``max_late`` chats came late (the way is stuck: more would only repeat it)."""
    connections = [await ChatConnection.open(port) for port in ports]
    order = [(kind, way) for kind in kinds for way in (STRAIGHT, THROUGH)]
    shuffler = random.Random(seed)
    try:
        for index in range(warmup + rounds):
            shuffler.shuffle(order)
            for kind, way in order:
                timed = await _one(connections, ports, way, kind, deadline_s)
                if index < warmup:
                    continue
                if timed is None:
                    kind.late[way] += 1
                    if sum(sum(k.late) for k in kinds) >= max_late:
                        return
                else:
                    (kind.straight if way == STRAIGHT else kind.through).append(timed)
    finally:
        for connection in connections:
            await connection.aclose()


async def _one(
    connections: list[ChatConnection],
    ports: tuple[int, int],
    way: int,
    kind: Kind,
    deadline_s: float | None,
) -> Timed | None:
    if deadline_s is None:
        return await connections[way].chat(kind.body)
    with anyio.move_on_after(deadline_s):
        return await connections[way].chat(kind.body)
    await connections[way].aclose()  # left mid-answer: its connection cannot carry another
    connections[way] = await ChatConnection.open(ports[way])
    return None


def pct(values: Sequence[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


@dataclass(frozen=True)
class Compared:
    """One figure both ways, in ms: straight and through at p50 and p99."""

    straight_p50: float
    straight_p99: float
    through_p50: float
    through_p99: float
    paired_ms: float  # the median of each through chat less its straight partner

    @property
    def added_p50(self) -> float:
        return self.through_p50 - self.straight_p50

    @property
    def added_p99(self) -> float:
        return self.through_p99 - self.straight_p99

    def line(self) -> str:
        return (
            f"straight p50 {self.straight_p50:.2f} / p99 {self.straight_p99:.2f} ms; through "
            f"p50 {self.through_p50:.2f} / p99 {self.through_p99:.2f} ms; added p50 "
            f"{self.added_p50:+.2f} ms (paired median {self.paired_ms:+.2f}), p99 "
            f"{self.added_p99:+.2f} ms; ratio p50 x{_ratio(self.through_p50, self.straight_p50)}"
            f", p99 x{_ratio(self.through_p99, self.straight_p99)}"
        )


def _ratio(through: float, straight: float) -> str:
    return f"{through / straight:.2f}" if straight > 0 else "-"


def compare(straight: Sequence[float], through: Sequence[float]) -> Compared:
    """The figures of two ways' seconds (paired by index as sent), in ms."""
    paired = [(b - a) * 1e3 for a, b in zip(straight, through, strict=False)]
    return Compared(
        pct(straight, 0.5) * 1e3,
        pct(straight, 0.99) * 1e3,
        pct(through, 0.5) * 1e3,
        pct(through, 0.99) * 1e3,
        statistics.median(paired) if paired else 0.0,
    )


def bad(kind: Kind) -> str:
    """The chats of a kind that did not end whole or came late, in words ("" for none)."""
    words: list[str] = []
    for way, name in ((STRAIGHT, "straight"), (THROUGH, "through")):
        timed = kind.straight if way == STRAIGHT else kind.through
        failed = [t.status for t in timed if not t.good]
        if failed:
            words.append(f"{len(failed)} {name} not whole (statuses {sorted(set(failed))})")
        if kind.late[way]:
            words.append(f"{kind.late[way]} {name} past the deadline")
    return "; ".join(words)


async def hold_streams(
    port: int, body: bytes, count: int, deadline_s: float
) -> tuple[list[ChatConnection], int]:
    """Open ``count`` streams at once and keep those whose first token came within
    ``deadline_s``; (the streams held, how many got no token in time: closed)."""
    held: list[ChatConnection] = []
    missed = 0

    async def one() -> None:
        nonlocal missed
        connection = await ChatConnection.open(port)
        got = False
        with anyio.move_on_after(deadline_s):
            status, _, _ = await connection.send(body)
            got = status == 200 and await connection.first_data()
        if got:
            held.append(connection)
        else:
            missed += 1
            await connection.aclose()

    async with anyio.create_task_group() as group:
        for _ in range(count):
            group.start_soon(one)
    return held, missed
