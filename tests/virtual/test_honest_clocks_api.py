"""Honest clocks on the master's API (docs/design.md §5.18): a deployment on a suspect node is
``at_risk`` and still serving; on a node confirmed dead it is not ready (``readyReplicas`` 0,
``starting``, and so in ``/metrics``); its incident starts at the node's last heartbeat, and the
recovery's phases are in ``GET /deployments/{id}/history`` and ``/metrics``, across restarts."""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx
import pytest
from keeper_harness import build_instance, node_info
from metrics_scrape import scrape, value
from model_ids import QWEN
from test_history_api import applied, history, seconds, serving_master

from keeper.model.api_models import DeploymentsResponse, DeploymentView
from keeper.model.catalog import BUILTIN_MODEL_CARDS
from keeper.model.events import (
    InstanceCreated,
    NodeConfirmedDead,
    NodeSuspected,
    RunnerStatusUpdated,
)
from keeper.model.state import NodeIdentity, RunnerReady
from keeper.sim.master.service import Master

CARD = next(card for card in BUILTIN_MODEL_CARDS if card.model_id == QWEN)
# Virtual seconds: the node quiet until suspected, then until confirmed dead; the keeper's
# placement after the verdict; the replacement's load.
QUIET_S = 3.0
CONFIRM_S = 5.0
PLACE_S = 0.5
LOAD_S = 2.0


async def view(client: httpx.AsyncClient, deployment_id: str) -> DeploymentView:
    response = await client.get("/deployments")
    assert response.status_code == 200, response.text
    (found,) = [
        v
        for v in DeploymentsResponse.model_validate(response.json()).deployments
        if v.deployment.deployment_id == deployment_id
    ]
    return found


def now(master: Master) -> float:
    return master.clock.wall().timestamp()


@pytest.mark.anyio
async def test_a_node_suspected_then_confirmed_dead_is_at_risk_then_down_from_its_heartbeat(
    tmp_path: Path,
) -> None:
    studio = node_info("n-studio").model_copy(
        update={"identity": NodeIdentity(friendly_name="studio")}
    )
    async with serving_master(tmp_path) as (master, client):
        await applied(master, studio, node_info("n-mini"))
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        await applied(master, InstanceCreated(instance=build_instance(CARD, ["n-studio"], "i1")))
        ready_i1 = RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerReady())
        await applied(master, ready_i1)
        labels = {"deployment": deployment_id, "model": QWEN}
        served = await view(client, deployment_id)
        assert (served.status, served.ready_replicas, served.at_risk) == ("serving", 1, False)
        assert (await client.get("/deployments")).json()["deployments"][0]["at_risk"] is False

        # studio reports a last time, then is quiet for QUIET_S (virtual time) until suspected.
        heard = now(master)
        await anyio.sleep(QUIET_S)
        await applied(master, NodeSuspected(node_id="n-studio", last_heard=heard, at=now(master)))
        risky = await view(client, deployment_id)
        assert (risky.status, risky.ready_replicas, risky.at_risk) == ("serving", 1, True)
        assert value(await scrape(client), "exo_deploy_deployment_at_risk", **labels) == 1

        await anyio.sleep(CONFIRM_S)
        verdict_at = now(master)
        dead = NodeConfirmedDead(
            node_id="n-studio", last_heard=heard, at=verdict_at, why="session closed"
        )
        await applied(master, dead)
        down = await view(client, deployment_id)
        # Not serving from the verdict on: the keeper is placing its replacement (or the dead
        # node's instance is still listed, starting), either way nothing is ready.
        assert down.status in ("placing", "starting")
        assert (down.ready_replicas, down.at_risk) == (0, False)
        # A body is kept up to a second (keeper.runtime.metrics): wait for one built since.
        with anyio.fail_after(5):
            while value(samples := await scrape(client), "exo_deploy_deployment_at_risk", **labels):
                await anyio.sleep(0.1)
        assert value(samples, "exo_deploy_deployment_replicas_ready", **labels) == 0
        assert value(samples, "exo_deploy_deployment_status", **labels, status="serving") == 0
        assert value(samples, "exo_deploy_deployment_incidents_total", **labels) == 1
        (ongoing,) = (await history(client, deployment_id)).incidents
        assert ongoing.cause == "node studio confirmed dead (session closed)"
        assert seconds(ongoing.start) == pytest.approx(heard, abs=1e-3)  # its last heartbeat
        assert (ongoing.end, ongoing.phases) == (None, None)

        await anyio.sleep(PLACE_S)
        placed_at = now(master)
        await applied(master, InstanceCreated(instance=build_instance(CARD, ["n-mini"], "i2")))
        await anyio.sleep(LOAD_S)
        await applied(
            master, RunnerStatusUpdated(runner_id="i2-runner-0", runner_status=RunnerReady())
        )
        (ended,) = (await history(client, deployment_id)).incidents
        served_at = seconds(ended.end or "")
        with anyio.fail_after(5):
            while not value(
                samples := await scrape(client),
                "exo_deploy_recovery_phase_seconds_count",
                phase="detected",
            ):
                await anyio.sleep(0.1)
    assert seconds(ended.start) == pytest.approx(heard, abs=1e-3)
    assert ended.downtime_s == pytest.approx(served_at - heard, abs=2e-3)
    phases = ended.phases
    assert phases is not None
    # Detection: the heartbeat to the verdict; then the placement, no download, the load.
    assert phases.detected == pytest.approx(verdict_at - heard, abs=2e-3)
    assert phases.detected >= QUIET_S + CONFIRM_S
    assert phases.placed == pytest.approx(placed_at - verdict_at, abs=2e-3)
    assert phases.downloaded == 0.0  # no download reported: nothing to wait for
    assert phases.loaded >= LOAD_S
    total = phases.detected + phases.placed + phases.downloaded + phases.loaded
    assert total == pytest.approx(ended.downtime_s, abs=5e-3)
    # The master's /metrics has the same phases.
    assert value(samples, "exo_deploy_recovery_phase_seconds_count", phase="detected") == 1
    assert value(
        samples, "exo_deploy_recovery_phase_seconds_sum", phase="detected"
    ) == pytest.approx(phases.detected, abs=2e-3)

    # A new master over the same data dir tells the same incident and phases, from its records.
    async with serving_master(tmp_path) as (master, client):
        # Its wall clock starts from the real one, behind the virtual seconds the first master
        # ran: let it catch up with the records (instantly, in virtual time).
        newest = master.state.serving_history[deployment_id][-1]
        assert newest.phases is not None
        await anyio.sleep(max(0.0, newest.at - now(master)) + 1.0)
        (again,) = (await history(client, deployment_id)).incidents
    # The incident's chats are counted in memory only (docs/design.md §3.5): a new master does
    # not know them, and says so rather than zero.
    assert again.chats is None
    assert again == ended.model_copy(update={"chats": None})
    body = again.model_dump(by_alias=True)
    assert set(body["phases"]) == {"detected", "placed", "downloaded", "loaded"}
