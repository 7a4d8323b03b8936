"""A bidirectional message channel between a node and the master, whatever carries it.

The master serves every node through ``MasterSide`` and a node talks through ``NodeSide``; a
real deployment carries them over a WebSocket, and virtual-time tests over anyio memory streams
(``memory_channel_pair``), where sockets would break trio's MockClock. Both sides raise
``ChannelClosedError`` from ``send``/``receive`` once the other end is gone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import anyio
from anyio.abc import ObjectReceiveStream, ObjectSendStream

from keeper.sim.link.protocol import AnyMasterMessage, AnyNodeMessage

SendT = TypeVar("SendT")
RecvT = TypeVar("RecvT")


class ChannelClosedError(Exception):
    """The other end of a node channel is gone."""


class MasterSide(Protocol):
    async def send(self, message: AnyMasterMessage) -> None: ...
    async def receive(self) -> AnyNodeMessage: ...
    async def aclose(self) -> None: ...
    # Close because the peer may not take part (not proven, not allowed): a node told so does
    # not retry.
    async def refuse(self, reason: str) -> None: ...


class NodeSide(Protocol):
    async def send(self, message: AnyNodeMessage) -> None: ...
    async def receive(self) -> AnyMasterMessage: ...
    async def aclose(self) -> None: ...


# Deep enough that a burst of events (a snapshot's worth) never blocks the master on one slow
# in-memory node, small enough that a node that stopped reading is noticed.
_MEMORY_BUFFER = 10_000


@dataclass
class _MemoryEnd(Generic[SendT, RecvT]):
    _send: ObjectSendStream[SendT]
    _recv: ObjectReceiveStream[RecvT]
    refused_because: str | None = None

    async def send(self, message: SendT) -> None:
        try:
            await self._send.send(message)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise ChannelClosedError from exc

    async def receive(self) -> RecvT:
        try:
            return await self._recv.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError) as exc:
            raise ChannelClosedError from exc

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._recv.aclose()

    async def refuse(self, reason: str) -> None:
        self.refused_because = reason
        await self.aclose()


def memory_channel_pair() -> tuple[MasterSide, NodeSide]:
    """An in-process channel: (the master's end, the node's end)."""
    to_node_send, to_node_recv = anyio.create_memory_object_stream[AnyMasterMessage](_MEMORY_BUFFER)
    to_master_send, to_master_recv = anyio.create_memory_object_stream[AnyNodeMessage](
        _MEMORY_BUFFER
    )
    master: _MemoryEnd[AnyMasterMessage, AnyNodeMessage] = _MemoryEnd(to_node_send, to_master_recv)
    node: _MemoryEnd[AnyNodeMessage, AnyMasterMessage] = _MemoryEnd(to_master_send, to_node_recv)
    return master, node
