"""Downloads, disks and vitals in the dashboard's model and cells: the rows and the GPU
readings, from built States, events, polls and exo's recorded States. The words alone are in
test_tui_download_words."""

from __future__ import annotations

import pytest

from exo_deploy_tui.cells import (
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
from exo_deploy_tui.client import STOCK_EXO
from exo_deploy_tui.model import GPU_READINGS_KEPT, ClusterModel, parse_iso
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from exo_deploy_tui.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate
from keeper.model.events import (
    AnyEvent,
    IndexedEvent,
    NodeGatheredInfo,
    NodeTimedOut,
)
from keeper.model.state import (
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    SystemVitals,
)
from tests.recorded_exo import recorded_state

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
    assert node_id_for("studio") not in model._gpu  # pyright: ignore[reportPrivateUsage]


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
