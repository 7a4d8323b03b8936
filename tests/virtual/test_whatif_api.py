"""``GET /whatif`` (docs/design.md §5.14) on the master and on the bridge, in virtual time.

The master with simulated nodes: the answer is the pure what-if's on its State, a replacement
goes where the keeper staged the model, and when that node really crashes the keeper puts the
replacement exactly there; the seconds it would take count from the master's own flags (fast
failover's thresholds, its node timeout and sweep). Bad input is a 404 naming the node or a
422, in exo's error envelope, never a 500. The bridge in front of exo's stand-in answers the
same route the same way, on exo's State (its seconds from its flags and exo's default timeout),
and a 503 while it cannot read that State.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from bridge_harness import bridge_api, exo_with_bridge
from exo_errors import assert_exo_error
from model_ids import QWEN
from waiting import wait_until

from keeper.bridge.service import BridgeConfig
from keeper.core.whatif import what_if_named
from keeper.model.api_models import WhatIfResponse, WhatIfThresholds
from keeper.model.liveness import LivenessConfig
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

NODES = [NodeConfig("a", 32.0), NodeConfig("b", 32.0), NodeConfig("c", 32.0)]
NO_GRACE = MasterConfig(startup_grace_s=0.0)
# Flags of its own, so the answer's thresholds are seen to be the master's.
FAST_FAILOVER = MasterConfig(
    startup_grace_s=0.0,
    liveness=LivenessConfig(3.0, 8.0),
    node_timeout_s=20.0,
    sweep_interval_s=5.0,
)
# A crashed node stays away this long: long past its timeout, the sweep and the re-placement.
DOWN_S = 600.0


@asynccontextmanager
async def master_with_nodes(
    config: MasterConfig = NO_GRACE,
) -> AsyncIterator[tuple[Master, InProcessCluster, httpx.AsyncClient]]:
    master = Master(None, config=config)
    cluster = InProcessCluster(master, NODES)
    transport = httpx.ASGITransport(app=create_app(master))
    async with (
        anyio.create_task_group() as group,
        httpx.AsyncClient(transport=transport, base_url="http://master") as api,
    ):
        await group.start(master.run)
        await group.start(cluster.run)
        await wait_until(lambda: len(master.state.node_memory) == len(NODES), 10, "nodes joined")
        yield master, cluster, api
        group.cancel_scope.cancel()


def name_of(master: Master, node_id: str) -> str:
    identity = master.state.node_identities.get(node_id)  # gone with a node that timed out
    return identity.friendly_name if identity is not None else node_id


def serving_nodes(master: Master) -> set[str]:
    return {
        name_of(master, node_id)
        for instance in master.state.instances.values()
        if instance.shard_assignments.model_id == QWEN
        for node_id in instance.shard_assignments.node_to_runner
    }


@pytest.mark.anyio
async def test_the_master_says_where_a_lost_node_s_instance_goes_and_it_goes_there() -> None:
    async with master_with_nodes(FAST_FAILOVER) as (master, cluster, api):
        created = await master.create_deployment(QWEN, standby=1)

        def staged() -> bool:
            (view,) = master.deployments_view().deployments
            copies = [copy.state for copy in view.staged]
            return view.status == "serving" and copies == ["completed"]

        await wait_until(staged, 120, "a serving instance and its standby copy")
        (serving,) = serving_nodes(master)

        response = await api.get("/whatif", params={"nodes": serving})
        assert response.status_code == 200, response.text
        answer = WhatIfResponse.model_validate_json(response.content)
        # The pure rule, on its State, with the master's own flags.
        assert answer.thresholds == WhatIfThresholds(
            suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=20.0, exo_sweep_s=5.0
        )
        assert answer == what_if_named(master.state, [serving], thresholds=answer.thresholds)
        assert [node.name for node in answer.nodes] == [serving]
        (deployment,) = answer.deployments
        assert deployment.deployment_id == created.deployment_id
        assert (deployment.outcome, deployment.before, deployment.after) == ("moves", 1, 1)
        (placement,) = deployment.placed
        assert placement.model_on_disk  # the staged copy: no download before it loads
        estimate = placement.estimate
        assert estimate is not None  # serving once the node is suspect and the copy loaded
        assert (estimate.detection_s, estimate.download_s) == (3.0, 0.0)
        assert estimate.total_s == round(3.0 + estimate.load_s, 1)
        assert estimate.load_rate_assumed
        (target,) = [node.name for node in placement.nodes]
        assert target != serving

        cluster.crash(serving, DOWN_S)
        await wait_until(lambda: serving_nodes(master) == {target}, 120, f"re-placed on {target}")


@pytest.mark.anyio
async def test_the_master_refuses_bad_node_lists_in_exo_s_envelope() -> None:
    async with master_with_nodes() as (_, _, api):
        assert_exo_error(
            await api.get("/whatif", params={"nodes": "a,zeta"}),
            404,
            "No node 'zeta' in the cluster",
        )
        for empty in ("", " , ,"):
            response = await api.get("/whatif", params={"nodes": empty})
            assert_exo_error(response, 422, "name at least one node")
        assert_exo_error(await api.get("/whatif"), 422, "nodes")
        # Nodes named by id or name alike, each once; nothing deployed: nothing to say of it.
        node_ids = list((await api.get("/state")).json()["topology"]["nodes"])
        response = await api.get("/whatif", params={"nodes": f"b,{node_ids[0]},b"})
        assert response.status_code == 200
        assert response.json()["deployments"] == []
        # Fast failover off (the master's default): exo's timeout and sweep, at its values.
        assert response.json()["thresholds"] == {
            "suspect_after_s": 0.0,
            "dead_after_s": 0.0,
            "exo_timeout_s": 30.0,
            "exo_sweep_s": 10.0,
        }


@pytest.mark.anyio
async def test_the_bridge_answers_on_exo_s_state_and_503_while_it_cannot_read_it() -> None:
    fast = BridgeConfig(liveness=LivenessConfig(3.0, 8.0))
    nodes = (("a", 32.0), ("b", 32.0))
    async with exo_with_bridge(nodes=nodes, bridge_config=fast) as h, bridge_api(h.bridge) as api:
        _, instance_id = await h.serve_qwen()
        (serving,) = h.master.state.instances[instance_id].shard_assignments.node_to_runner
        name = h.master.state.node_identities[serving].friendly_name
        response = await api.get("/whatif", params={"nodes": name})
        assert response.status_code == 200, response.text
        answer = WhatIfResponse.model_validate_json(response.content)
        (deployment,) = answer.deployments
        assert deployment.outcome == "moves"
        assert [i.instance_id for i in deployment.lost] == [instance_id]
        assert [n.name for p in deployment.placed for n in p.nodes] == [{"a": "b", "b": "a"}[name]]
        # The bridge's fast failover flags; exo's timeout and sweep at exo's defaults, which
        # the bridge cannot read. The model downloads first, at a rate no node reports.
        assert answer.thresholds == WhatIfThresholds(
            suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=30.0, exo_sweep_s=10.0
        )
        (placement,) = deployment.placed
        assert placement.estimate is not None and placement.estimate.detection_s == 3.0
        assert not placement.model_on_disk and placement.estimate.total_s is None
        assert_exo_error(
            await api.get("/whatif", params={"nodes": "zeta"}), 404, "No node 'zeta' in the cluster"
        )
        assert_exo_error(await api.get("/whatif", params={"nodes": ","}), 422, "at least one")

        h.link.down = True
        await wait_until(lambda: h.bridge.outage is not None, 10, "the bridge sees exo down")
        assert_exo_error(
            await api.get("/whatif", params={"nodes": name}), 503, "exo's State is not followed"
        )
