"""Following exo: which of exo's URLs the bridge reads, and whether what it read may be acted on.

The bridge may be given several exo URLs (any node's API serves exo's State and takes its
commands). ``ExoFollower`` follows the first that answers and moves to the next when the one in
use stops answering; each tick uses only the State read in that tick from the URL in use.

Nothing is decided on a stale State: if the read fails (no answer, a 5xx, unreadable JSON), the
follower records an ``Outage`` and the bridge steps nothing; the deployments say why ("exo
unreachable since 12:03:04: ..."), and the next good read clears it. A State that lacks what the
keeper decides on (``keeper.model.exo_state``: no ``instances``, ``runners``, ``topology`` or
``nodeMemory``, or an instance that does not parse), or that is larger or nested more deeply
than the bridge reads (``keeper.bridge.exo_bounds``), is an outage of its own kind
("exo state unreadable since ..."): exo answers, so the follower stays on that URL.

A read has a deadline that follows what exo takes (``keeper.bridge.state_deadline``): short for
a quick exo, so a frozen node it follows is left at once; longer for a slow one, so a loaded exo
is read rather than called unreachable.

It stands apart from the bridge's service because it owns one thing, the URL in use and the
outage, behind a narrow interface (``read``, ``available``, ``unavailable``), and knows nothing
of deployments or of the keeper.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final, Literal

import anyio

from keeper.bridge.exo_client import ExoApi, ExoState, ExoStateUnreadableError, ExoUnavailableError
from keeper.bridge.state_deadline import FLOOR_S, hedge_after, next_deadline
from keeper.model.refusals import RefusalError
from keeper.runtime.clock import iso_utc

log = logging.getLogger(__name__)

# UNREACHABLE: no usable answer; STATE_UNREADABLE: exo answers, with a State the bridge does
# not act on (one lacking what the keeper decides on, or over the bounds it reads).
OutageKind = Literal["unreachable", "state unreadable"]
UNREACHABLE: Final = "unreachable"
STATE_UNREADABLE: Final = "state unreadable"


class ExoDownError(RefusalError):
    """A request that needs exo's answer while exo does not give one."""

    status_code = 503


@dataclass(frozen=True)
class Outage:
    since: datetime  # wall clock, UTC
    reason: str
    kind: OutageKind = UNREACHABLE


