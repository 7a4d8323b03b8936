"""The event store under disk trouble: compaction cut short at every step, a full or read-only
disk while running (injected, and once for real on a tiny tmpfs), and damage in the middle of
the log found by a start, by ``exo-deploy log check`` and cut away by ``log repair``.

Every test compares States rebuilt from disk with the State the service held, and counts the
history events the log still offers (``iter_events``), so nothing lost can go unnoticed.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, _run_cancellable, exo_with_bridge, wait_until
from keeper_fakes import NoDrains
from model_ids import QWEN as BRIDGE_MODEL
from test_event_log import LLAMA, QWEN, story

from keeper.bridge.exo_client import ExoClient
from keeper.bridge.service import Bridge
from keeper.cli import main as cli_main
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    DeploymentDeleted,
    IndexedEvent,
    NodeGatheredInfo,
)
from keeper.model.state import State
from keeper.runtime import log_repair
from keeper.runtime.event_log import (
    HISTORY_KINDS,
    LOG_FILE,
    EventLog,
    EventLogCorruptError,
    FileOps,
    iter_events,
)
from keeper.runtime.event_store import EventStore, LogNotWritableError
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig


def churn(count: int) -> list[AnyEvent]:
    """Node reports: the bulk of a real log, and what compaction drops."""
    return [
        NodeGatheredInfo(node_id=f"n0-{i % 3}", when=f"2026-01-01T01:00:{i % 60:02d}.000Z")
        for i in range(count)
    ]


def history_of(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events if type(event).__name__ in HISTORY_KINDS]


def reopen(data_dir: Path) -> State:
    log = EventLog(data_dir)
    state = log.open().state
    log.close()
    return state


class _Crash(BaseException):
    """A kill at a step of compaction (BaseException: no ``except OSError`` may swallow it)."""


STEPS = [
    "temp written",
    "temp synced",
    "log replaced",
    "directory synced",
    "snapshot points at the compacted log",
]


def test_compaction_keeps_history_and_the_state(tmp_path: Path) -> None:
    events = story(rounds=3)
    middle = len(events) // 2
    before, after = events[:middle] + churn(500), events[middle:] + churn(50)
    store = EventStore(tmp_path, snapshot_every=10**9)
    store.open()
    store.commit_now(before)
    size_before = (tmp_path / LOG_FILE).stat().st_size
    store.snapshot_every = 1
    store.snapshot_now_if_due()
    assert store.compactions == 1
    assert (tmp_path / LOG_FILE).stat().st_size < size_before / 5
    store.snapshot_every = 10**9
    store.commit_now(after)
    live = store.state
    kinds = [type(indexed.event).__name__ for indexed in store.iter_events()]
    # History from before the compaction, then every event since.
    assert kinds[: len(history_of(before))] == history_of(before)
    assert len(kinds) == len(history_of(before)) + len(after)
    store.close()  # a clean stop snapshots and compacts too
    assert reopen(tmp_path) == live
    kinds = [type(indexed.event).__name__ for indexed in iter_events(tmp_path)]
    # Every event after the previous snapshot stays, so that it too rebuilds the State.
    assert kinds == history_of(before) + [type(event).__name__ for event in after]


def test_history_older_than_the_keep_period_is_dropped_by_a_later_compaction(
    tmp_path: Path,
) -> None:
    now = [0.0]
    store = EventStore(tmp_path, snapshot_every=1, history_keep_s=100.0, wall_time=lambda: now[0])
    store.open()
    first_day = story(rounds=1)
    store.commit_now(first_day)
    store.snapshot_now_if_due()  # compaction at t=0 marks the first day's last index
    now[0] = 50.0
    second_day = story(rounds=2)[len(first_day) :]
    store.commit_now(second_day)
    store.snapshot_now_if_due()  # within the keep period: everything kept
    # The first day's history, and the whole second day: it follows the previous snapshot.
    assert len(list(store.iter_events())) == len(history_of(first_day)) + len(second_day)
    now[0] = 120.0
    store.commit_now(churn(5))
    store.snapshot_now_if_due()  # the first mark is older than 100 s: its history goes
    kept = [indexed.idx for indexed in store.iter_events()]
    assert len(kept) == len(history_of(second_day)) + 5
    assert min(kept) >= len(first_day)
    live = store.state
    store.close()
    assert reopen(tmp_path) == live


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_at_any_step_of_compaction_loses_nothing(tmp_path: Path, step: str) -> None:
    earlier = story(rounds=1) + churn(100)
    events = earlier + story(rounds=2)[len(story(rounds=1)) :] + churn(200)
    store = EventStore(tmp_path, snapshot_every=10**9)
    store.open()
    store.commit_now(earlier)
    store.snapshot_every = 1
    store.snapshot_now_if_due()  # a first compaction: the crash is in the second
    store.snapshot_every = 10**9
    store.commit_now(events[len(earlier) :])
    live = store.state

    def crash(at: str) -> None:
        if at == step:
            raise _Crash(at)

    store.event_log.compaction_step = crash
    store.snapshot_every = 1
    with pytest.raises(_Crash):
        store.snapshot_now_if_due()
    # The process is gone: no close. A new one starts from what is on disk, and so it would
    # from the previous snapshot alone.
    alone = tmp_path / "previous-alone"
    alone.mkdir()
    for name in (LOG_FILE, "snapshot.prev.json"):
        (alone / name).write_bytes((tmp_path / name).read_bytes())
    assert reopen(alone) == live
    restarted = EventStore(tmp_path, snapshot_every=10**9)
    assert restarted.open().state == live
    assert history_of([i.event for i in restarted.iter_events()]) == history_of(events)
    more = churn(10) + story(rounds=1)[:6]
    restarted.commit_now(more)
    expected = restarted.state
    restarted.close()
    assert reopen(tmp_path) == expected
    assert expected.last_event_applied_idx == len(events) + len(more) - 1
    assert not (tmp_path / "events.jsonl.compacting").exists()


def test_a_compacted_log_without_its_snapshots_refuses_to_start(tmp_path: Path) -> None:
    store = EventStore(tmp_path, snapshot_every=1)
    store.open()
    store.commit_now(story(rounds=1))
    store.snapshot_now_if_due()
    store.close()
    (tmp_path / "snapshot.json").unlink()
    (tmp_path / "snapshot.prev.json").unlink()
    with pytest.raises(EventLogCorruptError, match="gap"):
        EventLog(tmp_path).open()


# --- a full or read-only disk -------------------------------------------------------------------


class FaultyDisk(FileOps):
    """Writes fail with ``error`` while it is set; ``partial`` first writes half the data."""

    def __init__(self) -> None:
        self.error: int | None = None
        self.partial = False

    def write(self, fd: int, data: memoryview) -> int:
        if self.error is not None:
            if self.partial and len(data) > 1:
                self.partial = False
                return super().write(fd, data[: len(data) // 2])
            raise OSError(self.error, os.strerror(self.error))
        return super().write(fd, data)


def test_a_failed_append_leaves_no_half_line_and_applies_nothing(tmp_path: Path) -> None:
    disk = FaultyDisk()
    store = EventStore(tmp_path, snapshot_every=10**9, file_ops=disk)
    store.open()
    events = story(rounds=1)
    store.commit_now(events[:5])
    kept = store.state
    disk.error, disk.partial = errno.ENOSPC, True
    with pytest.raises(LogNotWritableError, match="No space left on device"):
        store.commit_now(events[5:10])
    assert store.state == kept
    assert store.write_error == "event log not writable: No space left on device"
    disk.error = None
    store.commit_now(events[5:])
    assert store.write_error is None
    live = store.state
    assert [i.idx for i in store.iter_events()] == list(range(len(events)))
    store.close()
    assert reopen(tmp_path) == live


class CountingKeeper(NoDrains):
    def __init__(self, _started_at: float, _place: Any) -> None:
        self.steps = 0

    def step(self, state: State, now: float) -> list[AnyEvent]:
        self.steps += 1
        return []

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        return [DeploymentDeleted(deployment_id=deployment_id)]

    def scale(self, deployment_id: str, replicas: int, state: State) -> list[AnyEvent]:
        return []

    def timers(self, state: State, now: float) -> dict[str, Any]:
        return {}


async def wait_for(condition: Any, seconds: float = 60) -> None:
    with anyio.fail_after(seconds):  # virtual seconds
        while not condition():
            await anyio.sleep(0.5)


@pytest.mark.anyio
async def test_a_full_disk_refuses_changes_keeps_reads_and_recovers_by_itself(
    tmp_path: Path,
) -> None:
    disk = FaultyDisk()
    keepers: list[CountingKeeper] = []

    def keeper_factory(started_at: float, place: Any, *, startup_grace: float) -> CountingKeeper:
        keepers.append(CountingKeeper(started_at, place))
        return keepers[-1]

    master = Master(
        tmp_path,
        config=MasterConfig(startup_grace_s=0),
        keeper_factory=keeper_factory,
        file_ops=disk,
    )
    transport = httpx.ASGITransport(app=create_app(master, None))
    live, created = State(), list[str | None]()
    async with (
        anyio.create_task_group() as group,
        httpx.AsyncClient(transport=transport, base_url="http://master") as client,
    ):
        await group.start(master.run)
        first = await master.create_deployment(QWEN.model_id)
        await wait_for(lambda: keepers[0].steps > 0)
        disk.error = errno.ENOSPC
        refused = await client.post("/deployments", json={"model_id": LLAMA.model_id})
        assert refused.status_code == 503
        assert "event log not writable: No space left on device" in refused.text
        assert (await client.get("/state")).status_code == 200
        assert (await client.get("/deployments")).status_code == 200
        health = await client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["event_log"]["error"] == (
            "event log not writable: No space left on device"
        )
        await master.emit(churn(3))  # node reports nobody waits for: held, not applied
        await wait_for(lambda: master.events_held_unwritable == 3)
        assert "n0-0" not in master.state.last_seen
        steps = keepers[0].steps
        await anyio.sleep(10)
        assert keepers[0].steps == steps  # not stepped: it could not log a placement
        assert list(master.state.deployments) == [first.deployment_id]
        disk.error = errno.EROFS
        refused = await client.delete(f"/deployments/{first.deployment_id}")
        assert refused.status_code == 503
        assert "Read-only file system" in refused.text
        disk.error = None
        await wait_for(lambda: keepers[0].steps > steps)  # carries on by itself
        await wait_for(lambda: master.events_held_unwritable == 0)  # and logs what it held
        assert "n0-0" in master.state.last_seen
        assert (await client.get("/healthz")).status_code == 200
        second = await master.create_deployment(LLAMA.model_id)
        created = [first.deployment_id, second.deployment_id]
        live = master.state
        group.cancel_scope.cancel()
    assert sorted(reopen(tmp_path).deployments) == sorted(d for d in created if d)
    assert len(created) == 2
    assert reopen(tmp_path) == live


class NearlyFullDisk(FileOps):
    """A disk on which the log may grow to ``capacity`` bytes (None: no limit). A write past it
    writes what fits and returns the count, as a real nearly full disk does, and the next one
    fails with ENOSPC; a cut-off frees the room again. Other files (the probe) always fit: the
    case of a disk with a little room left that a whole backlog does not fit in."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.capacity: int | None = None

    def size(self) -> int:
        return self.log_path.stat().st_size

    def write(self, fd: int, data: memoryview) -> int:
        if self.capacity is None or os.fstat(fd).st_ino != self.log_path.stat().st_ino:
            return super().write(fd, data)
        room = self.capacity - os.fstat(fd).st_size
        if room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return super().write(fd, data[:room])


