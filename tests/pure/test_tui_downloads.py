"""Downloads, disks and vitals in the dashboard's model and cells: the rows, the GPU readings,
the timeline's lines and a recovery's parts, from built States, events, polls and exo's
recorded States. The words alone are in test_tui_download_words."""

from __future__ import annotations

import pytest
from recorded_exo import recorded_state

from exo_deploy_tui.feed.client import STOCK_EXO
from exo_deploy_tui.model.cluster import (
    GPU_READINGS_KEPT,
    MOMENTS_WINDOW_S,
    ClusterModel,
    parse_iso,
)
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from exo_deploy_tui.view.cells import (
    MODELS_MIN,
    detail_text,
    disk_cell,
    gpu_cell,
    heat_cell,
    instance_columns,
    instance_table_rows,
    next_text,
    node_cells,
    node_columns,
    timer_words,
)
from keeper.model.events import (
    AnyEvent,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.state import (
    AnyDownload,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    SystemVitals,
)

QWEN = "mlx-community/Qwen3-0.6B-4bit"
QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"


# --- the rows -----------------------------------------------------------------------------


def downloading(now: float = FROZEN_NOW) -> ClusterBuilder:
    """Qwen3-30B on studio (ready, its model on disk) and mini-b (its runner waiting for a
    download 43% done); Qwen3-0.6B serving on mini-a, whose disk also queues Qwen3-30B."""
    builder = ClusterBuilder(now=now)
    for name, ram, free in (("studio", 96, 60), ("mini-a", 24, 20), ("mini-b", 24, 14)):
        builder.node(name, ram_gb=ram, free_gb=free, seen_ago_s=2)
        builder.disk(name, 500, 320 if name != "mini-b" else 12)
        builder.vitals(name, gpu=0.62 if name == "studio" else 0.03, temp=58, power=95)
    return (
        builder.link_all()
        .deployment(QWEN, on=["mini-a"])
        .deployment(QWEN30, on=["studio", "mini-b"], runners=[RunnerReady(), RunnerIdle()])
        .download("studio", QWEN30)
        .download("mini-a", QWEN)
        .download("mini-a", QWEN30, queued=True)
        .download("mini-b", QWEN30, done_gb=7.1, speed_mb=210, eta_s=46)
    )


def connected(builder: ClusterBuilder, now: float = FROZEN_NOW) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], now)
    return model


def test_a_runner_waiting_for_its_download_shows_the_download() -> None:
    model = connected(downloading())
    instance = next(i for i in model.instance_rows(FROZEN_NOW) if i.model_id == QWEN30)
    studio, mini_b = instance.runners
    assert studio.download is None  # ready: its download is done and no news
    assert mini_b.download is not None and mini_b.download.phase == "downloading"
    columns = instance_columns(160)
    cells = dict(instance_table_rows([instance], columns))
    words = cells["run-qwen3-30b-a3b-4bit-1"][2][0]
    assert words == "downloading 43% · 7.1/16.4 GB · 210 MB/s · ETA 46s"
    row = next(r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN30)
    assert (row.status, row.download_on) == ("starting", "mini-b")
    assert next_text(row) == "↓43% 46s"
    assert timer_words(row) == "mini-b: downloading 43% · 7.1/16.4 GB · 210 MB/s · ETA 46s"
    assert "mini-b: downloading 43%" in detail_text(row, 78, 3).plain


def test_a_loading_runner_shows_its_layers_not_a_stale_download() -> None:
    loading = RunnerLoading(layers_loaded=4, total_layers=24)
    builder = downloading().instance(
        QWEN30, on=["studio", "mini-b"], runners=[RunnerReady(), loading]
    )
    model = connected(builder)
    runner = next(i for i in model.instance_rows(FROZEN_NOW) if i.model_id == QWEN30).runners[1]
    assert (runner.download, runner.progress) == (None, 4 / 24)


