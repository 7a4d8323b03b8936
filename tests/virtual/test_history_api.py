"""``GET /deployments/{id}/history`` on the master: the serving records written with the events
that change them, summarised; an incident that spans a master restart comes out whole (the
records are in the snapshot and the log); and every bad ``hours`` is a 4xx naming it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import anyio
import httpx
import pytest
from keeper_harness import build_instance, node_info
from model_ids import QWEN

from keeper.model.api_models import DeploymentHistoryResponse
from keeper.model.catalog import BUILTIN_MODEL_CARDS
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    InstanceCreated,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.state import Deployment, NodeIdentity, RunnerReady
from keeper.runtime.event_store import EventStore
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig

# The keeper stays out of the way: these tests place instances themselves.
QUIET = MasterConfig(startup_grace_s=3600)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real time, not the MockClock of tests/virtual


@asynccontextmanager
async def serving_master(
    data_dir: Path | None, config: MasterConfig = QUIET
) -> AsyncIterator[tuple[Master, httpx.AsyncClient]]:
    master = Master(data_dir, config=config)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        transport = httpx.ASGITransport(app=create_app(master))
        async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
            yield master, client
        group.cancel_scope.cancel()


async def applied(master: Master, *events: AnyEvent) -> None:
    target = master.state.last_event_applied_idx + len(events)
    await master.emit(list(events))
    with anyio.fail_after(5):
        while master.state.last_event_applied_idx < target:
            await anyio.sleep(0.01)


async def history(client: httpx.AsyncClient, deployment_id: str) -> DeploymentHistoryResponse:
    response = await client.get(f"/deployments/{deployment_id}/history")
    assert response.status_code == 200, response.text
    return DeploymentHistoryResponse.model_validate(response.json())


async def serve_on(master: Master, node: str, instance_id: str) -> None:
    card = next(card for card in BUILTIN_MODEL_CARDS if card.model_id == QWEN)
    instance = build_instance(card, [node], instance_id)
    await applied(
        master,
        InstanceCreated(instance=instance),
        RunnerStatusUpdated(runner_id=f"{instance_id}-runner-0", runner_status=RunnerReady()),
    )


def seconds(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@pytest.mark.anyio
async def test_an_incident_across_a_master_restart_is_one_incident_with_its_cause(
    tmp_path: Path,
) -> None:
    named = node_info("n-studio").model_copy(
        update={"identity": NodeIdentity(friendly_name="studio")}
    )
    async with serving_master(tmp_path) as (master, client):
        await applied(master, named, node_info("n-mini"))
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        await serve_on(master, "n-studio", "i1")
        assert (await history(client, deployment_id)).incidents == []
        await applied(master, NodeTimedOut(node_id="n-studio"))
        down = await history(client, deployment_id)
        (incident,) = down.incidents
        assert (incident.cause, incident.end) == ("node studio timed out", None)
    # A new master over the same data dir knows the incident, still ongoing.
    async with serving_master(tmp_path) as (master, client):
        (ongoing,) = (await history(client, deployment_id)).incidents
        assert ongoing.start == incident.start
        await serve_on(master, "n-mini", "i2")
        after = await history(client, deployment_id)
    (ended,) = after.incidents
    assert (ended.start, ended.cause) == (incident.start, "node studio timed out")
    assert ended.end is not None
    # Times are given to the millisecond and the downtime to 3 decimals: up to 1.5 ms apart.
    assert ended.downtime_s == pytest.approx(seconds(ended.end) - seconds(ended.start), abs=2e-3)
    assert after.mttr_s == ended.downtime_s
    assert after.availability is not None and 0 < after.availability < 1
    assert after.window_hours == 24 and after.complete_from is None


@pytest.mark.anyio
async def test_snapshots_and_compaction_in_a_worker_thread_keep_the_history(tmp_path: Path) -> None:
    # As the master runs in production: log I/O in a worker thread, which cannot read the
    # master's clock, so compaction's time must come from the event loop.
    config = MasterConfig(startup_grace_s=3600, log_io_in_thread=True, snapshot_every_events=20)
    async with serving_master(tmp_path, config) as (master, client):
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        await applied(master, node_info("n-a"))
        await serve_on(master, "n-a", "i1")
        for _ in range(3):  # node reports: enough events for a snapshot and a compaction
            await applied(master, *(node_info("n-a") for _ in range(20)))
        with anyio.fail_after(5):
            while not (tmp_path / "snapshot.json").exists():
                await anyio.sleep(0.01)
        assert master.running
        assert (await history(client, deployment_id)).availability == 1.0
    # The records are in the snapshot, not in the compacted log.
    snapshot = json.loads((tmp_path / "snapshot.json").read_bytes())
    assert [r["serving"] for r in snapshot["state"]["servingHistory"][deployment_id]] == [
        False,
        True,
    ]
    assert b"DeploymentServingChanged" not in (tmp_path / "events.jsonl").read_bytes()


@pytest.mark.anyio
async def test_a_log_from_before_serving_records_gets_them_at_the_start(tmp_path: Path) -> None:
    # A data dir whose deployment serves, written with no serving records.
    card = next(card for card in BUILTIN_MODEL_CARDS if card.model_id == QWEN)
    old = EventStore(tmp_path, snapshot_every=1000)
    old.open()
    old.commit_now(
        [
            DeploymentCreated(deployment=Deployment(deployment_id="d-old", model_card=card)),
            node_info("n-a"),
            InstanceCreated(instance=build_instance(card, ["n-a"], "i1")),
            RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerReady()),
        ]
    )
    old.close()
    async with serving_master(tmp_path) as (master, client):
        (record,) = master.state.serving_history["d-old"]
        assert (record.serving, record.begins) == (True, "observed")
        served = await history(client, "d-old")
    assert served.availability == 1.0
    assert served.complete_from is not None  # known only from this start


@pytest.mark.anyio
async def test_history_answers_in_camel_case_with_the_hours_asked() -> None:
    async with serving_master(None) as (_master, client):
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        response = await client.get(f"/deployments/{deployment_id}/history?hours=0.5")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {
        "deploymentId",
        "windowHours",
        "availability",
        "incidents",
        "mttrS",
        "completeFrom",
    }
    assert (body["deploymentId"], body["windowHours"]) == (deployment_id, 0.5)
    # Not serving since it was created: a start-up, no incident, no availability yet.
    assert (body["availability"], body["incidents"]) == (None, [])


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("query", "status", "fragment"),
    [
        ("?hours=0", 422, "hours"),
        ("?hours=-3", 422, "hours"),
        ("?hours=721", 422, "hours"),
        ("?hours=abc", 422, "hours"),
        ("?hours=nan", 422, "hours"),
        ("?hours=inf", 422, "hours"),
        ("", 404, "no-such-deployment"),
    ],
)
async def test_bad_hours_and_unknown_deployments_are_refused_by_name(
    query: str, status: int, fragment: str
) -> None:
    async with serving_master(None) as (_master, client):
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        if status == 404:
            deployment_id = "no-such-deployment"
        response = await client.get(f"/deployments/{deployment_id}/history{query}")
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert fragment in error["message"] or error["param"] == fragment, error