def counting_keeper(started_at: float, place: Any, *, startup_grace: float) -> CountingKeeper:
    return CountingKeeper(started_at, place)


def timed_reports(count: int) -> list[NodeGatheredInfo]:
    """Node reports each with its own time, so their order on disk can be checked."""
    return [
        NodeGatheredInfo(
            node_id=f"n0-{i % 3}",
            when=f"2026-01-01T{i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}.000Z",
        )
        for i in range(count)
    ]


def report_times(data_dir: Path) -> list[str]:
    times: list[str] = []
    for indexed in iter_events(data_dir):
        if isinstance(indexed.event, NodeGatheredInfo):
            times.append(indexed.event.when)
    return times


@pytest.mark.anyio
async def test_a_backlog_larger_than_the_room_left_is_written_a_batch_at_a_time(
    tmp_path: Path,
) -> None:
    disk = NearlyFullDisk(tmp_path / LOG_FILE)
    master = Master(
        tmp_path,
        config=MasterConfig(startup_grace_s=0, node_timeout_s=10**6, compact_log=False),
        keeper_factory=counting_keeper,
        file_ops=disk,
    )
    reports = timed_reports(3_000)
    backlog = sum(
        len(IndexedEvent(idx=10**4, event=event).model_dump_json()) + 1 for event in reports
    )
    live, deployments = State(), list[str | None]()
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        first = await master.create_deployment(QWEN.model_id)
        disk.capacity = disk.size()  # the disk is full
        await master.emit(reports)
        await wait_for(lambda: master.events_held_unwritable == len(reports))
        with pytest.raises(LogNotWritableError):
            await master.create_deployment(LLAMA.model_id)
        # Room for a third of the backlog: the held reports go out a batch at a time, each one
        # durable, until what is left no longer fits.
        disk.capacity += backlog // 3
        await wait_for(lambda: master.events_held_unwritable < len(reports))
        await wait_for(lambda: disk.capacity is not None and disk.capacity - disk.size() < 400)
        written = report_times(tmp_path)
        assert len(reports) // 4 < len(written) < len(reports) // 2
        assert master.events_held_unwritable == len(reports) - len(written)
        assert written == [event.when for event in reports[: len(written)]]  # in order, a prefix
        with pytest.raises(LogNotWritableError):  # the rest, ahead of it, still does not fit
            await master.create_deployment(LLAMA.model_id)
        # Room for the rest: the next command is admitted once the backlog ahead of it is in.
        disk.capacity = None
        second = await master.create_deployment(LLAMA.model_id)
        assert master.events_held_unwritable == 0
        assert master.events_dropped_unwritable == 0
        deployments = [first.deployment_id, second.deployment_id]
        live = master.state
        group.cancel_scope.cancel()
    assert reopen(tmp_path) == live
    assert sorted(live.deployments) == sorted(d for d in deployments if d)
    assert report_times(tmp_path) == [event.when for event in reports]
    kinds = [type(indexed.event).__name__ for indexed in iter_events(tmp_path)]
    created = [at for at, kind in enumerate(kinds) if kind == "DeploymentCreated"]
    reported = [at for at, kind in enumerate(kinds) if kind == "NodeGatheredInfo"]
    assert created[0] < reported[0] and reported[-1] < created[1]  # the log's order is emit's


