"""The HTTP API in-process (ASGI): exo's shapes on success, exo's error body with a useful message
on every kind of bad input (and no change to the State), the bearer token, model cards, scaling.
The streaming endpoints against a real uvicorn, and the process entry, are in
tests/processes/test_api_process.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from exo_errors import assert_exo_error
from model_ids import LLAMA, QWEN
from recorded_exo import FIXTURES

from keeper.model.api_models import CommandResponse, DeploymentsResponse, ModelList
from keeper.model.catalog import BUILTIN_MODEL_CARDS
from keeper.model.events import NodeGatheredInfo
from keeper.model.state import Backend, Memory, MemoryUsage, State
from keeper.runtime.model_cards import ModelCardError, load_model_cards, merge_catalogs
from keeper.runtime.starting import InsecureBindError, check_bind
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig

TOKEN = "s3cret-token"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real time, as under uvicorn (asyncio only), not tests/virtual's MockClock


@asynccontextmanager
async def running_master() -> AsyncIterator[Master]:
    master = Master(None)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        yield master
        group.cancel_scope.cancel()


@asynccontextmanager
async def api_client(
    master: Master, token: str | None = None, headers: dict[str, str] | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_app(master, token))
    async with httpx.AsyncClient(
        transport=transport, base_url="http://master", headers=headers
    ) as client:
        yield client


async def add_node(master: Master, node_id: str = "node-a", memory_gb: float = 64) -> None:
    memory = Memory.from_gb(memory_gb)
    await master.emit(
        [
            NodeGatheredInfo(
                node_id=node_id,
                when="2026-01-01T00:00:00.000Z",
                memory=MemoryUsage(ram_total=memory, ram_available=memory),
                backends=[Backend.MLX_METAL],
            )
        ]
    )
    with anyio.fail_after(5):
        while node_id not in master.state.node_memory:
            await anyio.sleep(0.01)


# --- bad input --------------------------------------------------------------------------

JSON = {"content-type": "application/json"}
# The path of the deployment every bad-input case starts with (its id is only known then).
EXISTING = "/deployments/{existing}"


@dataclass
class Bad:
    name: str
    method: str
    path: str
    status: int
    fragments: tuple[str, ...]
    json_body: Any = None
    raw: bytes | None = None
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))


BAD_INPUTS = [
    Bad("unknown model", "POST", "/deployments", 404, ("nope/model",), {"model_id": "nope/model"}),
    Bad(
        "bad sharding enum",
        "POST",
        "/deployments",
        422,
        ("sharding", "Pipeline", "Tensor"),
        {"model_id": QWEN, "sharding": "Diagonal"},
    ),
    Bad(
        "bad instance_meta enum",
        "POST",
        "/deployments",
        422,
        ("instance_meta", "MlxRing"),
        {"model_id": QWEN, "instance_meta": "Ring"},
    ),
    Bad(
        "min_nodes 0",
        "POST",
        "/deployments",
        422,
        ("min_nodes: Input should be greater than or equal to 1",),
        {"model_id": QWEN, "min_nodes": 0},
    ),
    Bad(
        "min_nodes absurd",
        "POST",
        "/deployments",
        422,
        ("min_nodes: Input should be less than or equal to",),
        {"model_id": QWEN, "min_nodes": 10**9},
    ),
    Bad(
        "min_nodes more than the model's layers",
        "POST",
        "/deployments",
        400,
        ("min_nodes 100", "28", "no cluster could place it"),
        {"model_id": QWEN, "min_nodes": 100},
    ),
    Bad(
        "min_nodes wrong type",
        "POST",
        "/deployments",
        422,
        ("min_nodes", "integer"),
        {"model_id": QWEN, "min_nodes": "two"},
    ),
    Bad(
        "min_nodes with a fraction",
        "POST",
        "/deployments",
        422,
        ("min_nodes", "integer"),
        {"model_id": QWEN, "min_nodes": 2.5},
    ),
    Bad(
        "min_nodes a boolean",
        "POST",
        "/deployments",
        422,
        ("min_nodes", "integer"),
        {"model_id": QWEN, "min_nodes": True},
    ),
    Bad("model_id wrong type", "POST", "/deployments", 422, ("model_id",), {"model_id": 5}),
    Bad("missing model_id", "POST", "/deployments", 422, ("model_id: Field required",), {}),
    Bad(
        "extra field",
        "POST",
        "/deployments",
        422,
        ("colour: Extra inputs are not permitted",),
        {"model_id": QWEN, "colour": 3},
    ),
    Bad(
        "replicas over 16",
        "POST",
        "/deployments",
        422,
        ("replicas: Input should be less than or equal to 16",),
        {"model_id": QWEN, "replicas": 17},
    ),
    Bad(
        "standby over 4",
        "POST",
        "/deployments",
        422,
        ("standby: Input should be less than or equal to 4",),
        {"model_id": QWEN, "standby": 5},
    ),
    Bad(
        "standby negative",
        "POST",
        "/deployments",
        422,
        ("standby: Input should be greater than or equal to 0",),
        {"model_id": QWEN, "standby": -1},
    ),
    Bad(
        "standby not a number",
        "POST",
        "/deployments",
        422,
        ("standby: Input should be a valid integer",),
        {"model_id": QWEN, "standby": "1"},
    ),
    Bad(
        "patch standby over 4",
        "PATCH",
        EXISTING,
        422,
        ("standby: Input should be less than or equal to 4",),
        {"standby": 9},
    ),
    Bad(
        "replicas zero",
        "POST",
        "/deployments",
        422,
        ("replicas: Input should be greater than or equal to 1",),
        {"model_id": QWEN, "replicas": 0},
    ),
    Bad(
        "replicas not a whole number",
        "POST",
        "/deployments",
        422,
        ("replicas:",),
        {"model_id": QWEN, "replicas": 1.5},
    ),
    Bad("body is a list", "POST", "/deployments", 422, ("JSON object",), [QWEN]),
    Bad("no body", "POST", "/deployments", 422, ("body required",), raw=b""),
    Bad("malformed JSON", "POST", "/deployments", 400, ("Malformed JSON",), raw=b'{"model_id": '),
    Bad(
        "huge body",
        "POST",
        "/deployments",
        413,
        ("larger than",),
        raw=b'{"model_id": "' + b"x" * (2 * 1024 * 1024) + b'"}',
    ),
    Bad(
        "wrong content type",
        "POST",
        "/deployments",
        415,
        ("application/json", "text/plain"),
        raw=json.dumps({"model_id": QWEN}).encode(),
        headers={"content-type": "text/plain"},
    ),
    Bad("unknown deployment", "DELETE", "/deployments/no-such-id", 404, ("no-such-id",)),
    Bad(
        "scale an unknown deployment",
        "PATCH",
        "/deployments/no-such-id",
        404,
        ("no-such-id", "not found"),
        {"replicas": 2},
    ),
    Bad(
        "scale to 0 replicas",
        "PATCH",
        EXISTING,
        422,
        ("replicas: Input should be greater than or equal to 1",),
        {"replicas": 0},
    ),
    Bad(
        "scale to negative replicas",
        "PATCH",
        EXISTING,
        422,
        ("replicas: Input should be greater than or equal to 1",),
        {"replicas": -2},
    ),
    Bad(
        "scale over 16 replicas",
        "PATCH",
        EXISTING,
        422,
        ("replicas: Input should be less than or equal to 16",),
        {"replicas": 17},
    ),
    Bad(
        "scale to a fraction",
        "PATCH",
        EXISTING,
        422,
        ("replicas", "integer"),
        {"replicas": 1.5},
    ),
    Bad(
        "scale to a string",
        "PATCH",
        EXISTING,
        422,
        ("replicas", "integer"),
        {"replicas": "2"},
    ),
    Bad(
        "scale to a boolean",
        "PATCH",
        EXISTING,
        422,
        ("replicas", "integer"),
        {"replicas": True},
    ),
    Bad(
        "patch with no setting",
        "PATCH",
        EXISTING,
        422,
        ("give one at least of replicas, standby, priority, preempt, sharding",),
        {},
    ),
    Bad(
        "priority over 1000",
        "POST",
        "/deployments",
        422,
        ("priority: Input should be less than or equal to 1000",),
        {"model_id": QWEN, "priority": 1001},
    ),
    Bad(
        "priority negative",
        "POST",
        "/deployments",
        422,
        ("priority: Input should be greater than or equal to 0",),
        {"model_id": QWEN, "priority": -1},
    ),
    Bad(
        "priority a fraction",
        "POST",
        "/deployments",
        422,
        ("priority", "integer"),
        {"model_id": QWEN, "priority": 2.5},
    ),
    Bad(
        "priority a string",
        "POST",
        "/deployments",
        422,
        ("priority", "integer"),
        {"model_id": QWEN, "priority": "700"},
    ),
    Bad(
        "preempt a number",
        "POST",
        "/deployments",
        422,
        ("preempt", "boolean"),
        {"model_id": QWEN, "preempt": 1},
    ),
    Bad(
        "preempt a string",
        "POST",
        "/deployments",
        422,
        ("preempt", "boolean"),
        {"model_id": QWEN, "preempt": "true"},
    ),
    Bad(
        "repair neither auto nor report",
        "POST",
        "/deployments",
        422,
        ("repair", "'auto' or 'report'"),
        {"model_id": QWEN, "repair": "sometimes"},
    ),
    Bad(
        "patch repair a number",
        "PATCH",
        EXISTING,
        422,
        ("repair", "'auto' or 'report'"),
        {"repair": 1},
    ),
    Bad(
        "repair of no such instance",
        "POST",
        "/instances/nope/repair",
        404,
        ("no instance nope",),
        {},
    ),
    Bad(
        "patch priority over 1000",
        "PATCH",
        EXISTING,
        422,
        ("priority: Input should be less than or equal to 1000",),
        {"priority": 5000},
    ),
    Bad(
        "patch priority negative",
        "PATCH",
        EXISTING,
        422,
        ("priority: Input should be greater than or equal to 0",),
        {"priority": -3},
    ),
    Bad(
        "patch priority a boolean",
        "PATCH",
        EXISTING,
        422,
        ("priority", "integer"),
        {"priority": True},
    ),
    Bad(
        "patch preempt a string",
        "PATCH",
        EXISTING,
        422,
        ("preempt", "boolean"),
        {"preempt": "yes"},
    ),
    Bad(
        "patch preempt null alone",
        "PATCH",
        EXISTING,
        422,
        ("give one at least of replicas, standby, priority, preempt, sharding",),
        {"preempt": None},
    ),
    Bad(
        "patch a good priority beside a bad preempt",
        "PATCH",
        EXISTING,
        422,
        ("preempt", "boolean"),
        {"priority": 900, "preempt": 0},
    ),
    Bad(
        "scale with an extra key",
        "PATCH",
        EXISTING,
        422,
        ("model_id: Extra inputs are not permitted",),
        {"replicas": 2, "model_id": "x"},
    ),
    Bad(
        "options the model cannot take",
        "PATCH",
        EXISTING,
        422,
        ("is more than", "has layers", "no cluster could place it"),
        {"replicas": 2, "min_nodes": 1000},
    ),
    Bad(
        "an unknown sharding",
        "PATCH",
        EXISTING,
        422,
        ("sharding: Input should be 'Pipeline' or 'Tensor'",),
        {"sharding": "Diagonal"},
    ),
    Bad("scale with malformed JSON", "PATCH", EXISTING, 400, ("Malformed JSON",), raw=b"{"),
    Bad("unknown instance", "DELETE", "/instance/no-such-instance", 404, ("no-such-instance",)),
    Bad(
        "place_instance unknown model",
        "POST",
        "/place_instance",
        404,
        ("nope/model",),
        {"model_id": "nope/model"},
    ),
    Bad(
        "place_instance with no room",
        "POST",
        "/place_instance",
        400,
        ("No cycles found with sufficient memory",),
        {"model_id": "mlx-community/DeepSeek-V3.1-4bit"},
    ),
    Bad("unknown route", "GET", "/no/such/route", 404, ("Not Found",)),
    Bad("wrong method", "PUT", "/deployments", 405, ("Method Not Allowed",), {}),
    Bad("OPTIONS", "OPTIONS", "/deployments", 405, ("Method Not Allowed",)),
    Bad(
        "chat for a model with no instance",
        "POST",
        "/v1/chat/completions",
        404,
        (QWEN,),
        {"model": QWEN, "messages": [{"role": "user", "content": "hi"}]},
    ),
    Bad(  # the front door's own check (docs/design.md §8.6): a 400 naming the field
        "chat with no messages",
        "POST",
        "/v1/chat/completions",
        400,
        ("messages",),
        {"model": QWEN, "messages": []},
    ),
    Bad(
        "chat max_tokens 0",
        "POST",
        "/v1/chat/completions",
        422,
        ("max_tokens: Input should be greater than or equal to 1",),
        {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("bad", BAD_INPUTS, ids=[bad.name for bad in BAD_INPUTS])
async def test_bad_input_gets_a_4xx_naming_the_problem_and_changes_nothing(bad: Bad) -> None:
    async with running_master() as master, api_client(master) as client:
        await add_node(master, memory_gb=16)  # room for small models, never for DeepSeek
        existing = await client.post("/deployments", json={"model_id": LLAMA})
        assert existing.status_code == 200
        before = (await client.get("/state")).json()
        content = bad.raw if bad.raw is not None else json.dumps(bad.json_body).encode()
        if bad.method in {"GET", "DELETE", "OPTIONS"}:
            content = None
        path = bad.path.format(existing=existing.json()["deployment_id"])
        response = await client.request(bad.method, path, content=content, headers=bad.headers)
        assert_exo_error(response, bad.status, *bad.fragments)
        assert (await client.get("/state")).json() == before


@pytest.mark.anyio
async def test_a_whole_number_written_with_a_fraction_is_read_as_the_integer_it_is() -> None:
    # The document says min_nodes is an integer, and JSON Schema's integers include 2.0.
    async with running_master() as master, api_client(master) as client:
        created = await client.post("/deployments", json={"model_id": QWEN, "min_nodes": 2.0})
        assert created.status_code == 200, created.text
        (deployment,) = master.state.deployments.values()
        assert deployment.min_nodes == 2


@pytest.mark.anyio
async def test_a_chunked_body_over_the_limit_is_refused() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"model_id": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    async with running_master() as master, api_client(master) as client:
        response = await client.post("/deployments", content=chunks(), headers=JSON)
        assert "content-length" not in response.request.headers
        assert_exo_error(response, 413, "larger than")
        assert master.state.deployments == {}


@pytest.mark.anyio
async def test_a_second_deployment_of_a_model_is_a_conflict_naming_the_first() -> None:
    async with running_master() as master, api_client(master) as client:
        first = await client.post("/deployments", json={"model_id": QWEN})
        first_id = first.json()["deployment_id"]
        again = await client.post("/deployments", json={"model_id": QWEN, "min_nodes": 2})
        assert_exo_error(again, 409, first_id, QWEN)
        assert list(master.state.deployments) == [first_id]


@pytest.mark.anyio
async def test_tensor_sharding_of_a_model_without_tensor_support_is_refused() -> None:
    qwen = next(c for c in BUILTIN_MODEL_CARDS if c.model_id == QWEN)
    no_tensor = qwen.model_copy(update={"model_id": "acme/no-tensor", "supports_tensor": False})
    master = Master(None, config=MasterConfig(model_cards=(*BUILTIN_MODEL_CARDS, no_tensor)))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        async with api_client(master) as client:
            body = {"model_id": "acme/no-tensor", "sharding": "Tensor"}
            refused = await client.post("/deployments", json=body)
            assert_exo_error(refused, 400, "acme/no-tensor does not support tensor sharding")
            assert refused.json()["error"]["param"] == "sharding"
            assert master.state.deployments == {}
            body["sharding"] = "Pipeline"
            assert (await client.post("/deployments", json=body)).status_code == 200
        group.cancel_scope.cancel()


# --- success shapes ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_replicas_are_asked_for_on_create_and_shown_with_the_ready_count() -> None:
    async with running_master() as master, api_client(master) as client:
        created = await client.post("/deployments", json={"model_id": QWEN, "replicas": 3})
        assert created.status_code == 200
        (item,) = (await client.get("/deployments")).json()["deployments"]
        assert item["deployment"]["replicas"] == 3
        assert (item["replicas"], item["readyReplicas"]) == (3, 0)
        refused = await client.post("/deployments", json={"model_id": LLAMA, "replicas": 17})
        assert refused.status_code == 422
        assert "replicas" in refused.json()["error"]["message"]
        old_style = await client.post("/deployments", json={"model_id": LLAMA})
        assert old_style.status_code == 200
        by_model = {
            i["deployment"]["modelCard"]["modelId"]: i
            for i in (await client.get("/deployments")).json()["deployments"]
        }
        assert by_model[LLAMA]["replicas"] == 1


@pytest.mark.anyio
async def test_deployment_endpoints_answer_in_exo_shapes() -> None:
    async with running_master() as master, api_client(master) as client:
        created = await client.post(
            "/deployments", json={"model_id": LLAMA, "sharding": "Tensor", "min_nodes": 2}
        )
        assert created.status_code == 200
        assert set(created.json()) == {"message", "command_id", "deployment_id"}
        deployment_id = CommandResponse.model_validate(created.json()).deployment_id

        listed = await client.get("/deployments")
        assert listed.status_code == 200
        raw = listed.json()["deployments"][0]
        assert raw["deployment"]["deploymentId"] == deployment_id  # camelCase domain object
        assert raw["deployment"]["modelCard"]["modelId"] == LLAMA
        assert raw["deployment"]["sharding"] == "Tensor"
        assert raw["deployment"]["minNodes"] == 2
        assert raw["deployment"]["instanceId"] is None
        view = DeploymentsResponse.model_validate(listed.json()).deployments[0]
        assert view.status == "placing"
        assert view.waiting == "grace"  # a new master waits before placing
        assert view.next_attempt_at is not None and view.next_attempt_at.endswith("Z")
        assert view.next_attempt_in_s is not None and 0 < view.next_attempt_in_s <= 15

        deleted = await client.delete(f"/deployments/{deployment_id}")
        assert deleted.status_code == 200
        assert deleted.json()["deployment_id"] == deployment_id
        assert set(deleted.json()) == {"message", "command_id", "deployment_id"}
        assert (await client.get("/deployments")).json() == {"deployments": []}


@pytest.mark.anyio
async def test_state_models_healthz_and_instances() -> None:
    async with running_master() as master, api_client(master) as client:
        await add_node(master)
        state = await client.get("/state")
        assert state.status_code == 200
        assert "lastEventAppliedIdx" in state.json() and "nodeMemory" in state.json()
        assert State.model_validate_json(state.content) == master.state

        models = ModelList.model_validate((await client.get("/models")).json())
        ids = {entry.id for entry in models.data}
        for required in (
            QWEN,
            LLAMA,
            "mlx-community/Qwen3-30B-A3B-4bit",
            "mlx-community/Llama-3.3-70B-Instruct-4bit",
            "mlx-community/DeepSeek-V3.1-4bit",
        ):
            assert required in ids
        qwen = next(entry for entry in models.data if entry.id == QWEN)
        assert qwen.n_layers == 28 and qwen.storage_size_megabytes == 327

        health = await client.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"

        placed = await client.post("/place_instance", json={"model_id": QWEN})
        assert placed.status_code == 200, placed.text
        instance_id = placed.json()["instance_id"]
        assert set(placed.json()) == {"message", "command_id", "instance_id"}
        raw_state = (await client.get("/state")).json()
        assert "MlxRingInstance" in raw_state["instances"][instance_id]  # tagged union
        deleted = await client.delete(f"/instance/{instance_id}")
        assert deleted.status_code == 200
        assert master.state.instances == {}


# --- auth -------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "header", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN, f"Bearer {TOKEN.upper()}", "Bearer"]
)
async def test_changes_need_the_token(header: str | None) -> None:
    headers = {"authorization": header} if header is not None else None
    async with running_master() as master, api_client(master, TOKEN, headers) as client:
        for method, path, body in [
            ("POST", "/deployments", {"model_id": QWEN}),
            ("POST", "/place_instance", {"model_id": QWEN}),
            ("DELETE", "/deployments/x", None),
            ("DELETE", "/instance/x", None),
            ("POST", "/v1/chat/completions", {"model": QWEN, "messages": []}),
        ]:
            response = await client.request(method, path, json=body)
            assert_exo_error(response, 401, "bearer token")
            assert response.headers["www-authenticate"] == "Bearer"
        assert master.state.deployments == {}
        for path in ("/deployments", "/state", "/models", "/healthz"):
            assert (await client.get(path)).status_code == 200  # reads stay open


@pytest.mark.anyio
async def test_the_right_token_is_accepted_and_no_token_means_open() -> None:
    async with running_master() as master:
        bearer = {"authorization": f"Bearer {TOKEN}"}
        async with api_client(master, TOKEN, bearer) as client:
            assert (await client.post("/deployments", json={"model_id": QWEN})).status_code == 200
        async with api_client(master) as client:
            assert (await client.post("/deployments", json={"model_id": LLAMA})).status_code == 200
        assert len(master.state.deployments) == 2


def test_binding_beyond_loopback_requires_a_token() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    check_bind("0.0.0.0", "token")
    for host in ("0.0.0.0", "192.0.2.7", "::", "my-host.example"):
        with pytest.raises(InsecureBindError, match="EXO_DEPLOY_TOKEN"):
            check_bind(host, None)


# --- model cards ------------------------------------------------------------------------


def test_model_card_files_extend_the_catalog(tmp_path: Path) -> None:
    for source in FIXTURES.glob("*.toml"):
        (tmp_path / source.name).write_text(source.read_text())
    custom = (FIXTURES / "mlx-community--Qwen3-30B-A3B-4bit.toml").read_text()
    custom = custom.replace("mlx-community/Qwen3-30B-A3B-4bit", "custom/Tiny").replace(
        "n_layers = 48", "n_layers = 4"
    )
    (tmp_path / "custom.toml").write_text(custom)
    cards = {card.model_id: card for card in load_model_cards(tmp_path)}
    assert cards["mlx-community/DeepSeek-V3.1-4bit"].storage_size.in_bytes == 405_874_409_472
    assert cards["custom/Tiny"].n_layers == 4
    merged = merge_catalogs(BUILTIN_MODEL_CARDS, tuple(cards.values()))
    assert {card.model_id for card in BUILTIN_MODEL_CARDS} < {card.model_id for card in merged}
    assert len({card.model_id for card in merged}) == len(merged)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("model_id = ", "not a readable TOML file"), ('model_id = "x"\n', "n_layers: Field required")],
)
def test_a_bad_model_card_is_named(tmp_path: Path, content: str, fragment: str) -> None:
    (tmp_path / "broken.toml").write_text(content)
    with pytest.raises(ModelCardError, match=r"broken\.toml") as error:
        load_model_cards(tmp_path)
    assert fragment in str(error.value)


@pytest.mark.anyio
async def test_models_lists_cards_loaded_from_files(tmp_path: Path) -> None:
    custom = (FIXTURES / "mlx-community--Qwen3-30B-A3B-4bit.toml").read_text()
    (tmp_path / "c.toml").write_text(custom.replace("mlx-community/Qwen3-30B-A3B-4bit", "c/C"))
    cards = merge_catalogs(BUILTIN_MODEL_CARDS, load_model_cards(tmp_path))
    master = Master(None, config=MasterConfig(model_cards=cards))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        async with api_client(master) as client:
            ids = [entry["id"] for entry in (await client.get("/models")).json()["data"]]
            assert "c/C" in ids and QWEN in ids
            assert (await client.post("/deployments", json={"model_id": "c/C"})).status_code == 200
        group.cancel_scope.cancel()


# --- scaling ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_patch_scales_a_deployment_durably_and_the_same_count_is_a_no_op() -> None:
    config = MasterConfig(startup_grace_s=0, keeper_interval_s=0.05)
    master = Master(None, config=config)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        async with api_client(master) as client:
            await add_node(master, "node-a", memory_gb=16)
            await add_node(master, "node-b", memory_gb=16)
            created = await client.post("/deployments", json={"model_id": QWEN, "replicas": 2})
            deployment_id = created.json()["deployment_id"]
            with anyio.fail_after(10):
                while len(master.state.deployments[deployment_id].placed_instance_ids) < 2:
                    await anyio.sleep(0.02)
            oldest, newest = master.state.deployments[deployment_id].placed_instance_ids
            nodes = [
                set(master.state.instances[i].shard_assignments.node_to_runner)
                for i in (oldest, newest)
            ]
            assert nodes[0].isdisjoint(nodes[1])  # replicas apart

            scaled = await client.patch(f"/deployments/{deployment_id}", json={"replicas": 1})
            assert scaled.status_code == 200, scaled.text
            body = CommandResponse.model_validate(scaled.json())
            assert body.deployment_id == deployment_id
            assert "from 2 to 1" in body.message
            # Durable and applied before the answer: the newest instance is gone already.
            deployment = master.state.deployments[deployment_id]
            assert deployment.replicas == 1
            assert set(master.state.instances) == {oldest}
            assert deployment.placed_instance_ids == (oldest,)

            before = (await client.get("/state")).json()
            again = await client.patch(f"/deployments/{deployment_id}", json={"replicas": 1})
            assert again.status_code == 200, again.text
            assert "already keeps 1" in again.json()["message"]
            assert (await client.get("/state")).json() == before

            listed = DeploymentsResponse.model_validate((await client.get("/deployments")).json())
            (view,) = listed.deployments
            assert view.replicas == 1
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_standby_is_set_on_create_and_by_patch_and_listed() -> None:
    master = Master(None, config=MasterConfig(startup_grace_s=0, keeper_interval_s=0.05))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        async with api_client(master) as client:
            created = await client.post("/deployments", json={"model_id": QWEN, "standby": 0})
            assert created.status_code == 200, created.text
            deployment_id = created.json()["deployment_id"]
            assert master.state.deployments[deployment_id].standby == 0
            listed = DeploymentsResponse.model_validate((await client.get("/deployments")).json())
            assert listed.deployments[0].staging is None  # no standby, nothing to say

            changed = await client.patch(f"/deployments/{deployment_id}", json={"standby": 2})
            assert changed.status_code == 200, changed.text
            assert "keeps 2 standby set(s), was 0" in changed.json()["message"]
            assert master.state.deployments[deployment_id].standby == 2
            again = await client.patch(f"/deployments/{deployment_id}", json={"standby": 2})
            assert "already keeps 2 standby" in again.json()["message"]
            listed = DeploymentsResponse.model_validate((await client.get("/deployments")).json())
            (view,) = listed.deployments
            assert view.deployment.standby == 2 and view.staged == []
            assert view.staging is not None and view.staging.startswith("standby")
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_priority_and_preempt_are_set_on_create_and_by_patch_and_listed() -> None:
    async with running_master() as master, api_client(master) as client:
        plain = await client.post("/deployments", json={"model_id": LLAMA})
        assert plain.status_code == 200, plain.text
        created = await client.post(
            "/deployments", json={"model_id": QWEN, "priority": 900, "preempt": True}
        )
        assert created.status_code == 200, created.text
        deployment_id = created.json()["deployment_id"]
        listed = (await client.get("/deployments")).json()["deployments"]
        by_model = {item["deployment"]["modelCard"]["modelId"]: item for item in listed}
        assert (
            by_model[QWEN]["deployment"]["priority"],
            by_model[QWEN]["deployment"]["preempt"],
        ) == (
            900,
            True,
        )
        # Not given: the default, which is also what a deployment from before priorities reads as.
        assert (
            by_model[LLAMA]["deployment"]["priority"],
            by_model[LLAMA]["deployment"]["preempt"],
        ) == (
            500,
            False,
        )

        path = f"/deployments/{deployment_id}"
        lowered = await client.patch(path, json={"priority": 100})
        assert lowered.status_code == 200, lowered.text
        message = lowered.json()["message"]
        assert "now has priority 100, preempting, was priority 900, preempting" in message
        deployment = master.state.deployments[deployment_id]
        assert (deployment.priority, deployment.preempt) == (100, True)
        off = await client.patch(path, json={"preempt": False})
        assert "not preempting" in off.json()["message"]
        assert master.state.deployments[deployment_id].preempt is False
        before = master.state.last_event_applied_idx
        again = await client.patch(path, json={"priority": 100, "preempt": False})
        assert "already has priority 100, not preempting" in again.json()["message"]
        assert master.state.last_event_applied_idx == before  # the same again: no event
        # With the replicas in the same request, the answer says what each setting did.
        both = await client.patch(path, json={"priority": 700, "replicas": 2})
        assert both.status_code == 200, both.text
        assert "now has priority 700" in both.json()["message"]
        assert "scaled from 1 to 2" in both.json()["message"]
        assert master.state.deployments[deployment_id].replicas == 2


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer"])
async def test_the_scheme_s_name_is_case_insensitive(scheme: str) -> None:
    """RFC 7235: the scheme's name is case-insensitive; the token itself is not."""
    header = {"authorization": f"{scheme} {TOKEN}"}
    async with running_master() as master, api_client(master, TOKEN, header) as client:
        created = await client.post("/deployments", json={"model_id": QWEN})
        assert created.status_code == 200, created.text


@pytest.mark.anyio
async def test_repair_is_set_on_create_and_by_patch_and_health_is_listed() -> None:
    async with running_master() as master, api_client(master) as client:
        plain = await client.post("/deployments", json={"model_id": LLAMA})
        created = await client.post("/deployments", json={"model_id": QWEN, "repair": "report"})
        assert created.status_code == 200, created.text
        deployment_id = created.json()["deployment_id"]
        listed = (await client.get("/deployments")).json()["deployments"]
        by_model = {item["deployment"]["modelCard"]["modelId"]: item for item in listed}
        assert by_model[QWEN]["deployment"]["repair"] == "report"
        assert by_model[LLAMA]["deployment"]["repair"] == "auto"  # the default
        assert by_model[QWEN]["health"] is None  # nothing broken (no instance at all)
        path = f"/deployments/{deployment_id}"
        changed = await client.patch(path, json={"repair": "auto"})
        assert "now has repair auto, was report" in changed.json()["message"]
        assert master.state.deployments[deployment_id].repair == "auto"
        before = master.state.last_event_applied_idx
        again = await client.patch(path, json={"repair": "auto"})
        assert "already has repair auto" in again.json()["message"]
        assert master.state.last_event_applied_idx == before
        assert plain.status_code == 200
