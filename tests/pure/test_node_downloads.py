"""A simulated node's models directory (``keeper.sim.node.downloads``), as a pure function of time.

The disk is asked for models at given moments and read at others; the figures are exact: a
download of T bytes at R bytes/s ends T / R after it starts, the next one starts that very
moment, and the entries are exo's, moving once a second.
"""

from __future__ import annotations

import math

import pytest

from keeper.model.catalog import catalog_by_id
from keeper.model.state import (
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    Memory,
    ModelCard,
)
from keeper.sim.node.downloads import (
    GIB,
    MIB,
    MODELS_DIR,
    REPORT_S,
    ModelsDisk,
    disk_refusal,
    file_count,
    whole_model_shard,
)

CATALOG = catalog_by_id()
QWEN_30B = CATALOG["mlx-community/Qwen3-30B-A3B-4bit"]  # 17.6 GB (16.4 GiB)
QWEN_06B = CATALOG["mlx-community/Qwen3-0.6B-4bit"]
LLAMA_1B = CATALOG["mlx-community/Llama-3.2-1B-Instruct-4bit"]
RATE = 2000 * MIB
NODE = "node-a"


def disk(total_gb: float = 100, has: tuple[ModelCard, ...] = ()) -> ModelsDisk:
    return ModelsDisk(NODE, int(total_gb * GIB), RATE, has)