# --- the real thing: a tiny filesystem ----------------------------------------------------------


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tiny tmpfs here (needs root): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.processes  # mount(8) runs for real: out of -m "not processes" too
@pytest.mark.anyio
async def test_a_really_full_filesystem(tiny_fs: Path) -> None:
    # Read-only is covered by the injected EROFS above: a tmpfs with the log open for writing
    # cannot be remounted read-only ("mount point is busy").
    data_dir = tiny_fs / "master"
    # No keeper: its placement-failed events would change the State under the checks.
    master = Master(data_dir, config=MasterConfig(keeper_enabled=False))
    live, first_id = State(), ""
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        first = await master.create_deployment(QWEN.model_id)
        filler = tiny_fs / "filler"
        with filler.open("wb", buffering=0) as file, pytest.raises(OSError, match="space"):
            while True:
                file.write(b"\0" * 4096)
        # A burst of node reports larger than what is left of the log's last page.
        before = master.state
        await master.emit(churn(200))
        await wait_for(lambda: master.events_held_unwritable == 200)
        assert master.state == before  # the burst was not applied, but held
        # A deployment's one small line may still fit in the page the burst could not fill:
        # then it is durable; if not, it is refused and absent. Either way, never half.
        try:
            await master.create_deployment(LLAMA.model_id)
        except LogNotWritableError as exc:
            assert "No space left on device" in exc.message
            assert list(master.state.deployments) == [first.deployment_id]
            filler.unlink()
            await master.create_deployment(LLAMA.model_id)
        filler.unlink(missing_ok=True)
        assert master.write_error is None
        assert len(master.state.deployments) == 2
        # The held burst was logged and applied before the deployment, none of it lost.
        await wait_for(lambda: master.events_held_unwritable == 0)
        assert {"n0-0", "n0-1", "n0-2"} <= set(master.state.last_seen)
        assert master.events_dropped_unwritable == 0
        await wait_for(lambda: master.write_error is None)
        live, first_id = master.state, first.deployment_id or ""
        group.cancel_scope.cancel()
    assert reopen(data_dir) == live
    assert first_id in live.deployments


