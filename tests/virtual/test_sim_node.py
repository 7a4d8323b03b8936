"""The simulated node against a scripted master, in virtual time.

A fake master holds the other end of an in-memory channel, applies the events it chooses to
emit, and records every message the node sends with the (virtual) time it arrived, so the tests
can check exo's runner lifecycle to the millisecond: how long loading takes at the node's GB/s,
the retry backoff, the deletion request after 5 failures, the chat token rate.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio
import pytest

from keeper.model.apply import apply_indexed
from keeper.model.catalog import catalog_by_id
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
    AnyDownload,
    AnyRunnerStatus,
    Connection,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    Memory,
    MlxRingInstance,
    ModelCard,
    NetworkInterface,
    NodeNetwork,
    PipelineShardMetadata,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    ShardAssignments,
    SocketConnection,
    State,
    SystemVitals,
    download_model_id,
)
from keeper.runtime.clock import AnyioClock
from keeper.sim.link.channel import MasterSide, memory_channel_pair
from keeper.sim.link.identity import NodeKey, hello_refusal, new_challenge
from keeper.sim.link.protocol import (
    AnyNodeMessage,
    CancelDownload,
    Challenge,
    ChatChunk,
    ChatError,
    ChatRequest,
    DeleteDownload,
    DownloadReport,
    EventMessage,
    Heartbeat,
    Hello,
    LinkDown,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    StartDownload,
    Welcome,
)
from keeper.sim.node.sim_node import (
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
# The model is on the node's disk from the start: these tests time loading alone (downloads have
# tests/test_sim_downloads.py).
NODE = NodeConfig(name="alpha", memory_gb=16, load_gb_per_s=1.0, has_models=(CARD,))
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

    async def hello(self) -> tuple[float, Hello]:
        """Challenge the node as a master does; its Hello, checked to prove its id."""
        challenge = new_challenge()
        await self.side.send(Challenge(nonce=challenge))
        at, hello = await self.expect(Hello)
        assert hello_refusal(hello.node_id, challenge, hello.signature) is None
        return at, hello

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
        await master.hello()
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
    key = NodeKey.generate()
    assert NodeConfig(name="x", memory_gb=1, key=key).resolved_id == key.node_id


@pytest.mark.anyio
async def test_hello_then_info_then_heartbeats() -> None:
    node = SimNode(NODE, AnyioClock())
    master_side, node_side = memory_channel_pair()
    master = FakeMaster(master_side)
    async with anyio.create_task_group() as tg:
        tg.start_soon(node.run, node_side)
        _, hello = await master.hello()
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
        infos = [round(at - start, 3) for at, m in master.log if isinstance(m, NodeInfo)]
        # INFO_REFRESH_S is a second, exo's cadence: lastSeen moves once a second.
        assert infos == [float(k) for k in range(len(infos))] and len(infos) >= 6
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
    # 0.5 s for 8 layers, the model on disk
    fast = NodeConfig(name="fast", memory_gb=16, load_gb_per_s=8.0, has_models=(CARD,))
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
        _, hello = await master.hello()
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
        await master.hello()
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


# --- downloads ------------------------------------------------------------------------------

# The same node without the model on its disk: 4 GiB at 1024 MB/s is 4 s of downloading.
LACKING = NodeConfig(name="alpha", memory_gb=16, load_gb_per_s=1.0, download_mb_per_s=1024.0)
DOWNLOAD_S = 4.0
OTHER = CARD.model_copy(update={"model_id": "test/model-1g", "storage_size": Memory.from_gb(1)})


def whole(card: ModelCard) -> PipelineShardMetadata:
    return PipelineShardMetadata(
        model_card=card,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=card.n_layers,
        n_layers=card.n_layers,
    )


async def downloads_until(
    master: FakeMaster, last: Callable[[AnyDownload], bool], model_id: str = CARD.model_id
) -> list[tuple[float, AnyDownload]]:
    """The node's download reports for ``model_id`` up to the first ``last`` one, with when each
    arrived (the fake master never shows them in its State, so the node re-sends the last one
    every few seconds: later ones are not read)."""
    found: list[tuple[float, AnyDownload]] = []
    while True:
        at, report = await master.expect(
            DownloadReport, lambda m: download_model_id(m.download_progress) == model_id
        )
        found.append((at, report.download_progress))
        if last(report.download_progress):
            return found


def completed(entry: AnyDownload) -> bool:
    return isinstance(entry, DownloadCompleted)


@pytest.mark.anyio
async def test_a_runner_waits_idle_for_its_model_s_download_then_loads() -> None:
    async with running(LACKING) as (node, master):
        t0 = anyio.current_time()
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        reports = await downloads_until(master, completed)
        times = [round(at - t0, 6) for at, _ in reports]
        # exo's progress once a second from the download's start, then complete at size / rate.
        assert times == [0.0, 1.0, 2.0, 3.0, DOWNLOAD_S]
        ongoing = [entry for _, entry in reports[:-1]]
        assert all(isinstance(entry, DownloadOngoing) for entry in ongoing)
        progress = [
            entry.download_progress for entry in ongoing if isinstance(entry, DownloadOngoing)
        ]
        assert [p.downloaded.in_bytes for p in progress] == [k * GIB for k in range(4)]
        assert {(p.total.in_bytes, p.speed, p.total_files) for p in progress} == {
            (4 * GIB, float(GIB), 8)
        }
        assert [p.eta_ms for p in progress] == [4000, 3000, 2000, 1000]
        done = reports[-1][1]
        assert isinstance(done, DownloadCompleted) and done.total == CARD.storage_size
        assert (
            done.shard_metadata
            == instance_on([node.node_id]).shard_assignments.runner_to_shard["inst-1-runner-0"]
        )
        # Meanwhile the runner waited idle, as exo's does, then went on as ever.
        ready_at, _ = await master.expect(
            RunnerStatusReport, lambda m: m.runner_status == RunnerReady()
        )
        statuses = [
            (round(at - t0, 6), m.runner_status)
            for at, m in master.log
            if isinstance(m, RunnerStatusReport)
        ]
        assert statuses[0] == (0.0, RunnerIdle())
        assert statuses[1] == (DOWNLOAD_S, RunnerConnecting())
        assert round(ready_at - t0, 6) == DOWNLOAD_S + RUNNER_CONNECT_S + LOAD_S


@pytest.mark.anyio
async def test_a_model_on_disk_from_the_start_is_reported_complete_and_never_downloaded() -> None:
    async with running(NODE) as (node, master):
        welcomed = anyio.current_time()
        at, report = await master.expect(DownloadReport)
        assert at == welcomed  # the first thing it says of its disk once it knows the State
        assert isinstance(report.download_progress, DownloadCompleted)
        assert report.download_progress.shard_metadata == whole(CARD)
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        assert not any(
            isinstance(m, DownloadReport) and not completed(m.download_progress)
            for _, m in master.log
        )


@pytest.mark.anyio
async def test_a_17_gb_model_asked_for_without_a_runner_downloads_at_the_node_s_rate() -> None:
    qwen_30b = catalog_by_id()["mlx-community/Qwen3-30B-A3B-4bit"]
    size = qwen_30b.storage_size.in_bytes
    config = NodeConfig(name="alpha", memory_gb=16, download_mb_per_s=500.0)
    rate = 500.0 * 1024**2
    async with running(config) as (node, master):
        await master.expect(NodeInfo)
        asked = anyio.current_time()
        await master.side.send(StartDownload(shard_metadata=whole(qwen_30b)))
        reports = await downloads_until(master, completed, qwen_30b.model_id)
        times = [at - asked for at, _ in reports]
        assert times[-1] == pytest.approx(size / rate)  # 33.6 s
        assert max(b - a for a, b in itertools.pairwise(times)) <= 1.0 + 1e-9
        downloaded = [
            entry.download_progress.downloaded.in_bytes
            for _, entry in reports
            if isinstance(entry, DownloadOngoing)
        ]
        assert len(downloaded) == 34 and downloaded == sorted(downloaded)
        # The disk is reported at once when the download ends (just before the entry is).
        at, info = [(at, m) for at, m in master.log if isinstance(m, NodeInfo)][-1]
        assert at - asked == pytest.approx(size / rate)
        assert info.disk is not None
        assert info.disk.available.in_bytes == Memory.from_gb(1000).in_bytes - size
        assert node.running_instances() == []


@pytest.mark.anyio
async def test_one_download_at_a_time_the_next_waits_pending() -> None:
    async with running(LACKING) as (_, master):
        asked = anyio.current_time()
        await master.side.send(StartDownload(shard_metadata=whole(CARD)))
        await master.side.send(StartDownload(shard_metadata=whole(OTHER)))
        _, first = await master.expect(
            DownloadReport, lambda m: download_model_id(m.download_progress) == OTHER.model_id
        )
        assert isinstance(first.download_progress, DownloadPending)
        assert first.download_progress.total == OTHER.storage_size
        reports = await downloads_until(master, completed, OTHER.model_id)
        started_at, started = reports[0]
        assert isinstance(started, DownloadOngoing)
        assert started_at - asked == pytest.approx(DOWNLOAD_S)  # when the first one ended
        assert reports[-1][0] - asked == pytest.approx(DOWNLOAD_S + 1.0)


@pytest.mark.anyio
async def test_a_model_the_disk_cannot_hold_fails_its_runner_with_exo_s_backoff() -> None:
    small_disk = NodeConfig(name="alpha", memory_gb=16, disk_gb=3.0)
    async with running(small_disk) as (node, master):
        t0 = anyio.current_time()
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        _, report = await master.expect(DownloadReport)
        failed = report.download_progress
        assert isinstance(failed, DownloadFailed)
        assert failed.error_message.startswith("No writable model directory has 4.0 GiB free.")
        assert "needs 4.0 GiB; 3.0 GiB of 3.0 GiB free" in failed.error_message
        reported = [m for _, m in master.log if isinstance(m, RunnerStatusReport)]
        assert [m.runner_status for m in reported] == [
            RunnerFailed(error_message=failed.error_message)
        ]
        # Each of exo's retries (after 0.5, 1, 2 and 4 s) finds the disk still too small, so the
        # runner never leaves Failed, and after the fifth failure the node asks for deletion.
        asked_at, ask = await master.expect(RequestInstanceDeletion)
        assert asked_at - t0 == pytest.approx(0.5 + 1 + 2 + 4)
        assert "failed 5 times" in ask.reason and failed.error_message in ask.reason


@pytest.mark.anyio
async def test_delete_download_frees_the_disk_unless_a_runner_uses_the_model() -> None:
    async with running(NODE) as (node, master):
        _, info = await master.expect(NodeInfo)
        assert info.disk is not None
        full = Memory.from_gb(1000).in_bytes
        assert info.disk.available.in_bytes == full - CARD.storage_size.in_bytes
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        await master.side.send(DeleteDownload(model_id=CARD.model_id))
        with anyio.move_on_after(10):
            await master.expect(
                DownloadReport, lambda m: isinstance(m.download_progress, DownloadPending)
            )
            pytest.fail("the files of a model a runner uses were deleted")
        await master.emit(InstanceDeleted(instance_id="inst-1"))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerShutdown())
        asked = anyio.current_time()
        await master.side.send(DeleteDownload(model_id=CARD.model_id))
        at, report = await master.expect(DownloadReport)
        assert at == pytest.approx(asked)
        assert report.download_progress == DownloadPending(
            node_id=node.node_id,
            shard_metadata=whole(CARD),
            model_directory=f"/fake/models/{CARD.model_id}",
        )
        _, info = await master.expect(NodeInfo)
        assert info.disk is not None and info.disk.available.in_bytes == full


@pytest.mark.anyio
async def test_cancel_download_stops_it_keeping_what_it_downloaded() -> None:
    async with running(LACKING) as (_, master):
        await master.side.send(StartDownload(shard_metadata=whole(CARD)))
        await master.expect(DownloadReport)
        await anyio.sleep(2.5)
        await master.side.send(CancelDownload(model_id=CARD.model_id))
        reports = await downloads_until(master, lambda entry: isinstance(entry, DownloadPending))
        pending = reports[-1][1]
        assert isinstance(pending, DownloadPending)
        assert pending.downloaded.in_bytes == pytest.approx(2.5 * GIB, abs=1)
        assert pending.total == CARD.storage_size


@pytest.mark.anyio
async def test_system_vitals_follow_what_the_runners_do() -> None:
    async with running() as (node, master):
        _, idle_info = await master.expect(NodeInfo)
        idle = idle_info.system
        assert idle == SystemVitals(
            gpu_usage=0.03, temp=41.0, sys_power=12.0, pcpu_usage=0.2, ecpu_usage=0.1
        )  # exo's recorded idle node
        await master.emit(InstanceCreated(instance=instance_on([node.node_id])))
        await master.expect(RunnerStatusReport, lambda m: m.runner_status == RunnerReady())
        _, loaded_info = await master.expect(NodeInfo)  # the next refresh samples them
        loaded = loaded_info.system
        assert idle is not None and loaded is not None
        assert loaded.gpu_usage == 0.12
        assert idle.temp < loaded.temp < 58.0  # below a node serving a chat
        assert idle.sys_power < loaded.sys_power < 95.0
