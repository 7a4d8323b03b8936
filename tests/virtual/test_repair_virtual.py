"""Broken instances on a whole cluster (docs/design.md §5.19), in virtual time: the real master
with simulated nodes, one told to misbehave (``NodeConfig.fault``), shows the deployment serving
again on its own — recognised from the State, replaced on another node, the broken instance
deleted — with the figures (fault -> recognised -> serving) each test prints for the README."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import anyio
import pytest
from model_ids import QWEN as MODEL
from waiting import wait_until

from keeper.core.keeper import Keeper
from keeper.core.repair import AVOID_FOR_S
from keeper.model.events import DeploymentRepairPlaced, InstanceFoundBroken
from keeper.model.instance_health import WARM_UP_BOUND_S
from keeper.model.refusals import ChatFailedError, NoInstanceError
from keeper.model.state import (
    SERVING_RUNNER_TYPES,
    AnyInstance,
    AnyRunnerStatus,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerWarmingUp,
    State,
)
from keeper.runtime.clock import AnyioClock
from keeper.runtime.hosted_keeper import KeeperWrapper
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.link.protocol import ChatMessage
from keeper.sim.master.service import Master
from keeper.sim.node.sim_node import NodeConfig, SimFault

NODES = [
    NodeConfig(name="big", memory_gb=64, load_gb_per_s=2.0),
    NodeConfig(name="mid", memory_gb=32, load_gb_per_s=2.0),
    NodeConfig(name="small", memory_gb=16, load_gb_per_s=2.0),
]


def instances(state: State) -> list[AnyInstance]:
    return [i for i in state.instances.values() if i.shard_assignments.model_id == MODEL]


def names(state: State, instance: AnyInstance) -> set[str]:
    return {
        state.node_identities[n].friendly_name for n in instance.shard_assignments.node_to_runner
    }


def serving_off(state: State, node: str) -> AnyInstance | None:
    for instance in instances(state):
        runners = instance.shard_assignments.node_to_runner.values()
        ready = all(isinstance(state.runners.get(r), SERVING_RUNNER_TYPES) for r in runners)
        if ready and node not in names(state, instance):
            return instance
    return None


def on_node(state: State, node: str) -> AnyInstance | None:
    return next((i for i in instances(state) if node in names(state, i)), None)


async def until(condition: Callable[[], bool], within: float, what: str) -> float:
    await wait_until(condition, within, what)
    return anyio.current_time()


async def chat_until_done(master: Master) -> None:
    """Chats to the model, one after another, each read to its end or its failure."""
    while True:
        try:
            stream = await master.chat(MODEL, [ChatMessage(role="user", content="hi")], 8)
            async for _ in stream:
                pass
        except (ChatFailedError, NoInstanceError):
            pass
        await anyio.sleep(0.5)


async def recovered(
    fault: SimFault, problem: str, broken: Callable[[AnyRunnerStatus | None], bool]
) -> tuple[float, float, float]:
    """The model placed on ``big`` (the freest) that misbehaves with ``fault``: when the State
    first showed it ``broken``, when the keeper said so (health), when it served elsewhere."""
    nodes = [replace(NODES[0], fault=fault), *NODES[1:]]
    master = Master(None)
    fault_at = said_at = served_at = 0.0  # (set below, before the group is cancelled)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await group.start(InProcessCluster(master, nodes).run)
        repairs: list[tuple[float, DeploymentRepairPlaced]] = []

        async def follow() -> None:
            async with master.subscribe() as subscription:
                async for indexed in subscription:
                    if isinstance(indexed.event, DeploymentRepairPlaced):
                        repairs.append((anyio.current_time(), indexed.event))

        group.start_soon(follow)
        created = await master.create_deployment(MODEL, standby=0)
        deployment_id = created.deployment_id
        assert deployment_id is not None
        await until(lambda: on_node(master.state, "big") is not None, 60, "placed on big")
        first = on_node(master.state, "big")
        assert first is not None

        runners = list(first.shard_assignments.node_to_runner.values())
        # Seen reporting first (a runner with no status yet is not "gone").
        await until(lambda: all(r in master.state.runners for r in runners), 30, "reported")

        def shows_broken() -> bool:
            return any(broken(master.state.runners.get(r)) for r in runners)

        if fault == "fail-chats":
            await until(lambda: serving_off(master.state, "") is not None, 30, "ready")
            group.start_soon(chat_until_done, master)
        fault_at = await until(shows_broken, 60, f"{fault} shown")
        await until(lambda: bool(repairs), WARM_UP_BOUND_S + 60, "recognised")
        said_at, record = repairs[0]
        assert record.move.old_instance_id == first.instance_id
        assert record.problem == problem
        served_at = await until(lambda: serving_off(master.state, "big") is not None, 60, "served")
        await until(lambda: first.instance_id not in master.state.instances, 30, "broken deleted")
        assert len(instances(master.state)) == 1
        assert master.state.deployments[deployment_id].repairing is None
        group.cancel_scope.cancel()
    print(  # the README's figures
        f"{fault}: recognised {said_at - fault_at:.1f} s after the fault showed, "
        f"serving again {served_at - said_at:.1f} s later"
    )
    return fault_at, said_at, served_at


@pytest.mark.anyio
async def test_a_stalled_warm_up_is_replaced_and_the_model_serves_again() -> None:
    fault_at, said_at, served_at = await recovered(
        "stall-warmup", "stalled", lambda s: isinstance(s, RunnerWarmingUp)
    )
    # The bound: a warm-up's fixed one, whatever the load rate measured.
    assert said_at - fault_at == pytest.approx(WARM_UP_BOUND_S, abs=2)
    assert served_at - said_at < 5


@pytest.mark.anyio
async def test_a_runner_lost_on_a_live_node_is_replaced_at_once() -> None:
    fault_at, said_at, served_at = await recovered(
        "lose-runner",
        "hollow",
        lambda s: s is None or isinstance(s, RunnerShutdown | RunnerShuttingDown),
    )
    assert said_at - fault_at == pytest.approx(5, abs=1.5)  # GONE_GRACE_S
    assert served_at - said_at < 5


@pytest.mark.anyio
async def test_an_instance_failing_every_chat_while_ready_is_replaced() -> None:
    # "Broken" is seen only through the chats: the fault shows once the runner reads Ready.
    fault_at, said_at, served_at = await recovered(
        "fail-chats", "failing", lambda s: isinstance(s, SERVING_RUNNER_TYPES)
    )
    assert said_at - fault_at == pytest.approx(5 * 0.5, abs=1.5)  # five chats, one per 0.5 s
    assert served_at - said_at < 5


@pytest.mark.anyio
async def test_a_fault_set_on_a_serving_node_takes_its_runners_and_heals() -> None:
    """The soak's broken-instance faults (``SimNode.set_fault``): told to stall its warm-up, a
    serving node's runner restarts and hangs in RunnerWarmingUp until healed; told to lose its
    runner, the runner reads RunnerShutdown and stays lost after the heal."""
    master = Master(None)
    cluster = InProcessCluster(master, NODES[:1])
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await group.start(cluster.run)
        await master.create_deployment(MODEL, standby=0)
        await until(lambda: serving_off(master.state, "") is not None, 60, "ready")
        instance = on_node(master.state, "big")
        assert instance is not None
        (runner,) = instance.shard_assignments.node_to_runner.values()
        node = cluster.node("big")

        def status() -> AnyRunnerStatus | None:
            return master.state.runners.get(runner)

        node.set_fault("stall-warmup")
        assert node.fault == "stall-warmup"
        await until(lambda: isinstance(status(), RunnerWarmingUp), 10, "hung in warm-up")
        node.set_fault(None)
        await until(lambda: isinstance(status(), SERVING_RUNNER_TYPES), 10, "healed")
        node.set_fault("lose-runner")
        await until(lambda: isinstance(status(), RunnerShutdown) or status() is None, 10, "lost")
        node.set_fault(None)
        # Virtual seconds: a runner brought back by the heal would report within one.
        await anyio.sleep(3)
        assert not isinstance(status(), SERVING_RUNNER_TYPES)
        assert instance.instance_id not in node.running_instances()
        group.cancel_scope.cancel()


def avoided_now(master: Master) -> list[str]:
    """What the master's keeper avoids for the model now, in words."""
    hosted = master.keeper
    assert isinstance(hosted, KeeperWrapper) and isinstance(hosted.inner, Keeper)
    return hosted.inner.avoiding(master.state, MODEL, master.clock.monotonic())