# --- damage in the middle -----------------------------------------------------------------------


def damaged(data_dir: Path) -> int:
    """A log of one story with its fifth line overwritten; returns that line's byte offset."""
    store = EventStore(data_dir, snapshot_every=10**9, compact=False)
    store.open()
    store.commit_now(story(rounds=1))
    store.close()
    path = data_dir / LOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:4])
    lines[4] = b'{"idx":4,"event":{"Garbage":' + b"x" * (len(lines[4]) - 30) + b"\n"
    path.write_bytes(b"".join(lines))
    return offset


def test_damage_in_the_middle_stops_the_start_and_log_check_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offset = damaged(tmp_path)
    with pytest.raises(EventLogCorruptError, match=rf"events\.jsonl.*byte {offset}.*Garbage"):
        EventLog(tmp_path).open()
    with pytest.raises(SystemExit) as exited:
        cli_main(["log", "check", str(tmp_path)])
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert f"byte {offset}" in err and "Garbage" in err
    # The start refused it: nothing on disk changed.
    assert b"Garbage" in (tmp_path / LOG_FILE).read_bytes()


def test_log_repair_keeps_a_backup_cuts_at_the_last_good_record_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    offset = damaged(tmp_path)
    original = (tmp_path / LOG_FILE).read_bytes()
    total = len(original.splitlines())
    with pytest.raises(SystemExit) as exited:
        cli_main(["log", "repair", str(tmp_path)])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert f"at byte {offset}: dropped {total - 5} events" in out
    backups = list(tmp_path.glob("events.jsonl.bak-*"))
    assert [backup.read_bytes() for backup in backups] == [original]
    assert (tmp_path / LOG_FILE).stat().st_size == offset
    # The snapshot a clean stop wrote still holds the State through the last event.
    assert "the snapshot still holds the State through event 16" in out
    assert reopen(tmp_path).last_event_applied_idx == 16
    assert log_repair.check(tmp_path).ok


