"""Reading exo's State strictly: each way a recorded State can lose what the keeper decides on.

Every case starts from a State a real exo answered (``tests/fixtures/exo_recordings``) and
breaks one thing: a key deleted or renamed, one instance's tag or fields broken, one runner,
the topology, one node's memory. Each must come back ``Unreadable`` naming what was wrong, and
the untouched recordings must read exactly as our tolerant model reads them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from recorded_exo import RECORDINGS

from keeper.model.exo_state import DECIDING_KEYS, Unreadable, read_exo_state
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


def reason_naming(raw: dict[str, Any], prefix: str) -> str:
    """Why ``raw`` is unreadable, which must start by naming what (``prefix``)."""
    reason = reason_of(raw)
    assert reason.startswith(prefix), reason
    return reason


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
    assert read_exo_state(raw) == State.model_validate(raw)


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


def test_an_instance_with_an_unknown_tag_is_named_with_the_tag() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    raw["instances"][instance_id] = {"MlxRingInstanceV2": tagged["MlxRingInstance"]}
    reason = reason_naming(raw, f"instance {instance_id}: ")
    assert "MlxRingInstanceV2" in reason, reason


def test_our_tolerant_model_does_not_drop_an_unknown_instance_variant_silently() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    raw["instances"][instance_id] = {"MlxRingInstanceV2": tagged["MlxRingInstance"]}
    with pytest.raises(ValidationError, match="MlxRingInstanceV2"):
        State.model_validate(raw)


def test_an_instance_missing_a_field_is_named_with_the_field() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    del tagged["MlxRingInstance"]["shardAssignments"]
    reason = reason_naming(raw, f"instance {instance_id}: ")
    assert "shardAssignments" in reason and "Field required" in reason, reason


def test_an_instance_with_a_broken_shard_is_named() -> None:
    raw = recorded(TWO_NODES)
    instance_id, tagged = only_instance(raw)
    shards = tagged["MlxRingInstance"]["shardAssignments"]["runnerToShard"]
    runner_id = sorted(shards)[0]
    shards[runner_id]["PipelineShardMetadata"]["startLayer"] = "zero"
    reason = reason_naming(raw, f"instance {instance_id}: ")
    assert "startLayer" in reason, reason


def test_an_instance_filed_under_another_id_is_unreadable() -> None:
    raw = recorded(WITH_INSTANCE)
    instance_id, tagged = only_instance(raw)
    raw["instances"] = {"not-its-id": tagged}
    assert reason_of(raw) == f"instance not-its-id: its instanceId is {instance_id}"


def test_a_runner_in_an_unknown_status_is_named() -> None:
    raw = recorded(WITH_INSTANCE)
    (runner_id,) = raw["runners"]
    raw["runners"][runner_id] = {"RunnerDancing": {}}
    reason = reason_naming(raw, f"runner {runner_id}: ")
    assert "RunnerDancing" in reason, reason


@pytest.mark.parametrize("key", ["nodes", "connections"])
def test_a_topology_without_its_nodes_or_connections_is_unreadable(key: str) -> None:
    raw = recorded(WITH_INSTANCE)
    del raw["topology"][key]
    assert reason_of(raw) == f'exo\'s State has a topology without "{key}"'


def test_a_topology_with_unreadable_nodes_is_unreadable() -> None:
    raw = recorded(WITH_INSTANCE)
    raw["topology"]["nodes"] = [{"nodeId": "n1"}]
    assert reason_of(raw).startswith("topology: nodes.0: ")


def test_node_memory_without_available_ram_is_named_by_node() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    del raw["nodeMemory"][node_id]["ramAvailable"]
    assert reason_of(raw) == f'nodeMemory of node {node_id}: no "ramAvailable"'


def test_node_memory_that_does_not_parse_is_named_by_node() -> None:
    raw = recorded(WITH_INSTANCE)
    node_id = sorted(raw["nodeMemory"])[0]
    raw["nodeMemory"][node_id]["ramAvailable"] = {"inBytes": "lots"}
    reason_naming(raw, f"nodeMemory of node {node_id}: ramAvailable.inBytes")


def test_unknown_keys_stay_ignored() -> None:
    raw = recorded(WITH_INSTANCE)
    expected = State.model_validate(raw)
    grown = copy.deepcopy(raw)
    grown["somethingExoAddedLater"] = {"x": [1, 2]}
    instance_id, tagged = only_instance(grown)
    tagged["MlxRingInstance"]["newField"] = True
    assert read_exo_state(grown) == expected
    assert instance_id in expected.instances
