"""Contract tests of what the bridge sends exo, against JSON in exo's exact format.

The fixtures are exo's own JSON: ``exo_create_instance.json`` is the instance of exo's example
State (produced by exo: camelCase, tagged unions, its full model card and its extra shard
fields), ``exo_create_instance_jaccl.json`` the RDMA instance of the project's State fixture,
``exo_models.json`` an answer of exo's ``GET /models``. Two independent readings of the format
are checked against them and against each other: the bridge's encoder (``keeper.bridge.exo_wire``)
and the stand-in's strict parser (``keeper.sim.exo_standin.app``), which refuses unknown keys and
loose types as exo's does.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from model_ids import LLAMA as LLAMA_1B
from pydantic import ValidationError
from recorded_exo import FIXTURES

from keeper.bridge.exo_wire import (
    cards_in_state,
    exo_model_card,
    file_card,
    instance_json,
    listed_card,
    listed_models,
)
from keeper.bridge.server import exo_card_files
from keeper.core.placement import place_instance
from keeper.model.catalog import catalog_by_id
from keeper.model.state import (
    InstanceMeta,
    Memory,
    MlxJacclInstance,
    MlxRingInstance,
    Sharding,
    State,
)
from keeper.sim.exo_standin.app import ExoCreateInstance, insufficient_memory

QWEN_30B = "mlx-community/Qwen3-30B-A3B-4bit"
CATALOG = catalog_by_id()


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def exo_state_raw() -> dict[str, Any]:
    return fixture("exo_state.json")


def shapes(value: Any) -> Any:
    """The JSON's shape: the same keys everywhere, each value replaced by its JSON type."""
    if isinstance(value, dict):
        return {key: shapes(item) for key, item in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list):
        return [shapes(item) for item in value]  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


# --- the encoder reproduces exo's own JSON ------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("exo_create_instance.json", MlxRingInstance),
        ("exo_create_instance_jaccl.json", MlxJacclInstance),
    ],
)
def test_an_instance_read_from_exo_is_sent_back_exactly_as_exo_wrote_it(
    name: str, kind: type[Any]
) -> None:
    expected = fixture(name)
    raw = exo_state_raw()
    state = State.model_validate(raw)
    (instance,) = [
        inst
        for inst in state.instances.values()
        if inst.instance_id == next(iter(expected["instance"].values()))["instanceId"]
    ]
    assert isinstance(instance, kind)
    card = cards_in_state(raw)[instance.shard_assignments.model_id]
    assert {"instance": instance_json(instance, card)} == expected


def test_every_fixture_passes_the_strict_parser() -> None:
    for name in ("exo_create_instance.json", "exo_create_instance_jaccl.json"):
        parsed = ExoCreateInstance.model_validate_json((FIXTURES / name).read_text())
        assert parsed.instance.body.instance_id in (FIXTURES / name).read_text()


def test_exo_s_card_file_reads_as_exactly_the_card_exo_loads_from_it() -> None:
    files = exo_card_files(FIXTURES)  # exo's own model-card TOMLs
    exo_own = fixture("qwen3_30b_card.json")  # the card exo put in its State for that model
    assert files[QWEN_30B] == exo_own
    assert list(files[QWEN_30B]) == list(exo_own)  # exo's key order too
    assert files[QWEN_30B]["samplingDefaults"]["nonThinking"]["topP"] == 0.8


def test_the_end_to_end_test_s_card_file_is_exo_s_recorded_card() -> None:
    (ring,) = fixture("exo_recordings/instance-placement-ok.json").values()
    (shard,) = next(iter(ring["shardAssignments"]["runnerToShard"].values())).values()
    files = exo_card_files(FIXTURES / "exo_cards")
    assert files == {"mlx-community/Qwen3-0.6B-4bit": shard["modelCard"]}


def test_a_card_file_without_what_every_card_needs_is_refused() -> None:
    toml_card = {"modelId": QWEN_30B, "storageSize": {"inBytes": 1}, "hiddenSize": 2048}
    with pytest.raises(ValueError, match="nLayers, supportsTensor, tasks"):
        file_card(toml_card)
    no_sampling = file_card({**toml_card, "nLayers": 48, "supportsTensor": True, "tasks": []})
    # What exo itself loads from such a file: every knob left to the engine.
    assert set(no_sampling["samplingDefaults"].values()) == {None}


def test_a_card_exo_showed_in_its_state_is_read_verbatim() -> None:
    seen = cards_in_state(exo_state_raw())[QWEN_30B]
    assert seen == fixture("qwen3_30b_card.json")
    card = exo_model_card(seen)
    assert (card.n_layers, card.hidden_size) == (48, 2048)
    with pytest.raises(ValueError, match="nLayers"):
        exo_model_card({**seen, "nLayers": "many"})


