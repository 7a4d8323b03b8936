"""The bridge places through exo: exo's placement posted verbatim, exo's refusals kept by the
keeper's rules, our placement only for an exo without the endpoint, and every model exo lists
deployable. In virtual time, against the stand-in with exo's recorded answers scripted on the
link (``tests/bridge_harness.py``, ``tests/fixtures/exo_recordings``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import (
    ExoWithBridge,
    exo_with_bridge,
    new_bridge,
    recorded,
    recorded_card,
    wait_until,
    where_exo_places,
)
from model_ids import QWEN

from keeper.bridge.exo_client import ExoClient
from keeper.bridge.placement_choice import (
    ExoPlacement,
    Preview,
    choose_apart,
    preview_card,
    read_previews,
)
from keeper.bridge.placing import NO_ANSWERS, PlacementAnswers, StepPlacement, due_for_placement
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.core.keeper import DeploymentTimer, Keeper
from keeper.core.view import nodes_serving
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.constants import STARTUP_GRACE, UNPLACEABLE_RETRY
from keeper.model.events import DeploymentPlacementFailed
from keeper.model.state import Deployment, InstanceMeta, Sharding, State
from keeper.sim.exo_standin.app import ExoCreateInstance

GEMMA = "mlx-community/gemma-4-26b-a4b-it-4bit"
DEEPSEEK_V4 = "mlx-community/DeepSeek-V4-Flash"
PLACEMENT = "/instance/placement"


def posted(h: ExoWithBridge) -> list[Any]:
    return [body for method, path, body in h.link.calls if (method, path) == ("POST", "/instance")]


def asked(h: ExoWithBridge) -> list[dict[str, str]]:
    return [query for path, query in h.link.queries if path == PLACEMENT]


def failures_logged(data_dir: Path) -> int:
    """DeploymentPlacementFailed events in the bridge's durable event log."""
    return sum(
        path.read_text().count('"DeploymentPlacementFailed"') for path in data_dir.glob("*.jsonl")
    )


async def restart_with(h: ExoWithBridge, config: BridgeConfig) -> None:
    h.bridge_scope.cancel()
    h.bridge = new_bridge(h.link, None, config)
    await h.group.start(h.bridge.run)


@pytest.mark.anyio
async def test_exo_s_placement_is_posted_byte_for_byte_and_its_id_kept() -> None:
    placement = recorded("instance-placement-ok.json")
    async with exo_with_bridge() as h:
        h.link.answers[("GET", PLACEMENT)] = lambda _: (200, placement)
        created = await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(posted(h)), STARTUP_GRACE + 5, "an instance posted")
        assert asked(h) == [
            {"model_id": QWEN, "sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": "1"}
        ]
        (body,) = posted(h)
        # The same JSON, key order included: nothing of exo's card or shards was re-encoded.
        assert json.dumps(body) == json.dumps({"instance": placement})
        assert body == recorded("post-instance-request.json")
        (ring,) = placement.values()
        await wait_until(
            lambda: (
                h.bridge.state.deployments[created.deployment_id or ""].instance_id
                == ring["instanceId"]
            ),
            5,
            "the deployment names exo's instance id",
        )


@pytest.mark.anyio
async def test_exo_s_refusal_is_the_placement_error_retried_by_the_keeper_s_rules(
    tmp_path: Path,
) -> None:
    refusal = recorded("instance-placement-refused-gemma4-pipeline.json")
    async with exo_with_bridge(data_dir=tmp_path) as h:
        h.link.answers[("GET", "/models")] = lambda _: (200, recorded("models.json"))
        h.link.answers[("GET", PLACEMENT)] = lambda _: (400, refusal)
        await h.bridge.create_deployment(GEMMA, min_nodes=2)
        await wait_until(lambda: h.status() == "cant_place", STARTUP_GRACE + 5, "cant_place")
        (view,) = h.bridge.deployments_view().deployments
        assert view.deployment.placement_error == refusal["error"]["message"]
        assert view.waiting == "unplaceable_retry"
        assert asked(h)[0]["min_nodes"] == "2"
        first_at = anyio.current_time()

        # Asked again every 30 s on an unchanged cluster; the same reason is not recorded again.
        await anyio.sleep(2 * UNPLACEABLE_RETRY + 0.5)
        assert len(asked(h)) == 3
        assert failures_logged(tmp_path) == 1

        # A node leaving changes the cluster: asked again at once, not at the next 30 s. (It
        # leaves exo's State 30 s after it stops, 10 s past a periodic retry: 4 asks by then.)
        await anyio.sleep(10)
        node_b = h.nodes.node("b").node_id
        h.nodes.crash("b", 1000)
        await wait_until(
            lambda: node_b not in h.master.state.topology.nodes, 40, "node b left exo's State"
        )
        gone_at = anyio.current_time()
        took = await wait_until(lambda: len(asked(h)) == 5, 2, "asked again")
        since_retry = (gone_at + took - first_at) % UNPLACEABLE_RETRY
        assert 5 < since_retry < UNPLACEABLE_RETRY - 5, since_retry  # not the periodic retry
        assert posted(h) == []
        assert failures_logged(tmp_path) == 1


