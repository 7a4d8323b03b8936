"""A cluster of simulated nodes inside the master's process, joined over in-memory channels.

This is what lets the whole system run in virtual time: sockets would tie the test to the real
clock, memory channels do not, so a master and its nodes under trio's MockClock cover minutes of
faults in milliseconds. The embedded demo (``keeper.sim.cluster.demo``) uses it on the real clock
too.

Each node has a supervisor that connects it (``memory_channel_pair`` + ``Master.serve_node``),
runs its session, and reconnects after a short pause whenever the session ends: the master
closed it (silence, restart), or a fault cut it. Faults are plain methods, callable from the
event loop at any moment, and each models a real fault in-process:

- ``crash``: the node dies; after ``down_s`` a new node with the same id and no runners starts
  (a process restart: the master sees the same node come back empty-handed), with the files its
  disk held (a download cut short reads DownloadPending with its bytes);
- ``freeze``: the node stops reading and writing for N s, then carries on (SIGSTOP/SIGCONT as the
  master sees it; its runners' clocks keep running);
- ``partition``: the link is cut and cannot be re-established for N s (the node keeps running);
- ``kill_runner``: a runner process dies and is retried with exo's backoff.

``set_master`` swaps the master (a restart from the same log): every link is cut and the nodes
reconnect to the new one, reporting what they still run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import TaskStatus

from keeper.runtime.clock import AnyioClock, Clock
from keeper.sim.link.channel import MasterSide, NodeSide, memory_channel_pair
from keeper.sim.link.protocol import AnyMasterMessage, AnyNodeMessage
from keeper.sim.master.service import Master
from keeper.sim.node.sim_node import NodeConfig, SimNode, sleep_or_wake

# Pause before a node reconnects after its session ended, as a real node's first backoff step:
# short enough to come back inside the master's startup grace, long enough not to spin.
RECONNECT_S = 0.5


@dataclass
class _NodeHandle:
    config: NodeConfig
    node: SimNode
    down_until: float = -1.0  # crashed or partitioned until then
    frozen_until: float = -1.0
    link: anyio.CancelScope | None = None
    sessions: int = 0  # sessions started, for tests and the demo's status
    wake: anyio.Event = field(default_factory=anyio.Event)

    def cut(self) -> None:
        if self.link is not None:
            self.link.cancel()


class _FreezableChannel:
    """A node's end of the channel that stalls both ways while its node is frozen."""

    def __init__(self, inner: NodeSide, handle: _NodeHandle, clock: Clock) -> None:
        self._inner = inner
        self._handle = handle
        self._clock = clock

    async def _thaw(self) -> None:
        while (left := self._handle.frozen_until - self._clock.monotonic()) > 0:
            await self._clock.sleep(left)

    async def send(self, message: AnyNodeMessage) -> None:
        await self._thaw()
        await self._inner.send(message)

    async def receive(self) -> AnyMasterMessage:
        await self._thaw()
        message = await self._inner.receive()
        await self._thaw()
        return message

    async def aclose(self) -> None:
        await self._inner.aclose()


