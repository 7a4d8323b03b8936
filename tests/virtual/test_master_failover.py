"""Fast failover on the master, in virtual time (docs/design.md §5.18): a silent node is
suspected after ``--suspect-after-s``, confirmed dead after ``--dead-after-s`` while the others
are heard (or at once once suspect with its session closed), its instances are deleted then,
not 40 s later; a stale view (every node silent together) suspects nobody; a node heard again
is cleared; off (``suspect_after_s=0``) leaves exo's rule alone. ``GET /nodes``' liveness and
silence come from the same verdicts.
"""

from __future__ import annotations

import anyio
import pytest
from model_ids import QWEN
from test_master import FakeNode, connect, instances_of, serving, wait_until

from keeper.core.alerts import incidents_of
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
)
from keeper.model.liveness import OFF, LivenessConfig
from keeper.sim.master.service import Master, MasterConfig

FAST = MasterConfig(liveness=LivenessConfig(3.0, 8.0))


class Seen:
    """Every applied event with the virtual time it was seen."""

    def __init__(self) -> None:
        self.events: list[tuple[float, AnyEvent]] = []

    async def follow(self, master: Master) -> None:
        async for indexed in master.subscribe():
            self.events.append((anyio.current_time(), indexed.event))

    def first(self, kind: type[AnyEvent]) -> float | None:
        return next((t for t, e in self.events if isinstance(e, kind)), None)

    def of(self, kind: type[AnyEvent]) -> list[AnyEvent]:
        return [e for _, e in self.events if isinstance(e, kind)]


async def three_nodes_serving(
    master: Master, group: anyio.abc.TaskGroup, seen: Seen
) -> tuple[list[FakeNode], FakeNode, str]:
    nodes = [FakeNode("a"), FakeNode("b"), FakeNode("c")]
    await group.start(master.run)
    for node in nodes:
        await connect(master, group, node)
    group.start_soon(seen.follow, master)
    await master.create_deployment(QWEN)
    await wait_until(lambda: serving(master, QWEN), STARTUP_GRACE + 5, "first placement")
    (first,) = instances_of(master, QWEN)
    holder = next(iter(master.state.instances[first].shard_assignments.node_to_runner))
    victim = next(n for n in nodes if n.node_id == holder)
    return nodes, victim, first


@pytest.mark.anyio
async def test_a_frozen_node_is_suspect_then_dead_and_its_instance_deleted_in_seconds() -> None:
    master = Master(None, config=FAST)
    seen = Seen()
    async with anyio.create_task_group() as group:
        _, victim, first = await three_nodes_serving(master, group, seen)
        victim.frozen = True
        frozen_at = anyio.current_time()
        await wait_until(lambda: victim.node_id in master.state.node_watch, 5, "suspected")
        suspected_at = seen.first(NodeSuspected)
        assert suspected_at is not None and 2.9 <= suspected_at - frozen_at <= 4.5
        (view,) = [v for v in master.nodes_view().nodes if victim.node_id in v.node_ids]
        assert view.liveness == "suspect" and view.silent_s is not None and view.silent_s >= 3
        await wait_until(lambda: first not in master.state.instances, 8, "deleted once dead")
        dead_at = seen.first(NodeConfirmedDead)
        assert dead_at is not None and 7.9 <= dead_at - frozen_at <= 9.5
        (verdict,) = seen.of(NodeConfirmedDead)
        assert isinstance(verdict, NodeConfirmedDead)
        assert "while the other nodes were heard" in verdict.why
        deleted = [e for e in seen.of(InstanceDeleted) if e.instance_id == first]  # type: ignore[attr-defined]
        assert deleted and seen.first(InstanceDeleted) is not None
        assert master.state.node_watch[victim.node_id].phase == "dead"
        (view,) = [v for v in master.nodes_view().nodes if victim.node_id in v.node_ids]
        assert view.liveness == "dead"
        await wait_until(lambda: serving(master, QWEN), 3, "placed again")
        assert seen.of(NodeTimedOut) == []  # all of it long before exo's 30 s
        # It wakes: heard again, the verdict cleared.
        victim.frozen = False
        await wait_until(lambda: victim.node_id not in master.state.node_watch, 3, "cleared")
        assert len(seen.of(NodeHeardAgain)) == 1
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_closed_session_makes_a_suspect_node_dead_after_the_suspicion() -> None:
    master = Master(None, config=FAST)
    seen = Seen()
    async with anyio.create_task_group() as group:
        _, victim, first = await three_nodes_serving(master, group, seen)
        victim.frozen = True
        assert victim._channel is not None  # pyright: ignore[reportPrivateUsage]
        await victim._channel.aclose()  # pyright: ignore[reportPrivateUsage]
        closed_at = anyio.current_time()
        await wait_until(lambda: first not in master.state.instances, 5, "deleted once dead")
        dead_at = seen.first(NodeConfirmedDead)
        assert dead_at is not None and dead_at - closed_at <= 4.5
        (verdict,) = seen.of(NodeConfirmedDead)
        assert isinstance(verdict, NodeConfirmedDead) and "connection closed" in verdict.why
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_every_node_silent_together_is_a_stale_view_and_nobody_is_suspected() -> None:
    master = Master(None, config=FAST)
    seen = Seen()
    async with anyio.create_task_group() as group:
        nodes, _, first = await three_nodes_serving(master, group, seen)
        for node in nodes:
            node.frozen = True
        await anyio.sleep(12)
        assert seen.of(NodeSuspected) == [] and seen.of(NodeConfirmedDead) == []
        assert first in master.state.instances
        assert master._membership.watcher.stale is not None  # pyright: ignore[reportPrivateUsage]
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_off_is_exos_rule_alone() -> None:
    master = Master(None, config=MasterConfig(liveness=OFF))
    seen = Seen()
    async with anyio.create_task_group() as group:
        _, victim, first = await three_nodes_serving(master, group, seen)
        victim.frozen = True
        await anyio.sleep(20)
        assert seen.of(NodeSuspected) == [] and master.state.node_watch == {}
        assert first in master.state.instances
        (view,) = [v for v in master.nodes_view().nodes if victim.node_id in v.node_ids]
        assert view.liveness == "alive"
        group.cancel_scope.cancel()