@pytest.mark.anyio
async def test_an_unreadable_placement_answer_is_a_placement_error_and_nothing_is_posted() -> None:
    async with exo_with_bridge() as h:
        h.link.answers[("GET", PLACEMENT)] = lambda _: (200, {"MlxRingInstance": {"x": 1}})
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: h.status() == "cant_place", STARTUP_GRACE + 5, "cant_place")
        (view,) = h.bridge.deployments_view().deployments
        error = view.deployment.placement_error or ""
        assert error.startswith(f"exo's placement of {QWEN} cannot be used: "), error
        assert "instanceId" in error
        assert posted(h) == []


@pytest.mark.anyio
async def test_without_exo_s_placement_the_bridge_places_with_exo_s_full_card() -> None:
    async with exo_with_bridge() as h:
        # An older exo, without the endpoint.
        h.link.answers[("GET", PLACEMENT)] = lambda _: (404, {"detail": "Not Found"})
        await restart_with(h, BridgeConfig(exo_card_files={QWEN: recorded_card()}))
        await h.bridge.create_deployment(QWEN)
        await wait_until(h.serving, STARTUP_GRACE + 10, "serving")
        (body,) = posted(h)
        ExoCreateInstance.model_validate(body)
        (ring,) = body["instance"].values()
        for tagged in ring["shardAssignments"]["runnerToShard"].values():
            (shard,) = tagged.values()
            assert shard["modelCard"] == recorded_card()  # temperature 0.6, top-k 20...
        assert ("GET", PLACEMENT, None) in h.link.calls


@pytest.mark.anyio
async def test_without_exo_s_placement_or_a_full_card_the_deployment_says_so() -> None:
    async with exo_with_bridge() as h:
        h.link.answers[("GET", PLACEMENT)] = lambda _: (404, {"detail": "Not Found"})
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: h.status() == "cant_place", STARTUP_GRACE + 5, "cant_place")
        (view,) = h.bridge.deployments_view().deployments
        assert "--model-cards DIR" in (view.deployment.placement_error or "")
        assert "no GET /instance/placement" in (view.deployment.placement_error or "")
        await anyio.sleep(UNPLACEABLE_RETRY + 1)
        assert posted(h) == []


@pytest.mark.anyio
@pytest.mark.parametrize("model_id", [GEMMA, DEEPSEEK_V4])
async def test_a_model_only_exo_s_list_names_can_be_deployed(model_id: str) -> None:
    models = recorded("models.json")
    (listed,) = [entry for entry in models["data"] if entry["id"] == model_id]
    async with exo_with_bridge() as h:
        h.link.answers[("GET", "/models")] = lambda _: (200, models)
        created = await h.bridge.create_deployment(model_id)
        card = h.bridge.state.deployments[created.deployment_id or ""].model_card
        assert model_id not in h.bridge.catalog
        assert card.storage_size.in_bytes == listed["storage_size_megabytes"] * 1024 * 1024
        assert (card.n_layers, card.hidden_size) == (0, 0)  # not given by exo: unknown
        assert card.supports_tensor is listed["supports_tensor"]


@pytest.mark.anyio
async def test_a_model_outside_the_catalog_takes_exo_s_card_from_its_previews() -> None:
    async with exo_with_bridge() as h:
        h.link.answers[("GET", "/instance/previews")] = lambda _: (
            200,
            recorded("instance-previews.json"),
        )
        await restart_with(h, BridgeConfig(model_cards=()))
        created = await h.bridge.create_deployment(QWEN)
        card = h.bridge.state.deployments[created.deployment_id or ""].model_card
        exo_card = recorded_card()
        assert (card.n_layers, card.hidden_size) == (exo_card["nLayers"], exo_card["hiddenSize"])
        assert card.supports_tensor is False  # exo's figure, not our catalog's
        assert h.link.queries == [("/instance/previews", {"model_id": QWEN})]


# --- choosing a placement apart from the model's other instances (replicas) -------------------

