"""Cordons and drains through a stock exo: the bridge keeps them in its own log (exo knows
none), places around cordoned nodes with exo's previews, and moves an instance off a draining
node make-before-break through exo's POST and DELETE /instance. Against the exo stand-in with
simulated nodes (``tests/bridge_harness.py``), in virtual time.
"""

from __future__ import annotations

import anyio
import pytest
from bridge_harness import ExoWithBridge, bridge_api, exo_with_bridge, wait_until
from model_ids import QWEN

from keeper.model.constants import STARTUP_GRACE
from keeper.model.state import node_name

THREE_NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))


def names_of(h: ExoWithBridge, instance_id: str) -> set[str]:
    state = h.master.state
    return {
        node_name(state, n) for n in state.instances[instance_id].shard_assignments.node_to_runner
    }


def serving_names(h: ExoWithBridge) -> set[str]:
    return {name for instance_id in h.exo_instances() for name in names_of(h, instance_id)}


@pytest.mark.anyio
async def test_the_bridge_drains_a_node_make_before_break_through_exo() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        _, first = await h.serve_qwen()
        (node,) = names_of(h, first)
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, len(h.exo_instances()))
                await anyio.sleep(0.1)

        h.group.start_soon(watch)
        async with bridge_api(h.bridge) as api:
            answer = await api.post(f"/nodes/{node}/drain", json={})
            assert answer.status_code == 200, answer.text
            assert (await api.post("/nodes/nowhere/cordon")).status_code == 404
        await wait_until(
            lambda: first not in h.exo_instances() and len(h.exo_instances()) == 1 and h.serving(),
            30,
            "the instance moved off the node",
        )
        await wait_until(lambda: not h.bridge.state.drains, 5, "the drain ended")
        assert node not in serving_names(h)
        assert most == 2  # replicas + 1, while the move ran
        assert h.bridge.state.cordoned == (node,)
        listed = h.bridge.nodes_view().nodes
        assert [n.name for n in listed if n.cordoned] == [node]


@pytest.mark.anyio
async def test_the_bridge_places_around_a_cordoned_node_and_says_so() -> None:
    async with exo_with_bridge(nodes=(("a", 32.0), ("b", 32.0))) as h:
        await h.bridge.cordon_node("a")
        await h.bridge.cordon_node("b")
        created = await h.bridge.create_deployment(QWEN)
        deployment_id = created.deployment_id
        assert deployment_id is not None
        await wait_until(
            lambda: bool(h.bridge.state.deployments[deployment_id].placement_error),
            STARTUP_GRACE + 10,
            "the placement refused",
        )
        assert h.exo_instances() == []
        error = h.bridge.state.deployments[deployment_id].placement_error
        assert error is not None and "cordoned" in error
        await h.bridge.uncordon_node("b")
        await wait_until(h.serving, 10, "placed once b is uncordoned")
        assert serving_names(h) == {"b"}


@pytest.mark.anyio
async def test_the_bridge_replaces_an_instance_for_a_rolling_change_through_exo() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        deployment_id, first = await h.serve_qwen()
        assert deployment_id is not None
        assert len(names_of(h, first)) == 1
        most = 0

        async def watch() -> None:
            nonlocal most
            while True:
                most = max(most, len(h.exo_instances()))
                await anyio.sleep(0.1)

        h.group.start_soon(watch)
        async with bridge_api(h.bridge) as api:
            answer = await api.patch(f"/deployments/{deployment_id}", json={"min_nodes": 2})
            assert answer.status_code == 200, answer.text
            assert "replacing 1 instance(s), one at a time" in answer.json()["message"]
            listed = (await api.get("/deployments")).json()["deployments"]
            assert listed[0]["updating"] == {"replaced": 0, "replicas": 1, "note": None}
        await wait_until(
            lambda: first not in h.exo_instances() and len(h.exo_instances()) == 1 and h.serving(),
            30,
            "the instance replaced",
        )
        (second,) = h.exo_instances()
        assert len(names_of(h, second)) == 2  # as min_nodes now asks
        assert most == 2  # replicas + 1, while the replacement ran
        # The bridge's log records the old instance's deletion once exo's States stop showing
        # it for a while; the move ends with it.
        await wait_until(
            lambda: h.bridge.state.deployments[deployment_id].moving is None, 10, "the move ended"
        )
        assert h.bridge.state.deployments[deployment_id].replacing == ()
        assert h.bridge.deployments_view().deployments[0].updating is None