def test_log_repair_without_a_snapshot_starts_from_the_good_records(tmp_path: Path) -> None:
    damaged(tmp_path)
    (tmp_path / "snapshot.json").unlink()
    (tmp_path / "snapshot.prev.json").unlink()
    report = log_repair.repair(tmp_path)
    assert report.ok, report.lines
    assert reopen(tmp_path).last_event_applied_idx == 3


def test_log_check_on_a_healthy_dir_and_on_no_dir(tmp_path: Path) -> None:
    store = EventStore(tmp_path, snapshot_every=10)
    store.open()
    for event in story(rounds=1):
        store.commit_now([event])
        store.snapshot_now_if_due()
    store.close()
    report = log_repair.check(tmp_path)
    assert report.ok and report.exit_code == 0
    assert "snapshot at event" in report.lines[0]
    missing = log_repair.check(tmp_path / "nope")
    assert (missing.ok, missing.exit_code) == (False, 1)
    assert "no events.jsonl" in missing.lines[0]


def test_indexed_events_round_trip_through_the_store(tmp_path: Path) -> None:
    store = EventStore(tmp_path, snapshot_every=10**9)
    store.open()
    numbered = store.commit_now(story(rounds=1)[:3])
    store.close()  # node reports only: the compaction at close drops them
    assert list(iter_events(tmp_path)) == []
    store = EventStore(tmp_path, snapshot_every=10**9)
    store.open()
    numbered = store.commit_now(story(rounds=1)[6:9])
    store.event_log.close()
    assert [i.idx for i in numbered] == [3, 4, 5]
    assert list(iter_events(tmp_path)) == [IndexedEvent(idx=i.idx, event=i.event) for i in numbered]


# --- the bridge's data dir follows the same rules -----------------------------------------------


@pytest.mark.anyio
async def test_the_bridge_refuses_changes_and_places_nothing_while_its_log_is_full(
    tmp_path: Path,
) -> None:
    async with exo_with_bridge(data_dir=None) as h:
        h.bridge_scope.cancel()
        disk = FaultyDisk()
        bridge = Bridge(ExoClient(EXO_URL, transport=h.link), tmp_path, file_ops=disk)
        h.bridge = bridge
        h.bridge_scope = await h.group.start(_run_cancellable, bridge)
        disk.error = errno.ENOSPC
        with pytest.raises(LogNotWritableError, match="No space left on device"):
            await bridge.create_deployment(BRIDGE_MODEL)
        assert bridge.state.deployments == {}
        assert bridge.health().model_dump(mode="json")["event_log"] == {
            "writable": False,
            "error": "event log not writable: No space left on device",
        }
        disk.error = None
        created = await bridge.create_deployment(BRIDGE_MODEL)
        disk.error = errno.ENOSPC  # the keeper's placement could not be recorded: none is made
        await anyio.sleep(STARTUP_GRACE + 10)
        assert h.link.posted_instances() == []
        disk.error = None
        await wait_until(h.serving, 30, "the deployment serving once the disk has room")
        disk.error = errno.EROFS
        with pytest.raises(LogNotWritableError, match="Read-only file system"):
            await bridge.delete_deployment(created.deployment_id or "")
        assert bridge.doomed_instances == []  # refused means nothing of it happened
        assert created.deployment_id in bridge.state.deployments
        assert h.serving()
        disk.error = None
    assert created.deployment_id in reopen(tmp_path).deployments
