"""Prompt stepping (docs/design.md §6.6): the master steps at once on an applied event that
calls for it (the rule, ``keeper.core.keeper.calls_for_step``, is tested in
``test_step_triggers.py``), never before its previous step's events are applied.

The master runs in virtual time (trio's MockClock), where "at once" is measurable: the old
once-a-second tick let a second of virtual time pass, prompt stepping none.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup
from model_ids import LLAMA as LLAMA_1B
from model_ids import QWEN
from test_event_store import FaultyDisk
from test_master import FakeNode, connect, instances_of, wait_until

from keeper.core.keeper import Keeper, PlaceFn
from keeper.model.events import (
    AnyEvent,
    DeploymentPlacementFailed,
    IndexedEvent,
    InstanceDeleted,
)
from keeper.model.state import (
    State,
)
from keeper.runtime.hosted_keeper import KeeperLike
from keeper.sim.master.service import Master, MasterConfig


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


async def start_with_nodes(master: Master, group: TaskGroup, names: str) -> None:
    """Run ``master`` in ``group`` and connect a fake node for each letter of ``names``."""
    await group.start(master.run)
    for name in names:
        await connect(master, group, FakeNode(name))


@pytest.mark.anyio
async def test_a_deleted_instance_is_replaced_at_once_not_at_the_next_tick() -> None:
    master, _ = recording_master()
    async with anyio.create_task_group() as group:
        await start_with_nodes(master, group, "ab")
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
        await start_with_nodes(master, group, "abcd")
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


class FailingOnceKeeper:
    """Steps without events, except once: that step's events meet a log that refuses them."""

    def __init__(self, disk: FaultyDisk) -> None:
        self.disk = disk
        self.steps = 0
        self.fail_next = False

    def step(self, state: State, now: float) -> list[AnyEvent]:
        self.steps += 1
        if not self.fail_next:
            return []
        self.fail_next = False
        self.disk.error = errno.ENOSPC  # the disk fills between the probe and the write
        return [DeploymentPlacementFailed(deployment_id="d", error="a step's event")]

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        return []

    def timers(self, state: State, now: float) -> dict[str, Any]:
        return {}


@pytest.mark.anyio
async def test_a_steps_events_held_by_a_full_log_are_logged_once_it_recovers(
    tmp_path: Path,
) -> None:
    disk = FaultyDisk()
    keeper = FailingOnceKeeper(disk)

    def factory(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
        return keeper  # type: ignore[return-value]

    config = MasterConfig(startup_grace_s=0.0)
    master = Master(tmp_path, config=config, keeper_factory=factory, file_ops=disk)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await wait_until(lambda: keeper.steps > 0, 2, "a first step")
        keeper.fail_next = True
        await wait_until(lambda: master.events_held_unwritable == 1, 2, "the step's event held")
        steps = keeper.steps
        await anyio.sleep(5)
        assert keeper.steps == steps  # no step while its predecessor's events are not applied
        disk.error = None
        # No node, no command: nothing but the keeper loop can carry the held event to the log.
        await wait_until(lambda: master.events_held_unwritable == 0, 3, "the held event logged")
        assert master.state.last_event_applied_idx >= 0
        await wait_until(lambda: keeper.steps > steps, 3, "stepping again")
        group.cancel_scope.cancel()
