"""The simulated node against a scripted master, in virtual time.

A fake master holds the other end of an in-memory channel, applies the events it chooses to
emit, and records every message the node sends with the (virtual) time it arrived, so the tests
can check exo's runner lifecycle to the millisecond: how long loading takes at the node's GB/s,
the retry backoff, the deletion request after 5 failures, the chat token rate.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import pytest

from keeper.link.channel import MasterSide, memory_channel_pair
from keeper.link.protocol import (
    AnyNodeMessage,
    ChatChunk,
    ChatError,
    ChatRequest,
    EventMessage,
    Heartbeat,
    Hello,
    LinkDown,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    Welcome,
)
from keeper.model.apply import apply_indexed
from keeper.model.events import (
    AnyEvent,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
)
from keeper.model.state import (
    AnyRunnerStatus,
    Connection,
    Memory,
    MlxRingInstance,
    ModelCard,
    NetworkInterface,
    NodeNetwork,
    PipelineShardMetadata,
    RunnerConnecting,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    ShardAssignments,
    SocketConnection,
    State,
)
from keeper.node.sim_node import (
    GIB,
    LOADING_REPORT_S,
    PEER_PORT,
    RUNNER_CONNECT_S,
    RUNNER_SHUTDOWN_S,
    NodeConfig,
    SimNode,
    node_id_for,
    reply_tokens,
)
from keeper.runtime.clock import AnyioClock

M = TypeVar("M")

# 4 GiB over 8 layers at 1 GB/s: 4 s of loading, one layer every 0.5 s.
CARD = ModelCard(
    model_id="test/model-4g",
    storage_size=Memory(in_bytes=4 * GIB),
    n_layers=8,
    hidden_size=1024,
    supports_tensor=True,
)
LOAD_S = 4.0
NODE = NodeConfig(name="alpha", memory_gb=16, load_gb_per_s=1.0)
PEER = "12D3KooWpeer"


def break_runner(node: SimNode, instance_id: str | None = None) -> int:
    """Make a runner fail now and on every retry (a corrupt shard), so after exo's 5 tries the
    node asks the master to delete the instance. Returns how many runners broke."""
    now = node._clock.monotonic()
    selected = list(node._selected(instance_id))
    for runner in selected:
        runner.kill(now, "runner crashed while loading its shard")
        runner.broken = True  # from now on: set after the kill so it is not back-dated
    node._poke()
    return len(selected)


def instance_on(
    nodes: list[str], card: ModelCard = CARD, instance_id: str = "inst-1"
) -> MlxRingInstance:
    """A pipeline instance splitting ``card``'s layers evenly over ``nodes`` (rank = order)."""
    per = card.n_layers // len(nodes)
    runner_to_shard: dict[str, Any] = {}
    node_to_runner: dict[str, str] = {}
    for rank, node in enumerate(nodes):
        runner_id = f"{instance_id}-runner-{rank}"
        end = card.n_layers if rank == len(nodes) - 1 else (rank + 1) * per
        runner_to_shard[runner_id] = PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=len(nodes),
            start_layer=rank * per,
            end_layer=end,
            n_layers=card.n_layers,
        )
        node_to_runner[node] = runner_id
    return MlxRingInstance(
        instance_id=instance_id,
        shard_assignments=ShardAssignments(
            model_id=card.model_id, runner_to_shard=runner_to_shard, node_to_runner=node_to_runner
        ),
    )


@dataclass
class FakeMaster:
    """The master's end of the channel, scripted by the test."""

    side: MasterSide
    state: State = field(default_factory=State)
    log: list[tuple[float, AnyNodeMessage]] = field(default_factory=list[tuple[float, Any]])

    async def welcome(self) -> None:
        await self.side.send(Welcome(state=self.state))

    async def emit(self, event: AnyEvent) -> None:
        indexed = IndexedEvent(idx=self.state.last_event_applied_idx + 1, event=event)
        self.state = apply_indexed(self.state, indexed)
        await self.side.send(EventMessage(indexed=indexed))

    async def expect(
        self, kind: type[M], where: Callable[[M], bool] = lambda _: True, within: float = 60.0
    ) -> tuple[float, M]:
        """The next message of ``kind`` matching ``where`` and when it arrived (others are
        logged and skipped)."""
        with anyio.fail_after(within):
            while True:
                message = await self.side.receive()
                now = anyio.current_time()
                self.log.append((now, message))
                if isinstance(message, kind) and where(message):
                    return now, message

    async def statuses(self, count: int) -> list[tuple[float, AnyRunnerStatus]]:
        found: list[tuple[float, AnyRunnerStatus]] = []
        for _ in range(count):
            at, report = await self.expect(RunnerStatusReport)
            found.append((at, report.runner_status))
        return found


