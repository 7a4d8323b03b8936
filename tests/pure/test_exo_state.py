"""Reading exo's State: closed for what cannot be read, open for the rest (docs/design.md §8.2).

Every case starts from a State a real exo answered (``tests/fixtures/exo_recordings``) and
breaks one thing. What everything hangs on (a deciding key, the topology) makes the whole State
``Unreadable``, naming what was wrong; one entry (an instance's tag or fields, a runner, one
node's memory) is left out and named as an ``UnreadablePart``, with everything else read. The
untouched recordings must read exactly as our tolerant model reads them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from recorded_exo import RECORDINGS

from keeper.model.exo_state import (
    DECIDING_KEYS,
    ExoRead,
    Unreadable,
    UnreadablePart,
    read_exo_state,
    touched_deployments,
    unreadable_instances,
)
from keeper.model.state import State

STATES = sorted(RECORDINGS.glob("state-*.json"))
STATES = [path for path in STATES if path.name != "state-path-nodeMemory.json"]
WITH_INSTANCE = RECORDINGS / "state-instance-ready.json"
TWO_NODES = RECORDINGS / "state-two-node-pipeline-ready.json"


def recorded(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def reason_of(raw: dict[str, Any]) -> str:
    read = read_exo_state(raw)
    assert isinstance(read, Unreadable), "read as a State"
    return read.reason


def read_whole(raw: dict[str, Any]) -> ExoRead:
    read = read_exo_state(raw)
    assert isinstance(read, ExoRead), read
    return read


def only_part(raw: dict[str, Any]) -> UnreadablePart:
    """The one part of ``raw`` left out as unreadable."""
    (part,) = read_whole(raw).unreadable
    return part


def only_instance(raw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    ((instance_id, tagged),) = raw["instances"].items()
    return instance_id, tagged


def test_there_are_recorded_states_with_and_without_instances() -> None:
    assert len(STATES) >= 5
    assert any(recorded(path)["instances"] for path in STATES)
    assert any(not recorded(path)["instances"] for path in STATES)


@pytest.mark.parametrize("path", STATES, ids=lambda path: path.stem)
def test_every_recorded_state_reads_as_the_tolerant_model_reads_it(path: Path) -> None:
    raw = recorded(path)
    assert read_exo_state(raw) == ExoRead(State.model_validate(raw))


@pytest.mark.parametrize("path", STATES, ids=lambda path: path.stem)
@pytest.mark.parametrize("key", DECIDING_KEYS)
def test_a_state_without_a_key_the_keeper_decides_on_is_unreadable(path: Path, key: str) -> None:
    raw = recorded(path)
    del raw[key]
    assert State.model_validate(raw) is not None  # the tolerant model would have read it
    assert reason_of(raw) == f'exo\'s State has no "{key}"'


def test_a_renamed_instances_key_is_unreadable_not_no_instances() -> None:
    raw = recorded(WITH_INSTANCE)
    raw["instanceMap"] = raw.pop("instances")
    assert State.model_validate(raw).instances == {}  # what the bridge used to act on
    assert reason_of(raw) == 'exo\'s State has no "instances"'


@pytest.mark.parametrize("key", DECIDING_KEYS)
def test_a_deciding_key_that_is_not_an_object_is_unreadable(key: str) -> None:
    raw = recorded(WITH_INSTANCE)
    raw[key] = []
    assert reason_of(raw) == f'exo\'s State has "{key}" that is not an object'


def test_an_instance_with_an_unknown_tag_is_left_out_and_named_with_its_model() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    body = tagged["MlxRingInstance"]
    raw["instances"][instance_id] = {"MlxRingInstanceV2": body}
    read = read_whole(raw)
    assert read.state.instances == {}
    assert unreadable_instances(read.unreadable) == {instance_id}
    (part,) = read.unreadable
    assert (part.kind, part.key) == ("instance", instance_id)
    assert "MlxRingInstanceV2" in part.reason, part.reason
    assert part.model_id == body["shardAssignments"]["modelId"]
    assert part.node_ids == tuple(sorted(body["shardAssignments"]["nodeToRunner"]))
    assert part.words.startswith(f"exo's instance {instance_id} cannot be read: ")


def test_our_tolerant_model_does_not_drop_an_unknown_instance_variant_silently() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    raw["instances"][instance_id] = {"MlxRingInstanceV2": tagged["MlxRingInstance"]}
    with pytest.raises(ValidationError, match="MlxRingInstanceV2"):
        State.model_validate(raw)


def test_an_instance_missing_a_field_is_named_with_the_field_and_no_model() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    del tagged["MlxRingInstance"]["shardAssignments"]
    part = only_part(raw)
    assert (part.kind, part.key, part.model_id, part.node_ids) == (
        "instance",
        instance_id,
        None,
        (),
    )
    assert "shardAssignments" in part.reason and "Field required" in part.reason, part.reason


def test_an_instance_with_a_broken_shard_is_named() -> None:
    raw = recorded(TWO_NODES)
    instance_id, tagged = only_instance(raw)
    shards = tagged["MlxRingInstance"]["shardAssignments"]["runnerToShard"]
    runner_id = sorted(shards)[0]
    shards[runner_id]["PipelineShardMetadata"]["startLayer"] = "zero"
    part = only_part(raw)
    assert (part.kind, part.key) == ("instance", instance_id)
    assert "startLayer" in part.reason, part.reason
    assert len(part.node_ids) == 2


def test_an_instance_filed_under_another_id_is_unreadable() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    raw["instances"] = {"not-its-id": tagged}
    part = only_part(raw)
    assert (part.key, part.reason) == ("not-its-id", f"its instanceId is {instance_id}")


def test_a_runner_in_an_unknown_status_is_left_out_and_named_with_its_instance_model() -> None:
    raw = recorded(WITH_INSTANCE)
    (runner_id,) = raw["runners"]
    raw["runners"][runner_id] = {"RunnerDancing": {}}
    read = read_whole(raw)
    assert read.state.runners == {}
    assert len(read.state.instances) == 1  # its instance reads: the runner alone is left out
    (part,) = read.unreadable
    assert (part.kind, part.key) == ("runner", runner_id)
    assert "RunnerDancing" in part.reason, part.reason
    _, tagged = only_instance(raw)
    assignments = tagged["MlxRingInstance"]["shardAssignments"]
    assert part.model_id == assignments["modelId"]
    assert part.node_ids == tuple(assignments["nodeToRunner"])


def test_a_runner_no_instance_names_is_named_with_no_model() -> None:
    raw = recorded(WITH_INSTANCE)
    raw["runners"]["stray"] = {"RunnerDancing": {}}
    part = only_part(raw)
    assert (part.kind, part.key, part.model_id, part.node_ids) == ("runner", "stray", None, ())


@pytest.mark.parametrize("key", ["nodes", "connections"])
def test_a_topology_without_its_nodes_or_connections_is_unreadable(key: str) -> None:
    raw = recorded(WITH_INSTANCE)
    del raw["topology"][key]
    assert reason_of(raw) == f'exo\'s State has a topology without "{key}"'


def test_a_topology_with_unreadable_nodes_is_unreadable() -> None:
    raw = recorded(WITH_INSTANCE)
    raw["topology"]["nodes"] = [{"nodeId": "n1"}]
    assert reason_of(raw).startswith("topology: nodes.0: ")


def test_node_memory_without_available_ram_is_left_out_and_named_by_node() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    del raw["nodeMemory"][node_id]["ramAvailable"]
    read = read_whole(raw)
    assert node_id not in read.state.node_memory  # so placement gives it nothing
    assert set(read.state.node_memory) == set(raw["nodeMemory"]) - {node_id}
    (part,) = read.unreadable
    assert (part.kind, part.key, part.node_ids) == ("node", node_id, (node_id,))
    assert part.reason == 'nodeMemory: no "ramAvailable"'


def test_node_memory_that_does_not_parse_is_left_out_and_named_by_node() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    raw["nodeMemory"][node_id]["ramAvailable"] = {"inBytes": "lots"}
    part = only_part(raw)
    assert (part.kind, part.key) == ("node", node_id)
    assert part.reason.startswith("nodeMemory: ramAvailable.inBytes"), part.reason


def test_node_memory_that_is_not_an_object_is_left_out() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    raw["nodeMemory"][node_id] = 7
    assert only_part(raw).reason == "nodeMemory: not an object"


def test_an_identity_that_does_not_parse_leaves_the_node_nameless_not_the_state_unread() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeIdentities"])[0]
    raw["nodeIdentities"][node_id] = {"friendlyName": ["a", "list"]}
    read = read_whole(raw)
    assert node_id not in read.state.node_identities
    assert len(read.state.instances) == 1
    part = only_part(raw)
    assert (part.kind, part.key) == ("node", node_id)
    assert part.reason.startswith("nodeIdentities: friendlyName"), part.reason


def test_a_top_level_value_of_the_wrong_kind_is_unreadable() -> None:
    raw = recorded(WITH_INSTANCE)
    raw["lastEventAppliedIdx"] = "many"
    assert reason_of(raw).startswith("exo's State: lastEventAppliedIdx"), reason_of(raw)


def test_unknown_keys_stay_ignored() -> None:
    raw = recorded(WITH_INSTANCE)
    expected = State.model_validate(raw)
    grown = copy.deepcopy(raw)
    grown["somethingExoAddedLater"] = {"x": [1, 2]}
    instance_id, tagged = only_instance(grown)
    tagged["MlxRingInstance"]["newField"] = True
    assert read_exo_state(grown) == ExoRead(expected)
    assert instance_id in expected.instances


# --- each part named, whatever else the State holds ------------------------------------------


def test_a_good_instance_before_an_unreadable_one_is_kept_and_the_bad_one_named() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    bad = copy.deepcopy(tagged["MlxRingInstance"])
    bad["instanceId"] = "zz-bad"
    raw["instances"]["zz-bad"] = {"MlxRingInstanceV2": bad}
    read = read_whole(raw)
    assert list(read.state.instances) == [instance_id]
    assert [part.key for part in read.unreadable] == ["zz-bad"]


def test_an_instance_whose_model_id_is_not_text_has_no_model() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    tagged["MlxRingInstance"]["shardAssignments"]["modelId"] = 5
    part = only_part(raw)
    assert (part.key, part.model_id) == (instance_id, None)


def test_an_untagged_instance_is_named_with_its_model() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    body = tagged["MlxRingInstance"]
    raw["instances"][instance_id] = body  # its fields, not wrapped in its kind's name
    part = only_part(raw)
    assert (part.key, part.model_id) == (instance_id, body["shardAssignments"]["modelId"])


@pytest.mark.parametrize("body", [["MlxRingInstance"], "MlxRingInstance", 7])
def test_an_instance_that_is_not_an_object_is_named_without_a_model(body: Any) -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, _ = only_instance(raw)
    raw["instances"][instance_id] = body
    part = only_part(raw)
    assert (part.key, part.model_id, part.node_ids) == (instance_id, None, ())


def test_a_runner_is_found_in_an_instance_after_one_without_nodes() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    (runner_id,) = raw["runners"]
    raw["runners"][runner_id] = {"RunnerDancing": {}}
    broken = copy.deepcopy(tagged)
    broken["MlxRingInstance"]["instanceId"] = "aa-first"
    broken["MlxRingInstance"]["shardAssignments"]["nodeToRunner"] = "none"
    raw["instances"] = {"aa-first": broken, instance_id: tagged}
    runner = next(p for p in read_whole(raw).unreadable if p.kind == "runner")
    assignments = tagged["MlxRingInstance"]["shardAssignments"]
    assert runner.model_id == assignments["modelId"]
    assert runner.node_ids == tuple(assignments["nodeToRunner"])


def test_a_runner_whose_instance_model_id_is_not_text_has_no_model() -> None:
    raw = recorded(WITH_INSTANCE)
    _, tagged = only_instance(raw)
    (runner_id,) = raw["runners"]
    raw["runners"][runner_id] = {"RunnerDancing": {}}
    tagged["MlxRingInstance"]["shardAssignments"]["modelId"] = ["not", "text"]
    runner = next(p for p in read_whole(raw).unreadable if p.kind == "runner")
    assert runner.model_id is None and runner.node_ids != ()


def test_downloads_of_a_node_that_are_not_an_array_are_named_and_the_next_node_read() -> None:
    raw = recorded(WITH_INSTANCE)
    first, second = sorted(raw["nodeMemory"])[:2]
    entries = raw["downloads"].get(second) or []
    raw["downloads"] = {first: 5, second: entries}
    read = read_whole(raw)
    (part,) = read.unreadable
    assert (part.kind, part.key, part.reason, part.model_id, part.node_ids) == (
        "download",
        first,
        "not an array",
        None,
        (first,),
    )
    assert first not in read.state.downloads
    assert len(read.state.downloads[second]) == len(entries)


def test_a_download_entry_naming_no_model_is_named_by_its_node() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    raw["downloads"] = {node_id: [{"DownloadVerifying": {"nodeId": node_id}}]}
    (part,) = read_whole(raw).unreadable
    assert (part.kind, part.key, part.model_id, part.node_ids) == (
        "download",
        node_id,
        None,
        (node_id,),
    )
    assert "DownloadVerifying" in part.reason


def test_a_download_entry_with_snake_case_keys_is_named_with_its_model() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    raw["downloads"] = {node_id: [{"DownloadVerifying": {"shard": {"model_id": "m/x"}}}]}
    (part,) = read_whole(raw).unreadable
    assert (part.key, part.model_id) == (f"{node_id}/m/x", "m/x")


def test_every_deployment_a_part_with_no_model_touches_is_touched_after_one_named() -> None:
    raw = recorded(WITH_INSTANCE)
    card = {"modelId": "a/one", "storageSize": {"inBytes": 1}, "nLayers": 1, "hiddenSize": 1}
    deployments = {
        d: {"deploymentId": d, "modelCard": {**card, "modelId": m, "supportsTensor": False}}
        for d, m in (("d1", "a/one"), ("d2", "b/two"))
    }
    state = State.model_validate({**raw, "deployments": deployments})
    node = UnreadablePart("node", "n", "nodeMemory: bad", None, ("n",))
    named = UnreadablePart("instance", "i-1", "bad", "a/one")
    unknown = UnreadablePart("runner", "r-1", "bad", None)
    touched = touched_deployments(state, [node, named, unknown])
    assert touched == {"d1": named.words, "d2": unknown.words}
