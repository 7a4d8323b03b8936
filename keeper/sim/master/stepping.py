"""The master's keeper loop, with prompt stepping (docs/design.md §6.6).

From the startup grace after start, ``Keeper.step`` runs as soon as an applied event may call for
a placement (``keeper.core.keeper.calls_for_step``: the master's publish calls ``want_step``) and at
least every ``interval_s``, but never before the previous step's events are applied: a step
decides from the State, so it must hold what the previous step placed (docs/design.md §5.2).
Triggers that arrive meanwhile coalesce into one step. It steps under the lock that deployment
deletion and scaling also take, and its events go to the router under that lock.

While the log cannot be written the keeper is not stepped (a placement it could not log would be
forgotten on restart); the store is probed each interval, and once it takes writes again what
the router held is logged first (``Router.flush_held``).

It stands apart from the master's service because it owns the stepping state (whether a step is
wanted, the previous step's events, the keeper's last error and version) and needs of the master
only the lock, the store, the router, the State and the started keeper and clock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import anyio

from keeper.model.state import State
from keeper.runtime.event_store import EventStore
from keeper.runtime.hosted_keeper import Started
from keeper.sim.master.router import Emit, Router

log = logging.getLogger(__name__)


class KeeperLoop:
    """Steps the keeper promptly and at least every ``interval_s`` (module doc)."""

    def __init__(
        self,
        *,
        lock: anyio.Lock,
        store: EventStore,
        router: Router,
        started: Started,
        state: Callable[[], State],
        interval_s: float,
        grace_s: float,
    ) -> None:
        self._lock = lock
        self._store = store
        self._router = router
        self._started = started
        self._state = state
        self._interval_s = interval_s
        self._grace_s = grace_s
        self._keeper_error: str | None = None
        self.version = 0  # bumped whenever the keeper's memory may have changed
        # Set by the router when an applied event calls for a step; the loop clears it just
        # before it reads the State to step.
        self._step_wanted = False
        self._step_wake: anyio.Event | None = None  # made in ``run``, inside the event loop
        self._last_step: Emit | None = None  # the previous step's events, until applied

    def keeper_changed(self) -> None:
        """The keeper's memory may have changed outside a step (a deletion, a scale)."""
        self.version += 1

    def want_step(self) -> None:
        self._step_wanted = True
        if self._step_wake is not None:
            self._step_wake.set()

    def stop(self) -> None:
        """The master stops: nothing waits on the last step's events any more."""
        if self._last_step is not None and self._last_step.applied is not None:
            self._last_step.applied.set()

    async def run(self, started_at: float) -> None:
        """Step the keeper whenever an applied event calls for it, and at least every
        ``interval_s``; never before the previous step's events are applied (§6.6)."""
        clock = self._started.clock
        interval = self._interval_s
        next_tick = started_at + self._grace_s
        await clock.sleep(max(0.0, next_tick - clock.monotonic()))
        self._step_wake = anyio.Event()
        while True:
            if not self._step_wanted:
                with anyio.move_on_after(max(0.0, next_tick - clock.monotonic())):
                    await self._step_wake.wait()
            # A step decides from the State, so it must hold what the previous step placed
            # (docs/design.md §5.2): wait until the router has applied those events. Triggers
            # that arrive meanwhile coalesce into this one step.
            previous = self._last_step
            if previous is not None and previous.applied is not None:
                with anyio.move_on_after(interval):
                    await previous.applied.wait()
                if not previous.applied.is_set():
                    # Held: the log refused them. Once it takes writes again, log them (nothing
                    # else may come along to carry them), and wait on.
                    if self._store.probe():
                        await self._router.flush_held()
                    continue
            self._last_step = None
            if not self._store.probe():
                # Unwritable log: a placement now could not be logged, so the keeper waits.
                next_tick = clock.monotonic() + interval
                await clock.sleep(interval)
                continue
            await self._router.flush_held()  # log what was held, now it can be
            async with self._lock:
                # Cleared just before reading the State: whatever is applied from here on
                # wakes the loop again.
                self._step_wanted = False
                self._step_wake = anyio.Event()
                try:
                    events = self._started.keeper.step(self._state(), clock.monotonic())
                    self.version += 1
                except Exception as exc:
                    self._report_keeper_error(exc)
                    events = []
                else:
                    self._keeper_error = None
                if events:
                    self._last_step = await self._router.send_step(events)
            next_tick = clock.monotonic() + interval

    def _report_keeper_error(self, exc: Exception) -> None:
        # A keeper bug must not take the master down (the cluster keeps running without it),
        # nor fill the log once a second: report each distinct error once.
        described = f"{type(exc).__name__}: {exc}"
        if described != self._keeper_error:
            log.exception("the keeper's step failed; retrying every second")
            self._keeper_error = described