def test_a_queued_or_failed_download_is_said_and_a_failed_one_is_unhealthy() -> None:
    queued = connected(downloading().download("mini-b", QWEN30, queued=True))
    row = next(r for r in queued.deployment_rows(FROZEN_NOW) if r.model_id == QWEN30)
    assert (next_text(row), timer_words(row)) == ("↓queued", "mini-b: download queued")
    failed = connected(downloading().download("mini-b", QWEN30, failed="No space left"))
    row = next(r for r in failed.deployment_rows(FROZEN_NOW) if r.model_id == QWEN30)
    assert timer_words(row) == "mini-b: download failed: No space left"
    instance = next(i for i in failed.instance_rows(FROZEN_NOW) if i.model_id == QWEN30)
    assert instance.unhealthy == "download failed on mini-b: No space left"


def test_nodes_show_their_disk_their_models_and_their_vitals() -> None:
    model = connected(downloading())
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW)}
    assert rows["mini-a"].models == (
        "Qwen3-0.6B-4bit Ready",
        "Qwen3-30B-A3B-4bit ↓queued",
    )
    assert rows["mini-b"].models == ("Qwen3-30B-A3B-4bit ↓43%",)
    assert rows["studio"].models == ("Qwen3-30B-A3B-4bit Ready",)
    assert disk_cell(rows["studio"], whole=False) == ("320G free", "")
    assert disk_cell(rows["studio"], whole=True) == ("320G free/500G", "")
    assert disk_cell(rows["mini-b"], whole=False) == ("12.0G free", "bold yellow")  # low
    assert gpu_cell(rows["studio"]) == ("62%  ▅", "")
    assert heat_cell(rows["studio"]) == ("58°C 95W", "")


def test_a_completed_download_without_a_runner_is_on_disk() -> None:
    model = connected(downloading().download("studio", QWEN))
    studio = next(r for r in model.node_rows(FROZEN_NOW) if r.name == "studio")
    assert studio.models == ("Qwen3-30B-A3B-4bit Ready", "Qwen3-0.6B-4bit on disk")


@pytest.mark.parametrize("width", [80, 100, 118, 160])
def test_node_columns_keep_the_models_room_and_fit(width: int) -> None:
    columns = node_columns(width, disk=True, vitals=True, models=True)
    keys = [c.key for c in columns]
    assert sum(c.width for c in columns) <= width - 1
    assert keys[:4] == ["name", "state", "memory", "disk"] and keys[-1] == "models"
    assert columns[-1].width >= MODELS_MIN
    # The vitals where the width allows (the 120-column dashboard's nodes panel), not at 80.
    assert ("gpu" in keys) == (width >= 118)


def test_without_disks_or_downloads_the_nodes_table_is_as_before() -> None:
    assert [c.key for c in node_columns(80)] == [
        "name",
        "state",
        "memory",
        "backends",
        "links",
        "runners",
    ]


def test_node_cells_at_80_and_120() -> None:
    model = connected(downloading())
    mini_b = next(r for r in model.node_rows(FROZEN_NOW) if r.name == "mini-b")
    narrow = node_columns(80, disk=True, vitals=True, models=True)
    assert [t.strip() for t, _ in node_cells(mini_b, narrow)] == [
        "mini-b",
        "● alive",
        "10.0G/24.0G",
        "12.0G free",
        "Qwen3-30B-A3B-4bit ↓43%",
    ]
    wide = node_columns(118, disk=True, vitals=True, models=True)
    cells = {c.key: t.strip() for c, (t, _) in zip(wide, node_cells(mini_b, wide), strict=True)}
    assert (cells["disk"], cells["gpu"], cells["heat"]) == ("12.0G free/500G", "3%   ▁", "58°C 95W")


# --- GPU readings -------------------------------------------------------------------------


