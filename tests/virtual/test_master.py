"""The master service in virtual time: keeper loop, membership, sweep, restart, chat routing.

Nodes here are a few lines each (``FakeNode``) driven over ``memory_channel_pair``, so every
rule is checked against the master alone; trio's MockClock makes the 15 s grace, the 30 s node
timeout and the 10 s sweep pass instantly. Each test waits on a condition with a virtual-time
deadline, never on a fixed sleep.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup, TaskStatus
from keeper_fakes import NoDrains
from model_ids import QWEN

from keeper.core.keeper import Keeper, PlaceFn
from keeper.core.placement import place_instance
from keeper.model.api_models import CommandResponse
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import InstanceCreated, InstanceDeleted, NodeGatheredInfo, NodeTimedOut
from keeper.model.refusals import ChatFailedError, NoInstanceError, NotFoundError
from keeper.model.state import (
    AnyInstance,
    Backend,
    Memory,
    MemoryUsage,
    Multiaddr,
    NodeIdentity,
    NodeNetwork,
    RunnerFailed,
    RunnerReady,
    RunnerShutdown,
    SocketConnection,
    State,
)
from keeper.runtime.hosted_keeper import HostedKeeper, KeeperLike, default_keeper, start_keeper
from keeper.sim.link.channel import ChannelClosedError, NodeSide, memory_channel_pair
from keeper.sim.link.identity import NodeKey
from keeper.sim.link.protocol import (
    AnyNodeMessage,
    Challenge,
    ChatChunk,
    ChatError,
    ChatMessage,
    ChatRequest,
    EventMessage,
    Heartbeat,
    Hello,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    Welcome,
)
from keeper.sim.master.chat import ChatStream
from keeper.sim.master.report_buffer import REPORT_INTERVAL_S
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.master.subscriptions import SubscriptionLaggedError

LLAMA_70B = "mlx-community/Llama-3.3-70B-Instruct-4bit"


class FakeNode:
    """Says Hello, reports its memory, marks its runners Ready, heartbeats, answers chats."""

    def __init__(self, name: str, memory_gb: float = 64.0, chat: str = "reply") -> None:
        self.key = NodeKey.for_name(f"node-{name}")
        self.node_id = self.key.node_id
        self.name = name
        self.memory_gb = memory_gb
        # "reply" | "die" (one chunk, then the connection drops) | "drop" (the connection drops
        # before any chunk) | "error" (the node answers an error before any chunk) | "hang"
        self.chat = chat
        self.frozen = False
        self.chat_requests: list[ChatRequest] = []
        self.state = State()
        self._channel: NodeSide | None = None

    def info(self) -> NodeInfo:
        memory = Memory.from_gb(self.memory_gb)
        return NodeInfo(
            memory=MemoryUsage(ram_total=memory, ram_available=memory),
            backends=[Backend.MLX_METAL],
            identity=NodeIdentity(friendly_name=self.name),
            network=NodeNetwork(),
        )

    async def run(self, channel: NodeSide, *, task_status: TaskStatus[None]) -> None:
        self._channel = channel
        challenge = await channel.receive()
        assert isinstance(challenge, Challenge)
        signature = self.key.sign_hello(challenge.nonce)
        await channel.send(Hello(node_id=self.node_id, name=self.name, signature=signature))
        await channel.send(self.info())
        task_status.started()
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self._heartbeat, channel)
                await self._follow(channel)
                group.cancel_scope.cancel()
        except ChannelClosedError:
            pass

    async def link(self, peer: FakeNode) -> None:
        assert self._channel is not None
        await self._channel.send(link_to(peer.node_id))

    async def _heartbeat(self, channel: NodeSide) -> None:
        while True:
            await anyio.sleep(1.0)
            if not self.frozen:
                await channel.send(Heartbeat())

    async def _follow(self, channel: NodeSide) -> None:
        while True:
            try:
                message = await channel.receive()
            except ChannelClosedError:
                return
            if self.frozen:
                continue
            match message:
                case Welcome(state=state):
                    self.state = state
                    for instance in state.instances.values():
                        await self._report_ready(channel, instance)
                case EventMessage(indexed=indexed):
                    if isinstance(indexed.event, InstanceCreated):
                        await self._report_ready(channel, indexed.event.instance)
                case ChatRequest():
                    self.chat_requests.append(message)
                    await self._answer(channel, message)
                case _:
                    pass

    async def _report_ready(self, channel: NodeSide, instance: AnyInstance) -> None:
        runner = instance.shard_assignments.node_to_runner.get(self.node_id)
        if runner is not None:
            await channel.send(RunnerStatusReport(runner_id=runner, runner_status=RunnerReady()))

    async def _answer(self, channel: NodeSide, request: ChatRequest) -> None:
        if self.chat == "hang":
            return
        if self.chat == "drop":
            await channel.aclose()
            return
        if self.chat == "error":
            await channel.send(ChatError(request_id=request.request_id, message="runner died"))
            return
        await channel.send(ChatChunk(request_id=request.request_id, text="Hello"))
        if self.chat == "die":
            await channel.aclose()
            return
        await channel.send(ChatChunk(request_id=request.request_id, text=" world"))
        await channel.send(ChatChunk(request_id=request.request_id, finish_reason="stop"))


def link_to(peer_id: str) -> LinkUp:
    return LinkUp(
        sink=peer_id,
        edge=SocketConnection(sink_multiaddr=Multiaddr(address="/ip4/10.0.0.9/tcp/52415")),
    )


async def connect(master: Master, group: TaskGroup, node: FakeNode) -> None:
    master_side, node_side = memory_channel_pair()
    group.start_soon(master.serve_node, master_side)
    await group.start(node.run, node_side)
    await wait_until(lambda: node.node_id in master.state.node_memory, 1, f"{node.name} joined")


async def wait_until(condition: Callable[[], bool], within_s: float, what: str) -> None:
    """Wait (virtual time) until ``condition`` holds; fail naming ``what`` after ``within_s``."""
    try:
        with anyio.fail_after(within_s):
            while not condition():
                await anyio.sleep(0.05)
    except TimeoutError:
        pytest.fail(f"not within {within_s} s: {what}")


async def serve_qwen(master: Master, group: TaskGroup, node: FakeNode) -> CommandResponse:
    """Run ``master``, connect ``node`` and wait until an instance of Qwen on it is ready."""
    await group.start(master.run)
    await connect(master, group, node)
    placed = await master.place_instance(QWEN)
    await wait_until(lambda: bool(master.ready_instances(QWEN)), 2, "runner ready")
    return placed


async def deploy_qwen_on_one_node(master: Master, group: TaskGroup) -> CommandResponse:
    """Run ``master`` with one node, deploy Qwen and wait (past the grace) until it serves."""
    await group.start(master.run)
    await connect(master, group, FakeNode("a"))
    created = await master.create_deployment(QWEN)
    await wait_until(lambda: serving(master, QWEN), STARTUP_GRACE + 5, "placement")
    return created


async def say_hi(master: Master) -> ChatStream:
    """A one-line chat to Qwen, asking for at most 8 tokens."""
    return await master.chat(QWEN, [ChatMessage(role="user", content="hi")], 8)


def instances_of(master: Master, model_id: str) -> list[str]:
    return [
        iid
        for iid, inst in master.state.instances.items()
        if inst.shard_assignments.model_id == model_id
    ]


def serving(master: Master, model_id: str) -> bool:
    return master.deployments_view().deployments[0].status == "serving" and bool(
        instances_of(master, model_id)
    )


@pytest.mark.anyio
async def test_deploy_places_only_after_the_grace() -> None:
    master = Master(None)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        started = anyio.current_time()
        await connect(master, group, FakeNode("a"))
        await master.create_deployment(QWEN)
        placed_at: list[float] = []
        subscription = master.subscribe()

        async def watch() -> None:
            async for indexed in subscription:
                if isinstance(indexed.event, InstanceCreated):
                    placed_at.append(anyio.current_time() - started)

        group.start_soon(watch)
        await wait_until(lambda: bool(placed_at), STARTUP_GRACE + 3, "an InstanceCreated")
        assert placed_at[0] >= STARTUP_GRACE
        await wait_until(lambda: serving(master, QWEN), 5, "the deployment serving")
        deployment = next(iter(master.state.deployments.values()))
        assert deployment.instance_id == instances_of(master, QWEN)[0]
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_every_id_the_master_mints_comes_from_its_id_factory() -> None:
    minted: list[str] = []

    def new_id() -> str:
        minted.append(str(uuid.UUID(int=len(minted) + 1)))
        return minted[-1]

    master = Master(None, config=MasterConfig(startup_grace_s=0), new_id=new_id)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, FakeNode("a"))
        created = await master.create_deployment(QWEN)
        await wait_until(lambda: serving(master, QWEN), 10, "the deployment serving")
        instance = master.state.instances[instances_of(master, QWEN)[0]]
        runners = set(instance.shard_assignments.node_to_runner.values())
        assert created.deployment_id is not None and runners
        assert {created.deployment_id, created.command_id, instance.instance_id} | runners <= set(
            minted
        )
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_silent_node_times_out_and_the_sweep_deletes_its_instance() -> None:
    master = Master(None)
    a, b = FakeNode("a"), FakeNode("b")
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, a)
        await connect(master, group, b)
        subscription = master.subscribe()
        seen: list[tuple[float, object]] = []

        async def watch() -> None:
            async for indexed in subscription:
                seen.append((anyio.current_time(), indexed.event))

        group.start_soon(watch)
        await master.create_deployment(QWEN)
        await wait_until(lambda: serving(master, QWEN), STARTUP_GRACE + 5, "first placement")
        (first,) = instances_of(master, QWEN)
        holder = next(iter(master.state.instances[first].shard_assignments.node_to_runner))
        victim = a if holder == a.node_id else b
        victim.frozen = True
        frozen_at = anyio.current_time()

        await wait_until(
            lambda: victim.node_id not in master.state.topology.nodes, 35, "NodeTimedOut"
        )
        timed_out_at = next(t for t, e in seen if isinstance(e, NodeTimedOut))
        assert 29 <= timed_out_at - frozen_at <= 32  # 30 s of silence, checked every second
        assert victim.node_id not in master.connected_nodes()  # its session was closed
        await wait_until(lambda: first not in master.state.instances, 11, "the sweep")
        deleted_at = next(
            t for t, e in seen if isinstance(e, InstanceDeleted) and e.instance_id == first
        )
        assert deleted_at - timed_out_at <= 10.5
        # The keeper places the model again on the node that is left.
        await wait_until(lambda: serving(master, QWEN), 5, "placed again")
        (second,) = instances_of(master, QWEN)
        survivor = b if victim is a else a
        assert list(master.state.instances[second].shard_assignments.node_to_runner) == [
            survivor.node_id
        ]
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_deleting_a_deployment_removes_its_instance_for_good() -> None:
    master = Master(None)
    async with anyio.create_task_group() as group:
        created = await deploy_qwen_on_one_node(master, group)
        assert created.deployment_id is not None
        await master.delete_deployment(created.deployment_id)
        assert master.state.deployments == {}
        assert instances_of(master, QWEN) == []
        await anyio.sleep(120)  # two minutes of keeper steps, sweeps and membership checks
        assert instances_of(master, QWEN) == []
        with pytest.raises(NotFoundError, match=created.deployment_id):
            await master.delete_deployment(created.deployment_id)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_an_instance_deleted_by_hand_is_placed_again() -> None:
    master = Master(None)
    async with anyio.create_task_group() as group:
        await deploy_qwen_on_one_node(master, group)
        (first,) = instances_of(master, QWEN)
        await anyio.sleep(1.5)  # let a keeper step see it ready
        await master.delete_instance(first)
        # Lost after it was ready: placed again at the next step, no backoff.
        await wait_until(
            lambda: bool(instances_of(master, QWEN)) and first not in master.state.instances,
            2.5,
            "a new instance",
        )
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_restart_keeps_deployments_and_places_no_duplicate(tmp_path: Path) -> None:
    nodes = [FakeNode("a"), FakeNode("b")]
    first = Master(tmp_path)
    instance_id = deployment_id = ""
    async with anyio.create_task_group() as group:
        await group.start(first.run)
        for node in nodes:
            await connect(first, group, node)
        deployment_id = (await first.create_deployment(QWEN)).deployment_id or ""
        await wait_until(lambda: serving(first, QWEN), STARTUP_GRACE + 5, "placement")
        (instance_id,) = instances_of(first, QWEN)
        group.cancel_scope.cancel()  # the master goes away; so do the node connections

    second = Master(tmp_path)
    async with anyio.create_task_group() as group:
        await group.start(second.run)
        assert deployment_id in second.state.deployments
        assert instance_id in second.state.instances
        await anyio.sleep(3)  # nodes take a few seconds to notice and reconnect
        for node in nodes:
            await connect(second, group, node)
        subscription = second.subscribe()
        created_again: list[InstanceCreated] = []

        async def watch() -> None:
            async for indexed in subscription:
                if isinstance(indexed.event, InstanceCreated):
                    created_again.append(indexed.event)

        group.start_soon(watch)
        await anyio.sleep(STARTUP_GRACE + 30)
        assert created_again == []
        assert instances_of(second, QWEN) == [instance_id]
        assert serving(second, QWEN)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chat_goes_to_the_rank_zero_node() -> None:
    master = Master(None)
    a, b = FakeNode("a", memory_gb=24), FakeNode("b", memory_gb=24)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, a)
        await connect(master, group, b)
        await wait_until(lambda: len(master.state.topology.nodes) == 2, 1, "both nodes joined")
        await a.link(b)
        await b.link(a)
        await wait_until(
            lambda: len(master.state.topology.connections) == 2, 2, "both links applied"
        )
        # 40 GB of model on 24 GB nodes: only a two-node instance fits.
        await master.place_instance(LLAMA_70B, min_nodes=2)
        (instance_id,) = instances_of(master, LLAMA_70B)
        await wait_until(lambda: bool(master.ready_instances(LLAMA_70B)), 2, "runners ready")
        assignments = master.state.instances[instance_id].shard_assignments
        rank0 = next(
            node
            for node, runner in assignments.node_to_runner.items()
            if assignments.runner_to_shard[runner].device_rank == 0
        )
        stream = await master.chat(LLAMA_70B, [ChatMessage(role="user", content="hi")], 16)
        text = "".join([piece async for piece in stream])
        assert text == "Hello world"
        assert stream.finish_reason == "stop"
        by_id = {a.node_id: a, b.node_id: b}
        assert [r.instance_id for r in by_id[rank0].chat_requests] == [instance_id]
        others = [node for node_id, node in by_id.items() if node_id != rank0]
        assert all(node.chat_requests == [] for node in others)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chat_without_a_ready_instance_is_refused() -> None:
    master = Master(None)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, FakeNode("a"))
        with pytest.raises(NoInstanceError, match=QWEN) as refused:
            await say_hi(master)
        assert refused.value.status_code == 404
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chat_ends_with_an_error_when_its_node_dies_mid_reply() -> None:
    master = Master(None)
    node = FakeNode("a", chat="die")
    async with anyio.create_task_group() as group:
        await serve_qwen(master, group, node)
        stream = await say_hi(master)
        received: list[str] = []
        started = anyio.current_time()
        with pytest.raises(ChatFailedError, match="disconnected"):
            async for piece in stream:
                received.append(piece)
        assert received == ["Hello"]
        assert anyio.current_time() - started < 1  # at once, not after a timeout
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chat_to_a_frozen_node_times_out_instead_of_hanging() -> None:
    config = MasterConfig(chat_chunk_timeout_s=5)
    master = Master(None, config=config)
    node = FakeNode("a", chat="hang")
    async with anyio.create_task_group() as group:
        await serve_qwen(master, group, node)
        stream = await say_hi(master)
        started = anyio.current_time()
        with pytest.raises(ChatFailedError, match="sent nothing for 5 s"):
            async for _ in stream:
                pass
        assert 5 <= anyio.current_time() - started < 6
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chat_ends_when_its_instance_is_deleted() -> None:
    master = Master(None)
    node = FakeNode("a", chat="hang")
    async with anyio.create_task_group() as group:
        placed = await serve_qwen(master, group, node)
        stream = await say_hi(master)
        assert placed.instance_id is not None
        await master.delete_instance(placed.instance_id)
        with pytest.raises(ChatFailedError, match="deleted"):
            async for _ in stream:
                pass
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_reconnecting_node_is_the_same_node() -> None:
    master = Master(None)
    node = FakeNode("a")
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, node)
        await wait_until(lambda: node.node_id in master.state.topology.nodes, 1, "joined")
        await connect(master, group, node)  # a second session replaces the first
        await wait_until(lambda: master.connected_nodes() == [node.node_id], 1, "one session")
        assert master.state.topology.nodes == [node.node_id]
        group.cancel_scope.cancel()


def test_start_keeper_passes_its_start_and_grace_to_the_factory() -> None:
    made: list[tuple[float, PlaceFn, float]] = []

    def factory(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
        made.append((started_at, place, startup_grace))
        return default_keeper(started_at, place, startup_grace=startup_grace)

    hosted = start_keeper(factory, 50.0, 3.0, place_instance)
    assert made == [(50.0, place_instance, 3.0)]
    assert isinstance(hosted, HostedKeeper) and isinstance(hosted.inner, Keeper)
    assert (hosted.inner.started_at, hosted.inner.startup_grace) == (50.0, 3.0)


@pytest.mark.anyio
async def test_a_crashing_placement_is_logged_once_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crash = ZeroDivisionError("placement bug")

    def crashing_place(*_: object) -> AnyInstance:
        raise crash

    config = MasterConfig(startup_grace_s=0, keeper_interval_s=1.0)
    master = Master(None, config=config, place=crashing_place)
    deployment_id = ""
    with caplog.at_level(logging.ERROR):
        async with anyio.create_task_group() as group:
            await group.start(master.run)
            await connect(master, group, FakeNode("a"))
            deployment_id = (await master.create_deployment(QWEN)).deployment_id or ""
            await wait_until(
                lambda: master.state.deployments[deployment_id].placement_error is not None,
                5,
                "the crash recorded on the deployment",
            )
            await anyio.sleep(120)  # retried (UNPLACEABLE_RETRY) meanwhile, crashing each time
            group.cancel_scope.cancel()
    assert master.state.deployments[deployment_id].placement_error == (
        "ZeroDivisionError: placement bug"
    )
    records = [r for r in caplog.records if "placement crashed" in r.getMessage()]
    assert len(records) == 1
    assert records[0].exc_info is not None and records[0].exc_info[1] is crash


@pytest.mark.anyio
async def test_a_keeper_that_raises_does_not_stop_the_master() -> None:
    class BrokenKeeper(NoDrains):
        steps = 0

        def step(self, state: State, now: float) -> list[Any]:
            BrokenKeeper.steps += 1
            raise RuntimeError("bug")

        def delete(self, deployment_id: str, state: State) -> list[Any]:
            return []

        def scale(self, deployment_id: str, replicas: int, state: State) -> list[Any]:
            return []

        def timers(self, state: State, now: float) -> dict[str, Any]:
            return {}

    master = Master(None, keeper_factory=lambda started_at, place, *, startup_grace: BrokenKeeper())
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await anyio.sleep(STARTUP_GRACE + 5)
        assert BrokenKeeper.steps >= 5
        created = await master.create_deployment(QWEN)  # commands still work
        assert created.deployment_id in master.state.deployments
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_subscriber_that_falls_behind_is_dropped_not_waited_for() -> None:
    master = Master(None, config=MasterConfig(subscriber_buffer=5))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        slow = master.subscribe()
        events = [NodeTimedOut(node_id=f"n{i}") for i in range(20)]
        await master.emit(events)
        await wait_until(lambda: master.state.last_event_applied_idx == 19, 1, "all applied")
        received = []
        with pytest.raises(SubscriptionLaggedError):
            async for indexed in slow:
                received.append(indexed.idx)
        assert received == [0, 1, 2, 3, 4]  # what fitted, in order, then the drop
        fresh = master.subscribe()  # a new subscription starts from the current State
        assert fresh.state.last_event_applied_idx == 19
        await fresh.aclose()
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_that_stops_reading_is_disconnected() -> None:
    master = Master(None, config=MasterConfig(subscriber_buffer=5))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        master_side, node_side = memory_channel_pair()
        group.start_soon(master.serve_node, master_side)
        deaf = NodeKey.for_name("deaf")
        challenge = await node_side.receive()
        assert isinstance(challenge, Challenge)
        signature = deaf.sign_hello(challenge.nonce)
        await node_side.send(Hello(node_id=deaf.node_id, name="deaf", signature=signature))
        await wait_until(lambda: master.connected_nodes() == [deaf.node_id], 1, "connected")
        # The in-memory channel buffers plenty; the session's own outbox (5) is what fills
        # while its forwarder is blocked, so block it: never read, and flood events.
        await master.emit([NodeTimedOut(node_id=f"n{i}") for i in range(20_000)])
        await wait_until(lambda: master.connected_nodes() == [], 5, "the deaf node dropped")
        group.cancel_scope.cancel()


# --- no node speaks for another ----------------------------------------------------------


async def sent_and_taken(master: Master, node: FakeNode, *messages: AnyNodeMessage) -> None:
    """Send ``messages`` as ``node``, then a change of its memory, and wait until the memory is
    in the State: the master's session has handled what came before it, in order."""
    assert node._channel is not None
    for message in messages:
        await node._channel.send(message)
    node.memory_gb += 1
    await node._channel.send(node.info())
    expected = Memory.from_gb(node.memory_gb)
    await wait_until(
        lambda: master.state.node_memory[node.node_id].ram_total == expected, 1, "info taken"
    )


