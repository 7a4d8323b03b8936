"""Clients streaming chats through a fault on a real exo cluster, for ``make test-exo``: some
through the bridge's front door, as many straight to exo, every chat counted by how it ended.

What a user meets is a chat, not an instance (docs/design.md §8.6), so the tier's kill and
master-kill scenarios run ``CLIENTS`` clients on each side at once, each sending streamed chats
back to back. Each chat is counted by the rule every tier counts with (tests/chat_outcomes.py):
``ok`` (answered whole, any text being the tiny model's answer), ``failed``, ``cut`` (what exo
sends when the instance under a chat is deleted: "neither a result nor an error"), or ``hung``
(no end within ``HUNG_S``).

The straight clients go round-robin over the APIs of the nodes the control API lists running
(exo's own routing then picks the instance, ready or not). Threads, not asyncio: the tier's
helpers are synchronous, and eight clients are eight threads.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import httpx
from chat_outcomes import OUTCOMES, Outcome, outcome_of_events

# Clients on each side, as the front door's promise is stated: four streaming at once.
CLIENTS = 4
# Tokens per chat: the tiny model writes about 100 a second on these cores, so a chat takes a
# few tenths of a second and a fault lands mid-answer on some of them.
CHAT_TOKENS = 32
# A chat with no end after this long is hung: the front door's 30 s hold and a failover (about
# 10 s on this cluster) fit inside, and exo's own ~48 s to forget a killed node does not.
HUNG_S = 60.0
# A client that met an error at once (exo's 404 while it has no instance) waits this long before
# the next chat, so a fault is not a flood of requests.
AFTER_ERROR_S = 0.25
# Connecting to a node's API on loopback: a refused or frozen node is met within this.
CONNECT_S = 3.0


def chat_body(model: str) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": CHAT_TOKENS,
        "stream": True,
    }


def streamed_outcome(url: str, model: str, client: httpx.Client) -> Outcome:
    """Send one streamed chat to ``url`` (an exo API or the bridge); how it ended. A connection
    that breaks is read as what came before it: a refused one is no answer, one broken
    mid-answer the answer so far."""
    started = time.monotonic()
    status, events = 0, list[str]()
    timeout = httpx.Timeout(HUNG_S, connect=CONNECT_S)
    try:
        with client.stream(
            "POST", f"{url}/v1/chat/completions", json=chat_body(model), timeout=timeout
        ) as answer:
            status = answer.status_code
            for line in answer.iter_lines():
                if time.monotonic() - started > HUNG_S:
                    return "hung"  # still coming (keep-alives), but no end in time
                if line.startswith("data:"):  # not a comment, nor the blank line between events
                    events.append(line[len("data:") :].strip())
    except httpx.TimeoutException:
        if time.monotonic() - started >= HUNG_S:
            return "hung"
    except httpx.TransportError:
        pass  # what came is the reply (above)
    except httpx.HTTPError:
        return "failed"
    return outcome_of_events(status, events, None)


@dataclass
class StreamingClients:
    """``CLIENTS`` clients through ``front_door`` and ``CLIENTS`` straight to exo (round-robin over
    ``exo_urls()``, read before each chat), chatting back to back until the block ends."""

    model: str
    front_door: str
    exo_urls: Callable[[], list[str]]
    through: Counter[Outcome] = field(default_factory=Counter[Outcome])
    straight: Counter[Outcome] = field(default_factory=Counter[Outcome])
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self, counts: Counter[Outcome], target: Callable[[int], str | None]) -> None:
        turn = 0
        with httpx.Client(trust_env=False) as client:
            while not self._stop.is_set():
                url = target(turn)
                turn += 1
                outcome = "failed" if url is None else streamed_outcome(url, self.model, client)
                with self._lock:
                    counts[outcome] += 1
                if outcome == "failed":
                    self._stop.wait(AFTER_ERROR_S)

    def _exo_url(self, turn: int) -> str | None:
        live = self.exo_urls()
        return live[turn % len(live)] if live else None

    @contextlib.contextmanager
    def chatting(self) -> Iterator[StreamingClients]:
        threads = [
            threading.Thread(target=self._client, args=(self.through, lambda _: self.front_door))
            for _ in range(CLIENTS)
        ] + [
            threading.Thread(target=self._client, args=(self.straight, self._exo_url))
            for _ in range(CLIENTS)
        ]
        for thread in threads:
            thread.daemon = True
            thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            for thread in threads:
                thread.join(timeout=HUNG_S + 5)

    def summary(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {
                "front_door": {k: self.through[k] for k in OUTCOMES},
                "straight_to_exo": {k: self.straight[k] for k in OUTCOMES},
            }

    def words(self) -> str:
        """Both counts in one line, as the closing note quotes them."""
        summary = self.summary()

        def side(counts: dict[str, int]) -> str:
            return " / ".join(f"{counts[k]} {k}" for k in OUTCOMES)

        return (
            f"front door {side(summary['front_door'])}; straight {side(summary['straight_to_exo'])}"
        )

    def front_door_lost(self) -> int:
        with self._lock:
            return self.through["failed"] + self.through["cut"] + self.through["hung"]
