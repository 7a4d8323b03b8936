"""Two snapshots on a compacted log: a damaged or lost ``snapshot.json`` costs nothing, and
``exo-deploy log check|repair`` state the truth about what each way out drops.

The data dir is a master's after three deployments, each created between compactions: the log
keeps the first two only as history (their node reports live in the snapshots) and every event
after the previous snapshot. Each test damages files the ways an operator or a disk might
(truncated, overwritten with garbage, deleted) and compares what a start then rebuilds with the
State the store held.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from keeper.cli import main as cli_main
from keeper.model.catalog import catalog_by_id
from keeper.model.events import AnyEvent, DeploymentCreated, NodeGatheredInfo
from keeper.model.state import Deployment, State
from keeper.runtime import log_repair
from keeper.runtime.event_log import LOG_FILE, SNAPSHOT_FILE, EventLog, EventLogCorruptError
from keeper.runtime.event_store import EventStore

# The data dir's layout, spelled out: the docs name it, and operators' backups depend on it.
PREVIOUS_SNAPSHOT_FILE = "snapshot.prev.json"
CATALOG = catalog_by_id()
# One model each: a master keeps one deployment per model.
MODELS = {
    "d-1": "mlx-community/Qwen3-0.6B-4bit",
    "d-2": "mlx-community/Llama-3.2-1B-Instruct-4bit",
    "d-3": "mlx-community/Llama-3.2-3B-Instruct-4bit",
}
DEPLOYMENTS = tuple(MODELS)


def reports(count: int, start: int) -> list[AnyEvent]:
    """Node reports: most of a real log, and what compaction drops."""
    return [
        NodeGatheredInfo(
            node_id=f"n-{i % 3}", when=f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z"
        )
        for i in range(start, start + count)
    ]


def created(deployment_id: str) -> DeploymentCreated:
    card = CATALOG[MODELS[deployment_id]]
    return DeploymentCreated(deployment=Deployment(deployment_id=deployment_id, model_card=card))


def compacted_master_dir(data_dir: Path) -> State:
    """d-1, reports, snapshot; d-2, reports, snapshot; d-3, reports, a clean stop (which
    snapshots and compacts once more). Returns the State the store held."""
    store = EventStore(data_dir, snapshot_every=10**9)
    store.open()
    for number, deployment_id in enumerate(DEPLOYMENTS):
        store.commit_now([created(deployment_id), *reports(50, start=50 * number)])
        if number < len(DEPLOYMENTS) - 1:
            store.snapshot_every = 1
            store.snapshot_now_if_due()
            store.snapshot_every = 10**9
    live = store.state
    store.close()
    assert store.compactions == 3
    assert sorted(live.deployments) == list(DEPLOYMENTS)
    return live


def reopen(data_dir: Path) -> State:
    log = EventLog(data_dir)
    state = log.open().state
    log.close()
    return state


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garbage(path: Path) -> None:
    path.write_bytes(b"\x00\xffnot a snapshot" * 20)


def deleted(path: Path) -> None:
    path.unlink()


DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated": truncated,
    "garbage": garbage,
    "deleted": deleted,
}
# What the start's warning and log check say of each.
SAID = {"truncated": "unreadable", "garbage": "unreadable", "deleted": "missing"}


def test_the_log_is_compacted_and_keeps_every_event_after_the_previous_snapshot(
    tmp_path: Path,
) -> None:
    live = compacted_master_dir(tmp_path)
    kept = [line for line in (tmp_path / LOG_FILE).read_bytes().splitlines()]
    assert len(kept) < live.last_event_applied_idx + 1  # compacted: node reports are gone
    (tmp_path / SNAPSHOT_FILE).unlink()
    (tmp_path / PREVIOUS_SNAPSHOT_FILE).unlink()
    with pytest.raises(EventLogCorruptError, match="gap"):  # the log alone cannot start
        reopen(tmp_path)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_newest_snapshot_starts_from_the_previous_one_losing_nothing(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    live = compacted_master_dir(tmp_path)
    DAMAGE[damage](tmp_path / SNAPSHOT_FILE)
    with caplog.at_level(logging.WARNING):
        store = EventStore(tmp_path, snapshot_every=10**9)
        recovery = store.open()
    assert recovery.snapshot_file == PREVIOUS_SNAPSHOT_FILE
    assert sorted(store.state.deployments) == list(DEPLOYMENTS)
    assert store.state == live
    warning = f"{tmp_path / SNAPSHOT_FILE} is {SAID[damage]}"
    assert warning in caplog.text and "starting from snapshot.prev.json" in caplog.text
    # It goes on, and its next snapshot makes the dir whole again.
    store.commit_now(reports(5, start=1000))
    live = store.state
    store.close()
    assert reopen(tmp_path) == live
    assert log_repair.check(tmp_path).ok


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_log_check_names_the_damaged_snapshot_and_that_the_previous_one_drops_nothing(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    live = compacted_master_dir(tmp_path)
    DAMAGE[damage](tmp_path / SNAPSHOT_FILE)
    with pytest.raises(SystemExit) as exited:
        cli_main(["log", "check", str(tmp_path)])
    assert exited.value.code == 1  # never ok with a damaged file
    said = capsys.readouterr().err
    assert f"damaged: {tmp_path / SNAPSHOT_FILE}: {SAID[damage]}" in said
    assert "a start goes on from snapshot.prev.json: it drops nothing" in said
    assert re.search(r"- from snapshot\.prev\.json \(event \d+\).*; drops nothing", said)
    # The log alone would keep d-1 only; check says so, by index and by name.
    last = live.last_event_applied_idx
    assert re.search(
        rf"- from events\.jsonl alone .* drops {last} events \(indices 1\.\.{last}\)"
        r", losing deployments d-2, d-3",
        said,
    )
    assert (
        "would keep a backup of each file it changes and write snapshot.json anew from "
        "snapshot.prev.json" in said
    )
    # The repair drops what it said: nothing.
    report = log_repair.repair(tmp_path)
    assert report.ok, report.lines
    assert (
        "repair: will keep a backup" in report.lines[1] and "this drops nothing" in report.lines[1]
    )
    assert reopen(tmp_path) == live
    if damage != "deleted":
        assert len(list(tmp_path.glob(f"{SNAPSHOT_FILE}.bak-*"))) == 1


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_previous_snapshot_is_reported_and_repaired_from_the_newest(
    tmp_path: Path, damage: str
) -> None:
    live = compacted_master_dir(tmp_path)
    DAMAGE[damage](tmp_path / PREVIOUS_SNAPSHOT_FILE)
    assert reopen(tmp_path) == live  # the newest is whole: a start does not need the other
    report = log_repair.check(tmp_path)
    if damage == "deleted":  # a dir may lack the previous snapshot (before its second one)
        assert report.ok, report.lines
        return
    assert not report.ok
    assert f"damaged: {tmp_path / PREVIOUS_SNAPSHOT_FILE}: unreadable" in report.lines[0]
    repaired = log_repair.repair(tmp_path)
    assert repaired.ok, repaired.lines
    assert "this drops nothing" in repaired.lines[1]
    assert (tmp_path / PREVIOUS_SNAPSHOT_FILE).read_bytes() == (
        tmp_path / SNAPSHOT_FILE
    ).read_bytes()
    assert reopen(tmp_path) == live


def test_the_previous_snapshot_is_found_in_the_log_whatever_its_offset_says(
    tmp_path: Path,
) -> None:
    live = compacted_master_dir(tmp_path)
    (tmp_path / SNAPSHOT_FILE).unlink()
    previous = tmp_path / PREVIOUS_SNAPSHOT_FILE
    lines = (tmp_path / LOG_FILE).read_bytes().splitlines(keepends=True)
    # Its offset is from the log before compaction; make it a line start past its own end.
    past = sum(len(line) for line in lines[:-3])
    previous.write_bytes(
        re.sub(rb'"logOffset":\d+', b'"logOffset":%d' % past, previous.read_bytes())
    )
    assert reopen(tmp_path) == live


def test_damage_only_the_previous_snapshot_reads_is_reported_and_the_previous_one_renewed(
    tmp_path: Path,
) -> None:
    live = compacted_master_dir(tmp_path)
    path = tmp_path / LOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    newest = log_repair.check(tmp_path)  # healthy: learn where each snapshot ends
    assert newest.ok, newest.lines
    # A line between the two snapshots: the newest covers it, only the previous one replays it.
    at = next(n for n, line in enumerate(lines) if b'"idx":120,' in line)
    lines[at] = b"x" * (len(lines[at]) - 1) + b"\n"
    path.write_bytes(b"".join(lines))
    assert reopen(tmp_path) == live  # a start from the newest does not read it
    report = log_repair.check(tmp_path)
    assert not report.ok
    assert any(line.startswith(f"damaged: {path}: the line at byte") for line in report.lines)
    repaired = log_repair.repair(tmp_path)
    assert repaired.ok, repaired.lines
    assert "this drops nothing" in " ".join(repaired.lines)
    assert (tmp_path / PREVIOUS_SNAPSHOT_FILE).read_bytes() == (
        tmp_path / SNAPSHOT_FILE
    ).read_bytes()
    assert reopen(tmp_path) == live


def stated_loss(text: str) -> tuple[int, int, int, str]:
    found = re.search(
        r"drops (\d+) events \(indices (\d+)\.\.(\d+)\), losing deployments ([\w, -]+)", text
    )
    assert found is not None, text
    return int(found[1]), int(found[2]), int(found[3]), found[4]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_with_both_snapshots_damaged_the_start_refuses_stating_what_repair_then_drops(
    tmp_path: Path, damage: str
) -> None:
    live = compacted_master_dir(tmp_path)
    DAMAGE[damage](tmp_path / SNAPSHOT_FILE)
    DAMAGE[damage](tmp_path / PREVIOUS_SNAPSHOT_FILE)
    with pytest.raises(EventLogCorruptError) as refused:
        reopen(tmp_path)
    advice = str(refused.value)
    assert f"exo-deploy log repair {tmp_path}" in advice
    if damage != "deleted":
        assert f"{tmp_path / SNAPSHOT_FILE} is unreadable" in advice
        assert f"{tmp_path / PREVIOUS_SNAPSHOT_FILE} is unreadable" in advice
    stated = stated_loss(advice)
    last = live.last_event_applied_idx
    assert stated == (last, 1, last, "d-2, d-3")  # d-1 is all the log alone still holds
    said: list[str] = []
    report = log_repair.repair(tmp_path, say=said.append)
    assert report.ok, report.lines
    assert said == report.lines
    announced = next(line for line in said if line.startswith("repair: will"))
    assert said.index(announced) < min(
        at for at, line in enumerate(said) if line.startswith("backup:")
    )  # stated before anything changed
    assert stated_loss(announced) == stated
    after = reopen(tmp_path)
    assert after.last_event_applied_idx == stated[1] - 1
    assert sorted(after.deployments) == ["d-1"]
    backups = sorted(p.name.split(".bak-")[0] for p in tmp_path.glob("*.bak-*"))
    kept = [LOG_FILE] + ([] if damage == "deleted" else [PREVIOUS_SNAPSHOT_FILE, SNAPSHOT_FILE])
    assert backups == sorted(kept)