@pytest.mark.anyio
async def test_a_restarted_master_still_avoids_the_node_until_the_same_moment(
    tmp_path: Path,
) -> None:
    # The backoff's facts are events in the log: a master rebuilt from it (another process,
    # another monotonic clock) reads them on its own wall clock and says the same.
    said = "avoiding node-big for " + MODEL + " for 10 min: 3 stalled starts"
    # One wall clock for both, moving with virtual time (as the host's does across processes):
    # the incidents are stamped in it, and each master reads them through its own offset.
    wall_clock = AnyioClock()
    first = Master(tmp_path, clock=wall_clock)
    async with anyio.create_task_group() as group:
        await group.start(first.run)
        await first.create_deployment(MODEL, standby=0)
        wall = first.clock.wall().timestamp()
        await first.emit(
            [
                InstanceFoundBroken(
                    instance_id=f"broken-{n}",
                    model_id=MODEL,
                    node_ids=("node-big",),
                    problem="stalled",
                    at=wall - 60 * (2 - n),
                )
                for n in range(3)
            ]
        )
        await wait_until(lambda: len(first.state.repair_incidents) == 3, 5, "applied")
        assert avoided_now(first) == [said]
        group.cancel_scope.cancel()

    await anyio.sleep(60)  # down for a minute
    second = Master(tmp_path, clock=wall_clock)
    async with anyio.create_task_group() as group:
        await group.start(second.run)
        assert len(second.state.repair_incidents) == 3  # from the log
        assert avoided_now(second) == [said.replace("10 min", "9 min")]
        # Until the same moment: AVOID_FOR_S after the last incident, not after the restart.
        await anyio.sleep(AVOID_FOR_S - 60 - 5)
        assert avoided_now(second) != []
        await anyio.sleep(10)
        assert avoided_now(second) == []
        group.cancel_scope.cancel()
