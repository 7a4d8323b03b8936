"""The OpenAPI document is the contract: schemathesis fuzzes each API against its own document.

Three apps, each built in-process with its service running beside it on schemathesis' event
loop: our master with two simulated nodes (and again with a token, for its changes), the bridge
in front of exo's stand-in (two nodes), and the stand-in itself. Every built-in check is on (no
5xx, only declared status codes, bodies matching their declared models, inputs the schema
allows accepted, the schema's refusals refused, ``Allow`` on 405s, changes refused without the
token...). The seed is fixed (hypothesis ``derandomize``) and the examples
per route bounded, so a run is the same run each time and adds well under a minute to
``make test``; a failure names the route and prints the case as a curl command.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
import schemathesis
from bridge_harness import ExoLink, exo_with_bridge, new_bridge
from hypothesis import HealthCheck, settings
from schemathesis.checks import positive_data_acceptance
from schemathesis.config import SchemathesisConfig
from starlette.types import ASGIApp, Receive, Scope, Send

from keeper.bridge.api import create_bridge_app
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

# Generated examples per route (the explicit ones schemathesis derives from the schema, such as
# each enum value and each bound, come on top). The four runs below fuzz 31 routes; at 50 they
# generate 1,807 cases (each sent once, some again by the checks) in 13 to 19 s on two cores.
EXAMPLES_PER_ROUTE = 50
TWO_NODES = [NodeConfig("a", 32.0), NodeConfig("b", 32.0)]
TOKEN = "s3cret-token"


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both of anyio's backends on their real clocks (anyio's own default), not the MockClock
    of tests/virtual."""
    return request.param


class Served:
    """An ASGI app that, each time its lifespan starts, starts a new service and the app in
    front of it, and stops both when the lifespan ends.

    schemathesis runs an app's lifespan on the event loop it sends every request on, and ends it
    after each route's test: so every route is fuzzed against a fresh service, whose loops share
    the requests' event loop as they do under uvicorn."""

    def __init__(self, start: Callable[[], AbstractAsyncContextManager[ASGIApp]]) -> None:
        self.start = start
        self.app: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            assert self.app is not None, "a request before the lifespan started"
            await self.app(scope, receive, send)
            return
        await receive()  # lifespan.startup
        async with self.start() as app:
            self.app = app
            await send({"type": "lifespan.startup.complete"})
            await receive()  # lifespan.shutdown
            self.app = None
        await send({"type": "lifespan.shutdown.complete"})


@asynccontextmanager
async def running_with_nodes(master: Master) -> AsyncIterator[None]:
    cluster = InProcessCluster(master, TWO_NODES)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await group.start(cluster.run)
        with anyio.fail_after(10):
            while len(master.state.node_memory) < len(TWO_NODES):
                await anyio.sleep(0.01)
        yield
        group.cancel_scope.cancel()


@asynccontextmanager
async def master_api(token: str | None = None) -> AsyncIterator[ASGIApp]:
    master = Master(None)
    async with running_with_nodes(master):
        yield create_app(master, token)


@asynccontextmanager
async def exo_api() -> AsyncIterator[ASGIApp]:
    master = Master(None, config=MasterConfig(keeper_enabled=False))
    async with running_with_nodes(master):
        yield create_exo_compat_app(master)


@asynccontextmanager
async def bridge_api() -> AsyncIterator[ASGIApp]:
    async with exo_with_bridge() as h:
        with anyio.fail_after(10):
            while not h.bridge.health().exo.state_readable:
                await anyio.sleep(0.01)
        yield create_bridge_app(h.bridge)


# A request the schema allows may still be refused by the cluster's state, which no schema can
# see: min_nodes above the model's layer count, no room to place it (our 400s), a model exo does
# not list (exo's 400). So 400 joins schemathesis' defaults for schema-valid requests; 422, what
# a schema mismatch gets, still fails the check.
CONFIG = SchemathesisConfig.from_dict(
    {
        "checks": {
            "enabled": True,  # every built-in check, as `--checks all`
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "400", "401", "404", "409", "503"]
            },
        }
    }
)