class InProcessCluster:
    """Simulated nodes attached to a master in this process; run it with ``run``."""

    def __init__(
        self,
        master: Master | None,
        node_configs: Sequence[NodeConfig],
        clock: Clock | None = None,
        reconnect_s: float = RECONNECT_S,
    ) -> None:
        names = [config.name for config in node_configs]
        if len(set(names)) != len(names):
            raise ValueError(f"node names must be distinct, got {names}")
        self._master = master
        self._configs = list(node_configs)
        self._clock = clock
        self._reconnect_s = reconnect_s
        self._handles: dict[str, _NodeHandle] = {}

    @property
    def clock(self) -> Clock:
        if self._clock is None:
            raise RuntimeError("the cluster is not running yet")
        return self._clock

    @property
    def master(self) -> Master | None:
        return self._master

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run every node until cancelled."""
        if self._clock is None:
            self._clock = AnyioClock()
        clock = self._clock
        self._handles = {c.name: _NodeHandle(c, SimNode(c, clock)) for c in self._configs}
        async with anyio.create_task_group() as group:
            for handle in self._handles.values():
                group.start_soon(self._supervise, handle)
            task_status.started()

    # --- reading ----------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return [config.name for config in self._configs]

    def node(self, name: str) -> SimNode:
        return self._handle(name).node

    def sessions(self, name: str) -> int:
        """How many sessions the node has started with a master (reconnections + 1)."""
        return self._handle(name).sessions

    def _handle(self, name: str) -> _NodeHandle:
        handle = self._handles.get(name)
        if handle is None:
            known = ", ".join(self.node_names()) or "none"
            raise KeyError(f"no node named {name!r} (nodes: {known})")
        return handle

    # --- faults -------------------------------------------------------------------------------

    def set_master(self, master: Master | None) -> None:
        """Point every node at another master (or none); current links are cut."""
        self._master = master
        for handle in self._handles.values():
            handle.cut()
            handle.wake.set()

    def crash(self, name: str, down_s: float) -> None:
        """The node dies now and restarts after ``down_s`` with the same id and no runners (its
        disk keeps its files)."""
        handle = self._handle(name)
        disk = handle.node.disk.survivor(self.clock.monotonic())
        handle.node = SimNode(handle.config, self.clock, disk)
        handle.down_until = self.clock.monotonic() + down_s
        handle.frozen_until = -1.0
        handle.cut()

    def freeze(self, name: str, seconds: float) -> None:
        """The node neither reads nor writes for ``seconds``, then resumes where it was."""
        handle = self._handle(name)
        handle.frozen_until = max(handle.frozen_until, self.clock.monotonic() + seconds)

    def partition(self, name: str, seconds: float) -> None:
        """Cut the node's link to the master; it cannot reconnect for ``seconds``."""
        handle = self._handle(name)
        handle.down_until = max(handle.down_until, self.clock.monotonic() + seconds)
        handle.cut()

    def kill_runner(self, name: str, instance_id: str | None = None) -> int:
        """A runner on the node dies (every runner there when ``instance_id`` is None)."""
        return self._handle(name).node.kill_runner(instance_id)

    # --- supervision --------------------------------------------------------------------------

    async def _supervise(self, handle: _NodeHandle) -> None:
        clock = self.clock
        while True:
            while (left := handle.down_until - clock.monotonic()) > 0:
                await clock.sleep(left)
            master = self._master
            if master is not None and master.running:
                await self._session(handle, master)
            await self._pause(handle)

    async def _pause(self, handle: _NodeHandle) -> None:
        """Wait ``reconnect_s``, or less if the master is swapped meanwhile."""
        handle.wake = wake = anyio.Event()
        await sleep_or_wake(self.clock, self._reconnect_s, wake)
        if wake.is_set():  # a new master: let its run() get going before connecting
            await self.clock.sleep(0)

    async def _session(self, handle: _NodeHandle, master: Master) -> None:
        master_side, node_side = memory_channel_pair()
        channel = _FreezableChannel(node_side, handle, self.clock)
        node = handle.node
        handle.sessions += 1
        with anyio.CancelScope() as link:
            handle.link = link
            async with anyio.create_task_group() as group:
                group.start_soon(_serve_then_cut, master, master_side, group.cancel_scope)
                await node.run(channel)
                group.cancel_scope.cancel()
        handle.link = None
        with anyio.CancelScope(shield=True):
            await _close_quietly(master_side)
            await _close_quietly(node_side)


async def _serve_then_cut(master: Master, channel: MasterSide, link: anyio.CancelScope) -> None:
    try:
        await master.serve_node(channel)
    finally:
        link.cancel()


async def _close_quietly(channel: MasterSide | NodeSide) -> None:
    with contextlib.suppress(Exception):
        await channel.aclose()
