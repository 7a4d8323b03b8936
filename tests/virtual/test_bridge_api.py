"""The bridge's HTTP API and the exo stand-in's, each in front of its service, in virtual time.

The bridge must answer like our master (same shapes, same error bodies, same token rule) so the
TUI and the CLI work against it unchanged; the stand-in must answer like exo (``/instance``
accepted then applied, strict bodies, no deployments). Requests go through ``ASGITransport``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import ExoWithBridge, exo_with_bridge, new_bridge, wait_until
from model_ids import QWEN
from recorded_exo import FIXTURES

from exo_deploy_tui.feed.client import MasterClient
from exo_deploy_tui.model.updates import ConnectionUpdate, SnapshotUpdate, Update
from keeper.bridge.api import create_bridge_app
from keeper.bridge.server import run_bridge
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import DeploymentCreated
from keeper.model.state import Deployment
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.master.service import Master

TOKEN = "s3cret-token"


@asynccontextmanager
async def bridge_api(
    h: ExoWithBridge, token: str | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_bridge_app(h.bridge, token))
    async with httpx.AsyncClient(transport=transport, base_url="http://bridge") as client:
        yield client


def assert_error(response: httpx.Response, status: int, *fragments: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return error


# --- the bridge's deployments API --------------------------------------------------------------


@pytest.mark.anyio
async def test_bad_requests_get_clear_4xx_answers_in_exo_s_error_shape() -> None:
    async with exo_with_bridge() as h, bridge_api(h) as api:
        assert_error(
            await api.post("/deployments", json={"model_id": "acme/nope"}),
            404,
            "'acme/nope'",
            "exo's GET /models does not list it",
        )
        error = assert_error(
            await api.post("/deployments", json={"model_id": QWEN, "sharding": "Diagonal"}), 422
        )
        assert error["param"] == "sharding"
        assert_error(await api.post("/deployments", json={"model_id": QWEN, "min_nodes": 0}), 422)
        assert_error(
            await api.post("/deployments", json={"model_id": QWEN, "min_nodes": 29}),
            400,
            "more than",
        )
        assert_error(await api.post("/deployments", json={"model_id": QWEN, "colour": 1}), 422)
        assert_error(
            await api.post(
                "/deployments",
                content=b'{"model_id": ',
                headers={"content-type": "application/json"},
            ),
            400,
            "Malformed JSON",
        )
        created = await api.post("/deployments", json={"model_id": QWEN})
        assert created.status_code == 200
        deployment_id = created.json()["deployment_id"]
        assert set(created.json()) == {"message", "command_id", "deployment_id"}
        assert_error(await api.post("/deployments", json={"model_id": QWEN}), 409, deployment_id)
        assert_error(await api.delete("/deployments/no-such-id"), 404, "'no-such-id'")
        scale = f"/deployments/{deployment_id}"
        before = h.bridge.deployments_json()
        for body, status, fragment in [
            ({"replicas": 0}, 422, "replicas: Input should be greater than or equal to 1"),
            ({"replicas": -1}, 422, "replicas: Input should be greater than or equal to 1"),
            ({"replicas": 17}, 422, "replicas: Input should be less than or equal to 16"),
            ({"replicas": 2.5}, 422, "replicas"),
            ({"replicas": "2"}, 422, "replicas"),
            (
                {},
                422,
                "give one at least of replicas, standby, priority, preempt, sharding",
            ),
            ({"priority": 1001}, 422, "priority: Input should be less than or equal to 1000"),
            ({"priority": -1}, 422, "priority: Input should be greater than or equal to 0"),
            ({"priority": "9"}, 422, "priority"),
            ({"preempt": 1}, 422, "preempt"),
            ({"priority": 600, "preempt": "no"}, 422, "preempt"),
            ({"replicas": 2, "colour": 1}, 422, "colour: Extra inputs are not permitted"),
        ]:
            assert_error(await api.patch(scale, json=body), status, fragment)
        assert_error(
            await api.patch("/deployments/no-such-id", json={"replicas": 2}), 404, "'no-such-id'"
        )
        assert h.bridge.deployments_json() == before
        same = await api.patch(scale, json={"replicas": 1})
        assert same.status_code == 200, same.text
        assert set(same.json()) == {"message", "command_id", "deployment_id"}
        assert "already keeps 1" in same.json()["message"]
        assert_error(await api.get("/events"), 404)
        deleted = await api.delete(f"/deployments/{deployment_id}")
        assert deleted.status_code == 200
        assert deleted.json()["deployment_id"] == deployment_id


@pytest.mark.anyio
async def test_deployments_list_carries_the_keeper_s_timers_and_the_bridge_s_detail() -> None:
    async with exo_with_bridge() as h, bridge_api(h) as api:
        await api.post("/deployments", json={"model_id": QWEN})
        (item,) = (await api.get("/deployments")).json()["deployments"]
        assert item["status"] == "placing"
        assert item["waiting"] == "grace"
        assert 0 < item["next_attempt_in_s"] <= 15
        h.link.down = True
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        (item,) = (await api.get("/deployments")).json()["deployments"]
        assert item["detail"].startswith("exo unreachable since ")


@pytest.mark.anyio
async def test_creating_while_exo_is_down_is_a_503_saying_so() -> None:
    async with exo_with_bridge() as h:
        h.link.down = True
        h.bridge = new_bridge(h.link, None)  # a bridge that never saw exo's model list
        await h.group.start(h.bridge.run)
        async with bridge_api(h) as api:
            assert_error(
                await api.post("/deployments", json={"model_id": QWEN}),
                503,
                "Cannot check",
                "cannot reach exo",
            )
            assert_error(await api.get("/state"), 503, "has not answered yet")
            assert_error(await api.get("/models"), 503, "model list is not available")
            # the first read's failure, once it is in (until then: no reason, not a wrong one)
            await wait_until(lambda: h.bridge.health().exo.reason is not None, 5, "a reason")
            health = (await api.get("/healthz")).json()
            assert health["exo"]["reachable"] is False
            assert "cannot reach exo" in health["exo"]["reason"]


@pytest.mark.anyio
async def test_state_is_exo_s_with_the_deployments_merged_in_and_models_pass_through() -> None:
    async with exo_with_bridge() as h, bridge_api(h) as api:
        created = (await api.post("/deployments", json={"model_id": QWEN})).json()
        await wait_until(h.serving, 30, "serving")
        await anyio.sleep(1.1)  # the bridge's next read of exo's State
        bridge_state = (await api.get("/state")).json()
        exo_state = (await h.exo_api("GET", "/state")).json()
        deployment_id = created["deployment_id"]
        assert bridge_state.pop("deployments").keys() == {deployment_id}
        # The bridge's serving records, judged on exo's States: created, then serving.
        records = bridge_state.pop("servingHistory")[deployment_id]
        assert records[0]["begins"] == "created"
        # The bridge's verdicts, cordons and drains (none here), for a TUI pointed at it.
        assert bridge_state.pop("nodeWatch") == {}
        assert bridge_state.pop("cordoned") == []
        assert bridge_state.pop("drains") == {}
        for own in ("deployments", "servingHistory", "nodeWatch", "cordoned", "drains"):
            assert own not in exo_state  # exo's State has no such key
        assert bridge_state == exo_state

        # GET /deployments/{id}/history on the bridge: serving since exo showed it ready.
        with anyio.fail_after(10):
            while True:
                history = await api.get(f"/deployments/{deployment_id}/history?hours=1")
                assert history.status_code == 200, history.text
                if history.json()["availability"]:
                    break
                await anyio.sleep(0.1)
        assert history.json()["incidents"] == []
        models = await api.get("/models")
        assert models.content == (await h.exo_api("GET", "/models")).content


@pytest.mark.anyio
async def test_changes_need_the_token_when_there_is_one() -> None:
    async with exo_with_bridge() as h, bridge_api(h, token=TOKEN) as api:
        assert_error(await api.post("/deployments", json={"model_id": QWEN}), 401, "token")
        assert (await api.get("/deployments")).status_code == 200
        authorized = {"Authorization": f"Bearer {TOKEN}"}
        created = await api.post("/deployments", json={"model_id": QWEN}, headers=authorized)
        assert created.status_code == 200
        deployment_id = created.json()["deployment_id"]
        assert_error(await api.delete(f"/deployments/{deployment_id}"), 401)
        assert (await api.delete(f"/deployments/{deployment_id}", headers=authorized)).is_success


def test_the_bridge_refuses_to_listen_beyond_loopback_without_a_token(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_bridge("http://127.0.0.1:52415", host="0.0.0.0", port=0) == 2
    assert "without a token" in capsys.readouterr().err
    assert run_bridge("ftp://exo", port=0) == 2
    assert "not exo's API URL" in capsys.readouterr().err


@pytest.mark.anyio
async def test_the_tui_s_client_follows_the_bridge_unchanged() -> None:
    async with exo_with_bridge() as h:
        created = await h.bridge.create_deployment(QWEN)
        updates: list[Update] = []
        transport = httpx.ASGITransport(app=create_bridge_app(h.bridge))
        client = MasterClient("http://bridge", transport=transport)

        def snapshots() -> list[SnapshotUpdate]:
            return [u for u in updates if isinstance(u, SnapshotUpdate)]

        async with anyio.create_task_group() as group:
            group.start_soon(client.run, updates.append)
            await wait_until(lambda: bool(snapshots()), 5, "a snapshot polled from the bridge")
            assert ConnectionUpdate("polling") in updates
            views = snapshots()[-1].deployments
            assert views is not None
            assert [v.deployment.deployment_id for v in views] == [created.deployment_id]
            await wait_until(
                lambda: any(
                    v.status == "serving" for s in snapshots() for v in (s.deployments or ())
                ),
                30,
                "the TUI sees it serving",
            )
            assert snapshots()[-1].state.instances.keys() == h.master.state.instances.keys()
            group.cancel_scope.cancel()
        await client.aclose()


@pytest.mark.anyio
async def test_the_tui_s_delete_instance_works_on_the_bridge_and_the_model_is_placed_again() -> (
    None
):
    # ctrl+k in the dashboard sends exo's own DELETE /instance/{id}; pointed at a bridge it must
    # delete through exo (the keeper then places the deployment's instance again), not 404.
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        transport = httpx.ASGITransport(app=create_bridge_app(h.bridge))
        client = MasterClient("http://bridge", transport=transport)
        try:
            await client.delete_instance(first)
            await wait_until(
                lambda: first in h.link.deleted_instances(), 5, "exo's DELETE /instance sent"
            )
            await wait_until(
                lambda: h.serving() and first not in h.exo_instances(),
                60,
                "serving again on another instance",
            )
        finally:
            await client.aclose()
        async with bridge_api(h) as api:
            answer = await api.delete("/instance/no-such-instance")
        assert_error(answer, 404, "'no-such-instance'", "exo's State")


# --- the stand-in for stock exo ------------------------------------------------------------------


@asynccontextmanager
async def exo_stand_in() -> AsyncIterator[tuple[Master, httpx.AsyncClient]]:
    async with exo_with_bridge() as h:
        transport = httpx.ASGITransport(app=create_exo_compat_app(h.master))
        async with httpx.AsyncClient(transport=transport, base_url="http://exo") as client:
            yield h.master, client


def instance_body(**card_changes: Any) -> dict[str, Any]:
    body = json.loads((FIXTURES / "exo_create_instance.json").read_text())
    (ring,) = body["instance"].values()
    for tagged in ring["shardAssignments"]["runnerToShard"].values():
        (shard,) = tagged.values()
        shard["modelCard"].update(card_changes)
    return body


@pytest.mark.anyio
async def test_exo_s_post_instance_is_accepted_then_applied() -> None:
    async with exo_stand_in() as (master, exo):
        response = await exo.post("/instance", json=instance_body())
        assert response.status_code == 200
        assert response.json()["message"] == "Command received."
        (ring,) = instance_body()["instance"].values()
        await wait_until(
            lambda: ring["instanceId"] in master.state.instances, 1, "the instance applied"
        )
        deleted = await exo.delete(f"/instance/{ring['instanceId']}")
        assert deleted.status_code == 200
        await wait_until(
            lambda: ring["instanceId"] not in master.state.instances, 1, "the deletion applied"
        )
        assert_error(await exo.delete(f"/instance/{ring['instanceId']}"), 404, "Instance not found")


def validation_errors(response: httpx.Response) -> list[dict[str, Any]]:
    """FastAPI's own 422 body, which exo answers a body that fails validation with."""
    assert response.status_code == 422, response.text
    return response.json()["detail"]