def joined(node_id: str, ip: str = "10.0.0.1") -> NodeGatheredInfo:
    return NodeGatheredInfo(
        node_id=node_id,
        when="2026-01-01T00:00:00.000Z",
        network=NodeNetwork(interfaces=[NetworkInterface(name="en0", ip_address=ip)]),
    )


@asynccontextmanager
async def running(
    config: NodeConfig = NODE, node: SimNode | None = None
) -> AsyncIterator[tuple[SimNode, FakeMaster]]:
    """A node serving one session against a fake master that has welcomed it."""
    sim = node or SimNode(config, AnyioClock())
    master_side, node_side = memory_channel_pair()
    master = FakeMaster(master_side)
    async with anyio.create_task_group() as tg:
        tg.start_soon(sim.run, node_side)
        await master.expect(Hello)
        master.state = apply_indexed(
            master.state, IndexedEvent(idx=0, event=joined(sim.node_id, sim.config.ip))
        )
        await master.welcome()
        yield sim, master
        tg.cancel_scope.cancel()


def test_node_ids_are_stable_and_distinct() -> None:
    assert node_id_for("alpha") == node_id_for("alpha")
    assert node_id_for("alpha") != node_id_for("beta")
    assert node_id_for("alpha").startswith("12D3KooW")
    assert NodeConfig(name="x", memory_gb=1, node_id="fixed").resolved_id == "fixed"


@pytest.mark.anyio
async def test_hello_then_info_then_heartbeats() -> None:
    node = SimNode(NODE, AnyioClock())
    master_side, node_side = memory_channel_pair()
    master = FakeMaster(master_side)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.run, node_side)
        _, hello = await master.expect(Hello)
        assert hello.node_id == node_id_for("alpha")
        assert hello.name == "alpha"
        assert hello.running_instances == []
        start, info = await master.expect(NodeInfo)
        assert info.identity.friendly_name == "alpha"
        assert info.memory.ram_total == Memory.from_gb(16)
        assert info.memory.ram_available == Memory.from_gb(16)
        assert [b.value for b in info.backends] == ["MlxMetal"]
        assert info.network.interfaces[0].ip_address == "127.0.0.1"
        beats = [(await master.expect(Heartbeat))[0] for _ in range(6)]
        # One heartbeat a second; NodeInfo again within INFO_REFRESH_S even with nothing new.
        assert [round(b - beats[0], 3) for b in beats] == [0, 1, 2, 3, 4, 5]
        await master.expect(Heartbeat)
        infos = [at - start for at, m in master.log if isinstance(m, NodeInfo)]
        assert infos == [0.0, 5.0]
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_runner_lifecycle_follows_the_load_speed() -> None:
    async with running() as (node, master):
        t0 = anyio.current_time()
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        seen = await master.statuses(1 + 8 + 1)  # Connecting, Loading 0..7, Ready
        times = [round(at - t0, 3) for at, _ in seen]
        kinds = [status for _, status in seen]
        assert kinds[0] == RunnerConnecting()
        assert kinds[1:9] == [RunnerLoading(layers_loaded=k, total_layers=8) for k in range(8)]
        assert kinds[9] == RunnerReady()
        # Loading starts after connecting, one layer every LOAD_S / 8 s, ready after LOAD_S.
        assert times[0] == 0
        assert times[1:9] == [round(RUNNER_CONNECT_S + k * LOAD_S / 8, 3) for k in range(8)]
        assert times[9] == round(RUNNER_CONNECT_S + LOAD_S, 3)
        assert node.running_instances() == ["inst-1"]


@pytest.mark.anyio
async def test_loading_reports_are_throttled_for_fast_loads() -> None:
    fast = NodeConfig(name="fast", memory_gb=16, load_gb_per_s=8.0)  # 0.5 s for 8 layers
    async with running(fast) as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        seen = await master.statuses(4)
        loading = [s for _, s in seen if isinstance(s, RunnerLoading)]
        assert [s.layers_loaded for s in loading] == [0, 4]  # every LOADING_REPORT_S, not per layer
        assert seen[-1][1] == RunnerReady()
        assert seen[2][0] - seen[1][0] == pytest.approx(LOADING_REPORT_S)


