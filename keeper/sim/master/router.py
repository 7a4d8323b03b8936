"""The master's router: every change to the State goes through ONE task, in batches.

``emit`` puts events on an anyio memory stream that one task consumes (``run``): it folds what
is queued into a batch, commits it to the event store (``keeper.runtime.event_store``: numbered,
appended with one fsync per batch, applied) and hands the numbered events to ``publish`` (the
master's: subscribers, prompt stepping, chats). So the State trails the events by a trip through
the router, as in exo, and every subscriber sees the same events in the same order as the log.

When the log cannot be written (disk full, read-only), a batch is neither applied nor published:
commands waiting on it (``emit_and_wait``) get the 503 naming the cause and do not happen;
events nobody waits for (node reports, the sweep's deletions) are held in order and logged first
once the log takes writes (``flush_held``), up to ``MAX_HELD_EVENTS``. What is held goes out in
bounded batches (``HELD_BATCH_EVENTS``, halved after each refusal down to one event), ahead of
anything newer: so a disk with little room left still takes the backlog a batch at a time, each
batch durable and applied once written, and a command is admitted as soon as the backlog ahead
of it is written, rather than one write of the whole backlog failing for as long as the disk
cannot hold all of it at once.

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
# The most held events written at once. A node report is about 0.4 KiB a line, so this is about
# 100 KiB: a write a nearly full disk can still take, where 10,000 held reports (4.4 MB) in one
# write would fail until the disk had room for all of them. After a refused write the next one
# takes half as many (down to one event, so any room for a line is used), and each success
# doubles it again.
HELD_BATCH_EVENTS = 256


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
        # Keeper steps among the held events: (how many held events up to the step's end, set
        # once those are applied).
        self._held_applied: list[tuple[int, anyio.Event]] = []
        self._held_batch = HELD_BATCH_EVENTS  # events of the next write of held events

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
        for _, applied in self._held_applied:
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
                try:
                    await self._write_held()
                    # The fsync runs in a worker thread (``log_io_in_thread``) so the event
                    # loop keeps serving meanwhile; what arrives during it forms the next batch.
                    indexed = await self._store.commit([e for item in batch for e in item.events])
                except LogNotWritableError as exc:
                    self._refuse(batch, exc)
                    continue
                if indexed:
                    self._publish(indexed)
                for item in batch:
                    if item.done is not None:
                        item.done.set()
                    if item.applied is not None:
                        item.applied.set()
                await self._store.snapshot_if_due()

    async def _write_held(self) -> None:
        """Log what was held, oldest first, in bounded batches; each one written is applied,
        published and no longer held. Raises ``LogNotWritableError`` at the first refused one
        (with what is still held unchanged)."""
        while self._held:
            chunk = self._held[: self._held_batch]
            try:
                indexed = await self._store.commit(chunk)
            except LogNotWritableError:
                self._held_batch = max(1, self._held_batch // 2)
                raise
            self._held_batch = min(HELD_BATCH_EVENTS, self._held_batch * 2)
            del self._held[: len(chunk)]
            self._publish(indexed)
            self._release_held(len(chunk))

    def _release_held(self, written: int) -> None:
        # Steps whose events are now all written (or were dropped as overflow) are applied.
        waiting: list[tuple[int, anyio.Event]] = []
        for end, applied in self._held_applied:
            if end <= written:
                applied.set()
            else:
                waiting.append((end - written, applied))
        self._held_applied = waiting

    def _refuse(self, batch: list[Emit], exc: LogNotWritableError) -> None:
        # Nothing of the batch was applied. A command learns why and did not happen; events
        # nobody waits for (node reports, the sweep's deletions) are held, in order, and go
        # first in the next batch the log takes. Past MAX_HELD_EVENTS the oldest are dropped.
        for item in batch:
            if item.done is None:
                self._held.extend(item.events)
                if item.applied is not None:
                    self._held_applied.append((len(self._held), item.applied))
            else:
                item.refused = exc
                item.done.set()
        overflow = len(self._held) - MAX_HELD_EVENTS
        if overflow > 0:
            self.dropped_while_unwritable += overflow
            del self._held[:overflow]
            # A step whose events were all dropped is released at the next write that succeeds.
            self._held_applied = [
                (max(1, end - overflow), applied) for end, applied in self._held_applied
            ]