@pytest.mark.parametrize(
    ("sharding", "meta", "kind"),
    [
        (Sharding.PIPELINE, InstanceMeta.MLX_RING, "MlxRingInstance"),
        (Sharding.TENSOR, InstanceMeta.MLX_JACCL, "MlxJacclInstance"),
    ],
)
def test_what_the_bridge_sends_for_a_fresh_placement_has_exo_s_shape(
    sharding: Sharding, meta: InstanceMeta, kind: str
) -> None:
    state = State.model_validate(exo_state_raw())
    card = CATALOG[LLAMA_1B]
    rdma = meta == InstanceMeta.MLX_JACCL
    state = _with_rdma(state) if rdma else state
    instance = place_instance(state, card, sharding, meta, 2)
    body = {"instance": instance_json(instance, exo_card_files(FIXTURES)[LLAMA_1B])}
    parsed = ExoCreateInstance.model_validate_json(json.dumps(body))
    assert parsed.instance.body.instance_id == instance.instance_id
    (sent,) = body["instance"].values()
    reference_name = "exo_create_instance_jaccl.json" if rdma else "exo_create_instance.json"
    (reference,) = fixture(reference_name)["instance"].values()
    assert list(body["instance"]) == [kind]
    assert set(sent) == set(reference)
    assert set(sent["shardAssignments"]) == set(reference["shardAssignments"])
    shard_sent = next(iter(sent["shardAssignments"]["runnerToShard"].values()))
    shard_ref = next(iter(reference["shardAssignments"]["runnerToShard"].values()))
    assert list(shard_sent) == list(shard_ref)  # the same shard type
    (shard_sent_body,) = shard_sent.values()
    (shard_ref_body,) = shard_ref.values()
    assert list(shard_sent_body) == list(shard_ref_body)
    assert list(shard_sent_body["modelCard"]) == list(shard_ref_body["modelCard"])


def _with_rdma(state: State) -> State:
    """The example's three nodes, with RDMA links both ways between two of them."""
    raw = state.model_dump(mode="json")
    nodes = state.topology.nodes[:2]
    for a, b in ((nodes[0], nodes[1]), (nodes[1], nodes[0])):
        raw["topology"]["connections"].setdefault(a, {})[b] = [
            {"sourceRdmaIface": "rdma_en2", "sinkRdmaIface": "rdma_en2"}
        ]
    return State.model_validate(raw)


# --- the strict parser refuses what exo refuses ------------------------------------------------


def _mutated(change: Any) -> str:
    body = fixture("exo_create_instance.json")
    change(body)
    return json.dumps(body)


def _first_shard(body: Any) -> Any:
    (ring,) = body["instance"].values()
    (tagged,) = list(ring["shardAssignments"]["runnerToShard"].values())[:1]
    (shard,) = tagged.values()
    return shard


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda b: b.update(extra=1), "extra"),
        (lambda b: next(iter(b["instance"].values())).update(color="red"), "color"),
        (lambda b: _first_shard(b).update(layers=3), "layers"),
        (lambda b: _first_shard(b)["modelCard"].update(nickname="q"), "nickname"),
        (lambda b: _first_shard(b)["modelCard"].update(nLayers="48"), "nLayers"),
        (lambda b: _first_shard(b).update(startLayer=1.5), "startLayer"),
        (lambda b: b.update(instance=next(iter(b["instance"].values()))), "instanceId"),
        (lambda b: b.update(instance={}), "exactly one of MlxRingInstance"),
        (lambda b: _first_shard(b)["modelCard"].pop("nLayers"), "nLayers"),
    ],
)
def test_the_strict_parser_refuses_unknown_keys_and_loose_types(change: Any, where: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ExoCreateInstance.model_validate_json(_mutated(change))
    assert where in str(caught.value)


def test_our_tolerant_model_would_have_accepted_those() -> None:
    # The point of the strict parser: our own models ignore unknown keys, so only a parser
    # as strict as exo's can tell that the bridge sends nothing exo would refuse.
    body = fixture("exo_create_instance.json")
    _first_shard(body)["modelCard"]["nickname"] = "q"
    state = State.model_validate({"instances": {"x": copy.deepcopy(body["instance"])}})
    assert len(state.instances) == 1


# --- reading exo's model list -------------------------------------------------------------------


def test_exo_s_model_list_is_read_by_id_and_bad_entries_are_skipped() -> None:
    payload = fixture("exo_models.json")
    payload["data"].append({"object": "model"})  # no id
    payload["data"].append("not an entry")
    listed = listed_models(payload)
    assert sorted(listed) == sorted(entry["id"] for entry in fixture("exo_models.json")["data"])
    assert listed_models({"nothing": []}) == {}
    assert listed_models(["not", "an", "object"]) == {}


def test_a_model_known_only_from_exo_s_list_gets_its_figures_and_0_for_the_unknown() -> None:
    listed = listed_models(fixture("exo_recordings/models.json"))
    gemma = listed["mlx-community/gemma-4-26b-a4b-it-4bit"]
    card = listed_card(gemma)
    assert (card.n_layers, card.hidden_size) == (0, 0)  # exo's list gives neither
    assert card.storage_size == Memory(in_bytes=(gemma.storage_size_megabytes or 0) * 1024 * 1024)
    assert card.supports_tensor is gemma.supports_tensor
    assert card.base_model == gemma.base_model


def test_exo_s_memory_refusal_is_worded_as_exo_words_it() -> None:
    refusal = insufficient_memory(Memory.from_gb(16.4), Memory.from_gb(12))
    assert refusal == fixture("exo_error_insufficient_memory.json")["error"]["message"]
    assert insufficient_memory(Memory.from_gb(1), Memory.from_gb(12)) is None


def test_instance_json_of_a_ring_keeps_the_host_order() -> None:
    state = State.model_validate(exo_state_raw())
    ring = next(i for i in state.instances.values() if isinstance(i, MlxRingInstance))
    sent = instance_json(ring, {"modelId": QWEN_30B})["MlxRingInstance"]
    for node, hosts in ring.hosts_by_node.items():
        assert [(h["ip"], h["port"]) for h in sent["hostsByNode"][node]] == [
            (h.ip, h.port) for h in hosts
        ]
