"""Broken instances through the bridge (docs/design.md §5.19), against the stock-exo stand-in in
virtual time: from exo's runner statuses alone, the bridge's keeper recognises a stalled start
and a hollow instance with the same pure rules as the master's, replaces it through exo's API on
the other node, and the deployment serves again on its own."""

from __future__ import annotations

import pytest
from bridge_harness import exo_with_bridge
from waiting import wait_until

from keeper.model.instance_health import WARM_UP_BOUND_S
from keeper.model.state import SERVING_RUNNER_TYPES, State
from keeper.sim.node.sim_node import SimFault

# "a" is the freest node: exo's placement puts the first instance there.
NODES = (("a", 64.0), ("b", 32.0))


def on_node(state: State, node_name: str) -> list[str]:
    return [
        instance_id
        for instance_id, instance in state.instances.items()
        if any(
            state.node_identities[n].friendly_name == node_name
            for n in instance.shard_assignments.node_to_runner
        )
    ]


def serving_on(state: State, node_name: str) -> bool:
    for instance_id in on_node(state, node_name):
        runners = state.instances[instance_id].shard_assignments.node_to_runner.values()
        if all(isinstance(state.runners.get(r), SERVING_RUNNER_TYPES) for r in runners):
            return True
    return False


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("fault", "problem", "within"),
    # A load shorter than the bridge's poll is never seen, so no rate is known: a warm-up's
    # bound is its own all the same.
    [("stall-warmup", "stalled", WARM_UP_BOUND_S + 60), ("lose-runner", "hollow", 60)],
)
async def test_the_bridge_replaces_a_broken_instance_from_exos_state(
    fault: SimFault, problem: str, within: float
) -> None:
    async with exo_with_bridge(nodes=NODES, faults={"a": fault}) as exo:
        created = await exo.bridge.create_deployment("mlx-community/Qwen3-0.6B-4bit", standby=0)
        deployment_id = created.deployment_id
        assert deployment_id is not None
        await wait_until(lambda: bool(on_node(exo.master.state, "a")), 60, "placed on a")
        (broken,) = on_node(exo.master.state, "a")
        said: list[str] = []

        def recognised() -> bool:
            views = exo.bridge.deployments_view().deployments
            health = views[0].health
            if health is not None:
                said.append(f"{health.problem}: {health.why}")
            return bool(said) or broken not in exo.master.state.instances

        # Looked at once a virtual second, as the bridge's keeper steps: each look builds the
        # deployments' view, and the stalled start takes two virtual minutes to be recognised.
        await wait_until(recognised, within, "recognised", poll_s=1.0)
        await wait_until(lambda: serving_on(exo.master.state, "b"), 60, "serving on b")
        await wait_until(lambda: broken not in exo.master.state.instances, 60, "broken deleted")
        assert on_node(exo.master.state, "a") == []
        if said:
            assert said[0].startswith(f"{problem}: runner on a ")
