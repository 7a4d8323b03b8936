"""Node membership: the sessions of connected nodes and the rules that judge silent ones.

A node is *heard* whenever any message of its arrives (heartbeats included); one not heard for
``node_timeout_s`` gets NodeTimedOut (exo's rule) and its session, if it still has one, is closed,
so when it wakes it reconnects and reports everything afresh instead of leaving half of itself (its
links) missing. Sooner than that, fast failover (``keeper.runtime.node_watch``, docs/design.md
§5.18) suspects a silent node and confirms it dead on a second sign (its session closed, or a long
silence while the others are heard), as events in the State. A node that connects again is the same
node (same node id): its new session replaces the old one. Each session turns the node's reports
into events (NodeInfo -> NodeGatheredInfo, RunnerStatusReport -> RunnerStatusUpdated, LinkUp/Down
-> TopologyEdgeCreated/Deleted, DownloadReport -> NodeDownloadProgress, RequestInstanceDeletion ->
InstanceDeleted) and hands chat replies to the chat router; what it sends the node is a Welcome
with the State, then every event, and the commands meant for it (``send``: exo's download
commands).
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

import anyio

from keeper.model.claims import Refusal, deletion_request_refusal, runner_report_refusal
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
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.node_strings import capped
from keeper.model.refusals import NotFoundError, NotRunningError
from keeper.model.state import Connection, NodeId, RunnerShutdown, State, download_model_id
from keeper.runtime.clock import Clock, iso_utc
from keeper.runtime.deployments import shown
from keeper.runtime.node_watch import NodeWatcher
from keeper.sim.link.channel import ChannelClosedError, MasterSide
from keeper.sim.link.identity import hello_refusal, new_challenge
from keeper.sim.link.protocol import (
    AnyMasterMessage,
    AnyNodeMessage,
    Challenge,
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
from keeper.sim.master.chat import ChatRouter
from keeper.sim.master.node_session import NodeSession, forward
from keeper.sim.master.report_buffer import REPORT_INTERVAL_S, ReportBuffer, ReportKey
from keeper.sim.master.subscriptions import Fanout

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
        liveness: LivenessConfig = OFF,
    ) -> None:
        self._state = state
        self.emit = emit
        self._fanout = fanout
        self._chats = chats
        self.node_timeout_s = node_timeout_s
        self.check_interval_s = check_interval_s
        self.outbox_size = outbox_size
        self.sessions: dict[NodeId, NodeSession] = {}
        # Node messages refused, by kind: an unproven Hello, reports about what is not theirs.
        self.refused: Counter[str] = Counter()
        self._last_heard: dict[NodeId, float] = {}
        self._clock: Clock | None = None
        self.liveness = liveness
        self._watcher: NodeWatcher | None = None

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            raise RuntimeError("membership has not started")
        return self._clock

    def start(self, clock: Clock) -> None:
        self._clock = clock
        # Nodes the log remembers must report back in time like any other, or time out.
        self._watcher = NodeWatcher(self.liveness, clock.monotonic())
        self._last_heard = dict.fromkeys(self._state().topology.nodes, self._silence_clock())

    def _silence_clock(self) -> float:
        """The time node silence is measured on: with fast failover, the master's running
        clock (a master that was paused blames itself, and times out nobody on waking,
        docs/design.md §5.18); without it, exactly exo's rule on the monotonic clock."""
        now = self.clock.monotonic()
        return self.watcher.running_at(now) if self.liveness.enabled else now

    @property
    def watcher(self) -> NodeWatcher:
        if self._watcher is None:
            raise RuntimeError("membership has not started")
        return self._watcher

    def silent_s(self, node_id: NodeId) -> float | None:
        """How long the node has been silent, on the master's running clock (None: never
        heard since the master started)."""
        if self._watcher is None or self._clock is None:
            return None
        return self._watcher.silent_s(node_id, self._clock.monotonic())

    def offer_to(self, node_id: NodeId, message: AnyMasterMessage) -> bool:
        """Queue a message for the node's session now, if it has one that takes it."""
        session = self.sessions.get(node_id)
        return session is not None and session.offer(message)

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
            state = self._state()
            # Fast failover's verdicts (docs/design.md §5.18), on the State before the timeouts;
            # the check also moves the running clock the timeouts are then measured on.
            verdicts = self.watcher.check(state, clock.monotonic(), clock.wall().timestamp())
            for verdict in verdicts:
                log.info("fast failover: %s %s", type(verdict).__name__, verdict)
            now = self._silence_clock()
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
            await self.emit([*verdicts, *events])

    async def serve(self, channel: MasterSide) -> None:
        """Serve one node connection until it closes; the channel is closed on return."""
        try:
            challenge = new_challenge()
            await channel.send(Challenge(nonce=challenge))
            hello: AnyNodeMessage | None = None
            with anyio.move_on_after(HELLO_TIMEOUT_S):
                hello = await channel.receive()
            if not isinstance(hello, Hello):
                log.warning(
                    "a node connection sent %s instead of Hello; closing it",
                    "nothing" if hello is None else type(hello).__name__,
                )
                return
            hello = capped(hello)  # its name is logged (docs/design.md §6.7)
            refusal = hello_refusal(hello.node_id, challenge, hello.signature)
            if refusal is not None:
                # Nothing of an unproven Hello is taken: a connected node of that id keeps its
                # session, and nothing the peer claims reaches the State.
                self.refused["hello not proven"] += 1
                log.warning(
                    "refused a Hello as node %s (%s): %s", hello.node_id, hello.name, refusal
                )
                await channel.refuse(f"node identity not proven: {refusal}")
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
        self._last_heard[node_id] = self._silence_clock()
        self.watcher.heard(node_id, self.clock.monotonic(), self.clock.wall().timestamp())
        log.info("node %s (%s) connected", node_id, hello.name)
        reports = _SessionReports(self, node_id)
        try:
            with session.scope:
                async with anyio.create_task_group() as group:
                    group.start_soon(forward, outbox_receive, channel, group.cancel_scope)
                    group.start_soon(reports.write)
                    await self._receive(node_id, channel, reports)
                    group.cancel_scope.cancel()
        finally:
            self._fanout.remove(key)
            outbox_send.close()
            if self.sessions.get(node_id) is session:
                del self.sessions[node_id]
                self.watcher.closed(node_id)
            self._chats.node_gone(node_id)
            # What the node said last is logged even though it left (its runner's failure, say).
            with anyio.CancelScope(shield=True):
                await reports.flush()
            log.info("node %s disconnected", node_id)

    def _refuse(
        self, node_id: NodeId, kind: str, refusal: Refusal, reports: _SessionReports
    ) -> None:
        """Count a report not taken; say so once per session and kind. A late one (about what
        is gone) is routine; a claim on another node's is not."""
        kind = f"stale {kind}" if refusal.stale else kind
        self.refused[kind] += 1
        if kind in reports.refusals_said:
            return
        reports.refusals_said.add(kind)
        if refusal.stale:
            log.info("node %s: dropped a late %s (%s)", node_id, kind, refusal.reason)
        else:
            log.warning(
                "node %s sent a report it may not make (%s: %s); refused, and further ones of "
                "this kind from this session are refused without a word",
                node_id,
                kind,
                refusal.reason,
            )

    async def _receive(
        self, node_id: NodeId, channel: MasterSide, reports: _SessionReports
    ) -> None:
        clock = self.clock
        while True:
            try:
                message = await channel.receive()
            except ChannelClosedError:
                return
            self._last_heard[node_id] = self._silence_clock()
            self.watcher.heard(node_id, clock.monotonic(), clock.wall().timestamp())
            if not isinstance(message, ChatChunk):  # a model's answer, for its client only
                message = capped(message)  # docs/design.md §6.7: node strings are capped
            match message:
                case NodeInfo():
                    event = NodeGatheredInfo(
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
                    await reports.file(("info",), event)
                case DownloadReport(download_progress=entry):
                    if entry.node_id != node_id:
                        refusal = Refusal(f"a download on node {entry.node_id}")
                        self._refuse(node_id, "download report", refusal, reports)
                    else:
                        event = NodeDownloadProgress(download_progress=entry)
                        await reports.file(("download", download_model_id(entry)), event)
                case RunnerStatusReport(runner_id=runner_id, runner_status=status):
                    refusal = runner_report_refusal(
                        self._state(),
                        node_id,
                        runner_id,
                        shutdown=isinstance(status, RunnerShutdown),
                    )
                    if refusal is not None:
                        self._refuse(node_id, "runner status", refusal, reports)
                    else:
                        event = RunnerStatusUpdated(runner_id=runner_id, runner_status=status)
                        await reports.file(("runner", runner_id), event)
                case LinkUp(sink=sink, edge=edge):
                    conn = Connection(source=node_id, sink=sink, edge=edge)
                    await reports.file(_link_key(conn), TopologyEdgeCreated(conn=conn))
                case LinkDown(sink=sink, edge=edge):
                    conn = Connection(source=node_id, sink=sink, edge=edge)
                    await reports.file(_link_key(conn), TopologyEdgeDeleted(conn=conn))
                case RequestInstanceDeletion(instance_id=instance_id, reason=reason):
                    refusal = deletion_request_refusal(self._state(), node_id, instance_id)
                    if refusal is None:
                        log.info("node %s gave up on instance %s: %s", node_id, instance_id, reason)
                        await reports.file(
                            ("deletion", instance_id), InstanceDeleted(instance_id=instance_id)
                        )
                    else:
                        self._refuse(node_id, "instance deletion", refusal, reports)
                case ChatChunk() | ChatError():
                    sent_to = self._chats.sent_to(message.request_id)
                    if sent_to is not None and sent_to != node_id:
                        refusal = Refusal(f"request {message.request_id} went to node {sent_to}")
                        self._refuse(node_id, "chat reply", refusal, reports)
                    else:
                        self._chats.deliver(node_id, message)
                case Heartbeat() | Hello():
                    pass


def _link_key(conn: Connection) -> tuple[str, ...]:
    # A link is one sink over one edge; a later up or down of it replaces an earlier one.
    return ("link", conn.sink, conn.edge.model_dump_json())


class _SessionReports:
    """One session's coalesced reports and the writer that logs them (``report_buffer``)."""

    def __init__(self, membership: Membership, node_id: NodeId) -> None:
        self._membership = membership
        self._node_id = node_id
        self._buffer = ReportBuffer()
        self._filed = anyio.Event()
        self.refusals_said: set[str] = set()

    async def file(self, key: ReportKey, event: AnyEvent) -> None:
        self._buffer.file(key, event)
        if self._buffer.full:
            # A node with this much unwritten waits for it, rather than growing the buffer.
            await self.flush()
        self._filed.set()

    async def flush(self) -> None:
        events = self._buffer.take()
        if events:
            # A master stopping takes no more (what is lost is a report the node repeats).
            with contextlib.suppress(
                NotRunningError, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                await self._membership.emit(events)

    async def write(self) -> None:
        """Log what was filed, at most every REPORT_INTERVAL_S, until cancelled."""
        clock = self._membership.clock
        while True:
            await self._filed.wait()
            self._filed = anyio.Event()
            await self.flush()
            await clock.sleep(REPORT_INTERVAL_S)
