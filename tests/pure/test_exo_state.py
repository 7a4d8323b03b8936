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
