"""The words of downloads and the parts of a recovery: pure functions, no model, no terminal."""

from __future__ import annotations

from recorded_exo import recorded_state

from exo_deploy_tui.model.downloads import (
    DownloadFacts,
    download_facts,
    download_mark,
    download_words,
    gating_download,
)
from exo_deploy_tui.model.format import part_duration, rate, size_gb, sizes_gb, sparkline
from exo_deploy_tui.model.recovery import NodeDownload, parts_text, recovery_parts
from keeper.model.state import AnyDownload

QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"
GB = 1024**3
MB = 1024**2


def facts(**fields: object) -> DownloadFacts:
    base: dict[str, object] = {
        "model_id": QWEN30,
        "phase": "downloading",
        "downloaded": int(7.3 * GB),
        "total": 17 * GB,
        "speed": 210 * MB,
        "eta_s": 46.0,
    }
    return DownloadFacts(**{**base, **fields})  # type: ignore[arg-type]


# --- words --------------------------------------------------------------------------------


def test_sizes_rates_and_parts_read_as_an_operator_reads_them() -> None:
    assert size_gb(17 * GB) == "17.0 GB"
    assert sizes_gb(int(7.3 * GB), 17 * GB) == "7.3/17.0 GB"
    assert rate(210.4 * MB) == "210 MB/s"
    assert [part_duration(s) for s in (0.012, 3.24, 31.4, 94)] == [
        "0.01 s",
        "3.2 s",
        "31 s",
        "1m34s",
    ]
    assert sparkline([0.0, 0.5, 1.0, 1.7, -1]) == "▁▅██▁"  # out of range is clamped


def test_a_download_in_words_and_narrower() -> None:
    ongoing = facts()
    assert download_words(ongoing) == "downloading 42% · 7.3/17.0 GB · 210 MB/s · ETA 46s"
    assert download_words(ongoing, 40) == "downloading 42% · 210 MB/s · ETA 46s"
    assert download_words(ongoing, 30) == "downloading 42% · ETA 46s"
    assert download_words(ongoing, 21) == "↓ 42% · ETA 46s"
    assert download_words(ongoing, 3) == "↓ 42%"  # the cell cuts what does not fit
    assert download_words(facts(phase="queued")) == "download queued"
    failed = facts(phase="failed", error="No space left on device")
    assert download_words(failed) == "download failed: No space left on device"
    assert download_words(facts(phase="failed")) == "download failed"
    # Nearly done is not done: the percentage rounds down.
    assert download_words(facts(downloaded=17 * GB - 1, eta_s=None, speed=0)).startswith(
        "downloading 99% · 17.0/17.0 GB"
    )
    assert [download_mark(f) for f in (ongoing, facts(phase="queued"), failed)] == [
        "↓42%",
        "↓queued",
        "↓failed",
    ]
    assert download_mark(facts(phase="downloaded")) == "on disk"


def test_exo_entries_read_as_facts() -> None:
    """exo's own entries: an ongoing one with every progress field, a completed one."""
    state = recorded_state("state-downloading")
    entries: dict[str, AnyDownload] = {n: e[0] for n, e in state.downloads.items()}
    ongoing = download_facts(entries["d2f80960-d20d-4473-b970-8318b488d614"])
    assert ongoing.phase == "downloading" and ongoing.total == 342884352
    assert ongoing.eta_s is not None and ongoing.speed > 0
    assert 0 < (ongoing.fraction or 0) < 1
    done = download_facts(entries["5763eeb9-da3e-4a1b-8b43-ed46f68c9532"])
    assert (done.phase, done.downloaded, done.total) == ("downloaded", 342884352, 342884352)


def test_an_instance_waits_for_its_failed_then_its_slowest_download() -> None:
    slow, fast = facts(eta_s=90.0), facts(eta_s=10.0)
    assert gating_download([("a", fast), ("b", slow)]) == ("b", slow)
    failed = facts(phase="failed", error="disk full")
    assert gating_download([("a", slow), ("c", failed)]) == ("c", failed)
    assert gating_download([("a", facts(phase="queued")), ("b", fast)]) == ("b", fast)
    assert gating_download([("a", facts(phase="downloaded"))]) is None


# --- a recovery's parts -------------------------------------------------------------------


def test_recovery_parts_from_the_moments_seen() -> None:
    parts = recovery_parts(
        outage_since=0.0,
        stopped_at=31.0,
        deletions=[31.0],
        placements=[31.01],
        downloads=[NodeDownload(31.5, 83.5), NodeDownload(None, None)],
        ready_at=94.5,
    )
    assert parts_text(parts) == "detected 31 s, placed 0.01 s, downloaded 52 s, loaded 11 s"


def test_recovery_parts_leave_out_what_was_not_seen() -> None:
    # Connected mid-recovery: nothing of its start was seen.
    unseen = recovery_parts(
        outage_since=0.0,
        stopped_at=None,
        deletions=[],
        placements=[5.0],
        downloads=[],
        ready_at=9.0,
    )
    assert unseen == []
    # A download whose start was not seen: its length is unknown, its end still dates the load.
    partial = recovery_parts(
        outage_since=0.0,
        stopped_at=0.0,
        deletions=[0.0, -50.0],
        placements=[2.0, -40.0],
        downloads=[NodeDownload(None, 30.0)],
        ready_at=40.0,
    )
    assert parts_text(partial) == "placed 2.0 s, loaded 10 s"
    # The last placement counts, from the deletion before it (the attempt that served).
    retried = recovery_parts(
        outage_since=0.0,
        stopped_at=0.0,
        deletions=[1.0, 20.0],
        placements=[2.0, 21.0],
        downloads=[],
        ready_at=30.0,
    )
    assert parts_text(retried) == "detected 1.0 s, placed 1.0 s, loaded 9.0 s"