class ExoFollower:
    """The exo URL in use, the last good State read from it, and the outage if there is one."""

    def __init__(
        self,
        apis: tuple[ExoApi, ...],
        wall: Callable[[], datetime],
        on_switch: Callable[[], None],
    ) -> None:
        if not apis:
            raise ValueError("the bridge needs at least one exo URL")
        self.apis = apis  # one per URL given, in order of preference
        self._in_use = 0
        self._wall = wall
        self._on_switch = on_switch  # another exo, another State: what was counted starts over
        self.last: ExoState | None = None  # the last good read of exo's State
        self.outage: Outage | None = None
        # When exo last answered (whatever its State held), and last gave a State to act on
        # (wall clock; None: not since the bridge started). ``GET /metrics`` says how long ago.
        self.answered_at: datetime | None = None
        self.readable_at: datetime | None = None
        # How long a State read may take before the next URL is read: a quick exo's at first,
        # then what exo takes (keeper.bridge.state_deadline).
        self.state_deadline_s = FLOOR_S
        # The URLs whose State showed most nodes silent together since the view was last fresh
        # (``stale_here``), and those that gave none while it was so: each is left once for the
        # next, none twice.
        self._stale_at: set[int] = set()
        # The URL the next tick reads first (``stale_here``), None: the one in use. Only a read
        # moves the URL in use: a tick's commands go where its State was read.
        self._read_next: int | None = None

    @property
    def exo(self) -> ExoApi:
        """The exo API in use: the State of each step is read from it, commands go to it."""
        return self.apis[self._in_use]

    @property
    def following(self) -> bool:
        """Whether the last read State may be acted on (read, and no outage since)."""
        return self.last is not None and self.outage is None

    async def read(self) -> ExoState | None:
        """This tick's State, from the URL in use, or from the next URL that answers first
        (which is then in use). None, with the outage recorded, when no URL gives a State to
        act on.

        The reads are hedged (``keeper.bridge.state_deadline.hedge_after``): when the URL in
        use has not answered within the hedge, the next is read beside it, and the first
        answer wins; a URL that fails outright hands over at once. A frozen followed node
        costs the bridge a hedge's wait, not the whole deadline: a State read late dates
        nothing late, but a tick not read is a check not made."""
        count = len(self.apis)
        first = self._in_use if self._read_next is None else self._read_next
        self._read_next = None
        order = [(first + offset) % count for offset in range(count)]
        deadline_s = self.state_deadline_s
        failures: list[tuple[int, str]] = []  # each URL that failed outright, and why
        # The first answer: the URL's index, its State or why it is unreadable, the read's time.
        answers: list[tuple[int, ExoState | ExoStateUnreadableError, float]] = []

        async with anyio.create_task_group() as group:

            async def read_one(index: int, failed: anyio.Event) -> None:
                started = anyio.current_time()
                try:
                    found: ExoState | ExoStateUnreadableError = await self.apis[index].state(
                        deadline_s
                    )
                except ExoStateUnreadableError as exc:
                    found = exc  # exo answers, with a State the keeper cannot act on
                except ExoUnavailableError as exc:
                    failures.append((index, str(exc)))
                    failed.set()
                    return
                answers.append((index, found, anyio.current_time() - started))
                group.cancel_scope.cancel()

            for index in order:
                failed = anyio.Event()
                group.start_soon(read_one, index, failed)
                with anyio.move_on_after(hedge_after(deadline_s)):
                    await failed.wait()
        if not answers:
            self.state_deadline_s = next_deadline(deadline_s, None)
            self.unavailable("; ".join(why for _, why in failures))
            return None
        index, found, read_s = answers[0]
        self.answered_at = self._wall()
        if self._stale_at:  # no fresher copy where nothing answered: not tried again meanwhile
            self._stale_at.update(url for url, _ in failures)
        self._switch_to(index, first)
        if isinstance(found, ExoStateUnreadableError):
            self.unavailable(str(found), STATE_UNREADABLE)
            return None
        self.state_deadline_s = next_deadline(deadline_s, read_s)
        return found

    def stale_here(self, why: str) -> None:
        """The State read from the URL in use shows most nodes fallen silent together: that
        node may be the one cut off (from exo's master, or by a split exo), while another
        node's copy hears them. So the next tick reads the next URL not yet found stale (or
        silent) first; once every URL has shown the same, the bridge stays where it is (exo's
        master itself is silent: no copy can be fresher). The URL in use changes only when
        that read answers: this tick's commands go to the URL its State came from (a real
        cluster's bridge once sent every command to the killed master's URL, refused tick
        after tick, while it read a live node's copy)."""
        self._stale_at.add(self._in_use)
        count = len(self.apis)
        for offset in range(1, count):
            index = (self._in_use + offset) % count
            if index not in self._stale_at:
                log.warning(
                    "the State exo at %s gives is stale (%s); reading exo at %s next",
                    self.exo.url,
                    why,
                    self.apis[index].url,
                )
                self._read_next = index
                return

    def fresh_here(self) -> None:
        """The State read from the URL in use hears its nodes: every URL may be tried again."""
        self._stale_at.clear()

    def _switch_to(self, index: int, first: int) -> None:
        """``index`` answered this tick's read, which began at ``first`` (the URL in use, or
        the one ``stale_here`` chose): it is in use from now on."""
        if index != self._in_use:
            if index == first:
                log.info("following exo at %s", self.apis[index].url)
            else:
                log.warning(
                    "exo at %s stopped answering; following exo at %s",
                    self.apis[first].url,
                    self.apis[index].url,
                )
            self._in_use = index
            self._on_switch()

    def available(self, exo: ExoState) -> None:
        """A State to act on was read: the outage, if any, is over."""
        if self.outage is not None:
            log.info(
                "exo at %s gives a State to act on again (%s since %s)",
                self.exo.url,
                self.outage.kind,
                iso_utc(self.outage.since),
            )
            self.outage = None
        self.last = exo
        self.readable_at = self._wall()

    def unavailable(self, reason: str, kind: OutageKind = UNREACHABLE) -> None:
        outage = self.outage
        if outage is None or outage.kind != kind:
            log.warning("exo %s, placing and deleting nothing: %s", kind, reason)
            self.outage = Outage(self._wall(), reason, kind)
        else:
            self.outage = replace(outage, reason=reason)
