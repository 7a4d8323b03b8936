"""Fan-out of the master's indexed events to its subscribers, without ever blocking the router.

The router hands each event to every subscriber synchronously (``Fanout.publish``), right
after applying it; a subscriber that cannot take it at once (its buffer is full) is dropped
rather than waited for, because one stuck dashboard or node must not stall the cluster. A
dropped dashboard sees ``SubscriptionLaggedError`` and reconnects for a fresh snapshot; a
dropped node session is closed and the node reconnects for a fresh Welcome.

Subscriptions (the dashboard streams, ``keeper.sim.master.dashboard_stream``) are counted from
``subscribe`` until they are closed, and a ``subscribe`` past the limit is refused
(``TooManySubscriptionsError``): each one holds a buffer of events and, over HTTP, a connection
with its kernel buffers, so their number must not be the clients' to choose. Node sessions are
bounded by the nodes a cluster has, and are not counted here.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

from keeper.model.events import IndexedEvent
from keeper.model.state import State

Deliver = Callable[[IndexedEvent], None]

# Dashboards a master streams to at once. A cluster has a few operators' TUIs and a handful of
# monitors; 64 is ten times that, and bounds what clients can make it hold: each stream's event
# buffer and its connection's kernel buffers (measured: 3.5 MB for a client that never reads,
# so about 220 MB at the limit, for at most the send deadline of
# keeper.httpapi.connection_deadlines).
MAX_DASHBOARD_STREAMS = 64


class SubscriptionLaggedError(Exception):
    """A subscriber fell more than its buffer behind and was dropped."""


class TooManySubscriptionsError(Exception):
    """``limit`` subscriptions are open already."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} subscriptions are open already")
        self.limit = limit


class Subscription:
    """The events after ``state``, in order: the snapshot a dashboard starts from and its
    continuation. Iterate it (or ``receive``); ``aclose`` or leaving ``async with``
    unsubscribes. Iteration stops when the master ends the stream (it is stopping)."""

    def __init__(
        self,
        state: State,
        receive: MemoryObjectReceiveStream[IndexedEvent],
        unsubscribe: Callable[[], None],
    ) -> None:
        self.state = state
        self._receive = receive
        self._unsubscribe = unsubscribe
        self.lagged = False

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> IndexedEvent:
        try:
            return await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            if self.lagged:
                raise SubscriptionLaggedError("the stream fell behind and was dropped") from None
            raise StopAsyncIteration from None

    async def receive(self) -> IndexedEvent:
        """The next event; StopAsyncIteration when the stream ended."""
        return await self.__anext__()

    def close(self) -> None:
        """Unsubscribe, at once and for good; closing again does nothing."""
        self._unsubscribe()
        self._receive.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Fanout:
    def __init__(self) -> None:
        self._deliver: dict[int, Deliver] = {}
        self._closers: dict[int, Callable[[], None]] = {}
        # Subscriptions not closed yet, ended or not (see the module docstring).
        self._open: set[int] = set()
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._deliver)

    def add(self, deliver: Deliver) -> int:
        key = self._next_key
        self._next_key += 1
        self._deliver[key] = deliver
        return key

    def remove(self, key: int) -> None:
        self._deliver.pop(key, None)
        self._closers.pop(key, None)

    def publish(self, indexed: IndexedEvent) -> None:
        for deliver in list(self._deliver.values()):
            deliver(indexed)

    @property
    def open_subscriptions(self) -> int:
        """Subscriptions from ``subscribe`` not closed yet."""
        return len(self._open)

    def subscribe(
        self, state: State, buffer: int, *, open_: bool = True, limit: int | None = None
    ) -> Subscription:
        """A subscription starting after ``state``; the caller must pass the State current at
        this moment, with no await in between, so no event is missed or doubled.
        TooManySubscriptionsError when ``limit`` of them are open already."""
        if limit is not None and len(self._open) >= limit:
            raise TooManySubscriptionsError(limit)
        send, receive = anyio.create_memory_object_stream[IndexedEvent](buffer)
        subscription = Subscription(state, receive, lambda: self._close(key))

        def deliver(indexed: IndexedEvent) -> None:
            try:
                send.send_nowait(indexed)
            except anyio.WouldBlock:
                subscription.lagged = True
                self._end(key)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                self.remove(key)

        key = self.add(deliver)
        self._open.add(key)
        self._closers[key] = send.close
        if not open_:
            self._end(key)
        return subscription

    def _close(self, key: int) -> None:
        self._open.discard(key)
        self._end(key)

    def _end(self, key: int) -> None:
        closer = self._closers.get(key)
        self.remove(key)
        if closer is not None:
            closer()

    def end_subscriptions(self) -> None:
        """End every ``Subscription`` (their iteration stops once drained)."""
        for key in list(self._closers):
            self._end(key)

    def clear(self) -> None:
        self.end_subscriptions()
        self._deliver.clear()
