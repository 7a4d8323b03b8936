"""``exo-deploy log check|repair DIR``: what an operator does with a data dir that will not start.

A master (or bridge) refuses to start from a log with damage in the middle, because starting
from a shorter history would silently forget deployments and instances. These two commands are
the way out, kept apart from the service so they run on a stopped data dir:

- ``check`` reads the snapshot and the log exactly as a start would (``event_log.scan_dir``),
  changing nothing, and reports what it found: file, byte offset and the unreadable bytes.
- ``repair`` copies the log aside first (``events.jsonl.bak-<UTC time>``), truncates it at the
  end of the last good record and says how many events that dropped (those the snapshot covers
  are still in the State it holds). It then checks again, so it never claims a repair that a
  start would not accept.

Pure reporting functions return a ``LogReport``; the CLI prints its lines and exits with its
code (0 ok / 1 damaged or not repaired).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from keeper.model.events import IndexedEvent
from keeper.runtime.dir_lock import lock_data_dir
from keeper.runtime.log_scan import LOG_FILE, Scan, read_snapshot, scan_dir


@dataclass(frozen=True)
class LogReport:
    ok: bool
    lines: list[str]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def check(data_dir: Path) -> LogReport:
    """Read ``data_dir`` as a start would and say whether it would start, and from what."""
    if not (data_dir / LOG_FILE).exists():
        return LogReport(False, [f"{data_dir}: no {LOG_FILE} here; is it a data dir?"])
    found = scan_dir(data_dir)
    if found.corrupt is not None:
        return LogReport(False, [f"corrupt: {found.corrupt}"])
    return LogReport(True, [f"ok: {_summary(data_dir, found)}"])


def _summary(data_dir: Path, found: Scan) -> str:
    snapshot = (
        f"snapshot at event {found.snapshot_idx}"
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


def repair(data_dir: Path) -> LogReport:
    """Back the log up, cut it at the last good record, and check the result. Holds the data
    dir while it does (``DataDirInUseError`` if a master or bridge has it)."""
    owner = lock_data_dir(data_dir) if data_dir.is_dir() else None
    try:
        return _repair(data_dir)
    finally:
        if owner is not None:
            owner.release()


def _repair(data_dir: Path) -> LogReport:
    checked = check(data_dir)
    if checked.ok:
        return LogReport(True, [*checked.lines, "nothing to repair"])
    found = scan_dir(data_dir)
    if found.corrupt is None:  # no log at all
        return checked
    log_path = data_dir / LOG_FILE
    cut = found.corrupt.offset
    dropped, unreadable, dropped_idx = _count_tail(log_path, cut)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    backup = data_dir / f"{LOG_FILE}.bak-{stamp}"
    shutil.copy2(log_path, backup)
    with log_path.open("r+b") as file:
        file.truncate(cut)
        os.fsync(file.fileno())
    lines = [
        f"damage: {found.corrupt}",
        f"backup: {backup}",
        f"truncated {log_path} at byte {cut}: dropped {dropped} events"
        + (f" (indices {dropped_idx[0]}..{dropped_idx[1]})" if dropped_idx else "")
        + f" and {unreadable} unreadable line(s)",
    ]
    snapshot = read_snapshot(data_dir)
    if snapshot is not None and dropped_idx and snapshot[0] >= dropped_idx[0]:
        lines.append(
            f"the snapshot still holds the State through event {snapshot[0]}, so events up to "
            "it are kept there"
        )
    after = check(data_dir)
    lines.extend(after.lines)
    return LogReport(after.ok, lines)


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
