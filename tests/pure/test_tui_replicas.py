"""Replicas in the dashboard without a terminal: the READY count, the unhealthy rule and the
per-instance progress the model keeps, the replicas check and fit hint of the forms, and the
``:scale`` / ``:delete-instance`` commands."""

from __future__ import annotations

import pytest
from model_ids import LLAMA, QWEN
from tui_clusters import three_nodes

from exo_deploy_tui.model.cluster import ClusterModel, RunnerRow
from exo_deploy_tui.model.health import UNHEALTHY_SILENT_S, unhealthy_reason
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from exo_deploy_tui.view.cells import deployment_cells, deployment_columns, nodes_text, ready_cell
from exo_deploy_tui.view.commands import Parsed, ParseError, parse_command
from exo_deploy_tui.view.forms import check_replicas, fit_hint, validate_create
from keeper.model.api_models import CreateDeploymentRequest, model_entry
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.events import DeploymentScaled, IndexedEvent, RunnerStatusUpdated
from keeper.model.instance_health import STALL_CEILING_S
from keeper.model.readiness import ready_replicas
from keeper.model.state import (
    MAX_REPLICAS,
    DownloadOngoing,
    DownloadProgressData,
    Memory,
    PipelineShardMetadata,
    RunnerFailed,
    RunnerLoading,
    State,
)

LLAMA70 = "mlx-community/Llama-3.3-70B-Instruct-4bit"
BY_ID = {c.model_id: model_entry(c) for c in BUILTIN_MODEL_CARDS}


def connected(builder: ClusterBuilder, now: float = FROZEN_NOW) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], now)
    return model


def heard_at(state: State, now: float) -> State:
    """``state`` with every node last heard of at ``now``: alive, whatever else stands still."""
    return state.model_copy(update={"last_seen": dict.fromkeys(state.last_seen, iso(now))})


def runner(node: str, status: str = "Ready", error: str | None = None) -> RunnerRow:
    return RunnerRow(
        runner_id=f"r-{node}",
        node_id=node_id_for(node),
        node_name=node,
        rank=0,
        start_layer=0,
        end_layer=28,
        status=status,
        progress=None,
        error=error,
        node_present=True,
    )


# --- READY ----------------------------------------------------------------------------------


def test_ready_counts_the_models_ready_instances_as_the_api_does() -> None:
    builder = (
        three_nodes()
        .deployment(QWEN, on=["mini-a"], replicas=3)
        .instance(QWEN, on=["mini-b"], runners=[RunnerLoading(layers_loaded=3)], suffix="-b")
        .deployment(LLAMA, on=["studio"], replicas=1)
    )
    model = connected(builder)
    rows = {r.model_id: r for r in model.deployment_rows(FROZEN_NOW)}
    state = builder.state
    for model_id, (ready, replicas, short) in {QWEN: (1, 3, True), LLAMA: (1, 1, False)}.items():
        found = rows[model_id]
        deployment = state.deployments[found.deployment_id]
        assert ready_replicas(deployment, state) == ready  # the keeper's own count
        assert (found.ready_replicas, found.replicas, found.short) == (ready, replicas, short)
    assert ready_cell(rows[QWEN]) == ("1/3", "bold yellow")  # amber: short
    assert ready_cell(rows[LLAMA]) == ("1/1", "")
    assert nodes_text(rows[QWEN]) == "mini-a|mini-b"  # every replica's nodes


def test_the_ready_column_fits_80_columns_and_leaves_with_the_deployments_api() -> None:
    columns = deployment_columns(80)
    keys = ["status", "model", "ready", "err", "nodes", "age", "next"]
    assert [c.key for c in columns] == keys
    assert sum(c.width for c in columns) <= 80
    stock = deployment_columns(120, replicas=False)
    assert "ready" not in [c.key for c in stock] and "fail" in [c.key for c in stock]
    model = connected(three_nodes().deployment(QWEN, on=["mini-a"], replicas=2))
    (row,) = model.deployment_rows(FROZEN_NOW)
    assert [t.strip() for t, _ in deployment_cells(row, columns)][2] == "1/2"


# --- the unhealthy rule ---------------------------------------------------------------------


def test_a_failed_runner_is_the_reason_first() -> None:
    failed = runner("mini-a", "Failed", "Metal OOM")
    quiet = {node_id_for("mini-a"): 30.0}
    reason = unhealthy_reason(
        [runner("studio"), failed], quiet_s=quiet, broken="runner on studio silent"
    )
    assert reason == "runner failed on mini-a: Metal OOM"


