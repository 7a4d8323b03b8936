"""The deployments client the CLI and the TUI share (``keeper.client.deployments``), against
scripted answers: every shape of refusal reads the same way, and every failure says what kind it
is."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from model_ids import QWEN

from keeper.client.deployments import (
    NO_DEPLOYMENTS_API,
    NO_SCALING_API,
    ApiError,
    DeploymentsClient,
    error_message,
    master_http,
    validation_summary,
)
from keeper.model.api_models import CreateDeploymentRequest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real time, not the MockClock of tests/virtual


def answer(status: int, body: Any = None, content: bytes | None = None) -> httpx.Response:
    if content is not None:
        return httpx.Response(status, content=content)
    return httpx.Response(status, json=body)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (
            answer(409, {"error": {"message": "taken", "type": "Conflict", "code": 409}}),
            "taken",
        ),
        (answer(404, {"detail": "Deployment 'x' not found"}), "Deployment 'x' not found"),
        (
            answer(
                422,
                {
                    "detail": [
                        {"loc": ["body", "min_nodes"], "msg": "Input should be >= 1"},
                        {"loc": ["body", "sharding"], "msg": "Input should be 'Pipeline'"},
                    ]
                },
            ),
            "body.min_nodes: Input should be >= 1; body.sharding: Input should be 'Pipeline'",
        ),
        (answer(422, {"detail": []}), "invalid, with no details given"),
        (answer(422, {"detail": ["odd", {"msg": "no place"}]}), "odd; no place"),
        (answer(502, content=b"<html>bad gateway</html>"), "HTTP 502 Bad Gateway: <html>bad"),
        (answer(500, content=b""), "the master answered HTTP 500 Internal Server Error"),
        (answer(500, [1, 2]), "the master answered HTTP 500 Internal Server Error: [1,2]"),
    ],
)
def test_every_refusal_reads_as_one_message(response: httpx.Response, message: str) -> None:
    assert message in error_message(response)


def test_validation_summary_never_fails() -> None:
    assert validation_summary([]) == "invalid, with no details given"
    assert validation_summary([{"loc": "not a list", "msg": "m"}]) == "m"
    assert validation_summary([{}]) == "invalid"


def client_for(handler: Any) -> DeploymentsClient:
    http = master_http("http://master", None, 5.0, httpx.MockTransport(handler))
    return DeploymentsClient(http, 5.0)


@pytest.mark.anyio
async def test_a_master_without_the_deployments_api_is_named() -> None:
    client = client_for(lambda request: answer(404, {"detail": "Not Found"}))
    with pytest.raises(ApiError) as refused:
        await client.list()
    assert (refused.value.message, refused.value.kind) == (NO_DEPLOYMENTS_API, "refused")


@pytest.mark.anyio
async def test_scale_sends_patch_with_the_count_and_names_a_master_that_cannot_scale() -> None:
    seen: list[tuple[str, str, bytes]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, request.content))
        if request.url.path == "/deployments/old":
            return answer(405, {"error": {"message": "Method Not Allowed"}})
        return answer(200, {"message": "scaled", "command_id": "c", "deployment_id": "d"})

    client = client_for(handler)
    scaled = await client.scale("d", 3)
    assert scaled.value.deployment_id == "d"
    assert seen == [("PATCH", "/deployments/d", b'{"replicas":3}')]
    with pytest.raises(ApiError) as refused:
        await client.scale("old", 2)
    assert (refused.value.message, refused.value.status) == (NO_SCALING_API, 405)


@pytest.mark.anyio
async def test_answers_keep_their_json_and_ignore_keys_a_newer_master_adds() -> None:
    sent = {"message": "created", "command_id": "c", "deployment_id": "d", "extra": 1}
    client = client_for(lambda request: answer(200, sent))
    created = await client.create(CreateDeploymentRequest(model_id=QWEN))
    assert created.value.deployment_id == "d"
    assert created.payload == sent


@pytest.mark.anyio
async def test_unreadable_answers_are_refusals_saying_what_was_wrong() -> None:
    client = client_for(lambda request: answer(200, content=b"<html>"))
    with pytest.raises(ApiError, match="with something that is not JSON"):
        await client.delete("d")
    client = client_for(lambda request: answer(200, {"deployments": "none"}))
    with pytest.raises(ApiError, match=r"unexpected answer to GET /deployments: deployments: "):
        await client.list()


@pytest.mark.anyio
async def test_failures_say_their_kind() -> None:
    def unreachable(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(ApiError, match="cannot reach the master at http://master: ") as down:
        await client_for(unreachable).list()
    assert down.value.kind == "unreachable"
    http = master_http("ftp://example.invalid", None, 5.0)
    with pytest.raises(ApiError, match="not a master URL") as bad:
        await DeploymentsClient(http, 5.0).list()
    assert bad.value.kind == "usage"