@pytest.mark.anyio
async def test_memory_drops_by_the_shard_held_and_comes_back_after_shutdown() -> None:
    async with running() as (node, master):
        await master.expect(NodeInfo)
        # Two nodes: this one holds half the layers, so half the model's bytes.
        await master.emit(InstanceCreated(instance=instance_on([node.node_id, PEER])))
        _, info = await master.expect(NodeInfo)
        assert info.memory.ram_available.in_bytes == Memory.from_gb(16).in_bytes - 2 * GIB
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        deleted_at = anyio.current_time()
        await master.emit(InstanceDeleted(instance_id="inst-1"))
        at, down = await master.expect(RunnerStatusReport)
        assert down.runner_status == RunnerShuttingDown()
        assert at == pytest.approx(deleted_at)
        at, gone = await master.expect(RunnerStatusReport)
        assert gone.runner_status == RunnerShutdown()
        assert at - deleted_at == pytest.approx(RUNNER_SHUTDOWN_S)
        _, info = await master.expect(NodeInfo)
        assert info.memory.ram_available == Memory.from_gb(16)
        assert node.running_instances() == []


@pytest.mark.anyio
async def test_a_killed_runner_retries_and_loads_again() -> None:
    async with running() as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        assert node.kill_runner() == 1
        failed_at, failed = await master.expect(RunnerStatusReport)
        assert isinstance(failed.runner_status, RunnerFailed)
        retry_at, retry = await master.expect(RunnerStatusReport)
        assert retry.runner_status == RunnerConnecting()
        assert retry_at - failed_at == pytest.approx(0.5)
        ready_at, _ = await master.expect(
            RunnerStatusReport, lambda m: m.runner_status == RunnerReady()
        )
        assert ready_at - retry_at == pytest.approx(RUNNER_CONNECT_S + LOAD_S)
        # A kill of a runner that already failed is not a second failure.
        assert node.kill_runner("no-such-instance") == 0


@pytest.mark.anyio
async def test_a_runner_that_keeps_failing_backs_off_then_asks_for_deletion() -> None:
    async with running() as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        assert break_runner(node, "inst-1") == 1
        failures: list[float] = []
        retries: list[float] = []
        while len(failures) < 5:
            at, report = await master.expect(RunnerStatusReport)
            if isinstance(report.runner_status, RunnerFailed):
                failures.append(at)
            elif report.runner_status == RunnerConnecting():
                retries.append(at)
        asked_at, ask = await master.expect(RequestInstanceDeletion)
        assert ask.instance_id == "inst-1"
        assert "5 times" in ask.reason
        assert asked_at == pytest.approx(failures[-1])
        # exo's backoff: 0.5 s doubling; each retry then fails half-way through loading.
        waits = [round(r - f, 3) for f, r in zip(failures, retries, strict=False)]
        assert waits == [0.5, 1.0, 2.0, 4.0]
        load_to_failure = [round(f - r, 3) for r, f in zip(retries, failures[1:], strict=True)]
        assert load_to_failure == [round(RUNNER_CONNECT_S + LOAD_S / 2, 3)] * 4
        # No more retries once it gave up.
        with anyio.move_on_after(30):
            await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerConnecting())
            pytest.fail("the node retried a runner it gave up on")


@pytest.mark.anyio
async def test_chat_streams_tokens_at_a_steady_rate() -> None:
    async with running() as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        asked = anyio.current_time()
        await master.side.send(
            ChatRequest(request_id="r1", instance_id="inst-1", messages=[], max_tokens=5)
        )
        chunks = [await master.expect(ChatChunk) for _ in range(5)]
        assert [round(at - asked, 3) for at, _ in chunks] == [0.05, 0.1, 0.15, 0.2, 0.25]
        assert "".join(c.text for _, c in chunks) == "".join(reply_tokens()[:5])
        assert [c.finish_reason for _, c in chunks] == [None, None, None, None, "length"]
        running_reports = [
            m.runner_status
            for _, m in master.log
            if isinstance(m, RunnerStatusReport) and m.runner_status == RunnerRunning()
        ]
        assert running_reports == [RunnerRunning()]  # exo reports Running while answering
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())

        await master.side.send(
            ChatRequest(request_id="r2", instance_id="inst-1", messages=[], max_tokens=1000)
        )
        _, last = await master.expect(ChatChunk, lambda c: c.finish_reason is not None)
        assert last.finish_reason == "stop"


