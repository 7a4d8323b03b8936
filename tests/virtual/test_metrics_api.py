"""``GET /metrics`` on a master with simulated nodes, in virtual time: every family present,
and the numbers the same as ``GET /deployments`` and the history API say, before and after the
node holding the model is frozen past exo's timeout (an incident counted, ready replicas down
to 0 and back, the recovery observed in the histogram, the node silent then gone); chats
counted by outcome; a scrape answered while the keeper's step lock is held."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

import anyio
import httpx
import pytest
from metrics_scrape import Samples, scrape, value
from model_ids import LLAMA, QWEN
from waiting import wait_until

from keeper.model.api_models import DeploymentHistoryResponse, DeploymentsResponse, DeploymentView
from keeper.model.liveness import NODE_COUNT_STATES, OFF
from keeper.runtime.metrics import STATUSES
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.link.protocol import INFO_REFRESH_S
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

NODES = [
    NodeConfig(name="big", memory_gb=64, load_gb_per_s=2.0),
    NodeConfig(name="mid", memory_gb=32, load_gb_per_s=2.0),
]


@asynccontextmanager
async def cluster_api() -> AsyncIterator[tuple[Master, InProcessCluster, httpx.AsyncClient]]:
    # exo's own rule (fast failover off): the lost node's instance is deleted at its 30 s timeout,
    # so the outage these counts follow always happens. With fast failover on, a replacement
    # may be ready before the node is confirmed dead, and then serving never stops (§5.18).
    master = Master(None, config=MasterConfig(liveness=OFF))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        cluster = InProcessCluster(master, NODES)
        await group.start(cluster.run)
        transport = httpx.ASGITransport(app=create_app(master))
        async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
            yield master, cluster, client
        group.cancel_scope.cancel()


async def views(client: httpx.AsyncClient) -> dict[str, DeploymentView]:
    response = await client.get("/deployments")
    assert response.status_code == 200
    listed = DeploymentsResponse.model_validate(response.json()).deployments
    return {view.deployment.deployment_id: view for view in listed}


async def history(client: httpx.AsyncClient, deployment_id: str) -> DeploymentHistoryResponse:
    response = await client.get(f"/deployments/{deployment_id}/history")
    assert response.status_code == 200
    return DeploymentHistoryResponse.model_validate(response.json())


def agree(samples: Samples, view: DeploymentView) -> None:
    """The scrape says of ``view``'s deployment what ``GET /deployments`` says."""
    labels = {
        "deployment": view.deployment.deployment_id,
        "model": view.deployment.model_card.model_id,
    }
    assert value(samples, "exo_deploy_deployment_replicas_desired", **labels) == view.replicas
    assert value(samples, "exo_deploy_deployment_replicas_ready", **labels) == view.ready_replicas
    for status in STATUSES:
        expected = 1.0 if view.status == status else 0.0
        assert value(samples, "exo_deploy_deployment_status", **labels, status=status) == expected
    assert (
        value(samples, "exo_deploy_deployment_standby_desired", **labels) == view.deployment.standby
    )
    staged = sum(1 for copy in view.staged if copy.state == "completed")
    assert value(samples, "exo_deploy_deployment_standby_staged", **labels) == staged
    has_error = 0.0 if view.deployment.placement_error is None else 1.0
    assert value(samples, "exo_deploy_deployment_placement_error", **labels) == has_error
    assert value(samples, "exo_deploy_deployment_placement_failures", **labels) == view.failures


async def nodes(client: httpx.AsyncClient) -> dict[str, float]:
    samples = await scrape(client)
    return {state: value(samples, "exo_deploy_nodes", state=state) for state in NODE_COUNT_STATES}


