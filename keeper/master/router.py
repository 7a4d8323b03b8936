"""The master's router: every change to the State goes through ONE task, in batches.

``emit`` puts events on an anyio memory stream that one task consumes (``run``): it folds what
is queued into a batch, commits it to the event store (``keeper.runtime.event_store``: numbered,
appended with one fsync per batch, applied) and hands the numbered events to ``publish`` (the
master's: subscribers, prompt stepping, chats). So the State trails the events by a trip through
the router, as in exo, and every subscriber sees the same events in the same order as the log.

When the log cannot be written (disk full, read-only), a batch is neither applied nor published:
commands waiting on it (``emit_and_wait``) get the 503 naming the cause and do not happen;
events nobody waits for (node reports, the sweep's deletions) are held in order and logged first
once the log takes writes (``flush_held``), up to ``MAX_HELD_EVENTS``.

It stands apart from the master's service because it owns the queue, the waiters and the held
events and needs nothing else of the master than the store and ``publish``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keeper.model.events import AnyEvent, IndexedEvent
from keeper.model.refusals import NotRunningError
from keeper.runtime.event_store import EventStore, LogNotWritableError

# The most queued emits the router folds into one batch (one write + fsync). Large enough that
# a burst costs one fsync per few hundred events, small enough that a batch applies in
# milliseconds and does not stall the event loop.
ROUTER_MAX_BATCH = 512
# ... and the most events: a batch is published at once, so it must fit well inside a
# subscriber's buffer (``subscriber_buffer``), or a pause of the router (a compaction, a slow
# fsync) that lets bursts pile up would drop every node session and dashboard as too slow.
ROUTER_MAX_BATCH_EVENTS = 2_048
# Node reports and sweep deletions held while the log cannot be written: minutes of reports
# from a large cluster; past it the oldest go (memory reports repeat, and each is counted).
MAX_HELD_EVENTS = 10_000


@dataclass
class Emit:
    events: list[AnyEvent]
    done: anyio.Event | None = None
    failed: bool = False
    refused: LogNotWritableError | None = None  # the log could not take it: nothing happened
    # Set once these events are applied (or the master stopped), whether the log took them at
    # once or held them first: the keeper's next step waits on its previous step's events.
    applied: anyio.Event | None = None


class Router:
    """The queue of emits, the task that commits and publishes them, and what the log refused."""

    def __init__(
        self, store: EventStore, publish: Callable[[list[IndexedEvent]], None], queue_size: int
    ) -> None:
        self._store = store
        self._publish = publish
        self._queue_size = queue_size
        self._send: MemoryObjectSendStream[Emit] | None = None
        self._waiters: dict[int, Emit] = {}
        self.dropped_while_unwritable = 0
        self._held: list[AnyEvent] = []  # node reports the log refused, to log when it can
        self._held_applied: list[anyio.Event] = []  # set once what was held is applied

    @property
    def running(self) -> bool:
        return self._send is not None

    @property
    def held(self) -> int:
        """Events nobody waited for, refused by the log and held until it takes them."""
        return len(self._held)

    def open(self) -> MemoryObjectReceiveStream[Emit]:
        """Take emits from now on; ``run`` the receiving end."""
        send, receive = anyio.create_memory_object_stream[Emit](self._queue_size)
        self._send = send
        return receive

    def close(self) -> None:
        """Take no more emits; whoever waits on one is told the master stopped."""
        send, self._send = self._send, None
        if send is not None:
            send.close()
        for item in list(self._waiters.values()):
            item.failed = True
            if item.done is not None:
                item.done.set()
        for applied in self._held_applied:
            applied.set()

    async def emit(self, events: Sequence[AnyEvent]) -> None:
        """Queue events for the router; they are applied shortly after (the State trails)."""
        if not events:
            return
        if self._send is None:
            raise NotRunningError("the master is not running")
        await self._send.send(Emit(list(events)))

    async def emit_and_wait(self, events: Sequence[AnyEvent]) -> None:
        """Queue events and wait until they are logged, applied and published."""
        if not events:
            return
        if self._send is None:
            raise NotRunningError("the master is not running")
        item = Emit(list(events), anyio.Event())
        self._waiters[id(item)] = item
        try:
            await self._send.send(item)
            assert item.done is not None
            await item.done.wait()
        finally:
            self._waiters.pop(id(item), None)
        if item.refused is not None:
            raise item.refused
        if item.failed:
            raise NotRunningError("the master stopped before the command was recorded")

    async def send_step(self, events: Sequence[AnyEvent]) -> Emit | None:
        """Queue a keeper step's events; the Emit's ``applied`` is set once they are."""
        if not events or self._send is None:
            return None
        step = Emit(list(events), applied=anyio.Event())
        await self._send.send(step)
        return step

    async def flush_held(self) -> None:
        """Have what the log refused logged now (nothing else may come along to carry it)."""
        if self._held and self._send is not None:
            await self._send.send(Emit([]))

    async def run(self, receive: MemoryObjectReceiveStream[Emit]) -> None:
        async with receive:
            async for first in receive:
                batch = [first]
                size = len(first.events)
                while len(batch) < ROUTER_MAX_BATCH and size < ROUTER_MAX_BATCH_EVENTS:
                    try:
                        batch.append(receive.receive_nowait())
                    except anyio.WouldBlock:
                        break
                    size += len(batch[-1].events)
                events = [*self._held, *(e for item in batch for e in item.events)]
                try:
                    # The fsync runs in a worker thread (``log_io_in_thread``) so the event
                    # loop keeps serving meanwhile; what arrives during it forms the next batch.
                    indexed = await self._store.commit(events)
                except LogNotWritableError as exc:
                    self._refuse(batch, exc)
                    continue
                self._held = []
                self._publish(indexed)
                for item in batch:
                    if item.done is not None:
                        item.done.set()
                    if item.applied is not None:
                        item.applied.set()
                for applied in self._held_applied:
                    applied.set()
                self._held_applied = []
                await self._store.snapshot_if_due()

    def _refuse(self, batch: list[Emit], exc: LogNotWritableError) -> None:
        # Nothing of the batch was applied. A command learns why and did not happen; events
        # nobody waits for (node reports, the sweep's deletions) are held, in order, and go
        # first in the next batch the log takes. Past MAX_HELD_EVENTS the oldest are dropped.
        for item in batch:
            if item.done is None:
                self._held.extend(item.events)
                if item.applied is not None:
                    self._held_applied.append(item.applied)
            else:
                item.refused = exc
                item.done.set()
        overflow = len(self._held) - MAX_HELD_EVENTS
        if overflow > 0:
            self.dropped_while_unwritable += overflow
            del self._held[:overflow]