def test_a_node_silent_more_than_ten_seconds_makes_it_unhealthy() -> None:
    node = node_id_for("studio")

    def reason(quiet: float) -> str | None:
        return unhealthy_reason([runner("studio")], quiet_s={node: quiet}, broken=None)

    assert reason(UNHEALTHY_SILENT_S) is None
    assert reason(14.2) == "node studio silent 14 s"


def test_a_node_that_left_makes_it_unhealthy() -> None:
    gone = RunnerRow(**{**runner("node1").__dict__, "node_present": False})
    reason = unhealthy_reason([gone], quiet_s={}, broken="stalled")
    assert reason == "node node1 left the cluster"


def test_the_data_models_words_come_last() -> None:
    # Stalled or hollow is the data model's rule (keeper.model.instance_health): its words,
    # after what the dashboard sees surely itself.
    loading = [runner("studio", "Loading")]
    assert unhealthy_reason(loading, quiet_s={}, broken="its words") == "its words"
    assert unhealthy_reason(loading, quiet_s={}, broken=None) is None
    quiet = {node_id_for("studio"): 30.0}
    assert unhealthy_reason(loading, quiet_s=quiet, broken="its words") == "node studio silent 30 s"


def stalled_words(node: str, still: str) -> str:
    """The data model's words for a 0.6 B runner loading on a node with no measured rate."""
    return (
        f"runner on {node} silent in RunnerLoading for {still} "
        f"(expected ≤ 15m00s the ceiling: {node}'s load rate unknown)"
    )


def test_the_model_dates_progress_from_successive_states_and_events() -> None:
    loading = RunnerLoading(layers_loaded=3, total_layers=28)
    builder = three_nodes().deployment(QWEN, on=["mini-a"], runners=[loading])
    model = connected(builder)

    def unhealthy(now: float) -> str | None:
        model.handle(SnapshotUpdate(heard_at(model.state, now), None), now)  # nodes report
        (instance,) = model.instance_rows(now)
        return instance.unhealthy

    # The same State again (a poll, nodes reporting) is no progress: the data model's bound
    # (the ceiling: no rate measured on mini-a) and its words.
    ceiling = STALL_CEILING_S
    assert unhealthy(FROZEN_NOW + ceiling - 1) is None
    assert unhealthy(FROZEN_NOW + ceiling + 12) == stalled_words("mini-a", "15m12s")
    # A layer more, by an event: progress, dated when it arrived.
    more = RunnerStatusUpdated(
        runner_id="run-qwen3-0.6b-4bit-0",
        runner_status=RunnerLoading(layers_loaded=4, total_layers=28),
    )
    idx = model.state.last_event_applied_idx + 1
    moved_at = FROZEN_NOW + ceiling + 20
    model.handle(EventUpdate(IndexedEvent(idx=idx, event=more)), moved_at)
    assert unhealthy(moved_at + ceiling - 1) is None
    assert unhealthy(moved_at + ceiling) == stalled_words("mini-a", "15m00s")
    # A download moving on its node, seen by polling: progress too.
    entry = _ongoing(node_id_for("mini-a"), QWEN)
    state = model.state.model_copy(update={"downloads": {node_id_for("mini-a"): [entry]}})
    downloaded_at = moved_at + ceiling + 10
    model.handle(SnapshotUpdate(state, None), downloaded_at)
    assert unhealthy(downloaded_at + ceiling - 1) is None


CARDS = catalog_by_id()


def _ongoing(node_id: str, model_id: str) -> DownloadOngoing:
    """A download of ``model_id`` on the node, one byte along."""
    shard = PipelineShardMetadata(
        model_card=CARDS[model_id],
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=CARDS[model_id].n_layers,
        n_layers=CARDS[model_id].n_layers,
    )
    progress = DownloadProgressData(downloaded=Memory(in_bytes=1))
    return DownloadOngoing(node_id=node_id, shard_metadata=shard, download_progress=progress)


def test_a_download_of_another_model_is_not_progress() -> None:
    loading = RunnerLoading(layers_loaded=3, total_layers=28)
    builder = three_nodes().deployment(QWEN, on=["mini-a"], runners=[loading])
    model = connected(builder)
    entry = _ongoing(node_id_for("mini-a"), LLAMA)
    state = model.state.model_copy(update={"downloads": {node_id_for("mini-a"): [entry]}})
    model.handle(SnapshotUpdate(state, None), FROZEN_NOW + 100)
    now = FROZEN_NOW + STALL_CEILING_S
    model.handle(SnapshotUpdate(heard_at(state, now), None), now)
    (instance,) = model.instance_rows(now)
    assert instance.unhealthy == stalled_words("mini-a", "15m00s")


