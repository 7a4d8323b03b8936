"""Canaries from a real exo cluster: exo's own answers read as the bridge reads them.

The recordings (``tests/fixtures/exo_cluster``) hold what exo does that our earlier recordings
never showed: a model card added through exo's ``POST /models/add`` lists every backend exo
knows (``Vllm`` among them), such a card stays in a node's ``DownloadCompleted`` entry after its
instance is gone, a failed runner carries exo's ``errorMessage`` and ``diagnostics``, and every
node may share one friendly name. Each must read, whole, with nothing left out (docs/design.md
§8.2); and a part that does not read must keep every other deployment kept.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded_exo import cluster_recorded

from keeper.model.exo_state import ExoRead, UnreadablePart, read_exo_state, touched_deployments
from keeper.model.state import (
    Deployment,
    ModelCard,
    RunnerFailed,
    RunnerReady,
    State,
    download_entry,
)

CUSTOM_MODEL = "exo-harness/tiny-llama"
STATES = [
    "state-3-nodes-idle",
    "state-runner-failed",
    "state-instance-deleted-download-kept",
    "state-custom-card-instance-ready",
]


def raw_state(name: str) -> dict[str, Any]:
    return json.loads(cluster_recorded(name))


def read(name: str) -> ExoRead:
    got = read_exo_state(raw_state(name))
    assert isinstance(got, ExoRead), got
    return got


@pytest.mark.parametrize("name", STATES)
def test_every_real_state_reads_whole(name: str) -> None:
    got = read(name)
    assert got.unreadable == ()
    assert len(got.state.topology.nodes) == 3


def test_a_custom_card_keeps_vllm_among_its_backends_as_text() -> None:
    (instance,) = read("state-custom-card-instance-ready").state.instances.values()
    (shard,) = instance.shard_assignments.runner_to_shard.values()
    assert shard.model_card.model_id == CUSTOM_MODEL
    assert shard.model_card.backends == ("MlxMetal", "MlxCpu", "MlxCuda", "Vllm")


def test_the_custom_card_kept_in_a_download_entry_reads() -> None:
    got = read("state-instance-deleted-download-kept")
    assert got.state.instances == {}
    holders = [
        node
        for node in got.state.topology.nodes
        if download_entry(got.state, node, CUSTOM_MODEL) is not None
    ]
    assert holders  # the entry that made the whole State unreadable before
    entry = download_entry(got.state, holders[0], CUSTOM_MODEL)
    assert entry is not None and "Vllm" in entry.shard_metadata.model_card.backends


def test_a_failed_runner_carries_exos_error_message_and_diagnostics() -> None:
    (status,) = read("state-runner-failed").state.runners.values()
    assert isinstance(status, RunnerFailed)
    assert status.error_message is not None
    assert "jinja2" in status.error_message
    assert status.diagnostics == ()


def test_diagnostics_are_kept_as_text_whatever_their_shape() -> None:
    status = RunnerFailed.model_validate(
        {"errorMessage": "boom", "diagnostics": ["oom at layer 3", {"rss": 12}]}
    )
    assert status.diagnostics == ("oom at layer 3", '{"rss":12}')


def test_the_ready_instance_is_ready_beside_a_runner_shutting_down() -> None:
    got = read("state-custom-card-instance-ready")
    (instance,) = got.state.instances.values()
    (runner_id,) = instance.shard_assignments.node_to_runner.values()
    assert isinstance(got.state.runners[runner_id], RunnerReady)


def test_every_node_shares_one_friendly_name_in_the_real_cluster() -> None:
    state = read("state-3-nodes-idle").state
    names = {identity.friendly_name for identity in state.node_identities.values()}
    assert names == {"vm"}


# --- a part that does not read keeps every other deployment --------------------------------


def deployment(deployment_id: str, model_id: str) -> Deployment:
    card = ModelCard.model_validate(
        {
            "modelId": model_id,
            "storageSize": {"inBytes": 1},
            "nLayers": 1,
            "hiddenSize": 1,
            "supportsTensor": False,
        }
    )
    return Deployment(deployment_id=deployment_id, model_card=card)


def with_deployments(state: State) -> State:
    return state.model_copy(
        update={
            "deployments": {
                "d-custom": deployment("d-custom", CUSTOM_MODEL),
                "d-other": deployment("d-other", "mlx-community/Other"),
            }
        }
    )


def test_an_instance_of_an_unknown_kind_touches_only_its_models_deployments() -> None:
    raw = raw_state("state-custom-card-instance-ready")
    ((instance_id, tagged),) = raw["instances"].items()
    raw["instances"][instance_id] = {"VllmInstance": tagged["MlxRingInstance"]}
    got = read_exo_state(raw)
    assert isinstance(got, ExoRead)
    touched = touched_deployments(with_deployments(got.state), got.unreadable)
    assert list(touched) == ["d-custom"]
    assert touched["d-custom"].startswith(f"exo's instance {instance_id} cannot be read: ")
    assert "VllmInstance" in touched["d-custom"]


def test_a_runner_in_an_unknown_status_touches_only_its_models_deployments() -> None:
    raw = raw_state("state-custom-card-instance-ready")
    ((_, tagged),) = raw["instances"].items()
    (runner_id,) = tagged["MlxRingInstance"]["shardAssignments"]["nodeToRunner"].values()
    raw["runners"][runner_id] = {"RunnerPaused": {}}
    got = read_exo_state(raw)
    assert isinstance(got, ExoRead)
    touched = touched_deployments(with_deployments(got.state), got.unreadable)
    assert list(touched) == ["d-custom"]
    assert touched["d-custom"].startswith(f"exo's runner {runner_id} cannot be read: ")


def test_a_part_whose_model_is_unknown_touches_every_deployment() -> None:
    state = with_deployments(State())
    part = UnreadablePart("instance", "i-1", "no shardAssignments")
    assert sorted(touched_deployments(state, [part])) == ["d-custom", "d-other"]


@pytest.mark.parametrize("kind", ["node", "download"])
def test_a_nodes_report_or_download_entry_touches_no_deployment(kind: Any) -> None:
    state = with_deployments(State())
    part = UnreadablePart(kind, "n-1", "broken", CUSTOM_MODEL, ("n-1",))
    assert touched_deployments(state, [part]) == {}


def test_each_touched_deployment_says_the_first_part_that_touches_it() -> None:
    state = with_deployments(State())
    first = UnreadablePart("instance", "i-1", "first", CUSTOM_MODEL)
    second = UnreadablePart("runner", "r-1", "second", CUSTOM_MODEL)
    assert touched_deployments(state, [first, second]) == {"d-custom": first.words}


def test_an_unknown_download_kind_is_left_out_and_named_with_its_node_and_model() -> None:
    raw = raw_state("state-instance-deleted-download-kept")
    node_id, entries = next(
        (node, entries)
        for node, entries in raw["downloads"].items()
        if any(CUSTOM_MODEL in json.dumps(entry) for entry in entries)
    )
    index = next(i for i, e in enumerate(entries) if CUSTOM_MODEL in json.dumps(e))
    (body,) = entries[index].values()
    entries[index] = {"DownloadVerifying": body}
    got = read_exo_state(raw)
    assert isinstance(got, ExoRead)
    (part,) = got.unreadable
    assert (part.kind, part.key, part.model_id) == (
        "download",
        f"{node_id}/{CUSTOM_MODEL}",
        CUSTOM_MODEL,
    )
    assert download_entry(got.state, node_id, CUSTOM_MODEL) is None
    assert len(got.state.downloads[node_id]) == len(entries) - 1