NODE_1, NODE_2, NODE_3 = (
    "3c018300-0485-4175-ad91-d7a662574ccb",
    "1f78d918-284c-4bf1-b42e-5fb18eb00058",
    "94a0d3cb-1ded-4ee0-b39f-c4382b95641e",
)


def state_with_qwen_on(node: str) -> State:
    """exo's recorded State with Qwen3-0.6B ready, its one runner moved to ``node``."""
    raw = recorded("state-instance-ready.json")
    (ring,) = next(iter(raw["instances"].values())).values()
    (runner,) = ring["shardAssignments"]["nodeToRunner"].values()
    ring["shardAssignments"]["nodeToRunner"] = {node: runner}
    ring["hostsByNode"] = {node: next(iter(ring["hostsByNode"].values()))}
    return State.model_validate(raw)


def previews() -> list[Preview]:
    return read_previews(recorded("instance-previews.json"))


def nodes_of(placement: ExoPlacement | None) -> set[str] | None:
    if placement is None:
        return None
    return set(placement.instance.shard_assignments.node_to_runner)


@pytest.mark.parametrize(
    ("serving_on", "min_nodes", "chosen"),
    [
        (NODE_2, 1, {NODE_1}),  # the fewest nodes, none of them serving it
        (NODE_3, 1, {NODE_1}),
        (NODE_2, 2, {NODE_1, NODE_3}),  # at least min_nodes
        (NODE_1, 1, None),  # exo places every preview on NODE_1
        (NODE_3, 2, None),  # the 2- and 3-node previews both use NODE_3
    ],
)
def test_a_placement_apart_uses_no_node_serving_the_model(
    serving_on: str, min_nodes: int, chosen: set[str] | None
) -> None:
    state = state_with_qwen_on(serving_on)
    assert nodes_serving(state, QWEN) == {serving_on}
    placement = choose_apart(previews(), state, QWEN, "Pipeline", "MlxRing", min_nodes)
    assert nodes_of(placement) == chosen
    if placement is not None:  # exo's JSON as exo gave it, to post back unchanged
        assert placement.raw in [p.instance for p in previews()]
        assert placement.card == recorded_card()


def test_a_placement_apart_keeps_the_deployment_s_sharding_and_instance_type() -> None:
    state = state_with_qwen_on(NODE_2)
    for sharding, meta in (("Tensor", "MlxRing"), ("Pipeline", "MlxJaccl")):
        assert choose_apart(previews(), state, QWEN, sharding, meta, 1) is None
    # Another model's instance does not keep it off a node.
    assert nodes_of(choose_apart(previews(), State(), QWEN, "Pipeline", "MlxRing", 1)) == {NODE_1}


def test_previews_that_cannot_be_read_are_refused_or_never_chosen() -> None:
    with pytest.raises(ValueError, match="no list of previews"):
        read_previews({"previews": None})
    with pytest.raises(ValueError, match="preview 0"):
        read_previews({"previews": [{"sharding": "Pipeline"}]})
    broken = recorded("instance-previews.json")
    (ring,) = broken["previews"][0]["instance"].values()
    del ring["instanceId"]
    chosen = choose_apart(read_previews(broken), State(), QWEN, "Pipeline", "MlxRing", 1)
    assert nodes_of(chosen) == {NODE_1, NODE_3}  # the unreadable one-node preview skipped
    assert preview_card(previews(), QWEN) == recorded_card()
    assert preview_card(previews(), "acme/other") is None


@pytest.mark.anyio
async def test_a_model_with_an_instance_is_placed_apart_through_exo_s_previews() -> None:
    def exo(request: httpx.Request) -> httpx.Response:
        assert (request.url.path, dict(request.url.params)) == (
            "/instance/previews",
            {"model_id": QWEN},
        )
        return httpx.Response(200, json=recorded("instance-previews.json"))

    bridge = Bridge(ExoClient("http://exo.test", transport=httpx.MockTransport(exo)), None)
    deployment = Deployment(deployment_id="d", model_card=bridge.catalog[QWEN])
    apart = await where_exo_places(bridge, deployment, state_with_qwen_on(NODE_2))
    assert isinstance(apart, ExoPlacement)
    assert nodes_of(apart) == {NODE_1}