class Feed:
    """Feeds events to a model with consecutive indexes, as the master's stream does."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self.idx = model.state.last_event_applied_idx

    def __call__(self, now: float, *events: AnyEvent) -> None:
        updates = []
        for event in events:
            self.idx += 1
            updates.append(EventUpdate(IndexedEvent(idx=self.idx, event=event)))
        self.model.handle(updates, now)


def report(name: str, at: float, gpu: float) -> NodeGatheredInfo:
    return NodeGatheredInfo(
        node_id=node_id_for(name), when=iso(at), system=SystemVitals(gpu_usage=gpu)
    )


def test_each_node_keeps_its_last_gpu_readings_and_loses_them_with_the_node() -> None:
    model = connected(downloading())
    feed = Feed(model)
    readings = [i / 20 for i in range(GPU_READINGS_KEPT + 4)]
    for i, gpu in enumerate(readings):
        feed(FROZEN_NOW + i, report("studio", FROZEN_NOW + i, gpu))
    feed(FROZEN_NOW + 20, NodeGatheredInfo(node_id=node_id_for("studio"), when=iso(FROZEN_NOW)))
    studio = next(r for r in model.node_rows(FROZEN_NOW + 20) if r.name == "studio")
    assert studio.gpu_history == tuple(readings[-GPU_READINGS_KEPT:])  # a memory report: none
    feed(FROZEN_NOW + 21, NodeTimedOut(node_id=node_id_for("studio")))
    assert node_id_for("studio") not in model._readings  # pyright: ignore[reportPrivateUsage]


def test_polls_count_a_reading_when_the_node_reported() -> None:
    """A stock exo polled: each poll is a reading when the node reported since (or its vitals
    changed), and a poll that saw no report adds none."""
    first = recorded_state("state-downloading")
    now = max(parse_iso(t) or 0.0 for t in first.last_seen.values()) + 1
    model = ClusterModel()
    model.handle([SnapshotUpdate(first, None), ConnectionUpdate("polling", STOCK_EXO)], now)
    model.handle(SnapshotUpdate(first, None), now + 1)  # the same State again
    staged = recorded_state("state-staged")  # every node reported since
    model.handle(SnapshotUpdate(staged, None), now + 2)
    histories = {r.name: r.gpu_history for r in model.node_rows(now + 2)}
    assert histories == {"node1": (0.62, 0.62), "node2": (0.03, 0.03), "node3": (0.03, 0.03)}


# --- the timeline -------------------------------------------------------------------------


def texts(model: ClusterModel) -> list[str]:
    """The timeline's lines, but for nodes going silent (the clock jumps between events)."""
    return [e.text for e in model.timeline if "silent" not in e.text]


def progress(builder: ClusterBuilder, name: str, model_id: str, **how: object) -> AnyDownload:
    """The node's entry after ``ClusterBuilder.download(name, model_id, **how)``."""
    state = builder.download(name, model_id, **how).state  # type: ignore[arg-type]
    node = node_id_for(name)
    return next(
        e for e in state.downloads[node] if e.shard_metadata.model_card.model_id == model_id
    )


def test_the_timeline_tells_a_download_start_and_completion_with_its_time() -> None:
    builder = downloading()
    model = connected(builder.download("mini-b", QWEN30, queued=True))
    feed = Feed(model)
    start = progress(builder, "mini-b", QWEN30, done_gb=0.1, speed_mb=300)
    feed(FROZEN_NOW + 1, NodeDownloadProgress(download_progress=start))
    more = progress(builder, "mini-b", QWEN30, done_gb=8, speed_mb=300)
    feed(FROZEN_NOW + 20, NodeDownloadProgress(download_progress=more))  # progress: no line
    done = progress(builder, "mini-b", QWEN30)
    feed(FROZEN_NOW + 53, NodeDownloadProgress(download_progress=done))
    assert texts(model)[-2:] == [
        "mini-b: downloading Qwen3-30B-A3B-4bit (16.4 GB)",
        "mini-b: downloaded Qwen3-30B-A3B-4bit 16.4 GB in 52s",
    ]
    assert model.history("dep-qwen3-30b-a3b-4bit")[-1].level == "good"


def test_a_download_that_started_before_we_connected_completes_without_a_time() -> None:
    builder = downloading()
    model = connected(builder)
    Feed(model)(
        FROZEN_NOW + 9, NodeDownloadProgress(download_progress=progress(builder, "mini-b", QWEN30))
    )
    assert texts(model)[-1] == "mini-b: downloaded Qwen3-30B-A3B-4bit 16.4 GB"


def test_a_failed_download_is_an_error_line_and_a_disk_report_is_no_news() -> None:
    builder = downloading()
    model = connected(builder)
    feed = Feed(model)
    failed = progress(builder, "mini-b", QWEN30, failed="No space left on device")
    feed(FROZEN_NOW + 3, NodeDownloadProgress(download_progress=failed))
    entry = model.timeline.since(model.timeline.appended - 1)[0]
    assert (entry.level, entry.text) == (
        "error",
        "mini-b: download of Qwen3-30B-A3B-4bit failed: No space left on device",
    )
    told = len(model.timeline)
    # A node reporting a model its disk already holds (exo does, as it starts) is not a download.
    feed(FROZEN_NOW + 4, NodeDownloadProgress(download_progress=progress(builder, "studio", QWEN)))
    assert len(model.timeline) == told