@pytest.mark.anyio
async def test_exo_s_post_instance_refuses_strictly_and_checks_memory() -> None:
    async with exo_stand_in() as (master, exo):
        unknown_key = validation_errors(
            await exo.post("/instance", json=instance_body(nickname="q"))
        )
        assert any(error["loc"][-1] == "nickname" for error in unknown_key)
        loose_type = validation_errors(
            await exo.post("/instance", json=instance_body(nLayers="48"))
        )
        assert any(error["loc"][-1] == "nLayers" for error in loose_type)
        not_json = await exo.post(
            "/instance", content=b"{", headers={"content-type": "application/json"}
        )
        assert validation_errors(not_json)[0]["type"] == "json_invalid"
        # exo sizes the model the instance names, whatever card its shards carry.
        too_big = instance_body()
        (ring,) = too_big["instance"].values()
        ring["shardAssignments"]["modelId"] = "mlx-community/DeepSeek-V3.1-4bit"
        assert_error(
            await exo.post("/instance", json=too_big),
            400,
            "Insufficient memory to create instance. Required: 378.0GB, Available: 64.0GB",
        )
        await anyio.sleep(1)
        assert master.state.instances == {}


@pytest.mark.anyio
async def test_exo_stand_in_has_no_deployments_and_exo_s_model_list() -> None:
    async with exo_stand_in() as (_, exo):
        assert_error(await exo.post("/deployments", json={"model_id": QWEN}), 404)
        assert_error(await exo.get("/deployments"), 404)
        listed = (await exo.get("/models")).json()
        assert listed == json.loads((FIXTURES / "exo_recordings" / "models.json").read_text())


@pytest.mark.anyio
async def test_a_master_without_its_keeper_places_nothing() -> None:
    async with exo_with_bridge() as h:  # two nodes with room to spare
        card = h.bridge.catalog[QWEN]
        deployment = Deployment(deployment_id="d", model_card=card)
        await h.master.emit([DeploymentCreated(deployment=deployment)])
        await anyio.sleep(STARTUP_GRACE + 45)
        assert "d" in h.master.state.deployments
        assert h.master.state.instances == {}
