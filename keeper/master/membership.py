"""Node membership: the sessions of connected nodes and the rule that drops silent ones.

A node is *heard* whenever any message of its arrives (heartbeats included); one not heard for
``node_timeout_s`` gets NodeTimedOut (exo's rule) and its session, if it still has one, is
closed, so when it wakes it reconnects and reports everything afresh instead of leaving half of
itself (its links) missing. A node that connects again is the same node (same node id): its new
session replaces the old one. Each session turns the node's reports into events (NodeInfo ->
NodeGatheredInfo, RunnerStatusReport -> RunnerStatusUpdated, LinkUp/Down ->
TopologyEdgeCreated/Deleted, DownloadReport -> NodeDownloadProgress, RequestInstanceDeletion ->
InstanceDeleted) and hands chat replies to the chat router; what it sends the node is a Welcome
with the State, then every event, and the commands meant for it (``send``: exo's download
commands).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

import anyio

from keeper.link.channel import ChannelClosedError, MasterSide
from keeper.link.protocol import (
    AnyMasterMessage,
    AnyNodeMessage,
    ChatChunk,
    ChatError,
    DownloadReport,
    Heartbeat,
    Hello,
    LinkDown,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    Welcome,
)
from keeper.master.chat import ChatRouter
from keeper.master.node_session import NodeSession, forward
from keeper.master.subscriptions import Fanout
from keeper.model.events import (
    AnyEvent,
    InstanceDeleted,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.refusals import NotFoundError
from keeper.model.state import Connection, NodeId, State
from keeper.runtime.clock import Clock, iso_utc
from keeper.runtime.deployments import shown

log = logging.getLogger(__name__)

# A connection that does not say Hello within this long is not a node; drop it.
HELLO_TIMEOUT_S = 10.0

Emit = Callable[[Sequence[AnyEvent]], Awaitable[None]]


class Membership:
    def __init__(
        self,
        state: Callable[[], State],
        emit: Emit,
        fanout: Fanout,
        chats: ChatRouter,
        *,
        node_timeout_s: float,
        check_interval_s: float,
        outbox_size: int,
    ) -> None:
        self._state = state
        self.emit = emit
        self._fanout = fanout
        self._chats = chats
        self.node_timeout_s = node_timeout_s
        self.check_interval_s = check_interval_s
        self.outbox_size = outbox_size
        self.sessions: dict[NodeId, NodeSession] = {}
        self._last_heard: dict[NodeId, float] = {}
        self._clock: Clock | None = None

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            raise RuntimeError("membership has not started")
        return self._clock

    def start(self, clock: Clock) -> None:
        self._clock = clock
        # Nodes the log remembers must report back in time like any other, or time out.
        self._last_heard = dict.fromkeys(self._state().topology.nodes, clock.monotonic())

    def send(self, node_id: NodeId, message: AnyMasterMessage) -> None:
        """Queue a command for a connected node; NotFoundError naming a node with no session
        (unknown, gone, or not reconnected yet)."""
        session = self.sessions.get(node_id)
        if session is None:
            known = (
                "it is not connected"
                if node_id in self._state().topology.nodes
                else ("no such node is in the cluster")
            )
            raise NotFoundError(
                f"Node {shown(node_id)} cannot be sent {message.tag}: {known} (GET /state "
                "lists the nodes)",
                param="node_id",
            )
        session.offer(message)

    def close_all(self, reason: str) -> None:
        for session in list(self.sessions.values()):
            session.close(reason)

    async def watch(self) -> None:
        """Time out silent nodes, until cancelled."""
        clock = self.clock
        timeout = self.node_timeout_s
        while True:
            await clock.sleep(self.check_interval_s)
            now = clock.monotonic()
            state = self._state()
            for node in state.topology.nodes:
                # A node can reach the topology without a session (a report that was in flight
                # when it timed out); it starts its silence now.
                self._last_heard.setdefault(node, now)
            silent = sorted(
                node for node, heard in self._last_heard.items() if now - heard >= timeout
            )
            events: list[AnyEvent] = []
            for node in silent:
                del self._last_heard[node]
                session = self.sessions.get(node)
                if session is not None:
                    session.close(f"silent for {timeout:g} s")
                if node in state.topology.nodes:
                    log.info("node %s timed out after %g s of silence", node, timeout)
                    events.append(NodeTimedOut(node_id=node))
            await self.emit(events)

    async def serve(self, channel: MasterSide) -> None:
        """Serve one node connection until it closes; the channel is closed on return."""
        try:
            hello: AnyNodeMessage | None = None
            with anyio.move_on_after(HELLO_TIMEOUT_S):
                hello = await channel.receive()
            if not isinstance(hello, Hello):
                log.warning(
                    "a node connection sent %s instead of Hello; closing it",
                    "nothing" if hello is None else type(hello).__name__,
                )
                return
            await self._session(hello, channel)
        except ChannelClosedError:
            pass
        finally:
            with anyio.CancelScope(shield=True):
                with contextlib.suppress(
                    ChannelClosedError, anyio.BrokenResourceError, anyio.ClosedResourceError
                ):
                    await channel.aclose()

    async def _session(self, hello: Hello, channel: MasterSide) -> None:
        node_id = hello.node_id
        previous = self.sessions.get(node_id)
        if previous is not None:
            previous.close("the node connected again")
        outbox_send, outbox_receive = anyio.create_memory_object_stream[AnyMasterMessage](
            self.outbox_size
        )
        session = NodeSession(node_id, outbox_send)
        # Welcome and subscription together, with no await between: no event missed or doubled.
        session.offer(Welcome(state=self._state()))
        key = self._fanout.add(session.offer_event)
        self.sessions[node_id] = session
        self._last_heard[node_id] = self.clock.monotonic()
        log.info("node %s (%s) connected", node_id, hello.name)
        try:
            with session.scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(forward, outbox_receive, channel, group.cancel_scope)
                    await self._receive(node_id, channel)
                    group.cancel_scope.cancel()
        finally:
            self._fanout.remove(key)
            outbox_send.close()
            if self.sessions.get(node_id) is session:
                del self.sessions[node_id]
            self._chats.fail(f"node {node_id} disconnected during the request", node_id=node_id)
            log.info("node %s disconnected", node_id)

    async def _receive(self, node_id: NodeId, channel: MasterSide) -> None:
        clock = self.clock
        while True:
            try:
                message = await channel.receive()
            except ChannelClosedError:
                return
            self._last_heard[node_id] = clock.monotonic()
            match message:
                case NodeInfo():
                    await self.emit(
                        [
                            NodeGatheredInfo(
                                node_id=node_id,
                                when=iso_utc(clock.wall()),
                                memory=message.memory,
                                backends=message.backends,
                                identity=message.identity,
                                network=message.network,
                                rdma_ctl=message.rdma_ctl,
                                disk=message.disk,
                                system=message.system,
                            )
                        ]
                    )
                case DownloadReport(download_progress=entry):
                    if entry.node_id != node_id:
                        log.warning(
                            "node %s reported node %s's download; dropped", node_id, entry.node_id
                        )
                    else:
                        await self.emit([NodeDownloadProgress(download_progress=entry)])
                case RunnerStatusReport(runner_id=runner_id, runner_status=status):
                    await self.emit(
                        [RunnerStatusUpdated(runner_id=runner_id, runner_status=status)]
                    )
                case LinkUp(sink=sink, edge=edge):
                    conn = Connection(source=node_id, sink=sink, edge=edge)
                    await self.emit([TopologyEdgeCreated(conn=conn)])
                case LinkDown(sink=sink, edge=edge):
                    conn = Connection(source=node_id, sink=sink, edge=edge)
                    await self.emit([TopologyEdgeDeleted(conn=conn)])
                case RequestInstanceDeletion(instance_id=instance_id, reason=reason):
                    if instance_id in self._state().instances:
                        log.info("node %s gave up on instance %s: %s", node_id, instance_id, reason)
                        await self.emit([InstanceDeleted(instance_id=instance_id)])
                case ChatChunk() | ChatError():
                    self._chats.deliver(node_id, message)
                case Heartbeat() | Hello():
                    pass
