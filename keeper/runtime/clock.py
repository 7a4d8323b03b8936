"""The master's only source of time, injectable so a whole cluster can run in virtual time.

Everything in the master that waits or stamps a time goes through a ``Clock``: the keeper's
``now``, node silence, the sweep, and the wall-clock times shown to operators. ``AnyioClock``
reads the event loop's own clock, so under trio's ``MockClock`` simulated hours pass in seconds
and the wall clock moves with them (it is anchored once and advanced by monotonic deltas, never
re-read from the system, which also keeps it from jumping when the host's clock is adjusted).
Timeouts inside the master use anyio's cancel scopes, which read the same event-loop clock.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol

import anyio


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> datetime: ...

    async def sleep(self, seconds: float) -> None: ...


class AnyioClock:
    """The running event loop's clock, with a wall clock that follows it.

    Construct it inside the event loop (it reads ``anyio.current_time()`` once to anchor).
    """

    def __init__(self) -> None:
        self._anchor_monotonic = anyio.current_time()
        self._anchor_wall = datetime.now(UTC)

    def monotonic(self) -> float:
        return anyio.current_time()

    def wall(self) -> datetime:
        return self._anchor_wall + timedelta(seconds=self.monotonic() - self._anchor_monotonic)

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)


def iso_utc(moment: datetime) -> str:
    """exo's timestamp format: ISO-8601 in UTC with a ``Z`` suffix, millisecond precision."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
