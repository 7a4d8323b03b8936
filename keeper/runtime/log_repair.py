"""``exo-deploy log check|repair DIR``: what an operator does with a data dir that will not start.

A master (or bridge) refuses to start from a log with damage in the middle, or from a compacted
log with both snapshots damaged, because starting from a shorter history would silently forget
deployments and instances. These two commands are the way out, kept apart from the service so
they run on a stopped data dir:

- ``check`` reads the snapshots and the log every way a start could
  (``keeper.runtime.log_choices``), changing nothing, and reports each damaged file and what is
  wrong with it, what a start does now, and for each way of starting the events and deployments
  it would drop. It says ``ok`` (exit 0) only when no file is damaged.
- ``repair`` takes the way that drops least and says what it will drop BEFORE changing
  anything. Then it keeps a backup of each file it changes (``<file>.bak-<UTC time>``), cuts
  the log at the end of the last good record if that way meets damage, writes
  ``snapshot.json`` anew from that way's State if it did not start from it, and replaces a
  damaged ``snapshot.prev.json`` by a copy of ``snapshot.json``. It then checks again, and fails
  unless a start now reaches exactly the State it said it would.

Pure reporting functions return a ``LogReport``; the CLI prints its lines and exits with its
code (0 ok / 1 damaged or not repaired). ``repair`` also hands each line to ``say`` as it goes,
so the statement of what it will drop is out before the first file changes.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from keeper.model.events import IndexedEvent
from keeper.runtime.dir_lock import lock_data_dir
from keeper.runtime.event_log import keep_as, write_snapshot_file
from keeper.runtime.log_choices import Assessment, Choice, assess
from keeper.runtime.log_scan import (
    LOG_FILE,
    PREVIOUS_SNAPSHOT_FILE,
    SNAPSHOT_FILE,
    SNAPSHOTS,
    Scan,
    scan_dir,
)


@dataclass(frozen=True)
class LogReport:
    ok: bool
    lines: list[str]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def check(data_dir: Path) -> LogReport:
    """Read ``data_dir`` every way it can start and say what is damaged and what each way
    drops; ok only if nothing is damaged."""
    if not (data_dir / LOG_FILE).exists():
        return LogReport(False, [f"{data_dir}: no {LOG_FILE} here; is it a data dir?"])
    found = assess(data_dir)
    if not found.damaged:
        return LogReport(True, [f"ok: {_summary(data_dir, found.start)}"])
    return LogReport(False, _damage_report(found))


def _damage_report(found: Assessment) -> list[str]:
    lines = [f"damaged: {what}" for what in found.damaged]
    start = found.start
    if start.corrupt is None:
        taken = next(c for c in found.choices if c.source == start.snapshot_file)
        lines.append(
            f"a start goes on from {taken.name}: it {taken.loss()} "
            f"({_summary(found.data_dir, start)})"
        )
    else:
        lines.append("a start refuses (the damage above)")
    lines.append("each way to start, and what it drops:")
    lines.extend(f"- {choice.describe()}" for choice in found.choices)
    lines.append(
        f"`exo-deploy log repair {found.data_dir}` would {_plan(found).describe()}: "
        f"it {found.best.loss()}"
    )
    return lines


def _summary(data_dir: Path, found: Scan) -> str:
    snapshot = (
        f"snapshot at event {found.snapshot_idx} ({found.snapshot_file})"
        if found.snapshot_idx is not None
        else "no snapshot"
    )
    text = (
        f"{data_dir}: {snapshot} + {found.replayed} events after it; the State is at event "
        f"{found.state.last_event_applied_idx} with {len(found.state.deployments)} deployments "
        f"and {len(found.state.instances)} instances"
    )
    if found.torn_at is not None:
        text += f"; a torn last line at byte {found.torn_at} (a crash's) is dropped at start"
    return text


@dataclass(frozen=True)
class _Plan:
    """What a repair changes, for the way it takes."""

    choice: Choice
    cut_at: int | None  # where the log is cut, if that way meets damage
    new_snapshot: bool  # snapshot.json written anew from the way's State
    new_previous: bool  # a damaged snapshot.prev.json replaced by a copy of snapshot.json

    def describe(self) -> str:
        steps = ["keep a backup of each file it changes"]
        if self.cut_at is not None:
            steps.append(f"cut {LOG_FILE} at byte {self.cut_at}")
        if self.new_snapshot:
            steps.append(
                f"write {SNAPSHOT_FILE} anew from {self.choice.name} "
                f"(the State at event {self.choice.reached})"
            )
        if self.new_previous:
            steps.append(f"replace {PREVIOUS_SNAPSHOT_FILE} by a copy of {SNAPSHOT_FILE}")
        return steps[0] if len(steps) == 1 else ", ".join(steps[:-1]) + " and " + steps[-1]


def _plan(found: Assessment) -> _Plan:
    best = found.best
    data_dir = found.data_dir
    corrupt = best.scan.corrupt
    snapshots_kept = any((data_dir / name).exists() for name in SNAPSHOTS)
    previous = next((c for c in found.choices if c.source == PREVIOUS_SNAPSHOT_FILE), None)
    # The previous snapshot must stay a whole second way to start: one that is damaged, or
    # that would lose what the way taken keeps (damage only it reads), is replaced.
    stale = previous is None or previous.lost_events > best.lost_events
    return _Plan(
        best,
        corrupt.offset if corrupt is not None else None,
        best.source != SNAPSHOT_FILE and snapshots_kept,
        (data_dir / PREVIOUS_SNAPSHOT_FILE).exists() and stale,
    )


def repair(data_dir: Path, say: Callable[[str], None] | None = None) -> LogReport:
    """Say what it will drop, then back up, cut and rewrite what the way that drops least
    needs, and check the result. Holds the data dir while it does (``DataDirInUseError`` if a
    master or bridge has it)."""
    owner = lock_data_dir(data_dir) if data_dir.is_dir() else None
    try:
        return _repair(data_dir, say if say is not None else _silent)
    finally:
        if owner is not None:
            owner.release()


def _silent(_line: str) -> None:
    pass


def _repair(data_dir: Path, say: Callable[[str], None]) -> LogReport:
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        say(line)

    checked = check(data_dir)
    if checked.ok or not (data_dir / LOG_FILE).exists():
        for line in checked.lines:
            out(line)
        if checked.ok:
            out("nothing to repair")
        return LogReport(checked.ok, lines)
    found = assess(data_dir)
    plan = _plan(found)
    best = plan.choice
    for what in found.damaged:
        out(f"damaged: {what}")
    out(f"repair: will {plan.describe()}; this {best.loss()}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if plan.cut_at is not None:
        _cut(data_dir, plan.cut_at, best, stamp, out)
    if plan.new_snapshot:
        newest = data_dir / SNAPSHOT_FILE
        if newest.exists():
            out(f"backup: {_back_up(newest, stamp)}")
        state, offset = best.scan.state, best.scan.good_end  # the log goes on from there
        write_snapshot_file(newest, state.last_event_applied_idx, offset, state.model_dump_json())
        out(f"wrote {newest}: the State at event {state.last_event_applied_idx}")
    if plan.new_previous:
        previous = data_dir / PREVIOUS_SNAPSHOT_FILE
        out(f"backup: {_back_up(previous, stamp)}")
        keep_as(data_dir / SNAPSHOT_FILE, previous, link=False)
        out(f"replaced {previous} by a copy of {SNAPSHOT_FILE}")
    after = check(data_dir)
    for line in after.lines:
        out(line)
    reached = scan_dir(data_dir).state.last_event_applied_idx
    if after.ok and reached != best.reached:
        out(f"not repaired: a start now reaches event {reached}, not {best.reached} as stated")
        return LogReport(False, lines)
    return LogReport(after.ok, lines)


def _cut(data_dir: Path, cut: int, best: Choice, stamp: str, out: Callable[[str], None]) -> None:
    log_path = data_dir / LOG_FILE
    dropped, unreadable, dropped_idx = _count_tail(log_path, cut)
    backup = data_dir / f"{LOG_FILE}.bak-{stamp}"
    shutil.copy2(log_path, backup)
    out(f"backup: {backup}")
    with log_path.open("r+b") as file:
        file.truncate(cut)
        os.fsync(file.fileno())
    out(
        f"truncated {log_path} at byte {cut}: dropped {dropped} events"
        + (f" (indices {dropped_idx[0]}..{dropped_idx[1]})" if dropped_idx else "")
        + f" and {unreadable} unreadable line(s)"
    )
    covered = best.scan.snapshot_idx
    if covered is not None and dropped_idx and covered >= dropped_idx[0]:
        out(
            f"the snapshot still holds the State through event {covered}, so events up to "
            "it are kept there"
        )


def _back_up(path: Path, stamp: str) -> Path:
    backup = path.with_name(f"{path.name}.bak-{stamp}")
    shutil.copy2(path, backup)
    return backup


def _count_tail(log_path: Path, cut: int) -> tuple[int, int, tuple[int, int] | None]:
    events = unreadable = 0
    first: int | None = None
    last = -1
    with log_path.open("rb") as file:
        file.seek(cut)
        for line in file:
            try:
                idx = IndexedEvent.model_validate_json(line).idx
            except ValidationError:
                unreadable += 1
                continue
            events += 1
            first = idx if first is None else first
            last = idx
    return events, unreadable, (first, last) if first is not None else None