@pytest.mark.anyio
async def test_with_no_preview_apart_ours_places_on_the_other_nodes_with_exo_s_card() -> None:
    def exo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=recorded("instance-previews.json"))

    bridge = Bridge(ExoClient("http://exo.test", transport=httpx.MockTransport(exo)), None)
    deployment = Deployment(deployment_id="d", model_card=bridge.catalog[QWEN])
    # exo places every one-node preview on NODE_1, and its larger ones use NODE_1 too.
    state = state_with_qwen_on(NODE_1)
    ours = await where_exo_places(bridge, deployment, state)
    assert isinstance(ours, ExoPlacement)
    (node,) = nodes_of(ours) or set()
    assert node in {NODE_2, NODE_3}
    assert ours.instance.instance_id not in {
        next(iter(p.instance.values()))["instanceId"] for p in previews() if p.instance
    }
    (ring,) = ours.raw.values()
    for tagged in ring["shardAssignments"]["runnerToShard"].values():
        (shard,) = tagged.values()
        assert shard["modelCard"] == recorded_card()  # exo's own, from its previews

    # Every node serving it already: neither exo nor ours has a placement apart.
    crowded = state.model_copy(
        update={
            "instances": {
                f"qwen-on-{node}": next(iter(state_with_qwen_on(node).instances.values()))
                for node in (NODE_1, NODE_2, NODE_3)
            }
        }
    )
    refused = await where_exo_places(bridge, deployment, crowded)
    assert isinstance(refused, str)
    assert refused.startswith(
        f"exo offers no Pipeline/MlxRing placement of {QWEN} apart from its other instances, "
        "nor does ours: "
    )


def test_a_step_is_asked_about_exactly_the_deployments_its_keeper_will_try() -> None:
    card = catalog_by_id(BUILTIN_MODEL_CARDS)[QWEN]
    serving = state_with_qwen_on(NODE_1)  # one instance of Qwen already
    state = serving.model_copy(
        update={
            "deployments": {
                "due": Deployment(deployment_id="due", model_card=card, replicas=2),
                "enough": Deployment(deployment_id="enough", model_card=card),
                "waiting": Deployment(deployment_id="waiting", model_card=card, replicas=2),
                "untimed": Deployment(deployment_id="untimed", model_card=card, replicas=2),
            }
        }
    )
    free = DeploymentTimer(failures=0, next_attempt_at=None, waiting=None)
    timers = {
        "due": free,
        "enough": free,
        "waiting": DeploymentTimer(failures=1, next_attempt_at=30.0, waiting="backoff"),
    }
    assert [d.deployment_id for d in due_for_placement(state, timers)] == ["due"]


def test_a_step_places_from_its_own_answers_only_and_a_missing_one_is_a_reason() -> None:
    card = catalog_by_id(BUILTIN_MODEL_CARDS)[QWEN]
    state = State(deployments={"d": Deployment(deployment_id="d", model_card=card)})
    placement = StepPlacement()
    keeper = Keeper(0.0, place=placement.place, startup_grace=0.0)
    # The step's answers are what it places from: exo's reason becomes the placement error.
    refused = PlacementAnswers(state, {QWEN: "exo says no"})
    assert placement.step(keeper, refused, state, 1.0) == [
        DeploymentPlacementFailed(deployment_id="d", error="exo says no")
    ]
    # None outlives its step, and a model with no answer is a reason, never a crash.
    no_answer = f"no placement of {QWEN} was asked of exo for this step"
    with pytest.raises(ValueError, match=no_answer):
        placement.place(state, card, Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
    again = Keeper(0.0, place=NO_ANSWERS.place, startup_grace=0.0)
    assert again.step(state, 1.0) == [DeploymentPlacementFailed(deployment_id="d", error=no_answer)]
    assert again.placement_crashes() == {}


def downloaded_on(state: State, node: str) -> State:
    """``state`` with exo's recorded completed download of Qwen3-0.6B on ``node``."""
    staged = State.model_validate(recorded("state-staged.json"))
    (entry, *_) = next(iter(staged.downloads.values()))
    return state.model_copy(
        update={"downloads": {node: [entry.model_copy(update={"node_id": node})]}}
    )


@pytest.mark.anyio
@pytest.mark.parametrize("holder", [NODE_2, NODE_3])
async def test_ours_places_apart_on_the_node_that_holds_the_model(holder: str) -> None:
    def exo(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=recorded("instance-previews.json"))

    bridge = Bridge(ExoClient("http://exo.test", transport=httpx.MockTransport(exo)), None)
    deployment = Deployment(deployment_id="d", model_card=bridge.catalog[QWEN])
    # No preview of exo's is apart from NODE_1, so ours places: on the node with the download.
    ours = await where_exo_places(
        bridge, deployment, downloaded_on(state_with_qwen_on(NODE_1), holder)
    )
    assert isinstance(ours, ExoPlacement)
    assert nodes_of(ours) == {holder}
