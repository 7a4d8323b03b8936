"""When the dashboard saw downloads start and complete (``model.download_moments``) and
each node's last GPU readings (``exo_deploy_tui.model.gpu_readings``): the model's memories of node
reports, tested apart from it."""

from __future__ import annotations

from model_ids import QWEN

from exo_deploy_tui.model.download_moments import DownloadMoments
from exo_deploy_tui.model.gpu_readings import GPU_READINGS_KEPT, GpuReadings
from exo_deploy_tui.model.recovery import NodeDownload
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from keeper.model.events import NodeDownloadProgress
from keeper.model.state import State, download_entry

STUDIO = node_id_for("studio")
T = FROZEN_NOW


def node() -> ClusterBuilder:
    return ClusterBuilder().node("studio")


def report(builder: ClusterBuilder) -> NodeDownloadProgress:
    """The event that brings the builder's entry for studio's download of QWEN."""
    entry = download_entry(builder.state, STUDIO, QWEN)
    assert entry is not None
    return NodeDownloadProgress(download_progress=entry)


def test_a_download_seen_start_and_complete_is_dated_both_ways() -> None:
    moments = DownloadMoments()
    nothing = node().state
    moments.note(report(node().download("studio", QWEN, done_gb=1)), nothing, T, blind=False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(T, None)
    assert moments.starts(blind=False) == {(STUDIO, QWEN): T}
    ongoing = node().download("studio", QWEN, done_gb=1).state
    # Progress is no moment.
    moments.note(report(node().download("studio", QWEN, done_gb=2)), ongoing, T + 5, False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(T, None)
    moments.note(report(node().download("studio", QWEN)), ongoing, T + 9, blind=False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(T, T + 9)


def test_after_a_gap_no_start_is_told_and_what_moved_meanwhile_is_forgotten() -> None:
    moments = DownloadMoments()
    nothing = node().state
    moments.note(report(node().download("studio", QWEN, done_gb=1)), nothing, T, blind=False)
    assert moments.starts(blind=True) == {}
    ongoing = node().download("studio", QWEN, done_gb=1).state
    moments.note(report(node().download("studio", QWEN)), ongoing, T + 9, blind=True)
    assert moments.of(STUDIO, QWEN) == NodeDownload(None, None)


def test_a_completion_never_seen_downloading_has_an_end_but_no_start() -> None:
    moments = DownloadMoments()
    queued = node().download("studio", QWEN, queued=True).state
    moments.note(report(node().download("studio", QWEN)), queued, T, blind=False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(None, T)


def test_a_disk_reporting_what_it_holds_is_no_completion() -> None:
    moments = DownloadMoments()
    moments.note(report(node().download("studio", QWEN)), node().state, T, blind=False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(None, None)


def test_failed_or_queued_again_forgets_the_download() -> None:
    for again in (
        node().download("studio", QWEN, failed="disk full"),
        node().download("studio", QWEN, queued=True),
    ):
        moments = DownloadMoments()
        moments.note(report(node().download("studio", QWEN, done_gb=1)), node().state, T, False)
        ongoing = node().download("studio", QWEN, done_gb=1).state
        moments.note(report(again), ongoing, T + 3, blind=False)
        assert moments.of(STUDIO, QWEN) == NodeDownload(None, None)


def test_a_download_of_a_node_the_state_does_not_hold_is_not_dated() -> None:
    moments = DownloadMoments()
    moments.note(report(node().download("studio", QWEN, done_gb=1)), State(), T, blind=False)
    assert moments.of(STUDIO, QWEN) == NodeDownload(None, None)


def test_a_node_that_left_takes_its_moments_with_it() -> None:
    moments = DownloadMoments()
    moments.note(report(node().download("studio", QWEN, done_gb=1)), node().state, T, False)
    moments.forget_node(node_id_for("mini"))
    assert moments.of(STUDIO, QWEN) == NodeDownload(T, None)
    moments.forget_node(STUDIO)
    assert moments.of(STUDIO, QWEN) == NodeDownload(None, None)
    assert moments.starts(blind=False) == {}


# -- GPU readings ---------------------------------------------------------------------------


def with_gpu(gpu: float, seen_at: float = T) -> State:
    builder = ClusterBuilder().node("studio").vitals("studio", gpu=gpu)
    state = builder.state
    return state.model_copy(update={"last_seen": {STUDIO: iso(seen_at)}})


def test_readings_keep_the_last_few_per_node_oldest_first() -> None:
    readings = GpuReadings()
    first = with_gpu(0.0)
    readings.note_snapshot(None, first)
    for i in range(1, GPU_READINGS_KEPT + 3):
        readings.reading(STUDIO, first.node_system[STUDIO].model_copy(update={"gpu_usage": i}))
    assert readings.of(STUDIO) == tuple(float(i) for i in range(3, GPU_READINGS_KEPT + 3))
    assert readings.of(node_id_for("mini")) == ()


def test_a_poll_counts_a_reading_only_when_the_node_reported_or_its_vitals_changed() -> None:
    readings = GpuReadings()
    readings.note_snapshot(None, with_gpu(0.5))
    readings.note_snapshot(with_gpu(0.5), with_gpu(0.5))  # nothing new
    assert readings.of(STUDIO) == (0.5,)
    readings.note_snapshot(with_gpu(0.5), with_gpu(0.5, seen_at=T + 1))  # it reported
    readings.note_snapshot(with_gpu(0.5, seen_at=T + 1), with_gpu(0.7, seen_at=T + 1))
    assert readings.of(STUDIO) == (0.5, 0.5, 0.7)


def test_readings_go_with_the_vitals_or_the_node() -> None:
    readings = GpuReadings()
    readings.note_snapshot(None, with_gpu(0.5))
    assert STUDIO in readings
    readings.note_snapshot(with_gpu(0.5), ClusterBuilder().node("studio").state)
    assert STUDIO not in readings and readings.of(STUDIO) == ()
    readings.note_snapshot(None, with_gpu(0.5))
    readings.forget(STUDIO)
    assert STUDIO not in readings