def test_a_17_gb_model_takes_its_size_over_the_rate_with_exo_s_progress_every_second() -> None:
    models = disk()
    size = QWEN_30B.storage_size.in_bytes
    assert models.request(whole_model_shard(QWEN_30B), at=10.0) is None
    duration = size / RATE
    assert duration == pytest.approx(8.398, abs=1e-3)
    seen: list[DownloadOngoing] = []
    moments: list[float] = []
    now = 10.0
    while (change := models.next_change(now)) is not None:
        entry = models.entries(now)[QWEN_30B.model_id]
        assert isinstance(entry, DownloadOngoing)
        seen.append(entry)
        moments.append(now)
        now = change
        models.advance(now)
    assert now == pytest.approx(10.0 + duration)
    assert models.completed_at(QWEN_30B.model_id) == pytest.approx(10.0 + duration)
    assert [round(m - 10.0, 6) for m in moments] == [k * REPORT_S for k in range(9)]
    progress = [entry.download_progress for entry in seen]
    downloaded = [p.downloaded.in_bytes for p in progress]
    assert downloaded == sorted(downloaded) and downloaded[0] == 0
    assert downloaded[3] == 3 * RATE
    assert all(p.total.in_bytes == size and p.speed == RATE for p in progress)
    assert progress[3].eta_ms == int((size - 3 * RATE) / RATE * 1000)
    assert progress[3].downloaded_this_session == progress[3].downloaded
    assert {p.total_files for p in progress} == {file_count(size)} == {11}
    assert [p.completed_files for p in progress] == [11 * d // size for d in downloaded]
    done = models.entries(now)[QWEN_30B.model_id]
    assert done == DownloadCompleted(
        node_id=NODE,
        shard_metadata=whole_model_shard(QWEN_30B),
        model_directory=f"{MODELS_DIR}/{QWEN_30B.model_id}",
        total=QWEN_30B.storage_size,
    )
    assert models.usage(now).available.in_bytes == 100 * GIB - size


def test_exo_s_recorded_small_model_counts_eight_files() -> None:
    assert file_count(QWEN_06B.storage_size.in_bytes) == 8  # state-downloading.json


def test_one_download_at_a_time_the_next_starts_when_one_ends() -> None:
    models = disk()
    models.request(whole_model_shard(QWEN_30B), at=0.0)
    models.request(whole_model_shard(LLAMA_1B), at=1.0)
    assert models.downloading() == QWEN_30B.model_id
    assert models.queued() == [LLAMA_1B.model_id]
    waiting = models.entries(2.0)[LLAMA_1B.model_id]
    assert waiting == DownloadPending(
        node_id=NODE,
        shard_metadata=whole_model_shard(LLAMA_1B),
        model_directory=f"{MODELS_DIR}/{LLAMA_1B.model_id}",
        downloaded=Memory(),
        total=LLAMA_1B.storage_size,
    )
    first_done = QWEN_30B.storage_size.in_bytes / RATE
    models.advance(first_done + 30.0)  # one call, long after both ended: both exact
    assert models.completed_at(QWEN_30B.model_id) == pytest.approx(first_done)
    assert models.completed_at(LLAMA_1B.model_id) == pytest.approx(
        first_done + LLAMA_1B.storage_size.in_bytes / RATE
    )
    # Asked for again once whole: nothing to do.
    assert models.request(whole_model_shard(LLAMA_1B), at=60.0) is None
    assert models.downloading() is None


def test_a_model_bigger_than_what_is_free_fails_at_once_naming_the_sizes() -> None:
    models = disk(total_gb=17.2, has=(LLAMA_1B,))
    # 16.4 GiB would fit beside Llama 1B (0.7 GiB), not beside Qwen 0.6B (0.3 GiB) too, which is
    # not on disk yet but downloading: what a download still needs counts as taken.
    models.request(whole_model_shard(QWEN_06B), at=0.0)
    refusal = models.request(whole_model_shard(QWEN_30B), at=0.0)
    assert refusal is not None
    # exo's sentence, then the sizes: what it needs, what is free (the disk less the model on
    # it and the one queued), of how much.
    assert refusal == (
        "No writable model directory has 16.4 GiB free. Checked: ['/fake/models'] "
        "(mlx-community/Qwen3-30B-A3B-4bit needs 16.4 GiB; 16.2 GiB of 17.2 GiB free)"
    )
    entry = models.entries(0.0)[QWEN_30B.model_id]
    assert isinstance(entry, DownloadFailed) and entry.error_message == refusal
    assert models.downloading() == QWEN_06B.model_id  # the one that fits goes on


def test_cancel_keeps_the_bytes_and_a_new_request_resumes_from_them() -> None:
    models = disk()
    size = QWEN_30B.storage_size.in_bytes
    models.request(whole_model_shard(QWEN_30B), at=0.0)
    assert models.cancel(QWEN_30B.model_id, 2.5)
    pending = models.entries(3.0)[QWEN_30B.model_id]
    assert isinstance(pending, DownloadPending)
    assert pending.downloaded.in_bytes == int(2.5 * RATE)
    assert pending.total.in_bytes == size
    assert models.next_change(3.0) is None
    assert models.usage(3.0).available.in_bytes == 100 * GIB - int(2.5 * RATE)
    assert not models.cancel(QWEN_30B.model_id, 3.0)  # nothing to stop any more
    models.request(whole_model_shard(QWEN_30B), at=10.0)
    resumed = models.entries(11.0)[QWEN_30B.model_id]
    assert isinstance(resumed, DownloadOngoing)
    assert resumed.download_progress.downloaded.in_bytes == int(2.5 * RATE) + RATE
    assert resumed.download_progress.downloaded_this_session.in_bytes == RATE
    models.advance(100.0)
    assert models.completed_at(QWEN_30B.model_id) == pytest.approx(10.0 + (size / RATE - 2.5))


def test_delete_frees_the_disk_and_reads_pending_with_nothing() -> None:
    models = disk(has=(QWEN_30B,))
    assert models.usage(0.0).available.in_bytes == 100 * GIB - QWEN_30B.storage_size.in_bytes
    assert models.completed_at(QWEN_30B.model_id) == -math.inf
    assert models.delete(QWEN_30B.model_id, 5.0)
    assert models.usage(5.0).available.in_bytes == 100 * GIB
    assert models.entries(5.0)[QWEN_30B.model_id] == DownloadPending(
        node_id=NODE,
        shard_metadata=whole_model_shard(QWEN_30B),
        model_directory=f"{MODELS_DIR}/{QWEN_30B.model_id}",
    )
    assert models.completed_at(QWEN_30B.model_id) is None
    assert not models.delete("nobody/nothing", 5.0)
    # A download under way is stopped and its partial files go too.
    models.request(whole_model_shard(LLAMA_1B), at=6.0)
    models.delete(LLAMA_1B.model_id, 6.2)
    assert models.downloading() is None
    assert models.usage(6.2).available.in_bytes == 100 * GIB


def test_models_said_to_be_on_disk_must_fit() -> None:
    deepseek = CATALOG["mlx-community/DeepSeek-V3.1-4bit"]
    refusal = disk_refusal(100 * GIB, [deepseek, QWEN_06B])
    assert refusal is not None and "take 378.3 GiB, more than the 100.0 GiB disk" in refusal
    with pytest.raises(ValueError, match=r"more than the 100\.0 GiB disk"):
        disk(has=(deepseek,))
    assert disk_refusal(100 * GIB, [QWEN_06B]) is None


def test_a_restarted_node_keeps_its_files_and_a_cut_download_reads_pending() -> None:
    models = disk(has=(QWEN_06B,))
    models.request(whole_model_shard(QWEN_30B), at=0.0)
    after = models.survivor(3.0)
    assert after.completed_at(QWEN_06B.model_id) == -math.inf
    assert after.downloading() is None
    cut = after.entries(3.0)[QWEN_30B.model_id]
    assert isinstance(cut, DownloadPending) and cut.downloaded.in_bytes == 3 * RATE


def test_a_usage_reading_during_a_download_moves_with_its_progress_ticks() -> None:
    models = disk()
    models.request(whole_model_shard(QWEN_30B), at=0.0)
    assert models.usage(0.5).available.in_bytes == 100 * GIB
    assert models.usage(1.5).available.in_bytes == 100 * GIB - RATE
    # Settled bytes (what makes a node report its disk at once) leave the download out.
    assert models.settled_bytes() == 0
