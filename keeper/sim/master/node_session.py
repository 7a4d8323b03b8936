"""One connected node, as the master sees it: an outbox of messages and a way to end it.

The router offers each event to every session without waiting (``offer``); the session's own
task forwards the outbox to the node's channel at the node's pace. A node whose outbox fills
(it stopped reading) or that falls silent is closed by cancelling its scope; the node then
reconnects and starts from a fresh Welcome, which is simpler and safer than resynchronising it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from keeper.model.events import IndexedEvent
from keeper.model.state import NodeId
from keeper.sim.link.channel import ChannelClosedError, MasterSide
from keeper.sim.link.protocol import AnyMasterMessage, EventMessage

log = logging.getLogger(__name__)


@dataclass
class NodeSession:
    node_id: NodeId
    outbox: MemoryObjectSendStream[AnyMasterMessage]
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    closed_because: str | None = None

    def offer(self, message: AnyMasterMessage) -> bool:
        """Queue a message without waiting; a node too far behind has its session closed."""
        try:
            self.outbox.send_nowait(message)
        except anyio.WouldBlock:
            self.close(f"node {self.node_id} fell behind the event stream")
            return False
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            return False
        return True

    def offer_event(self, indexed: IndexedEvent) -> None:
        self.offer(EventMessage(indexed=indexed))

    def close(self, reason: str) -> None:
        if self.closed_because is None:
            self.closed_because = reason
            log.info("closing the session of node %s: %s", self.node_id, reason)
        self.scope.cancel()


async def forward(
    outbox: MemoryObjectReceiveStream[AnyMasterMessage],
    channel: MasterSide,
    scope: anyio.CancelScope,
) -> None:
    """Send the outbox to the node until either side ends, then end the session."""
    try:
        async with outbox:
            async for message in outbox:
                await channel.send(message)
    except ChannelClosedError:
        pass
    scope.cancel()