# Each document is read from an app whose service never runs: the document does not depend on
# it, and loading it then starts nothing.
idle = Master(None)
master_schema = schemathesis.openapi.from_asgi("/openapi.json", create_app(idle), config=CONFIG)
exo_schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_exo_compat_app(idle), config=CONFIG
)
bridge_schema = schemathesis.openapi.from_asgi(
    "/openapi.json",
    create_bridge_app(new_bridge(ExoLink(create_exo_compat_app(idle)), None)),
    config=CONFIG,
)
token_schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(idle, TOKEN), config=CONFIG
)
MASTER = Served(master_api)
MASTER_WITH_TOKEN = Served(lambda: master_api(TOKEN))
EXO = Served(exo_api)
BRIDGE = Served(bridge_api)


FUZZ = settings(
    max_examples=EXAMPLES_PER_ROUTE,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# GET /events is the dashboard's endless stream: a request to it would never end. Its stream is
# tested in tests/processes/test_api_process.py; the stand-in's GET /events (one JSON array, as
# exo's) is fuzzed.
@master_schema.exclude(path="/events").parametrize()
@FUZZ
def test_the_master_answers_as_its_document_says(case: schemathesis.Case) -> None:
    case.call_and_validate(app=MASTER)


# With a token, each change is sent with it, and schemathesis' auth checks send it again without
# the token and with a wrong one, expecting the declared 401.
@token_schema.exclude(path="/events").include(method=["POST", "DELETE"]).parametrize()
@FUZZ
def test_the_master_with_a_token_answers_as_its_document_says(case: schemathesis.Case) -> None:
    case.call_and_validate(app=MASTER_WITH_TOKEN, headers={"Authorization": f"Bearer {TOKEN}"})


@exo_schema.parametrize()
@FUZZ
def test_exo_s_stand_in_answers_as_its_document_says(case: schemathesis.Case) -> None:
    # exo's POST /instance and POST /download/start are strict: they refuse 2.0 where their
    # schema says integer (in a shard), which JSON Schema cannot tell from 2 (its description
    # says so). The stand-in must refuse it too, as it is there to catch what exo would refuse,
    # so only there a schema-valid body may get 422.
    strict_exo = (case.method, case.path) in {("POST", "/instance"), ("POST", "/download/start")}
    case.call_and_validate(
        app=EXO, excluded_checks=[positive_data_acceptance] if strict_exo else []
    )


@bridge_schema.parametrize()
@FUZZ
def test_the_bridge_answers_as_its_document_says(case: schemathesis.Case) -> None:
    case.call_and_validate(app=BRIDGE)


# --- what the fuzzing relies on, said directly ------------------------------------------------


def operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (method.upper(), path): operation
        for path, item in document["paths"].items()
        for method, operation in item.items()
    }


def test_every_refusal_is_declared_with_exo_s_envelope() -> None:
    master = Master(None)
    document = create_app(master, "token").openapi()
    declared = {key: set(op["responses"]) for key, op in operations(document).items()}
    assert declared[("POST", "/deployments")] == {
        "200", "400", "401", "404", "409", "413", "415", "422", "503"
    }  # fmt: skip
    assert declared[("DELETE", "/deployments/{deployment_id}")] == {
        "200", "401", "404", "422", "503"
    }  # fmt: skip
    assert declared[("DELETE", "/instance/{instance_id}")] >= {"401", "404", "503"}
    assert declared[("POST", "/place_instance")] >= {"400", "401", "404", "503"}
    assert declared[("GET", "/whatif")] == {"200", "404", "422", "503"}
    # GET /metrics: Prometheus' text format, open like every read (no 401 even with a token).
    assert declared[("GET", "/metrics")] == {"200", "503"}
    metrics_ok = operations(document)[("GET", "/metrics")]["responses"]["200"]
    assert list(metrics_ok["content"]) == ["text/plain"]
    # A route's own 422 keeps its reason; FastAPI's (not what is sent) gives way to the app's.
    what_if_422 = operations(document)[("GET", "/whatif")]["responses"]["422"]
    assert what_if_422["description"] == "No node named: none given, or only commas"
    envelope = {"$ref": "#/components/schemas/ErrorResponse"}
    for (method, path), operation in operations(document).items():
        for code, answer in operation["responses"].items():
            if code.startswith("4") or code.startswith("5"):
                schema = answer["content"]["application/json"]["schema"]
                assert schema == envelope, (method, path, code)
    bearer = {"type": "http", "scheme": "bearer"}
    assert document["components"]["securitySchemes"] == {"bearer": bearer}
    assert operations(document)[("POST", "/deployments")]["security"] == [{"bearer": []}]
    assert "security" not in operations(document)[("GET", "/deployments")]
    # Without a token nothing answers 401, and the document does not say it does.
    open_document = create_app(master).openapi()
    assert all("401" not in op["responses"] for op in operations(open_document).values())
    assert "securitySchemes" not in open_document["components"]