def test_polls_tell_the_same_download_story() -> None:
    """exo's recorded States, polled: node2 downloading, then staged."""
    first = recorded_state("state-downloading")
    now = max(parse_iso(t) or 0.0 for t in first.last_seen.values()) + 1
    model = ClusterModel()
    queued = first.model_copy(
        update={"downloads": {k: v for k, v in first.downloads.items() if k.startswith("5763")}}
    )
    model.handle([SnapshotUpdate(queued, None), ConnectionUpdate("polling", STOCK_EXO)], now)
    model.handle(SnapshotUpdate(first, None), now + 1)
    model.handle(SnapshotUpdate(recorded_state("state-staged"), None), now + 2)
    assert texts(model)[1:] == [
        "node2: downloading Qwen3-0.6B-4bit (0.3 GB)",
        "node2: downloaded Qwen3-0.6B-4bit 0.3 GB in 1s",
    ]
    node2 = next(r for r in model.node_rows(now + 2) if r.name == "node2")
    assert node2.models == ("Qwen3-0.6B-4bit on disk",)
    assert node2.disk_free == 536528027648


def test_a_poll_after_a_gap_does_not_time_what_happened_in_it() -> None:
    first = recorded_state("state-downloading")
    now = max(parse_iso(t) or 0.0 for t in first.last_seen.values()) + 1
    model = ClusterModel()
    queued = first.model_copy(
        update={"downloads": {k: v for k, v in first.downloads.items() if k.startswith("5763")}}
    )
    model.handle([SnapshotUpdate(queued, None), ConnectionUpdate("polling", STOCK_EXO)], now)
    model.handle(SnapshotUpdate(first, None), now + 1)
    away = now + 1 + MOMENTS_WINDOW_S + 5
    model.handle(SnapshotUpdate(recorded_state("state-staged"), None), away)
    assert texts(model)[-1] == "node2: downloaded Qwen3-0.6B-4bit 0.3 GB"


# --- a recovery's parts -------------------------------------------------------------------


def test_serving_again_says_where_the_time_went() -> None:
    """Qwen3-30B loses mini-b (last heard 2 s before), is placed on mini-a, which downloads the
    model for 52 s, and its runners are ready 11 s later."""
    builder = downloading()
    builder.deployment(QWEN30, on=["studio", "mini-b"])  # both ready, serving
    model = connected(builder)
    feed = Feed(model)
    feed(FROZEN_NOW + 29, NodeTimedOut(node_id=node_id_for("mini-b")))
    feed(FROZEN_NOW + 29, InstanceDeleted(instance_id="inst-qwen3-30b-a3b-4bit"))
    placed = (
        ClusterBuilder()
        .node("studio")
        .node("mini-a")
        .instance(
            QWEN30, on=["studio", "mini-a"], runners=[RunnerIdle(), RunnerIdle()], suffix="-2"
        )
    )
    instance = placed.state.instances["inst-qwen3-30b-a3b-4bit-2"]
    feed(FROZEN_NOW + 29.01, InstanceCreated(instance=instance))
    start = progress(builder, "mini-a", QWEN30, done_gb=0.2, speed_mb=300)
    feed(FROZEN_NOW + 29.5, NodeDownloadProgress(download_progress=start))
    feed(
        FROZEN_NOW + 81.5,
        NodeDownloadProgress(download_progress=progress(builder, "mini-a", QWEN30)),
    )
    feed(
        FROZEN_NOW + 92.5,
        *[
            RunnerStatusUpdated(runner_id=r, runner_status=RunnerReady())
            for r in instance.shard_assignments.node_to_runner.values()
        ],
    )
    assert texts(model)[-1] == (
        "Qwen3-30B-A3B-4bit serving again after 1m34s: "
        "detected 31 s, placed 0.01 s, downloaded 52 s, loaded 11 s"
    )