def model_count(master: Master) -> int:
    return len(instances_of(master, QWEN))


@pytest.mark.anyio
async def test_a_replacement_before_break_then_the_old_goes_once_dead() -> None:
    master = Master(None, config=FAST)
    seen = Seen()
    most = 0
    async with anyio.create_task_group() as group:
        _, victim, first = await three_nodes_serving(master, group, seen)

        async def count() -> None:
            nonlocal most
            while True:
                most = max(most, model_count(master))
                await anyio.sleep(0.05)

        group.start_soon(count)
        victim.frozen = True
        frozen_at = anyio.current_time()
        await wait_until(lambda: model_count(master) == 2, 6, "a replacement placed")
        placed_at = anyio.current_time()
        assert placed_at - frozen_at <= 4.5
        (view,) = master.deployments_view().deployments
        assert view.failover is not None and view.failover.phase == "replacing"
        assert view.failover.nodes == [victim.name]
        assert first in master.state.instances  # nothing deleted for a suspicion
        await wait_until(lambda: first not in master.state.instances, 7, "the old one deleted")
        assert model_count(master) == 1 and serving(master, QWEN)
        (view,) = master.deployments_view().deployments
        assert view.failover is None
        assert most == 2  # replicas + 1 at most
        # One incident, from the frozen node's last heartbeat to its replacement's readiness,
        # though the replacement was ready before the node was confirmed dead (design §3.5).
        (incident,) = incidents_of(master.state.serving_history[view.deployment.deployment_id])
        offset = master.clock.wall().timestamp() - anyio.current_time()  # the records' clock
        assert frozen_at - 1.5 <= incident.start - offset <= frozen_at + 0.01  # to the ms
        assert incident.end is not None and incident.phases is not None
        assert incident.cause.startswith(f"node {victim.name} confirmed dead")
        # Its replacement was ready first: the stop was written on confirmation, dated back.
        assert master.state.serving_history[view.deployment.deployment_id][-1].step == "covered"
        phases = incident.phases
        total = phases.detected + phases.placed + phases.downloaded + phases.loaded
        assert total == pytest.approx(incident.downtime_s, abs=0.005)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_heard_again_before_dead_has_the_surplus_go() -> None:
    master = Master(None, config=FAST)
    seen = Seen()
    async with anyio.create_task_group() as group:
        _, victim, first = await three_nodes_serving(master, group, seen)
        victim.frozen = True
        await wait_until(lambda: model_count(master) == 2, 6, "a replacement placed")
        (replacement,) = [i for i in instances_of(master, QWEN) if i != first]
        victim.frozen = False
        await wait_until(lambda: model_count(master) == 1, 4, "the surplus gone")
        assert instances_of(master, QWEN) == [first]  # the replacement went
        assert replacement not in master.state.instances
        assert seen.of(NodeConfirmedDead) == []
        (view,) = master.deployments_view().deployments
        records = master.state.serving_history[view.deployment.deployment_id]
        assert incidents_of(records) == []  # heard again: no incident, only the covering
        group.cancel_scope.cancel()
