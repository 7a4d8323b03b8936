"""Chat requests in flight: routed to a node, answered chunk by chunk, never left hanging.

The master sends a ``ChatRequest`` to the node holding the instance's rank-0 runner and the
node streams ``ChatChunk`` messages back. ``ChatRouter`` keeps the open requests so a reply
reaches its waiter, and ends them when their node disconnects or their instance is deleted
(``RouteLost``); ``ChatStream`` also bounds the wait for every chunk. So a request whose node
dies ends promptly, and one whose node freezes ends after the chunk timeout.

A request whose route is lost, or that its node fails (``ChatError``: a runner killed under
it), before its first text is sent once more, to another instance (``Reroute``, given by the
master, which knows the replicas; docs/design.md §6.8): the client has seen nothing yet, so
nothing is repeated or lost, and another instance has its own runners. After the first text a
retry would repeat or drop part of the reply, so the request ends with ``ChatFailedError``.
Silence is not retried: the chunk timeout has already cost the client its wait.

``master --exo-compat`` follows a stock exo instead (``exo_streams``, docs/design.md §7.5): a
request may be opened before it is sent (``send``: held until its instance is ready), a node
that disconnects leaves its requests waiting as exo's API does, with no chunk timeout, and a
deleted instance ends its requests with ``StreamClosed``: no text, no error, no finish_reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keeper.model.ids import IdFactory, new_id
from keeper.model.refusals import ChatFailedError
from keeper.model.state import NodeId
from keeper.sim.link.protocol import AnyMasterMessage, CancelChat, ChatChunk, ChatError
from keeper.sim.master.node_session import NodeSession

# exo's stream writes a keep-alive after this long without an event (its ``with_sse_keepalive``).
EXO_KEEPALIVE_S = 10.0
# Chunks buffered for a reader; a reply this far ahead of its reader means the client stopped
# reading, and the request is ended rather than buffered without end.
CHAT_BUFFER_CHUNKS = 4096


@dataclass(frozen=True)
class RouteLost:
    """The request's node disconnected or its instance was deleted: the request never ran to
    its end there, through no fault of the request or the node's model."""

    request_id: str
    message: str


@dataclass(frozen=True)
class StreamClosed:
    """exo closed the request's stream (its instance was deleted): it just ends, neither
    answered nor failed (``exo_streams`` only)."""

    request_id: str


ChatReply = ChatChunk | ChatError | RouteLost | StreamClosed


@dataclass
class PendingChat:
    request_id: str
    instance_id: str
    node_id: NodeId
    replies: MemoryObjectSendStream[ChatReply]


@dataclass
class Route:
    """One request sent to one node: its entry in the router, its replies, and how it ends."""

    pending: PendingChat
    replies: MemoryObjectReceiveStream[ChatReply]
    on_end: Callable[[PendingChat, bool], None]


# Sends a request whose route was lost (instance id, node id) to another ready instance, or
# returns None when there is none.
Reroute = Callable[[str, NodeId], Route | None]


class ChatStream:
    """The text of one chat reply as it arrives; ``finish_reason`` is set once it ends.

    Iterating raises ``ChatFailedError`` if the node or instance goes away (after the first
    text, or when ``reroute`` finds nowhere else to send it) or sends nothing for
    ``chunk_timeout_s`` (with ``keepalive``, it yields an empty text instead and waits on).
    ``aclose`` (also run when iteration ends) cancels an unfinished request on its node.
    """

    def __init__(
        self,
        route: Route,
        chunk_timeout_s: float,
        reroute: Reroute | None = None,
        on_outcome: Callable[[bool], None] | None = None,
        send: Callable[[], AsyncIterator[None]] | None = None,
        keepalive: bool = False,
    ) -> None:
        self.finish_reason: str | None = None
        # Sends the request to its node once it may run there (exo's worker holds a chat until
        # its instance is ready), stepping each time it looks again; None: it was sent when it
        # was routed.
        self._send = send
        # Silence for ``chunk_timeout_s`` is no error but an empty text, "still waiting" (exo's
        # stream writes a keep-alive then), however long it lasts.
        self._keepalive = keepalive
        self._route = route
        self._timeout = chunk_timeout_s
        self._reroute = reroute  # used at most once, and only before the first text
        # Told once, when the stream ends, whether the reply was answered to its end.
        self._on_outcome = on_outcome
        self._ended = False
        self.rerouted_from: str | None = None  # the instance first tried, once rerouted
        self.closed = False  # its stream was closed under it, as exo closes them

    @property
    def request_id(self) -> str:
        return self._route.pending.request_id

    @property
    def instance_id(self) -> str:
        return self._route.pending.instance_id

    @property
    def node_id(self) -> NodeId:
        return self._route.pending.node_id

    def __aiter__(self) -> AsyncIterator[str]:
        return self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        started = False
        try:
            send, self._send = self._send, None
            if send is not None:
                said = anyio.current_time()
                async for _ in send():
                    if self._keepalive and anyio.current_time() - said >= self._timeout:
                        said = anyio.current_time()
                        yield ""
            while not self._ended:
                reply: ChatReply | None = None
                with anyio.move_on_after(self._timeout):
                    try:
                        reply = await self._route.replies.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        raise ChatFailedError("the chat request was cancelled") from None
                if isinstance(reply, StreamClosed):
                    self._ended = self.closed = True  # as exo: the stream just ends
                    return
                if reply is None and self._keepalive:
                    yield ""  # nothing yet: still waiting
                    continue
                if reply is None:
                    raise ChatFailedError(
                        f"node {self.node_id} sent nothing for {self._timeout:g} s; "
                        "the request was abandoned"
                    )
                if isinstance(reply, RouteLost | ChatError):
                    if not started and self._retry():
                        continue
                    raise ChatFailedError(reply.message)
                if reply.finish_reason is not None:
                    self.finish_reason = reply.finish_reason
                    self._ended = True
                if reply.text:
                    started = True
                    yield reply.text
        finally:
            await self.aclose()

    def _retry(self) -> bool:
        reroute, self._reroute = self._reroute, None
        if reroute is None:
            return False
        lost = self._route  # the router has already ended it (lost, or the node's error)
        lost.replies.close()
        route = reroute(lost.pending.instance_id, lost.pending.node_id)
        if route is None:
            return False
        self.rerouted_from = lost.pending.instance_id
        self._route = route
        return True

    async def aclose(self) -> None:
        unfinished = not self._ended
        self._ended = True
        on_outcome, self._on_outcome = self._on_outcome, None
        if on_outcome is not None:
            on_outcome(self.finish_reason is not None)
        self._route.on_end(self._route.pending, unfinished)
        await self._route.replies.aclose()


