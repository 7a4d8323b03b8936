"""The exo stand-in (``master --exo-compat``) answers with the keys exo 0.3.70 answers with.

Every route is compared with exo's own answer in ``tests/fixtures/exo_recordings`` by its key
set, recursively: maps keyed by ids (nodes, runners, instances, models) are compared by the
union of their values' keys, lists by the union of their items'. An answer with a key exo's
lacks, or lacking one exo's has, fails, so drift either way is caught. Values are compared
where they do not depend on ids, ports or which of several equal nodes was picked: exo's
figures, refusals and error bodies.

``GET /state`` is a subset of exo's (exo has keys for hardware we do not simulate); the stand-in
must carry at least ``STATE_KEYS_READ``: what the keeper, the bridge's fail-closed check and the
TUI read.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import exo_with_bridge, wait_until
from model_ids import QWEN
from recorded_exo import RECORDINGS

from keeper.model.state import (
    DownloadCompleted,
    DownloadOngoing,
    DownloadPending,
    InstanceMeta,
    Sharding,
    State,
    download_model_id,
)
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.exo_standin.model_list import CARD_SOURCES, MEBIBYTE, exo_catalog, exo_full_cards
from keeper.sim.exo_standin.placement_answers import exo_place, exo_previews, memory_delta_by_node
from keeper.sim.master.service import Master

GEMMA_4 = "mlx-community/gemma-4-26b-a4b-it-4bit"
PLACEMENT_QUERY = {"sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": "1"}
# The State's keys someone reads: the keeper and the bridge (instances, runners, topology,
# nodeMemory: the fail-closed check), the TUI (identities, last seen, backends, downloads).
STATE_KEYS_READ = {
    "instances",
    "runners",
    "topology",
    "nodeMemory",
    "nodeIdentities",
    "nodeBackends",
    "nodeNetwork",
    "lastSeen",
    "lastEventAppliedIdx",
    "downloads",
}
# The States exo recorded, together holding every key its State takes in these stages.
RECORDED_STATES = (
    "state-3-nodes-idle.json",
    "state-instance-loading.json",
    "state-instance-ready.json",
    "state-two-node-pipeline-ready.json",
    "state-node-timed-out.json",
    "state-node-timed-out-instance-deleted.json",
    "state-downloading.json",
    "state-staged.json",
)
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Shape = dict[str, "Shape"]


def recorded(name: str) -> Any:
    return json.loads((RECORDINGS / name).read_text())


def shape(value: Any) -> Shape:
    """The keys of ``value``, recursively; an id key (not a field name) stands as ``*`` and a
    list as ``[]``, each merging the shapes of all its values."""
    merged: Shape = {}
    if isinstance(value, dict):
        for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
            name = str(key) if _FIELD_NAME.match(str(key)) else "*"  # pyright: ignore[reportUnknownArgumentType]
            merged[name] = _merge(merged.get(name, {}), shape(item))
    elif isinstance(value, list):
        merged["[]"] = {}
        for item in value:  # pyright: ignore[reportUnknownVariableType]
            merged["[]"] = _merge(merged["[]"], shape(item))
    return merged


def _merge(a: Shape, b: Shape) -> Shape:
    return {key: _merge(a.get(key, {}), b.get(key, {})) for key in a.keys() | b.keys()}


def missing(ours: Shape, theirs: Shape, path: str = "") -> list[str]:
    """The key paths ``theirs`` has and ``ours`` lacks."""
    found: list[str] = []
    for key, sub in theirs.items():
        where = f"{path}.{key}" if path else key
        if key not in ours:
            found.append(where)
        else:
            found.extend(missing(ours[key], sub, where))
    return found


def assert_same_keys(ours: Any, theirs: Any) -> None:
    a, b = shape(ours), shape(theirs)
    assert (missing(a, b), missing(b, a)) == ([], []), "(lacking exo's keys, keys exo lacks)"


def without_inputs(body: Any) -> Any:
    return {"detail": [{**error, "input": None} for error in body["detail"]]}


def idle_state() -> State:
    return State.model_validate(recorded("state-3-nodes-idle.json"))


# --- the pure placement against exo's recorded cluster ------------------------------------------


def test_a_placement_is_exo_s_instance_with_exo_s_full_card() -> None:
    ours = exo_place(idle_state(), exo_catalog()[QWEN], Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
    theirs = recorded("instance-placement-ok.json")
    assert_same_keys(ours, theirs)
    (our_shard,) = ours["MlxRingInstance"]["shardAssignments"]["runnerToShard"].values()
    (their_shard,) = theirs["MlxRingInstance"]["shardAssignments"]["runnerToShard"].values()
    assert our_shard == their_shard  # the full card, ranks and layers: no id in a shard


def test_previews_list_what_exo_lists_in_exo_s_order() -> None:
    ours = exo_previews(idle_state(), exo_catalog()[QWEN])
    theirs = recorded("instance-previews.json")
    assert_same_keys({"previews": ours}, theirs)

    def summary(previews: list[Any]) -> list[tuple[Any, ...]]:
        # Which node of three equal ones exo picks is its cycle order's accident: compare the
        # figures, not the ids.
        return [
            (
                p["sharding"],
                p["instance_meta"],
                p["error"],
                sorted((p["memory_delta_by_node"] or {}).values()),
            )
            for p in previews
        ]

    assert summary(ours) == summary(theirs["previews"])


def test_a_placement_prefers_the_nodes_that_hold_the_model() -> None:
    # Recorded 2 s into a download of Qwen3-0.6B to a second node: completed on the node serving
    # it, 61% along on the second, nothing on the third; all three have 64 GiB free.
    state = State.model_validate(recorded("state-downloading.json"))
    completed, ongoing, bare = (
        "5763eeb9-da3e-4a1b-8b43-ed46f68c9532",
        "d2f80960-d20d-4473-b970-8318b488d614",
        "afe8d40b-b548-479a-bc21-3907aecfb5d1",
    )

    def nodes(state: State, min_nodes: int) -> set[str]:
        model = exo_catalog()[QWEN]
        placed = exo_place(state, model, Sharding.PIPELINE, InstanceMeta.MLX_RING, min_nodes)
        return set(placed["MlxRingInstance"]["shardAssignments"]["nodeToRunner"])

    assert nodes(state, 2) == {completed, ongoing}
    # Without the downloads, equal memory: the smallest ids.
    assert nodes(state.model_copy(update={"downloads": {}}), 2) == {completed, bare}
    only_ongoing = state.model_copy(update={"downloads": {ongoing: state.downloads[ongoing]}})
    assert nodes(only_ongoing, 1) == {ongoing}


def test_the_memory_delta_splits_the_size_and_gives_the_remainder_to_the_first_ids() -> None:
    assert memory_delta_by_node(["b", "a", "c"], 10) == {"a": 4, "b": 3, "c": 3}


def test_no_node_no_previews() -> None:
    assert exo_previews(State(), exo_catalog()[QWEN]) == []


def test_exo_s_own_refusals() -> None:
    state, catalog = idle_state(), exo_catalog()
    refusals = {
        (GEMMA_4, 2): "Pipeline parallelism is not supported for Gemma 4",
        (GEMMA_4, 1): "no full model card",  # one node would do: the layer count is missing
        ("mlx-community/DeepSeek-V3.1-8bit", 1): "No cycles found with sufficient memory",
        ("mlx-community/Qwen3-30B-A3B-4bit", 4): "No cycles found with sufficient memory",
    }
    for (model_id, min_nodes), reason in refusals.items():
        with pytest.raises(ValueError, match=reason):
            exo_place(state, catalog[model_id], Sharding.PIPELINE, InstanceMeta.MLX_RING, min_nodes)


def test_one_node_is_no_rdma_cycle_and_no_tensor_split() -> None:
    state, model = idle_state(), exo_catalog()["mlx-community/Qwen3-30B-A3B-4bit"]
    with pytest.raises(ValueError, match="no RDMA-connected cycles"):
        exo_place(state, model, Sharding.PIPELINE, InstanceMeta.MLX_JACCL, 1)
    alone = exo_place(state, model, Sharding.TENSOR, InstanceMeta.MLX_RING, 1)
    (shard,) = alone["MlxRingInstance"]["shardAssignments"]["runnerToShard"].values()
    assert list(shard) == ["PipelineShardMetadata"]
    split = exo_place(state, model, Sharding.TENSOR, InstanceMeta.MLX_RING, 2)
    shards = split["MlxRingInstance"]["shardAssignments"]["runnerToShard"].values()
    assert [list(shard) for shard in shards] == [["TensorShardMetadata"]] * 2


def test_deepseek_v3_1_8bit_is_never_pipelined_once_it_fits() -> None:
    raw = recorded("state-3-nodes-idle.json")
    for usage in raw["nodeMemory"].values():
        usage["ramAvailable"]["inBytes"] = usage["ramTotal"]["inBytes"] = 512 * 1024**3
    model = exo_catalog()["mlx-community/DeepSeek-V3.1-8bit"]
    with pytest.raises(ValueError, match=r"not supported for DeepSeek V3.1 \(8-bit\)"):
        exo_place(State.model_validate(raw), model, Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)


def test_shipped_cards_are_exo_s_and_agree_with_exo_s_list() -> None:
    catalog, cards = exo_catalog(), exo_full_cards()
    assert len(catalog) == 123
    assert set(cards) == set(CARD_SOURCES)
    recorded_card = recorded("post-instance-response.json")["model_card"]
    for model_id, card in cards.items():
        listed = catalog[model_id].listed
        assert list(card) == list(recorded_card), model_id  # exo's keys, in exo's order
        assert card["storageSize"]["inBytes"] // MEBIBYTE == listed["storage_size_megabytes"]
        assert (card["family"], card["baseModel"], card["capabilities"]) == (
            listed["family"],
            listed["base_model"],
            listed["capabilities"],
        )
        assert (card["supportsTensor"], card["contextLength"], card["reasoningDialect"]) == (
            listed["supports_tensor"],
            listed["context_length"],
            listed["reasoning_dialect"],
        )
    assert cards[QWEN] == recorded_card


# --- the routes --------------------------------------------------------------------------------


@asynccontextmanager
async def stand_in() -> AsyncIterator[tuple[Master, httpx.AsyncClient]]:
    nodes = (("n1", 64.0), ("n2", 64.0), ("n3", 64.0))  # as in the recordings
    async with exo_with_bridge(nodes=nodes) as h:
        transport = httpx.ASGITransport(app=create_exo_compat_app(h.master))
        async with httpx.AsyncClient(transport=transport, base_url="http://exo") as client:
            yield h.master, client


async def place_qwen(exo: httpx.AsyncClient) -> Any:
    response = await exo.get("/instance/placement", params={"model_id": QWEN, **PLACEMENT_QUERY})
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.anyio
async def test_placement_post_state_and_delete_answer_with_exo_s_keys() -> None:
    async with stand_in() as (master, exo):
        instance = await place_qwen(exo)
        assert_same_keys(instance, recorded("instance-placement-ok.json"))

        posted = await exo.post("/instance", json={"instance": instance})
        assert posted.status_code == 200, posted.text
        assert_same_keys(posted.json(), recorded("post-instance-response.json"))
        assert posted.json()["model_card"] == recorded("post-instance-response.json")["model_card"]

        instance_id = instance["MlxRingInstance"]["instanceId"]
        await wait_until(
            lambda: (
                all(
                    "RunnerReady" in status.model_dump() for status in master.state.runners.values()
                )
                and instance_id in master.state.instances
            ),
            60,
            "the instance ready",
        )
        state = (await exo.get("/state")).json()
        assert state["instances"][instance_id] == instance  # as posted: exo's full card
        assert state.keys() >= STATE_KEYS_READ
        exo_keys: Shape = {}
        for name in RECORDED_STATES:
            exo_keys = _merge(exo_keys, shape(recorded(name)))
        assert missing(exo_keys, shape(state)) == [], "keys exo's State never has"
        assert_same_keys(
            (await exo.get("/state/nodeMemory")).json(), recorded("state-path-nodeMemory.json")
        )

        deleted = await exo.delete(f"/instance/{instance_id}")
        assert deleted.status_code == 200
        assert_same_keys(deleted.json(), recorded("delete-instance-response.json"))
        assert deleted.json()["instance_id"] == instance_id


@pytest.mark.anyio
async def test_refusals_are_exo_s_bodies() -> None:
    async with stand_in() as (_, exo):
        gemma = await exo.get(
            "/instance/placement", params={**PLACEMENT_QUERY, "model_id": GEMMA_4, "min_nodes": 2}
        )
        assert (gemma.status_code, gemma.json()) == (
            400,
            recorded("instance-placement-refused-gemma4-pipeline.json"),
        )
        unknown_id = "52e5e3ec-deb2-422e-a76f-000000000000"
        unknown = await exo.delete(f"/instance/{unknown_id}")
        expected = recorded("delete-instance-unknown-response.json")
        assert (unknown.status_code, unknown.json()) == (expected["status"], expected["body"])

        too_big = recorded("post-instance-bad-insufficient-memory.json")
        answer = await exo.post("/instance", json=too_big["request"])
        assert (answer.status_code, answer.json()) == (400, too_big["response"])

        no_path = await exo.get("/state/nodeMemory/no-such-node")
        assert no_path.status_code == 404
        assert_same_keys(no_path.json(), expected["body"])
        assert no_path.json()["error"]["message"] == (
            "unable to find path 'nodeMemory.no-such-node' in state json"
        )


@pytest.mark.anyio
@pytest.mark.parametrize(
    "name",
    ["post-instance-bad-unknown-tag.json", "post-instance-bad-missing-shard-assignments.json"],
)
async def test_a_body_that_fails_validation_gets_fastapi_s_422(name: str) -> None:
    bad = recorded(name)
    async with stand_in() as (master, exo):
        answer = await exo.post("/instance", json=bad["request"])
        assert answer.status_code == bad["status"] == 422
        # Each error echoes the part of the body it is about (``input``): which parts those
        # are follows each parser's way through the union, so only the envelope is compared.
        assert_same_keys(without_inputs(answer.json()), without_inputs(bad["response"]))
        assert master.state.instances == {}


@pytest.mark.anyio
async def test_bad_queries_and_unknown_models() -> None:
    async with stand_in() as (_, exo):
        bad_enum = await exo.get(
            "/instance/placement", params={**PLACEMENT_QUERY, "model_id": QWEN, "sharding": "Diag"}
        )
        assert bad_enum.status_code == 422
        assert bad_enum.json()["detail"][0]["loc"] == ["query", "sharding"]
        for path in ("/instance/placement", "/instance/previews"):
            unknown = await exo.get(path, params={"model_id": "nobody/nothing"})
            assert unknown.status_code == 400
            assert "nobody/nothing" in unknown.json()["error"]["message"]
            assert (await exo.get(path)).status_code == 422  # no model_id


@pytest.mark.anyio
async def test_previews_and_models_answer_exo_s_shapes() -> None:
    async with stand_in() as (_, exo):
        previews = await exo.get("/instance/previews", params={"model_id": QWEN})
        assert previews.status_code == 200
        assert_same_keys(previews.json(), recorded("instance-previews.json"))
        assert (await exo.get("/models")).json() == recorded("models.json")


# --- downloads ---------------------------------------------------------------------------------


def download_entries(state: Any, node_id: str) -> dict[str, tuple[str, Any]]:
    """A node's entries in a ``GET /state`` body: model id -> (exo's tag, fields)."""
    found: dict[str, tuple[str, Any]] = {}
    for entry in state["downloads"].get(node_id, []):
        ((tag, fields),) = entry.items()
        ((_, shard),) = fields["shardMetadata"].items()
        found[shard["modelCard"]["modelId"]] = (tag, fields)
    return found


@pytest.mark.anyio
async def test_download_routes_answer_with_exo_s_shapes_and_the_entries_follow() -> None:
    async with stand_in() as (master, exo):
        serving = await place_qwen(exo)
        (serving_node,) = serving["MlxRingInstance"]["shardAssignments"]["nodeToRunner"]
        assert (await exo.post("/instance", json={"instance": serving})).status_code == 200
        other = next(node for node in master.state.topology.nodes if node != serving_node)
        request = {**recorded("download-start-request.json"), "target_node_id": other}

        async def state() -> Any:
            return (await exo.get("/state")).json()

        async def tag_on(node: str) -> str | None:
            entry = download_entries(await state(), node).get(QWEN)
            return entry[0] if entry is not None else None

        await wait_until(
            lambda: any(
                isinstance(entry, DownloadCompleted)
                for entry in master.state.downloads.get(serving_node, [])
            ),
            30,
            "the serving node downloaded its model",
        )
        started = await exo.post("/download/start", json=request)
        assert started.status_code == 200, started.text
        assert_same_keys(started.json(), recorded("download-start-response.json"))
        ongoing_state: list[Any] = []

        def caught_ongoing() -> bool:
            entry = next(
                (e for e in master.state.downloads.get(other, []) if download_model_id(e) == QWEN),
                None,
            )
            return isinstance(entry, DownloadOngoing)

        await wait_until(caught_ongoing, 10, "the other node downloading")
        ongoing_state.append(await state())
        # exo's State 2 s into that download: the same keys, entries and disks and vitals.
        downloading = recorded("state-downloading.json")
        assert_same_keys(ongoing_state[0]["downloads"], downloading["downloads"])
        assert_same_keys(ongoing_state[0]["nodeDisk"], downloading["nodeDisk"])
        assert_same_keys(ongoing_state[0]["nodeSystem"], downloading["nodeSystem"])
        (_, fields) = download_entries(ongoing_state[0], other)[QWEN]
        their_ongoing = next(
            e["DownloadOngoing"]
            for entries in downloading["downloads"].values()
            for e in entries
            if "DownloadOngoing" in e
        )
        assert fields["shardMetadata"] == their_ongoing["shardMetadata"]  # exo's card and all
        assert fields["downloadProgress"]["totalFiles"] == 8
        assert fields["modelDirectory"] == their_ongoing["modelDirectory"]

        await wait_until(lambda: tag_done(master, other), 10, "downloaded")
        staged = recorded("state-staged.json")
        assert_same_keys((await state())["downloads"], staged["downloads"])

        # camelCase keys are read too, as exo's do; a model on disk: nothing to download.
        camel = {"targetNodeId": other, "shardMetadata": request["shard_metadata"]}
        assert (await exo.post("/download/start", json=camel)).status_code == 200

        cancelled = await exo.post(
            "/download/cancel", json={"target_node_id": other, "model_id": QWEN}
        )
        assert cancelled.status_code == 200
        assert_same_keys(cancelled.json(), recorded("download-start-response.json"))

        deleted = await exo.delete(f"/download/{other}/{QWEN}")
        assert deleted.status_code == 200
        assert_same_keys(deleted.json(), recorded("download-delete-response.json"))
        assert deleted.json()["commandId"] != started.json()["commandId"]
        await wait_until(lambda: tag_is(master, other, DownloadPending), 10, "deleted")
        assert await tag_on(other) == "DownloadPending"  # exo's entry after a deletion
        # A runner's files are kept: exo's worker would reload them at once.
        await exo.delete(f"/download/{serving_node}/{QWEN}")
        await anyio.sleep(2)
        assert await tag_on(serving_node) == "DownloadCompleted"

        # exo publishes a command for any node id and answers it; so does the stand-in.
        for answer in (
            await exo.post("/download/start", json={**request, "target_node_id": "nobody"}),
            await exo.delete(f"/download/nobody/{QWEN}"),
            await exo.post("/download/cancel", json={"target_node_id": "x", "model_id": QWEN}),
        ):
            assert answer.status_code == 200
            assert_same_keys(answer.json(), recorded("download-start-response.json"))


def tag_is(master: Master, node_id: str, kind: type[Any]) -> bool:
    entries = master.state.downloads.get(node_id, [])
    return any(isinstance(e, kind) for e in entries if download_model_id(e) == QWEN)


def tag_done(master: Master, node_id: str) -> bool:
    return tag_is(master, node_id, DownloadCompleted)


@pytest.mark.anyio
async def test_a_download_body_exo_would_refuse_gets_fastapi_s_422_as_exo_s() -> None:
    bad = recorded("download-start-bad.json")
    async with stand_in() as (_, exo):
        answer = await exo.post("/download/start", json={"target_node_id": "x"})
        assert (answer.status_code, answer.json()) == (bad["status"], bad["body"])
        # As strict as exo's: a number is not a string, and unknown keys are refused.
        for body in (
            {"target_node_id": 1, "model_id": QWEN},
            {"target_node_id": "x", "model_id": QWEN, "extra": True},
            {"model_id": QWEN},
        ):
            refused = await exo.post("/download/cancel", json=body)
            assert refused.status_code == 422, body
            assert refused.json()["detail"][0]["loc"][0] == "body"