@pytest.mark.anyio
async def test_chat_fails_when_the_runner_dies_mid_request() -> None:
    async with running() as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        await master.side.send(
            ChatRequest(request_id="r1", instance_id="inst-1", messages=[], max_tokens=40)
        )
        for _ in range(3):
            await master.expect(ChatChunk)
        node.kill_runner("inst-1")
        _, error = await master.expect(ChatError)
        assert error.request_id == "r1"
        assert "died mid-request" in error.message
        assert not any(
            isinstance(m, ChatChunk) and m.finish_reason is not None for _, m in master.log
        )


@pytest.mark.anyio
async def test_chat_for_an_instance_not_ready_here_is_refused() -> None:
    async with running() as (_, master):
        await master.side.send(
            ChatRequest(request_id="r9", instance_id="nope", messages=[], max_tokens=4)
        )
        _, error = await master.expect(ChatError)
        assert error.request_id == "r9"
        assert "no ready runner" in error.message


@pytest.mark.anyio
async def test_links_to_live_peers_up_and_down() -> None:
    async with running() as (node, master):
        await master.emit(joined(PEER, ip="10.0.0.2"))
        _, up = await master.expect(LinkUp)
        assert up.sink == PEER
        assert isinstance(up.edge, SocketConnection)
        assert up.edge.sink_multiaddr.address == f"/ip4/10.0.0.2/tcp/{PEER_PORT}"
        # Once the State shows the edge, the node stays quiet about it.
        await master.emit(
            TopologyEdgeCreated(conn=Connection(source=node.node_id, sink=PEER, edge=up.edge))
        )
        with anyio.move_on_after(20):
            await master.expect(LinkUp)
            pytest.fail("a link the State shows was reported again")
        await master.emit(NodeTimedOut(node_id=PEER))
        _, down = await master.expect(LinkDown)
        assert down.sink == PEER


@pytest.mark.anyio
async def test_an_unconfirmed_link_is_reported_again() -> None:
    async with running() as (_, master):
        await master.emit(joined(PEER, ip="10.0.0.2"))
        first, _ = await master.expect(LinkUp)
        second, _ = await master.expect(LinkUp)
        assert second - first == pytest.approx(5.0)


@pytest.mark.anyio
async def test_a_node_timed_out_while_connected_announces_itself_again() -> None:
    async with running() as (node, master):
        await master.expect(NodeInfo)
        timed_out = anyio.current_time()
        await master.emit(NodeTimedOut(node_id=node.node_id))
        at, _ = await master.expect(NodeInfo)
        assert at - timed_out <= 1.0


@pytest.mark.anyio
async def test_the_node_keeps_its_runners_across_a_lost_channel() -> None:
    node = SimNode(NODE, AnyioClock())
    instance = instance_on([node.node_id])
    async with running(node=node) as (_, master):
        await master.emit(InstanceCreated(instance=instance))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        kept = master.state
        await master.side.aclose()
        with anyio.fail_after(5):
            while node.connected:
                await anyio.sleep(0.01)
    assert node.running_instances() == ["inst-1"]

    # A new master (rebuilt from its log) hears what the node still runs and its status.
    master_side, node_side = memory_channel_pair()
    master = FakeMaster(master_side, state=kept)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.run, node_side)
        _, hello = await master.expect(Hello)
        assert hello.running_instances == ["inst-1"]
        await master.welcome()
        _, report = await master.expect(RunnerStatusReport)
        assert report.runner_status == RunnerReady()
        assert report.runner_id == "inst-1-runner-0"
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_an_instance_deleted_while_away_is_shut_down_on_return() -> None:
    node = SimNode(NODE, AnyioClock())
    async with running(node=node) as (_, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        await master.emit(InstanceDeleted(instance_id="inst-1"))
        # The channel drops before the node hears of the deletion.
        gone = master.state
        await master.side.aclose()
    master_side, node_side = memory_channel_pair()
    master = FakeMaster(master_side, state=gone)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.run, node_side)
        await master.expect(Hello)
        await master.welcome()
        _, report = await master.expect(RunnerStatusReport)
        assert report.runner_status in (RunnerShuttingDown(), RunnerShutdown())
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerShutdown())
        assert node.running_instances() == []
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_status_reports_apply_cleanly_to_the_state() -> None:
    # What the node reports, turned into events, leaves a State with the runner ready.
    async with running() as (node, master):
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        while True:
            _, report = await master.expect(RunnerStatusReport)
            await master.emit(
                RunnerStatusUpdated(runner_id=report.runner_id, runner_status=report.runner_status)
            )
            if report.runner_status == RunnerReady():
                break
        assert master.state.runners == {"inst-1-runner-0": RunnerReady()}