class ChatRouter:
    """The requests in flight, by id: each reply reaches its reader, and each request ends when
    its node or instance goes (module doc)."""

    def __init__(
        self, chunk_timeout_s: float, new_id: IdFactory = new_id, *, exo_streams: bool = False
    ) -> None:
        # A stock exo's API waits on a chat without a bound: its stream's silence is not an
        # error but a keep-alive every EXO_KEEPALIVE_S (``ChatStream``'s ``keepalive``).
        self.chunk_timeout_s = EXO_KEEPALIVE_S if exo_streams else chunk_timeout_s
        self._new_id = new_id
        self._pending: dict[str, PendingChat] = {}
        self.exo_streams = exo_streams

    def load(self, instance_ids: list[str]) -> dict[str, int]:
        """Requests in flight per instance, for spreading chats over ready instances."""
        counts = dict.fromkeys(instance_ids, 0)
        for pending in self._pending.values():
            if pending.instance_id in counts:
                counts[pending.instance_id] += 1
        return counts

    def open(self, instance_id: str, session: NodeSession) -> Route:
        """Register a request to the session's node; the caller sends it (or ``forget``s it)."""
        return self.open_to(instance_id, session.node_id, session.offer)

    def open_to(
        self, instance_id: str, node_id: NodeId, offer: Callable[[AnyMasterMessage], bool]
    ) -> Route:
        """Register a request to ``node_id``, reached by ``offer`` (its session now, whichever
        that is when the request ends: a cancel goes there)."""
        send, receive = anyio.create_memory_object_stream[ChatReply](CHAT_BUFFER_CHUNKS)
        pending = PendingChat(self._new_id(), instance_id, node_id, send)
        self._pending[pending.request_id] = pending

        def on_end(ended: PendingChat, unfinished: bool) -> None:
            if self._pending.pop(ended.request_id, None) is None:
                return
            ended.replies.close()
            if unfinished:
                offer(CancelChat(request_id=ended.request_id))

        return Route(pending, receive, on_end)

    def is_open(self, request_id: str) -> bool:
        """The request is still in flight (not ended, answered or closed)."""
        return request_id in self._pending

    def forget(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.replies.close()

    def sent_to(self, request_id: str) -> NodeId | None:
        """The node a request in progress was sent to (None: no such request, or it ended)."""
        pending = self._pending.get(request_id)
        return None if pending is None else pending.node_id

    def deliver(self, node_id: NodeId, reply: ChatChunk | ChatError) -> None:
        """A node's reply to its waiter; replies to unknown or ended requests are dropped."""
        pending = self._pending.get(reply.request_id)
        if pending is None or pending.node_id != node_id:
            return
        try:
            pending.replies.send_nowait(reply)
        except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
            # The reader stopped reading (or left): end the request instead of buffering on.
            self.forget(reply.request_id)
            return
        if isinstance(reply, ChatError) or reply.finish_reason is not None:
            self.forget(reply.request_id)

    def fail(
        self,
        reason: str,
        *,
        node_id: NodeId | None = None,
        instance_id: str | None = None,
        route_lost: bool = True,
    ) -> None:
        """End the matching requests with ``reason``: as a lost route (their readers may send
        them elsewhere before the first text, else get ChatFailedError), or, with
        ``route_lost=False``, for good."""
        for pending in list(self._pending.values()):
            if (node_id is not None and pending.node_id == node_id) or (
                instance_id is not None and pending.instance_id == instance_id
            ):
                self._pending.pop(pending.request_id, None)
                with contextlib.suppress(
                    anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
                ):
                    end = RouteLost if route_lost else ChatError
                    pending.replies.send_nowait(end(request_id=pending.request_id, message=reason))
                pending.replies.close()

    def node_gone(self, node_id: NodeId) -> None:
        """The node's connection closed: its requests' routes are lost (``fail``); with
        ``exo_streams`` they wait on, as on exo, until their instance is deleted."""
        if not self.exo_streams:
            self.fail(f"node {node_id} disconnected during the request", node_id=node_id)

    def instance_deleted(self, instance_id: str) -> None:
        """The instance was deleted: its requests' routes are lost (``fail``); with
        ``exo_streams`` their streams are closed, as exo closes them (``StreamClosed``)."""
        if not self.exo_streams:
            self.fail(
                f"instance {instance_id} was deleted during the request", instance_id=instance_id
            )
            return
        for pending in list(self._pending.values()):
            if pending.instance_id == instance_id:
                self._pending.pop(pending.request_id, None)
                with contextlib.suppress(
                    anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
                ):
                    pending.replies.send_nowait(StreamClosed(request_id=pending.request_id))
                pending.replies.close()

    def fail_all(self, reason: str) -> None:
        for node_id in {pending.node_id for pending in self._pending.values()}:
            self.fail(reason, node_id=node_id, route_lost=False)