def test_exo_s_stand_in_declares_fastapi_s_422_as_it_sends_it() -> None:
    document = create_exo_compat_app(Master(None, config=MasterConfig(keeper_enabled=False)))
    fastapi_422 = {"$ref": "#/components/schemas/HTTPValidationError"}
    posted = operations(document.openapi())[("POST", "/instance")]
    assert posted["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ExoCreateInstance"
    }
    assert posted["responses"]["422"]["content"]["application/json"]["schema"] == fastapi_422
    assert set(posted["responses"]) == {"200", "400", "413", "415", "422", "503"}
    # exo's download commands: its bodies, its {"commandId"} answer, FastAPI's 422.
    accepted = {"$ref": "#/components/schemas/ExoCommandAccepted"}
    for (method, path), body in {
        ("POST", "/download/start"): "ExoStartDownload",
        ("POST", "/download/cancel"): "ExoCancelDownload",
        ("DELETE", "/download/{node_id}/{model_id}"): None,
    }.items():
        operation = operations(document.openapi())[(method, path)]
        answers = operation["responses"]
        assert answers["200"]["content"]["application/json"]["schema"] == accepted
        assert answers["422"]["content"]["application/json"]["schema"] == fastapi_422
        assert "503" in answers
        if body is not None:
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            assert schema == {"$ref": f"#/components/schemas/{body}"}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("OPTIONS", "/deployments", "GET, POST"),
        ("PUT", "/deployments", "GET, POST"),
        ("GET", "/deployments/some-id", "DELETE, PATCH"),
        ("OPTIONS", "/state", "GET"),
        ("PATCH", "/v1/chat/completions", "POST"),
    ],
)
async def test_a_method_not_served_gets_405_with_every_method_the_path_serves(
    method: str, path: str, allow: str
) -> None:
    transport = httpx.ASGITransport(app=create_app(Master(None)))
    async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
        response = await client.request(method, path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.json()["error"]["code"] == 405


@pytest.mark.anyio
async def test_exo_s_stand_in_names_a_concrete_path_s_methods_before_a_templated_one_s() -> None:
    app = create_exo_compat_app(Master(None, config=MasterConfig(keeper_enabled=False)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://exo") as client:
        placement = await client.request("OPTIONS", "/instance/placement")
        instance = await client.request("OPTIONS", "/instance/some-id")
    assert placement.headers["allow"] == "GET"  # not DELETE /instance/{instance_id}'s DELETE
    assert instance.headers["allow"] == "DELETE"


@pytest.mark.anyio
async def test_a_body_that_is_not_utf_8_gets_exo_s_422_from_the_stand_in_not_a_500() -> None:
    app = create_exo_compat_app(Master(None, config=MasterConfig(keeper_enabled=False)))
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://exo") as client:
        response = await client.post(
            "/instance", content=b"\x80\xff", headers={"content-type": "application/json"}
        )
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["type"] == "json_invalid" and error["loc"] == ["body"]
