"""The soak's load: chat clients that each keep one request in flight, every one with a deadline.

A client sends a chat completion, waits for its outcome and sends the next. The outcome is a
*result* (a reply), an *error* (anything the system answered or the connection said: a 404
because no instance serves, a 503, a refused or dropped connection) or, if neither came within
``REQUEST_DEADLINE_S``, the request is *lost*: the one outcome the system must never produce.

Sending is the target's business (``ChatSender``: HTTP for the process soak, the master's chat
call for the virtual one); it returns None for a result or a short label for the error, and the
deadline is enforced here, around it, so no client-side timeout can turn a lost request into an
error. The pauses after a result and after an error are settings: the process soak keeps the
master busy (no pause after a result), the virtual one spaces requests out so that a simulated
day fits in two minutes of wall time.

Each result also reports to ``on_result`` (model, sent at, answered at): the run uses it to tell
when a model serves again after a fault, sending ``probe`` requests of its own meanwhile so that
the moment is seen within a second however sparse the clients are.

Every request sent since ``count_from``'s moment is also kept one by one (``LoadStats.sent``:
model, when sent and ended, outcome), for the report to split by the fault it was in flight
under; a run of a day sends a few tens of thousands, a few megabytes.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from keeper.sim.soak.report import LOST, Sent

# Twice the master's 30 s chat chunk timeout: a request whose node froze or vanished mid-reply
# is ended with an error after 30 s; one still open after 60 s was dropped by the system.
REQUEST_DEADLINE_S = 60.0
# Twelve clients: steady load on every model without saturating two cores.
CLIENTS = 12
# Tokens per reply: a few, so a request is short (0.4 s at the simulated 20 tokens/s) and there
# are many of them, but still a streamed, multi-chunk reply.
MAX_TOKENS = 8

# What went wrong behind a 503, by a phrase of its message (the master's chat routing and the
# node's replies, keeper.sim.master.chat and keeper.sim.node.sim_node): the report counts 503s by
# cause,
# since some are avoidable with a replica ready and some are not.
_503_CAUSES = (
    ("sent nothing for", "node silent"),
    ("disconnected during", "node disconnected"),
    ("was deleted during", "instance deleted"),
    ("died mid-request", "runner died"),
    ("no ready runner", "no ready runner"),
    ("could not take", "node could not take it"),
    ("not running", "master not running"),
    ("is stopping", "master stopping"),
)

ChatSender = Callable[[str], Awaitable[str | None]]
ResultHook = Callable[[str, float, float], None]


def error_label(status: int, message: str) -> str:
    """A chat's error as the report counts it: ``HTTP <status>``, with the cause for a 503."""
    label = f"HTTP {status}"
    if status == 503:
        cause = next((name for phrase, name in _503_CAUSES if phrase in message), None)
        if cause is not None:
            return f"{label} ({cause})"
    return label


@dataclass
class ModelCounts:
    """One model's share of the outcomes: a replicated model's availability is its own."""

    requests: int = 0
    results: int = 0
    errors: int = 0
    lost: int = 0
    error_kinds: Counter[str] = field(default_factory=Counter[str])


@dataclass
class LoadStats:
    requests: int = 0
    results: int = 0
    errors: int = 0
    lost: int = 0
    in_flight: int = 0
    per_model: dict[str, ModelCounts] = field(default_factory=dict[str, ModelCounts])
    # The same, over the requests sent since ``Load.count_from``'s moment (the faults' start).
    per_model_since: dict[str, ModelCounts] = field(default_factory=dict[str, ModelCounts])
    error_kinds: Counter[str] = field(default_factory=Counter[str])
    lost_examples: list[str] = field(default_factory=list[str])
    # Each request sent since ``Load.count_from``'s moment, timed from it.
    sent: list[Sent] = field(default_factory=list[Sent])


@dataclass(frozen=True)
class LoadSettings:
    clients: int = CLIENTS
    deadline_s: float = REQUEST_DEADLINE_S
    # Each pause is drawn between half and one and a half times these (seeded per client), so
    # clients do not march in step: in virtual time identical requests take identical times.
    pause_after_result_s: float = 0.0
    pause_after_error_s: float = 0.5  # a client does not spin on a model that is not serving


class Load:
    """``clients`` chat clients spread round-robin over ``models``; ``run`` until ``stop``."""

    def __init__(
        self,
        send: ChatSender,
        models: Sequence[str],
        settings: LoadSettings,
        on_result: ResultHook,
        seed: int = 0,
    ) -> None:
        if not models:
            raise ValueError("the load needs at least one model")
        self._send = send
        self._models = list(models)
        self._settings = settings
        self._on_result = on_result
        self._seed = seed
        self._stopping = anyio.Event()
        self._since: float | None = None
        self.stats = LoadStats()

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def count_from(self, moment: float) -> None:
        """From now on also count each model's requests sent at or after ``moment`` apart."""
        self._since = moment

    def stop(self) -> None:
        """Send no new requests; those in flight still run to their outcome or deadline."""
        self._stopping.set()

    async def run(self) -> None:
        """Run every client; returns once ``stop`` was called and every request has ended."""
        async with anyio.create_task_group() as group:
            for client in range(self._settings.clients):
                rng = random.Random(f"load-{self._seed}-{client}")
                group.start_soon(self._client, self._models[client % len(self._models)], rng)

    async def _client(self, model: str, rng: random.Random) -> None:
        settings = self._settings
        while not self._stopping.is_set():
            ok = await self._one(model)
            pause = settings.pause_after_result_s if ok else settings.pause_after_error_s
            with anyio.move_on_after(pause * rng.uniform(0.5, 1.5)):
                await self._stopping.wait()

    async def probe(self, model: str) -> bool:
        """One extra request (counted like the clients' own): True if it got a reply."""
        return await self._one(model)

    async def _one(self, model: str) -> bool:
        settings, stats = self._settings, self.stats
        sent_at = anyio.current_time()
        counted = [stats.per_model.setdefault(model, ModelCounts())]
        since = self._since if self._since is not None and sent_at >= self._since else None
        if since is not None:
            counted.append(stats.per_model_since.setdefault(model, ModelCounts()))
        stats.requests += 1
        stats.in_flight += 1
        for counts in counted:
            counts.requests += 1
        error: str | None = None
        answered = False
        try:
            with anyio.move_on_after(settings.deadline_s):
                error = await self._send(model)
                answered = True
        finally:
            stats.in_flight -= 1
        if since is not None:
            stats.sent.append(
                Sent(
                    model=model,
                    at=round(sent_at - since, 3),
                    ended=round(anyio.current_time() - since, 3),
                    error=error if answered else LOST,
                )
            )
        if not answered:
            stats.lost += 1
            for counts in counted:
                counts.lost += 1
            if len(stats.lost_examples) < 20:
                stats.lost_examples.append(f"{model} sent at {sent_at:.1f}")
            return False
        if error is not None:
            stats.errors += 1
            for counts in counted:
                counts.errors += 1
                counts.error_kinds[error] += 1
            stats.error_kinds[error] += 1
            return False
        stats.results += 1
        for counts in counted:
            counts.results += 1
        self._on_result(model, sent_at, anyio.current_time())
        return True
