"""Priorities and preemption on a whole cluster (docs/design.md §5.13): the real master with
in-process simulated nodes under trio's MockClock, whose free memory is what their runners leave.

Two nodes of 20 GB each hold one of the two models (16.4 GB and 4.3 GB) but never both. When the
node serving the model that matters more is lost, that model preempts the other, serves on the
node that is left, and the other says why it is down; nothing moves again until the lost node
comes back, and then both serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import anyio
import pytest
from waiting import wait_until

from keeper.model.apply import apply_indexed
from keeper.model.events import InstanceCreated, InstanceDeleted
from keeper.model.readiness import deployment_status
from keeper.model.state import AnyInstance, State
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.service import Master
from keeper.sim.node.sim_node import NodeConfig

HIGH = "mlx-community/Qwen3-30B-A3B-4bit"  # 16.4 GB: fits a 20 GB node, not beside LOW
LOW = "mlx-community/Qwen3-8B-4bit"  # 4.3 GB
NODES = [NodeConfig(name="one", memory_gb=20), NodeConfig(name="two", memory_gb=20)]
DOWN_S = 900.0  # the lost node stays away this long


def instances_of(state: State, model_id: str) -> list[AnyInstance]:
    return [i for i in state.instances.values() if i.shard_assignments.model_id == model_id]


def nodes_of(state: State, model_id: str) -> set[str]:
    return {
        node for i in instances_of(state, model_id) for node in i.shard_assignments.node_to_runner
    }


@dataclass
class Watch:
    """Every State the master goes through: never two instances of a model, and every instance
    created and deleted, with the virtual time it was."""

    violations: list[str] = field(default_factory=list[str])
    created: list[tuple[float, str]] = field(default_factory=list[tuple[float, str]])
    deleted: list[tuple[float, str]] = field(default_factory=list[tuple[float, str]])

    async def follow(self, master: Master) -> None:
        async with master.subscribe() as subscription:
            state = subscription.state
            async for indexed in subscription:
                state = apply_indexed(state, indexed)
                models = [i.shard_assignments.model_id for i in state.instances.values()]
                if len(models) != len(set(models)):
                    self.violations.append(f"event {indexed.idx}: two of one model")
                now = anyio.current_time()
                match indexed.event:
                    case InstanceCreated(instance=instance):
                        self.created.append((now, instance.shard_assignments.model_id))
                    case InstanceDeleted(instance_id=instance_id):
                        self.deleted.append((now, instance_id))
                    case _:
                        pass


@pytest.mark.anyio
async def test_after_a_node_loss_the_higher_priority_model_serves_and_the_victim_says_why() -> None:
    master = Master(None)
    watch = Watch()
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        group.start_soon(watch.follow, master)
        cluster = InProcessCluster(master, NODES)
        await group.start(cluster.run)

        def serving(model_id: str) -> bool:
            deployment = next(
                d for d in master.state.deployments.values() if d.model_card.model_id == model_id
            )
            return deployment_status(deployment, master.state) == "serving"

        low = await master.create_deployment(LOW, priority=100, standby=0)
        await wait_until(lambda: serving(LOW), 60, "the low model serving")
        high = await master.create_deployment(HIGH, priority=900, preempt=True, standby=0)
        await wait_until(lambda: serving(HIGH), 60, "the high model serving")
        assert low.deployment_id is not None and high.deployment_id is not None
        (low_node,) = nodes_of(master.state, LOW)
        (high_node,) = nodes_of(master.state, HIGH)
        assert low_node != high_node  # one node cannot hold both

        # The node serving the high model is lost: the one left holds the low model, and has
        # too little room beside it for the high one, which preempts it.
        lost = next(name for name in ("one", "two") if cluster.node(name).node_id == high_node)
        lost_at = anyio.current_time()
        cluster.crash(lost, DOWN_S)
        await wait_until(lambda: high_node not in master.state.topology.nodes, 60, "timed out")
        await wait_until(
            lambda: serving(HIGH) and nodes_of(master.state, HIGH) == {low_node},
            60,
            "the high model serving on the node that is left",
        )
        assert instances_of(master.state, LOW) == []
        victim = master.state.deployments[low.deployment_id]
        assert victim.placement_error is not None
        assert victim.placement_error.startswith(f"preempted by {HIGH}")
        assert deployment_status(victim, master.state) == "cant_place"
        history = master.history(low.deployment_id, 1)
        assert history.incidents[-1].cause == f"preempted by {HIGH}"
        assert history.incidents[-1].end is None

        # No flapping: for as long as the node is away, nothing is placed or deleted again, and
        # the victim, retried every 30 s, still says why it is down.
        settled_at = anyio.current_time()
        kept = {i.instance_id for i in instances_of(master.state, HIGH)}
        await anyio.sleep(DOWN_S - (settled_at - lost_at) - 60)
        assert [at for at, _ in watch.created if at > settled_at] == []
        assert [at for at, _ in watch.deleted if at > settled_at] == []
        assert {i.instance_id for i in instances_of(master.state, HIGH)} == kept
        victim = master.state.deployments[low.deployment_id]
        assert victim.placement_error == (
            f"preempted by {HIGH}: No cycles found with sufficient memory"
        )

        # The node comes back: the low model is placed on it, and both serve.
        await wait_until(lambda: high_node in master.state.topology.nodes, 120, "rejoined")
        await wait_until(lambda: serving(LOW), 60, "the low model serving again")
        assert nodes_of(master.state, LOW) == {high_node}
        assert {i.instance_id for i in instances_of(master.state, HIGH)} == kept
        assert master.state.deployments[low.deployment_id].placement_error is None
        group.cancel_scope.cancel()
    assert watch.violations == []