@pytest.mark.anyio
async def test_a_lost_node_is_counted_as_the_api_and_history_say() -> None:
    async with cluster_api() as (master, cluster, client):
        created = await master.create_deployment(QWEN)
        deployment_id = created.deployment_id
        assert deployment_id is not None
        labels = {"deployment": deployment_id, "model": QWEN}

        async def ready() -> float:
            return value(await scrape(client), "exo_deploy_deployment_replicas_ready", **labels)

        await wait_until(
            lambda: master.deployments_view().deployments[0].ready_replicas == 1, 60, "serving"
        )
        samples = await scrape(client)
        agree(samples, (await views(client))[deployment_id])
        assert value(samples, "exo_deploy_deployment_incidents_total", **labels) == 0
        assert value(samples, "exo_deploy_deployment_recovery_seconds_count", **labels) == 0
        assert await nodes(client) == {"alive": 2, "silent": 0, "gone": 0, "cordoned": 0}
        assert value(samples, "exo_deploy_keeper_step_duration_seconds_count") > 0
        assert value(samples, "exo_deploy_keeper_placements_total", result="placed") == 1
        assert value(samples, "exo_deploy_deployment_availability_ratio", **labels) == 1.0
        await anyio.sleep(5)
        served_for = value(
            await scrape(client), "exo_deploy_deployment_serving_for_seconds", **labels
        )
        records = master.state.serving_history[deployment_id]
        assert served_for == pytest.approx(
            master.clock.wall().timestamp() - records[-1].at, abs=0.2
        )
        assert served_for >= 5

        # The node holding the model freezes past exo's 30 s: silent first, then gone.
        (instance,) = master.state.instances.values()
        (holder_id,) = instance.shard_assignments.node_to_runner
        holder = master.state.node_identities[holder_id].friendly_name
        frozen_at = master.clock.wall().timestamp()
        cluster.freeze(holder, 120)
        silent: dict[str, float] = {}

        async def silent_seen() -> bool:
            silent.update(await nodes(client))
            return silent["silent"] == 1

        with anyio.fail_after(20):
            while not await silent_seen():
                await anyio.sleep(0.5)
        assert silent == {"alive": 1, "silent": 1, "gone": 0, "cordoned": 0}

        with anyio.fail_after(40):
            while await ready() != 0:
                await anyio.sleep(0.5)
        samples = await scrape(client)
        agree(samples, (await views(client))[deployment_id])
        assert value(samples, "exo_deploy_deployment_incidents_total", **labels) == 1
        assert value(samples, "exo_deploy_deployment_serving_for_seconds", **labels) == 0
        assert value(samples, "exo_deploy_deployment_status", **labels, status="serving") == 0

        with anyio.fail_after(60):
            while await ready() != 1:
                await anyio.sleep(0.5)
        samples = await scrape(client)
        agree(samples, (await views(client))[deployment_id])
        told = await history(client, deployment_id)
        assert len(told.incidents) == 1
        (incident,) = told.incidents
        assert incident.end is not None
        assert value(samples, "exo_deploy_deployment_incidents_total", **labels) == 1
        assert value(samples, "exo_deploy_deployment_recovery_seconds_count", **labels) == 1
        recovered = value(samples, "exo_deploy_deployment_recovery_seconds_sum", **labels)
        assert recovered == pytest.approx(incident.downtime_s, abs=0.001)
        # From the node's last report (docs/design.md 3.5): exo's 30 s timeout, the sweep, a step,
        # a load.
        assert 30 <= recovered <= 30 + 10 + 5
        # The buckets say the same: none of those below its length, all from above it.
        assert (
            value(samples, "exo_deploy_deployment_recovery_seconds_bucket", **labels, le="5.0") == 0
        )
        assert (
            value(samples, "exo_deploy_deployment_recovery_seconds_bucket", **labels, le="+Inf")
            == 1
        )
        assert value(
            samples, "exo_deploy_deployment_availability_ratio", **labels
        ) == pytest.approx(told.availability, abs=0.01)
        assert value(samples, "exo_deploy_keeper_placements_total", result="placed") == 2
        start = datetime.fromisoformat(incident.start).timestamp()
        assert start >= master.state.serving_history[deployment_id][0].at
        # The incident starts at its last report before the freeze (one at least every 5 s).
        assert frozen_at - INFO_REFRESH_S - 0.5 <= start <= frozen_at + 0.5

        # Counted once: later scrapes do not count the same incident again.
        again = await scrape(client)
        assert value(again, "exo_deploy_deployment_incidents_total", **labels) == 1
        assert value(again, "exo_deploy_deployment_recovery_seconds_count", **labels) == 1


@pytest.mark.anyio
async def test_chats_are_counted_by_outcome_and_a_scrape_needs_no_step_lock() -> None:
    async with cluster_api() as (master, _, client):
        await master.create_deployment(QWEN)
        await wait_until(lambda: bool(master.ready_instances(QWEN)), 60, "serving")
        body = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        answered = await client.post("/v1/chat/completions", json=body)
        assert answered.status_code == 200
        missing = await client.post("/v1/chat/completions", json={**body, "model": LLAMA})
        assert missing.status_code == 404
        samples = await scrape(client)
        assert value(samples, "exo_deploy_chats_total", model=QWEN, result="answered") == 1
        assert value(samples, "exo_deploy_chats_total", model=LLAMA, result="no_instance") == 1
        assert value(samples, "exo_deploy_chats_routed_total", model=QWEN) == 1

        # The keeper's step, deletions and scaling take this lock; a scrape never does.
        async with master._lock:  # pyright: ignore[reportPrivateUsage]
            with anyio.fail_after(5):
                held = await scrape(client)
        assert value(held, "exo_deploy_deployments") == 1


@pytest.mark.anyio
async def test_a_master_not_running_answers_503() -> None:
    transport = httpx.ASGITransport(app=create_app(Master(None)))
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
        response = await client.get("/metrics")
    assert response.status_code == 503
    assert "not running" in response.json()["error"]["message"]
