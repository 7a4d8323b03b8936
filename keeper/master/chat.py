"""Chat requests in flight: routed to a node, answered chunk by chunk, never left hanging.

The master sends a ``ChatRequest`` to the node holding the instance's rank-0 runner and the
node streams ``ChatChunk`` messages back. ``ChatRouter`` keeps the open requests so a reply
reaches its waiter, and ends them with an error when their node disconnects or their instance
is deleted; ``ChatStream`` also bounds the wait for every chunk. So a request whose node dies
ends promptly with ``ChatFailedError``, and one whose node freezes ends after the chunk timeout.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keeper.ids import IdFactory, new_id
from keeper.link.protocol import CancelChat, ChatChunk, ChatError
from keeper.master.node_session import NodeSession
from keeper.runtime.errors import ChatFailedError
from keeper.state import NodeId

# Chunks buffered for a reader; a reply this far ahead of its reader means the client stopped
# reading, and the request is ended rather than buffered without end.
CHAT_BUFFER_CHUNKS = 4096

ChatReply = ChatChunk | ChatError


@dataclass
class PendingChat:
    request_id: str
    instance_id: str
    node_id: NodeId
    replies: MemoryObjectSendStream[ChatReply]


class ChatStream:
    """The text of one chat reply as it arrives; ``finish_reason`` is set once it ends.

    Iterating raises ``ChatFailedError`` if the node or instance goes away or sends nothing for
    ``chunk_timeout_s``. ``aclose`` (also run when iteration ends) cancels an unfinished
    request on its node.
    """

    def __init__(
        self,
        pending: PendingChat,
        replies: MemoryObjectReceiveStream[ChatReply],
        on_end: Callable[[PendingChat, bool], None],
        chunk_timeout_s: float,
    ) -> None:
        self.request_id = pending.request_id
        self.instance_id = pending.instance_id
        self.node_id = pending.node_id
        self.finish_reason: str | None = None
        self._pending = pending
        self._replies = replies
        self._on_end = on_end
        self._timeout = chunk_timeout_s
        self._ended = False

    def __aiter__(self) -> AsyncIterator[str]:
        return self._texts()

    async def _texts(self) -> AsyncIterator[str]:
        try:
            while not self._ended:
                reply: ChatReply | None = None
                with anyio.move_on_after(self._timeout):
                    try:
                        reply = await self._replies.receive()
                    except (anyio.EndOfStream, anyio.ClosedResourceError):
                        raise ChatFailedError("the chat request was cancelled") from None
                if reply is None:
                    raise ChatFailedError(
                        f"node {self.node_id} sent nothing for {self._timeout:g} s; "
                        "the request was abandoned"
                    )
                if isinstance(reply, ChatError):
                    raise ChatFailedError(reply.message)
                if reply.finish_reason is not None:
                    self.finish_reason = reply.finish_reason
                    self._ended = True
                if reply.text:
                    yield reply.text
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        unfinished = not self._ended
        self._ended = True
        self._on_end(self._pending, unfinished)
        await self._replies.aclose()


class ChatRouter:
    def __init__(self, chunk_timeout_s: float, new_id: IdFactory = new_id) -> None:
        self.chunk_timeout_s = chunk_timeout_s
        self._new_id = new_id
        self._pending: dict[str, PendingChat] = {}

    def load(self, instance_ids: list[str]) -> dict[str, int]:
        """Requests in flight per instance, for spreading chats over ready instances."""
        counts = dict.fromkeys(instance_ids, 0)
        for pending in self._pending.values():
            if pending.instance_id in counts:
                counts[pending.instance_id] += 1
        return counts

    def open(
        self, instance_id: str, session: NodeSession
    ) -> tuple[PendingChat, Callable[[], ChatStream]]:
        send, receive = anyio.create_memory_object_stream[ChatReply](CHAT_BUFFER_CHUNKS)
        pending = PendingChat(self._new_id(), instance_id, session.node_id, send)
        self._pending[pending.request_id] = pending

        def on_end(ended: PendingChat, unfinished: bool) -> None:
            if self._pending.pop(ended.request_id, None) is None:
                return
            ended.replies.close()
            if unfinished:
                session.offer(CancelChat(request_id=ended.request_id))

        return pending, lambda: ChatStream(pending, receive, on_end, self.chunk_timeout_s)

    def forget(self, request_id: str) -> None:
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.replies.close()

    def deliver(self, node_id: NodeId, reply: ChatReply) -> None:
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
        self, reason: str, *, node_id: NodeId | None = None, instance_id: str | None = None
    ) -> None:
        """End the matching requests with ``reason`` (their readers get ChatFailedError)."""
        for pending in list(self._pending.values()):
            if (node_id is not None and pending.node_id == node_id) or (
                instance_id is not None and pending.instance_id == instance_id
            ):
                self._pending.pop(pending.request_id, None)
                with contextlib.suppress(
                    anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
                ):
                    pending.replies.send_nowait(
                        ChatError(request_id=pending.request_id, message=reason)
                    )
                pending.replies.close()

    def fail_all(self, reason: str) -> None:
        for node_id in {pending.node_id for pending in self._pending.values()}:
            self.fail(reason, node_id=node_id)
