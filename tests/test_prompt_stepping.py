"""Prompt stepping (docs/design.md §6.6): which applied events call for a step, and the master
stepping at once on them, never before its previous step's events are applied.

The rule is a pure function of one event (``keeper.core.calls_for_step``), tested event type by
event type; the master is then run in virtual time (trio's MockClock), where "at once" is
measurable: the old once-a-second tick let a second of virtual time pass, prompt stepping none.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from test_master import QWEN, FakeNode, connect, instances_of, wait_until
from trio.testing import MockClock

from keeper.core import Keeper, PlaceFn, calls_for_step
from keeper.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentScaled,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.master.service import Master, MasterConfig
from keeper.runtime.hosted_keeper import KeeperLike
from keeper.state import (
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    State,
)

LLAMA_1B = "mlx-community/Llama-3.2-1B-Instruct-4bit"


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


# Fields do not matter to the rule, only the event's type (and a runner's status).
CALLS_FOR_STEP: list[AnyEvent] = [
    DeploymentCreated.model_construct(),
    DeploymentScaled.model_construct(),
    InstanceCreated.model_construct(),
    InstanceDeleted.model_construct(),
    NodeGatheredInfo.model_construct(),
    NodeTimedOut.model_construct(),
    TopologyEdgeCreated.model_construct(),
    TopologyEdgeDeleted.model_construct(),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerFailed(error_message="boom")),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerReady()),
]
CALLS_FOR_NO_STEP: list[AnyEvent] = [
    DeploymentDeleted.model_construct(),
    DeploymentPlaced.model_construct(),
    DeploymentPlacementFailed.model_construct(),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerRunning()),
    RunnerStatusUpdated(
        runner_id="r", runner_status=RunnerLoading(layers_loaded=1, total_layers=2)
    ),
]


@pytest.mark.parametrize(
    "event",
    CALLS_FOR_STEP,
    ids=lambda e: f"{type(e).__name__}-{type(getattr(e, 'runner_status', None)).__name__}",
)
def test_events_that_may_allow_a_placement_call_for_a_step(event: AnyEvent) -> None:
    assert calls_for_step(event)


@pytest.mark.parametrize(
    "event",
    CALLS_FOR_NO_STEP,
    ids=lambda e: f"{type(e).__name__}-{type(getattr(e, 'runner_status', None)).__name__}",
)
def test_bookkeeping_and_progress_call_for_no_step(event: AnyEvent) -> None:
    assert not calls_for_step(event)


class RecordingKeeper:
    """The real keeper, recording for each step the State's last applied index and its events."""

    def __init__(self, started_at: float, place: PlaceFn, *, startup_grace: float) -> None:
        self.inner = Keeper(started_at, place, startup_grace=startup_grace)
        self.steps: list[tuple[int, float, list[AnyEvent]]] = []

    def step(self, state: State, now: float) -> list[AnyEvent]:
        events = self.inner.step(state, now)
        self.steps.append((state.last_event_applied_idx, now, events))
        return events

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        return self.inner.delete(deployment_id, state)

    def timers(self, state: State, now: float) -> Any:
        return self.inner.timers(state, now)


def recording_master() -> tuple[Master, list[RecordingKeeper]]:
    made: list[RecordingKeeper] = []

    def factory(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
        keeper = RecordingKeeper(started_at, place, startup_grace=startup_grace)
        made.append(keeper)
        return keeper  # type: ignore[return-value]

    return Master(None, config=MasterConfig(startup_grace_s=0.0), keeper_factory=factory), made


@pytest.mark.anyio
async def test_a_deleted_instance_is_replaced_at_once_not_at_the_next_tick() -> None:
    master, _ = recording_master()
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        for name in "ab":
            await connect(master, group, FakeNode(name))
        await master.create_deployment(QWEN)
        await wait_until(lambda: bool(master.ready_instances(QWEN)), 5, "serving")
        (lost,) = instances_of(master, QWEN)
        await anyio.sleep(0.3)  # mid-way between two ticks
        deleted_at = anyio.current_time()
        await master.delete_instance(lost)
        await wait_until(lambda: bool(instances_of(master, QWEN)), 2, "replacement")
        # Virtual time stands still while anything can run: no tick was waited for.
        assert anyio.current_time() - deleted_at < 0.1
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_two_models_lost_at_once_are_both_replaced_at_once() -> None:
    master, _ = recording_master()
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        for name in "abcd":
            await connect(master, group, FakeNode(name))
        await master.create_deployment(QWEN)
        await master.create_deployment(LLAMA_1B)
        await wait_until(
            lambda: bool(master.ready_instances(QWEN) and master.ready_instances(LLAMA_1B)),
            5,
            "both serving",
        )
        lost = [*instances_of(master, QWEN), *instances_of(master, LLAMA_1B)]
        await anyio.sleep(0.3)
        deleted_at = anyio.current_time()
        await master.emit([InstanceDeleted(instance_id=i) for i in lost])
        await wait_until(
            lambda: (
                bool(instances_of(master, QWEN) and instances_of(master, LLAMA_1B))
                and not set(lost) & set(master.state.instances)
            ),
            2,
            "both replaced",
        )
        # One placement per step, each step after the previous one's events are applied: the
        # second replacement follows the first's InstanceCreated, not the next tick.
        assert anyio.current_time() - deleted_at < 0.1
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_no_step_reads_a_state_without_the_previous_steps_events() -> None:
    master, made = recording_master()
    log: list[IndexedEvent] = []
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        subscription = master.subscribe()

        async def follow() -> None:
            async for indexed in subscription:
                log.append(indexed)

        group.start_soon(follow)
        nodes = [FakeNode(name) for name in "abcdef"]
        for node in nodes:
            await connect(master, group, node)
        await master.create_deployment(QWEN, replicas=3)
        await master.create_deployment(LLAMA_1B, replicas=3)
        # Links going up and down while the keeper places: a trigger in every other batch.
        for peer in nodes[1:]:
            await nodes[0].link(peer)
        await wait_until(
            lambda: (
                len(instances_of(master, QWEN)) == 3 and len(instances_of(master, LLAMA_1B)) == 3
            ),
            5,
            "six replicas placed",
        )
        await anyio.sleep(0.1)
        group.cancel_scope.cancel()
    (keeper,) = made
    placing = [s for s in keeper.steps if s[2]]
    assert len(placing) >= 6  # one placement per step

    def logged_at(event: AnyEvent, after: int) -> int:
        return next(entry.idx for entry in log if entry.idx > after and entry.event == event)

    for (stepped_at, _, events), (seen, _, _) in zip(keeper.steps, keeper.steps[1:], strict=False):
        if events:
            assert seen >= max(logged_at(e, stepped_at) for e in events)
