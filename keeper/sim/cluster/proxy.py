"""A TCP proxy between a node and the master that can cut the link: a network partition on demand.

Each node of ``exo-deploy cluster`` (and of the soak harness) reaches the master through its
own proxy, so one node can be split from the master while both processes keep running.

A partition closes every connection through the proxy and refuses new ones until it heals.
Dropping bytes silently instead would corrupt the WebSocket stream mid-frame (TCP is a byte
stream; a proxy cannot lose "messages"), and both ends would see a protocol error rather than a
partition. What the node and master see here is what they see after a real partition once TCP
or their pings give up: the link is gone and cannot be re-established until the network heals.

``swallow_answers`` is the other fault a store client must survive: requests still reach the
target, answers never come back (a member frozen after it committed, a link lost on the way
back). A request's outcome is then unknown to its sender; the tests of the bridge's store use it
to check that such a write is settled or said to be unknown, never "nothing was changed".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import anyio
from anyio.abc import ByteReceiveStream, ByteSendStream, SocketAttribute, SocketStream, TaskStatus

log = logging.getLogger(__name__)

# Bytes read per chunk: large enough that a State snapshot crosses in a few reads.
_CHUNK = 64 * 1024


class TcpProxy:
    """Forwards connections from ``listen_host:listen_port`` to ``target_host:target_port``."""

    def __init__(
        self,
        target_host: str,
        target_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.listen_host = listen_host
        self._listen_port = listen_port
        self.port: int | None = None  # the bound port, once running
        self._partitioned = False
        self._links: set[anyio.CancelScope] = set()
        self.connections_refused = 0  # while partitioned; tests wait on it
        self.swallowing = False
        self._holed: set[anyio.CancelScope] = set()  # links that lost answers
        self.on_swallowed: Callable[[int], None] | None = None  # told each dropped answer chunk

    def partition(self) -> None:
        """Cut every link now and refuse new connections until ``heal``."""
        self._partitioned = True
        for link in list(self._links):
            link.cancel()

    def swallow_answers(self) -> None:
        """Forward requests, drop what the target answers, until ``heal``."""
        self.swallowing = True

    def heal(self) -> None:
        """Let everything through again. A link that lost answers is cut: TCP never loses bytes
        mid-stream, so its peer would otherwise read a stream with a hole in it."""
        self._partitioned = False
        self.swallowing = False
        for link in list(self._holed):
            link.cancel()
        self._holed.clear()

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the bound port when listening."""
        listener = await anyio.create_tcp_listener(
            local_host=self.listen_host, local_port=self._listen_port
        )
        async with listener:
            self.port = listener.extra(SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._handle)

    async def _handle(self, client: SocketStream) -> None:
        async with client:
            if self._partitioned:
                self.connections_refused += 1
                return
            try:
                upstream = await anyio.connect_tcp(self.target_host, self.target_port)
            except OSError as exc:
                log.debug("proxy cannot reach %s:%d: %s", self.target_host, self.target_port, exc)
                return
            async with upstream:
                with anyio.CancelScope() as link:
                    self._links.add(link)
                    try:
                        async with anyio.create_task_group() as group:
                            group.start_soon(_pump, client, upstream, group.cancel_scope)
                            group.start_soon(self._answers, upstream, client, group.cancel_scope)
                    finally:
                        self._links.discard(link)

    async def _answers(
        self, source: ByteReceiveStream, sink: ByteSendStream, link: anyio.CancelScope
    ) -> None:
        """The target's side: copied, or dropped while ``swallowing``."""
        with contextlib.suppress(
            anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
        ):
            while True:
                chunk = await source.receive(_CHUNK)
                if self.swallowing:
                    self._holed.add(link)
                    if self.on_swallowed is not None:
                        self.on_swallowed(len(chunk))
                    continue
                await sink.send(chunk)
        link.cancel()


async def _pump(source: ByteReceiveStream, sink: ByteSendStream, link: anyio.CancelScope) -> None:
    """Copy one direction; any end closing or failing ends the whole link."""
    with contextlib.suppress(
        anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError
    ):
        while True:
            await sink.send(await source.receive(_CHUNK))
    link.cancel()
