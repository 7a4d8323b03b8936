"""The dashboard pointed straight at a real exo cluster (``tests/fixtures/exo_cluster``).

What a real exo does that the recordings of its code never showed, read as the client reads a
poll (``exo_deploy_tui.feed.reading.read_state``) and fed to the pure model as the client feeds it:
a custom model card lists ``Vllm`` among its backends (the whole State used to be unreadable:
"not exo's State: instances…"), exo lists every model it knows as a pending download of every
node (each would read as a queued download nobody asked for), and a part of a State that does
not read is left out, said in the timeline and marked on its node's row while the rest is shown.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from recorded_exo import cluster_recorded

from exo_deploy_tui.feed.reading import StateRead, UnreadableAnswerError, read_state
from exo_deploy_tui.model.cluster import ClusterModel, parse_iso
from exo_deploy_tui.model.unread_parts import NAMED_PER_BATCH, UnreadParts
from exo_deploy_tui.model.updates import SnapshotUpdate
from keeper.model.exo_state import UnreadablePart

JSON = "application/json"
TINY = "tiny-llama"


def polled(*reads: StateRead) -> tuple[ClusterModel, float]:
    """A model fed ``reads`` one poll apart, as the client feeds a stock exo's /state."""
    model = ClusterModel()
    now = 0.0
    for read in reads:
        seen = [parse_iso(t) for t in read.state.last_seen.values()]
        now = max(now + 1.0, max(t for t in seen if t is not None) + 1.0)
        model.handle(SnapshotUpdate(read.state, None, unreadable=read.unreadable), now)
    return model, now


def read_body(raw: dict[str, Any]) -> StateRead:
    return read_state(json.dumps(raw).encode(), JSON)


def raw_of(name: str) -> dict[str, Any]:
    return json.loads(cluster_recorded(name))


def test_a_custom_card_with_vllm_reads_whole_and_its_instance_is_shown() -> None:
    read = read_state(cluster_recorded("state-custom-card-instance-ready"), JSON)
    assert read.unreadable == ()
    model, now = polled(read)
    (row,) = model.instance_rows(now)
    assert TINY in row.model_id
    assert model.summary(now).nodes_alive == 3


def test_downloads_nobody_asked_for_are_not_listed_as_models() -> None:
    model, now = polled(read_state(cluster_recorded("state-3-nodes-idle"), JSON))
    rows = model.node_rows(now)
    assert len(rows) == 3
    assert [row.models for row in rows] == [(), (), ()]


def test_a_model_on_disk_is_still_listed() -> None:
    read = read_state(cluster_recorded("state-instance-deleted-download-kept"), JSON)
    model, now = polled(read)
    listed = [model for row in model.node_rows(now) for model in row.models]
    assert len(listed) == 1 and TINY in listed[0], listed


def test_a_runner_that_does_not_read_is_said_and_marked_and_the_rest_shown() -> None:
    raw = raw_of("state-custom-card-instance-ready")
    ((_, tagged),) = raw["instances"].items()
    ((node_id, runner_id),) = tagged["MlxRingInstance"]["shardAssignments"]["nodeToRunner"].items()
    raw["runners"][runner_id] = {"RunnerPaused": {}}
    read = read_body(raw)
    (part,) = read.unreadable
    model, now = polled(read)
    assert model.summary(now).nodes_alive == 3
    assert len(model.instance_rows(now)) == 1
    said = [entry.text for entry in model.timeline if entry.level == "warn"]
    assert said == [f"exo's runner {runner_id} cannot be read: {part.reason} (shown without it)"]
    (row,) = [row for row in model.node_rows(now) if row.node_id == node_id]
    assert row.models[0] == f"⚠ runner {runner_id} unreadable"

    # Read whole again: said once; the mark goes.
    whole = read_state(cluster_recorded("state-custom-card-instance-ready"), JSON)
    model.handle(SnapshotUpdate(whole.state, None, unreadable=()), now + 1.0)
    assert list(model.timeline)[-1].text == "exo's State reads whole again"
    (row,) = [row for row in model.node_rows(now + 1.0) if row.node_id == node_id]
    assert not any(text.startswith("⚠") for text in row.models)


def test_a_state_that_cannot_be_read_at_all_still_names_why() -> None:
    raw = raw_of("state-3-nodes-idle")
    raw["topology"] = {"nodes": "three"}
    with pytest.raises(UnreadableAnswerError, match=r"^not exo's State: topology"):
        read_body(raw)


def test_many_new_parts_are_named_a_few_then_counted() -> None:
    parts = tuple(UnreadablePart("download", f"n/{i}", "bad", None, ("n",)) for i in range(5))
    entries = UnreadParts().took(parts, 0.0)
    assert len(entries) == NAMED_PER_BATCH + 1
    assert entries[-1].text == f"{5 - NAMED_PER_BATCH} more parts of exo's State unread"


def test_a_part_already_told_is_not_told_again() -> None:
    part = UnreadablePart("node", "n", "nodeMemory: bad", None, ("n",))
    unread = UnreadParts()
    assert len(unread.took((part,), 0.0)) == 1
    assert unread.took((part,), 1.0) == []
    assert unread.marks() == {"n": ("⚠ node n unreadable",)}