def test_a_failed_replica_is_unhealthy_and_the_ready_one_is_not() -> None:
    builder = (
        three_nodes()
        .deployment(QWEN, on=["mini-a"], replicas=2)
        .instance(QWEN, on=["mini-b"], runners=[RunnerFailed(error_message="boom")], suffix="-b")
    )
    rows = {r.instance_id: r for r in connected(builder).instance_rows(FROZEN_NOW)}
    assert rows["inst-qwen3-0.6b-4bit"].unhealthy is None
    assert rows["inst-qwen3-0.6b-4bit-b"].unhealthy == "runner failed on mini-b: boom"


# --- forms ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", 2),
        (" 16 ", MAX_REPLICAS),
        ("17", "replicas: Input should be less than or equal to 16"),
        ("0", "replicas: Input should be greater than or equal to 1"),
        ("", "replicas: Input should be a valid integer"),
        ("two", "replicas: Input should be a valid integer"),
    ],
)
def test_the_replicas_check_is_the_requests_own(text: str, expected: int | str) -> None:
    assert check_replicas(text) == expected


def test_create_sends_the_replicas_and_refuses_a_bad_count() -> None:
    form = validate_create(BY_ID[QWEN], "Pipeline", "MlxRing", "1", {}, "3")
    assert isinstance(form, CreateDeploymentRequest) and form.replicas == 3
    refused = validate_create(BY_ID[QWEN], "Pipeline", "MlxRing", "1", {}, "20")
    assert refused == "replicas: Input should be less than or equal to 16."


def test_the_fit_hint_counts_nodes_apart() -> None:
    state = three_nodes().state
    assert fit_hint(BY_ID[QWEN], state, 2) == (
        "needs 0.3 GB on each of 2 nodes apart: fits (3 nodes can hold it; "
        "most free: 60.0 GB on studio)"
    )
    assert fit_hint(BY_ID[QWEN], state, 4).endswith("4 replicas won't all fit")
    assert fit_hint(BY_ID[LLAMA70], state, 2) == (
        "needs 37.9 GB each; only 1 node can hold it: 2 replicas won't all fit"
    )
    # Two nodes pooled hold one more: an upper bound, said as such.
    pooled = ClusterBuilder().node("a", free_gb=40).node("b", free_gb=20).node("c", free_gb=20)
    assert "the others must span several nodes" in fit_hint(BY_ID[LLAMA70], pooled.state, 2)
    # One replica keeps the one-node wording.
    assert fit_hint(BY_ID[QWEN], state, 1).startswith("needs 0.3 GB: fits on one node")


# --- commands -------------------------------------------------------------------------------


def test_scale_and_delete_instance_commands() -> None:
    assert parse_command("scale", readonly=False, demo=False) == Parsed("scale")
    assert parse_command("scale 3", readonly=False, demo=False) == Parsed("scale", (3,))
    assert parse_command("delete-instance", readonly=False, demo=False) == Parsed("delete_instance")
    for line in ("scale", "scale 3", "delete-instance"):
        refused = parse_command(line, readonly=True, demo=False)
        assert isinstance(refused, ParseError) and "read-only" in refused.message
    bad = parse_command("scale lots", readonly=False, demo=False)
    assert isinstance(bad, ParseError) and bad.message.startswith("usage: scale [N]")


# --- timeline -------------------------------------------------------------------------------


def test_scaling_is_told_alike_from_an_event_and_from_a_polled_state() -> None:
    builder = three_nodes().deployment(QWEN, on=["mini-a"])
    by_event = connected(builder)
    scaled = DeploymentScaled(deployment_id="dep-qwen3-0.6b-4bit", replicas=3)
    idx = by_event.state.last_event_applied_idx + 1
    by_event.handle(EventUpdate(IndexedEvent(idx=idx, event=scaled)), FROZEN_NOW + 1)
    by_poll = connected(builder)
    deployment = builder.state.deployments["dep-qwen3-0.6b-4bit"]
    state = builder.state.model_copy(
        update={
            "deployments": {"dep-qwen3-0.6b-4bit": deployment.model_copy(update={"replicas": 3})}
        }
    )
    by_poll.handle(SnapshotUpdate(state, None), FROZEN_NOW + 1)
    told = "Qwen3-0.6B-4bit scaled from 1 to 3 replicas"
    for model in (by_event, by_poll):
        assert [e.text for e in model.timeline][-1] == told
        (row,) = model.deployment_rows(FROZEN_NOW + 1)
        assert (row.ready_replicas, row.replicas) == (1, 3)
