"""``exo-deploy apply`` carrying a plan out (``keeper.cli.apply.carry_out_plan``) against scripted
services, for what a real master of this version never answers: a service whose PATCH does not
take a planned setting (one from before PATCH took sharding, instance_meta and min_nodes), told
by its OpenAPI document before anything is applied, or by its 422 when it has no document. The
requests each service saw are checked, so "nothing applied" is the requests, not the words.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from keeper.cli.apply import carry_out_plan
from keeper.cli.deployments import EXIT_OK, EXIT_REFUSED
from keeper.client.apply_plan import Plan, plan_deployments
from keeper.client.deployments import DeploymentsClient
from keeper.model.api_models import CreateDeploymentRequest
from keeper.model.state import Deployment, Memory, ModelCard, Sharding

OLD = "mlx-community/Qwen3-30B-A3B-4bit"
NEW = "mlx-community/Llama-3.2-1B-Instruct-4bit"
# One request to a scripted transport; longer means the test is broken.
TIMEOUT_S = 5.0


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def document(patch_fields: list[str]) -> dict[str, Any]:
    """An OpenAPI document whose PATCH /deployments/{id} body takes ``patch_fields``."""
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Patch"}}}}
    return {
        "paths": {"/deployments/{deployment_id}": {"patch": {"requestBody": body}}},
        "components": {"schemas": {"Patch": {"properties": {name: {} for name in patch_fields}}}},
    }


def plan() -> Plan:
    card = ModelCard(
        model_id=OLD,
        storage_size=Memory.from_gb(17),
        n_layers=48,
        hidden_size=2048,
        supports_tensor=True,
    )
    current = [Deployment(deployment_id="d-old", model_card=card)]
    desired = [
        CreateDeploymentRequest(model_id=OLD, sharding=Sharding.TENSOR, replicas=2),
        CreateDeploymentRequest(model_id=NEW),
    ]
    return plan_deployments(desired, current, prune=False)


class Service:
    """A scripted service: its OpenAPI document (None: it has none) and its PATCH refusal."""

    def __init__(self, openapi: dict[str, Any] | None, patch_refusal: str | None) -> None:
        self.openapi = openapi
        self.patch_refusal = patch_refusal
        self.seen: list[tuple[str, str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.seen.append((request.method, request.url.path, body))
        if request.url.path == "/openapi.json":
            if self.openapi is None:
                return httpx.Response(404, json={"detail": "Not Found"})
            return httpx.Response(200, json=self.openapi)
        if request.method == "PATCH" and self.patch_refusal is not None:
            envelope = {"message": self.patch_refusal, "type": "Unprocessable Entity", "code": 422}
            return httpx.Response(422, json={"error": envelope})
        answer = {"message": f"{request.method} done", "command_id": "c", "deployment_id": "d"}
        return httpx.Response(200, json=answer)

    async def apply(self, plan: Plan) -> tuple[int, list[str], list[str]]:
        said: list[str] = []
        complained: list[str] = []
        transport = httpx.MockTransport(self.handle)
        async with httpx.AsyncClient(base_url="http://service", transport=transport) as http:
            code = await carry_out_plan(
                DeploymentsClient(http, TIMEOUT_S),
                plan,
                say=said.append,
                complain=complained.append,
            )
        return code, said, complained

    def changes(self) -> list[tuple[str, str, Any]]:
        return [seen for seen in self.seen if seen[0] != "GET"]


@pytest.mark.anyio
async def test_a_service_whose_patch_lacks_a_planned_setting_refuses_the_whole_plan() -> None:
    service = Service(document(["replicas", "standby", "priority", "preempt"]), None)
    code, said, complained = await service.apply(plan())
    assert code == EXIT_REFUSED
    assert service.changes() == []  # not even the create that comes first
    assert said == []
    (line,) = complained
    assert line.startswith(
        "the service at http://service cannot change sharding in place (its PATCH "
        "/deployments/{id} takes preempt, priority, replicas, standby): change of "
        f"{OLD} (deployment d-old) asks sharding Pipeline -> Tensor; nothing applied"
    )


@pytest.mark.anyio
async def test_a_service_without_a_document_refuses_at_the_step_and_the_report_says_so() -> None:
    service = Service(None, "sharding: Extra inputs are not permitted")
    code, said, complained = await service.apply(plan())
    assert code == EXIT_REFUSED
    assert service.changes() == [
        # (The default repair is left out of a create: an older service refuses the key.)
        (
            "POST",
            "/deployments",
            CreateDeploymentRequest(model_id=NEW).model_dump(mode="json", exclude={"repair"}),
        ),
        ("PATCH", "/deployments/d-old", {"sharding": "Tensor", "replicas": 2}),
    ]
    assert said == ["POST done: d"]
    assert complained == [
        f"change of {OLD} (deployment d-old) (sharding Pipeline -> Tensor, replicas 1 -> 2) "
        "refused: sharding: Extra inputs are not permitted",
        "this service cannot change sharding in place (an older exo-deploy): delete the "
        "deployment and apply again to recreate it",
        f"applied before it: create of {NEW}",
    ]


@pytest.mark.anyio
async def test_a_service_that_takes_the_settings_gets_only_those_that_differ() -> None:
    fields = ["replicas", "standby", "priority", "preempt", "sharding", "instance_meta"]
    service = Service(document([*fields, "min_nodes"]), None)
    code, said, complained = await service.apply(plan())
    assert (code, complained) == (EXIT_OK, [])
    assert service.changes()[1] == (
        "PATCH",
        "/deployments/d-old",
        {"sharding": "Tensor", "replicas": 2},
    )
    assert said == ["POST done: d", "PATCH done: d"]
