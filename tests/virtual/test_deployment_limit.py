"""The deployment maximum (keeper.runtime.deployments.check_room), on the master and the bridge
alike: a create past it is a 422 in exo's error shape naming the limit and how to raise it, and
changes nothing; a deletion makes room again. Requests go through ``ASGITransport``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from bridge_harness import exo_with_bridge
from exo_errors import assert_exo_error
from model_ids import LLAMA, QWEN

from keeper.bridge.api import create_bridge_app
from keeper.bridge.service import BridgeConfig
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig

LLAMA_3B = "mlx-community/Llama-3.2-3B-Instruct-4bit"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def assert_limit_refusal(response: httpx.Response, limit: int) -> None:
    assert_exo_error(
        response, 422, f"at most {limit} deployments", f"has {limit}", "--max-deployments N"
    )


@asynccontextmanager
async def master_api(max_deployments: int) -> AsyncIterator[tuple[Master, httpx.AsyncClient]]:
    master = Master(None, config=MasterConfig(max_deployments=max_deployments))
    transport = httpx.ASGITransport(app=create_app(master, None))
    async with (
        anyio.create_task_group() as group,
        httpx.AsyncClient(transport=transport, base_url="http://master") as client,
    ):
        await group.start(master.run)
        yield master, client
        group.cancel_scope.cancel()


def test_both_services_default_to_the_same_maximum() -> None:
    assert DEFAULT_MAX_DEPLOYMENTS == 1000
    assert MasterConfig().max_deployments == BridgeConfig().max_deployments == 1000


@pytest.mark.anyio
async def test_the_master_refuses_a_deployment_past_its_maximum_and_a_deletion_makes_room() -> None:
    async with master_api(2) as (master, api):
        first = await api.post("/deployments", json={"model_id": QWEN})
        assert first.status_code == 200, first.text
        assert (await api.post("/deployments", json={"model_id": LLAMA})).status_code == 200
        assert_limit_refusal(await api.post("/deployments", json={"model_id": LLAMA_3B}), 2)
        assert len(master.state.deployments) == 2  # the refusal changed nothing
        # A conflict is still named as one: the limit does not hide what else is wrong.
        assert_exo_error(await api.post("/deployments", json={"model_id": QWEN}), 409)
        deleted = await api.delete(f"/deployments/{first.json()['deployment_id']}")
        assert deleted.status_code == 200
        assert (await api.post("/deployments", json={"model_id": LLAMA_3B})).status_code == 200


@pytest.mark.anyio
async def test_the_bridge_refuses_a_deployment_past_its_maximum_too() -> None:
    async with exo_with_bridge(bridge_config=BridgeConfig(max_deployments=1)) as h:
        transport = httpx.ASGITransport(app=create_bridge_app(h.bridge, None))
        async with httpx.AsyncClient(transport=transport, base_url="http://bridge") as api:
            assert (await api.post("/deployments", json={"model_id": QWEN})).status_code == 200
            assert_limit_refusal(await api.post("/deployments", json={"model_id": LLAMA}), 1)
            assert len(h.bridge.deployments_view().deployments) == 1