def runner_of(master: Master, instance_id: str, node: FakeNode) -> str:
    return master.state.instances[instance_id].shard_assignments.node_to_runner[node.node_id]


@pytest.mark.anyio
async def test_a_node_cannot_fail_another_nodes_runner_or_delete_its_instance() -> None:
    master = Master(None)
    a, b = FakeNode("a"), FakeNode("b")
    async with anyio.create_task_group() as group:
        placed = await serve_qwen(master, group, a)
        await connect(master, group, b)
        assert placed.instance_id is not None
        runner = runner_of(master, placed.instance_id, a)
        failed = RunnerFailed(error_message="forged")
        await sent_and_taken(
            master,
            b,
            RunnerStatusReport(runner_id=runner, runner_status=failed),
            RunnerStatusReport(runner_id=runner, runner_status=failed),
            RequestInstanceDeletion(instance_id=placed.instance_id, reason="forged"),
        )
        assert isinstance(master.state.runners[runner], RunnerReady)
        assert placed.instance_id in master.state.instances
        assert master.ready_instances(QWEN)
        assert master.membership_refusals() == {"runner status": 2, "instance deletion": 1}
        # The node that holds them may.
        await sent_and_taken(
            master, a, RequestInstanceDeletion(instance_id=placed.instance_id, reason="gave up")
        )
        assert placed.instance_id not in master.state.instances
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_hello_that_does_not_prove_a_connected_id_changes_nothing() -> None:
    master = Master(None)
    a = FakeNode("a")
    async with anyio.create_task_group() as group:
        await serve_qwen(master, group, a)
        before = master.state
        session = master._membership.sessions[a.node_id]
        master_side, impostor = memory_channel_pair()
        group.start_soon(master.serve_node, master_side)
        challenge = await impostor.receive()
        assert isinstance(challenge, Challenge)
        # Without a.'s key: a signature by another key, then one over another challenge.
        for signature in (
            NodeKey.for_name("impostor").sign_hello(challenge.nonce),
            a.key.sign_hello("0" * 64),
        ):
            await impostor.send(Hello(node_id=a.node_id, name="a", signature=signature))
            with suppress(ChannelClosedError):  # what it says next is not taken either
                await impostor.send(
                    RunnerStatusReport(runner_id="r", runner_status=RunnerShutdown())
                )
            with pytest.raises(ChannelClosedError):
                while True:
                    await impostor.receive()
            assert master_side.refused_because is not None  # type: ignore[attr-defined]
            assert "not proven" in master_side.refused_because  # type: ignore[attr-defined]
            master_side, impostor = memory_channel_pair()
            group.start_soon(master.serve_node, master_side)
            challenge = await impostor.receive()
            assert isinstance(challenge, Challenge)
        assert master._membership.sessions[a.node_id] is session
        assert master.state == before
        assert master.membership_refusals() == {"hello not proven": 2}
        # With the key, it is the node itself reconnecting: the new session replaces the old.
        signature = a.key.sign_hello(challenge.nonce)
        await impostor.send(Hello(node_id=a.node_id, name="a", signature=signature))
        await wait_until(lambda: master._membership.sessions[a.node_id] is not session, 1, "new")
        assert session.closed_because == "the node connected again"
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_cannot_answer_a_chat_sent_to_another() -> None:
    master = Master(None)
    a, b = FakeNode("a", chat="hang"), FakeNode("b")
    async with anyio.create_task_group() as group:
        await serve_qwen(master, group, a)
        await connect(master, group, b)
        stream = await say_hi(master)
        await wait_until(lambda: bool(a.chat_requests), 1, "the request reached a")
        request_id = a.chat_requests[0].request_id
        await sent_and_taken(
            master,
            b,
            ChatChunk(request_id=request_id, text="forged"),
            ChatChunk(request_id=request_id, finish_reason="stop"),
        )
        assert master.membership_refusals() == {"chat reply": 2}
        assert a._channel is not None
        await a._channel.send(ChatChunk(request_id=request_id, text="real"))
        await a._channel.send(ChatChunk(request_id=request_id, finish_reason="stop"))
        assert [piece async for piece in stream] == ["real"]
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_flooding_reports_is_logged_at_a_bounded_rate() -> None:
    master = Master(None)
    a = FakeNode("a")
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, a)
        subscription = master.subscribe()
        logged: list[NodeGatheredInfo] = []

        async def watch() -> None:
            async for indexed in subscription:
                if isinstance(indexed.event, NodeGatheredInfo):
                    logged.append(indexed.event)

        group.start_soon(watch)
        started = anyio.current_time()
        assert a._channel is not None
        for _ in range(880):  # a second's worth from a node reporting as fast as it can
            await a._channel.send(a.info())
        await sent_and_taken(master, a)
        # Each write carries the latest info; at most one write per REPORT_INTERVAL_S.
        elapsed = anyio.current_time() - started
        assert len(logged) <= 2 + elapsed / REPORT_INTERVAL_S
        assert len(logged) <= 5
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_nodes_strings_are_capped_before_the_state_and_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A friendly name of 100,000 characters (the frame holds it) is 64 in the State and the
    log; the node's other strings are at most 512 (keeper.model.node_strings)."""
    caplog.set_level(logging.INFO)
    master = Master(None)
    node = FakeNode("n" * 100_000)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, node)
        await wait_until(lambda: node.node_id in master.state.node_identities, 1, "its info")
        group.cancel_scope.cancel()
    name = master.state.node_identities[node.node_id].friendly_name
    assert name == "n" * 63 + "…"
    assert "n" * 513 not in caplog.text
