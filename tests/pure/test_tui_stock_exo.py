"""The dashboard's pure model on a stock exo's own States (``tests/fixtures/exo_recordings``).

exo's State keeps what ours drops: a timed-out node keeps its identity and backends, and a
deleted instance's runners stay in ``runners``. These tests feed the recorded States as the
client does when it polls a stock exo (snapshots without deployments) and check that the
dashboard reads them as exo means them.
"""

from __future__ import annotations

from recorded_exo import (
    TIMED_OUT_INSTANCE,
    TIMED_OUT_NODE,
    before_the_timeout,
    recorded_state,
)

from exo_deploy_tui.model.cluster import ClusterModel, departed_nodes, parse_iso
from exo_deploy_tui.model.updates import SnapshotUpdate
from keeper.model.state import State

NODE1 = TIMED_OUT_NODE
QWEN_INSTANCE = TIMED_OUT_INSTANCE
STALE_RUNNER = "910bf567-2998-4f75-a927-95dc1f860594"  # that instance's runner


def just_after(state: State) -> float:
    """A moment one second after the newest report in ``state``: every listed node is alive."""
    seen = [parse_iso(t) for t in state.last_seen.values()]
    return max(t for t in seen if t is not None) + 1.0


def polled(*states: State) -> tuple[ClusterModel, float]:
    """A model fed ``states`` one poll apart, as the client feeds a stock exo's /state."""
    model = ClusterModel()
    now = 0.0
    for state in states:
        now = just_after(state)
        model.handle(SnapshotUpdate(state, None), now)
    return model, now


def texts(model: ClusterModel) -> list[str]:
    return [entry.text for entry in model.timeline]


def test_an_idle_exo_shows_its_nodes_by_their_friendly_names() -> None:
    model, now = polled(recorded_state("state-3-nodes-idle"))
    rows = model.node_rows(now)
    assert [(r.name, r.liveness) for r in rows] == [
        ("node1", "alive"),
        ("node2", "alive"),
        ("node3", "alive"),
    ]
    assert all(r.backends == ("MlxMetal",) and r.ram_total for r in rows)
    assert not model.has_timers
    summary = model.summary(now)
    assert (summary.nodes_alive, summary.nodes_gone, summary.instances) == (3, 0, 0)
    assert texts(model) == ["connected: 3 nodes, 0 instances"]


def test_a_loading_then_ready_instance_shows_its_runner() -> None:
    model, now = polled(recorded_state("state-instance-loading"))
    (instance,) = model.instance_rows(now)
    assert not instance.ready and instance.runners[0].status == "Loading"
    model, now = polled(
        recorded_state("state-instance-loading"), recorded_state("state-instance-ready")
    )
    (instance,) = model.instance_rows(now)
    assert instance.ready
    assert [(r.node_name, r.status, r.node_present) for r in instance.runners] == [
        ("node1", "Ready", True)
    ]
    assert [r.runners for r in model.node_rows(now)] == [("Qwen3-0.6B-4bit Ready",), (), ()]
    assert "runner ready: Qwen3-0.6B-4bit on node1 (layers 0-27)" in texts(model)


def test_a_two_node_pipeline_lists_both_runners_in_rank_order() -> None:
    model, now = polled(recorded_state("state-two-node-pipeline-ready"))
    (instance,) = model.instance_rows(now)
    assert instance.ready and instance.model_id == "mlx-community/Qwen3-30B-A3B-4bit"
    assert [(r.rank, r.node_name, r.status) for r in instance.runners] == [
        (0, "node3", "Ready"),
        (1, "node1", "Ready"),
    ]


def test_a_timed_out_node_the_state_still_describes_is_gone_not_alive() -> None:
    state = recorded_state("state-node-timed-out-instance-deleted")
    assert departed_nodes(state) == [NODE1]
    model, now = polled(state)
    rows = model.node_rows(now)
    assert [(r.name, r.liveness) for r in rows] == [
        ("node2", "alive"),
        ("node3", "alive"),
        ("node1", "gone"),
    ]
    assert rows[-1].quiet_for_s is None  # it left before we connected: since when, unknown
    summary = model.summary(now)
    assert (summary.nodes_alive, summary.nodes_gone) == (2, 1)
    assert "node node1 had left the cluster" in texts(model)


def test_runners_of_a_deleted_instance_are_neither_counted_nor_shown() -> None:
    state = recorded_state("state-node-timed-out-instance-deleted")
    assert STALE_RUNNER in state.runners  # exo keeps it, with its last status
    model, now = polled(state)
    assert model.instance_rows(now) == []
    assert all(r.runners == () for r in model.node_rows(now))
    assert model.summary(now).instances == 0


def test_an_instance_whose_node_left_is_not_ready() -> None:
    model, now = polled(recorded_state("state-node-timed-out"))
    (instance,) = model.instance_rows(now)
    assert instance.instance_id == QWEN_INSTANCE
    (runner,) = instance.runners
    assert (runner.node_name, runner.status, runner.node_present) == ("node1", "Ready", False)
    assert not instance.ready
    assert instance.unhealthy == "node node1 left the cluster"


def test_successive_polls_tell_the_node_loss_story() -> None:
    """node1 serving, then timed out (the instance still listed), then the instance deleted:
    the timeline says so in that order, and node1 is gone since the poll that saw it leave."""
    before = before_the_timeout()
    assert NODE1 in before.topology.nodes and NODE1 in before.node_memory
    timed_out = recorded_state("state-node-timed-out")
    deleted = recorded_state("state-node-timed-out-instance-deleted")
    model, now = polled(before, timed_out, deleted)
    story = texts(model)[1:]
    assert story == [
        "node node1 timed out and left the cluster",
        "instance 32569048 of Qwen3-0.6B-4bit deleted (was on node1)",
    ]
    node1 = [r for r in model.node_rows(now) if r.node_id == NODE1]
    assert [(r.name, r.liveness) for r in node1] == [("node1", "gone")]
    assert node1[0].quiet_for_s is not None  # seen leaving: the row counts from then
    assert model.summary(now).nodes_gone == 1
