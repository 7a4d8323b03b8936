"""The master's durable memory: an append-only log of indexed events plus periodic snapshots.

Layout of ``data_dir``:
- ``events.jsonl``: one ``IndexedEvent`` JSON per line, in index order. The router appends a
  whole batch with one write, then fsyncs once, and only then applies and publishes it; an
  event is acknowledged (a command's HTTP response, a node seeing it) only after that, so a
  crash can lose unacknowledged events but never acknowledged ones. Batching keeps the fsync
  cost per event small under load while a lone event still goes to disk at once.
- ``snapshot.json``: ``{"lastIdx", "logOffset", "state"}``, the State after event ``lastIdx``
  and the byte offset in the log just past it. Written via a temp file and ``os.replace``, so it
  is either the old snapshot or the new one, never half of either. Restart loads it and replays
  only the tail, which keeps restart time bounded however long the log has grown.
- ``snapshot.prev.json``: the snapshot ``snapshot.json`` replaced (hard-linked into place before
  the new one is written, so it costs no copy), or a copy of the first one. Whatever damages or
  deletes one snapshot file, the other is a second restart point.

Appends go straight to the file descriptor (no Python buffer that would retry a failed write
behind our back). A failed or partial write is cut off again, so a full disk never leaves half
a line in the middle of the log, and the batch counts as not written (``LogWriteError``).

Compaction (``compact``, run after a periodic snapshot) keeps the log from growing forever: it
rewrites the log with every event after the PREVIOUS snapshot and, of those before it, only
the history (deployment and instance events, which the soak's duplicate check and per-deployment
history read; node reports and runner statuses, nearly all of the volume, live on in the
snapshots), and swaps it in with ``os.replace``. So either snapshot plus the log rebuilds the
same State, at the cost of one snapshot interval of events more on disk. A crash at any step
leaves the old log or the compacted one, each consistent with both snapshots; recovery finds
where a snapshot ends by the events' indices when its byte offset no longer fits. A compacted
log has gaps, so without either snapshot it refuses to start instead of starting from a shorter
history, saying what ``exo-deploy log repair`` would drop (``keeper.runtime.log_choices``).

Recovery tolerates what a crash can leave: a torn last line (a write cut short, with or without
its newline) is truncated with a warning. Anything else unreadable (a bad line with more lines
after it, a gap in the indices) is damage and stops the start with an error naming the file,
the byte offset and what is there. Reading is ``keeper.runtime.log_scan`` (shared with
``exo-deploy log check|repair``, ``keeper.runtime.log_repair``); this module writes.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from keeper.model.events import IndexedEvent
from keeper.model.state import State
from keeper.runtime.dir_lock import DataDirLock, lock_data_dir
from keeper.runtime.log_choices import assess
from keeper.runtime.log_scan import (
    HISTORY_KINDS,
    LOG_FILE,
    PREVIOUS_SNAPSHOT_FILE,
    SNAPSHOT_FILE,
    EventLogCorruptError,
    Scan,
    is_history_line,
    iter_events,
    line_idx,
    scan_dir,
)

# The reading side's names are re-exported: callers deal with "the event log" as one thing.
__all__ = [
    "COMPACT_TEMP",
    "HISTORY_KINDS",
    "LOG_FILE",
    "PREVIOUS_SNAPSHOT_FILE",
    "PROBE_BYTES",
    "PROBE_FILE",
    "SNAPSHOT_FILE",
    "EventLog",
    "EventLogCorruptError",
    "FileOps",
    "LogWriteError",
    "Recovery",
    "iter_events",
]

log = logging.getLogger(__name__)

COMPACT_TEMP = "events.jsonl.compacting"
PROBE_FILE = ".write-probe"
# A probe writes this much: one filesystem block, about what a small batch needs.
PROBE_BYTES = 4096


class LogWriteError(OSError):
    """A batch could not be written durably; none of it is in the log."""


class FileOps:
    """The system calls an append makes: one seam for tests to inject a full or read-only disk."""

    def write(self, fd: int, data: memoryview) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)


@dataclass(frozen=True)
class Recovery:
    """What ``EventLog.open`` found, for the start-up log line and the restart benchmark."""

    state: State
    snapshot_idx: int | None  # lastIdx of the snapshot used, None for a full replay
    events_replayed: int
    torn_bytes: int  # bytes of a torn last line that were truncated
    snapshot_file: str | None = None  # which snapshot file it started from
    passed_over: tuple[str, ...] = ()  # the snapshot files not used, and what was wrong


class EventLog:
    """The log of one master. With ``data_dir`` None it keeps nothing (an in-memory master)."""

    def __init__(self, data_dir: Path | None, file_ops: FileOps | None = None) -> None:
        self.data_dir = data_dir
        self._ops = file_ops if file_ops is not None else FileOps()
        self._fd: int | None = None
        self._owner: DataDirLock | None = None
        self._dirty = False  # a failed write may have left bytes past _offset
        self._offset = 0  # bytes in the log file, all of them whole lines
        self._last_idx = -1
        # lastIdx of snapshot.json and of snapshot.prev.json when they are known to be whole and
        # to agree with the log (read at the start, or written since); None when not known.
        self._newest: int | None = None
        self._previous: int | None = None
        self.events_since_snapshot = 0
        # Called with each step's name during compaction; tests stop there to play a crash.
        self.compaction_step: Callable[[str], None] = _no_step

    @property
    def durable(self) -> bool:
        return self.data_dir is not None

    @property
    def log_path(self) -> Path | None:
        return None if self.data_dir is None else self.data_dir / LOG_FILE

    @property
    def snapshot_path(self) -> Path | None:
        return None if self.data_dir is None else self.data_dir / SNAPSHOT_FILE

    @property
    def last_idx(self) -> int:
        return self._last_idx

    # --- start-up ------------------------------------------------------------------------

    def open(self) -> Recovery:
        """Rebuild the State from the snapshot and the log, and open the log for appending."""
        if self.data_dir is None:
            return Recovery(State(), None, 0, 0)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # One owner per data dir (keeper.runtime.dir_lock): before anything is read or cut.
        self._owner = lock_data_dir(self.data_dir)
        log_path = self.data_dir / LOG_FILE
        log_path.touch(exist_ok=True)
        (self.data_dir / COMPACT_TEMP).unlink(missing_ok=True)  # a compaction cut short
        for name in (SNAPSHOT_FILE, PREVIOUS_SNAPSHOT_FILE):  # a snapshot cut short
            _temp_of(self.data_dir / name).unlink(missing_ok=True)
        try:
            recovery = self._recover(log_path)
        except BaseException:
            self._release_owner()  # a start that fails holds nothing
            raise
        self._fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        self._offset = log_path.stat().st_size
        self._last_idx = recovery.state.last_event_applied_idx
        self.events_since_snapshot = recovery.events_replayed
        used = recovery.snapshot_file
        self._newest = recovery.snapshot_idx if used == SNAPSHOT_FILE else None
        self._previous = recovery.snapshot_idx if used == PREVIOUS_SNAPSHOT_FILE else None
        return recovery

    def _recover(self, log_path: Path) -> Recovery:
        found = scan_dir(log_path.parent)
        if found.corrupt is not None:
            raise _refusal(log_path.parent, found, found.corrupt)
        for trouble in found.passed_over:
            instead = (
                f"{found.snapshot_file} (event {found.snapshot_idx})"
                if found.snapshot_file is not None
                else f"{LOG_FILE} alone"
            )
            log.warning(
                "%s: starting from %s and the %d events after it instead",
                trouble,
                instead,
                found.replayed,
            )
        torn_bytes = 0
        if found.torn_at is not None:
            torn_bytes = log_path.stat().st_size - found.torn_at
            log.warning(
                "%s: truncating a torn last line (%d bytes at byte %d), left by a crash",
                log_path,
                torn_bytes,
                found.torn_at,
            )
            with log_path.open("r+b") as file:
                file.truncate(found.torn_at)
                os.fsync(file.fileno())
        return Recovery(
            found.state,
            found.snapshot_idx,
            found.replayed,
            torn_bytes,
            found.snapshot_file,
            found.passed_over,
        )

    # --- running -------------------------------------------------------------------------

    def append(self, batch: Sequence[IndexedEvent]) -> None:
        """Write a batch and fsync it: when this returns the batch survives a crash.

        Raises ``LogWriteError`` if it could not (disk full, read-only): then nothing of the
        batch is in the log and the next append may try again."""
        if not batch:
            return
        if batch[0].idx != self._last_idx + 1:
            raise ValueError(f"event {batch[0].idx} appended after event {self._last_idx}")
        if self.data_dir is not None:
            data = b"".join(indexed.model_dump_json().encode() + b"\n" for indexed in batch)
            self._write_durably(data)
            self._offset += len(data)
        self._last_idx = batch[-1].idx
        self.events_since_snapshot += len(batch)

    def _write_durably(self, data: bytes) -> None:
        ops = self._ops
        try:
            fd = self._append_fd()
        except OSError as exc:
            raise LogWriteError(exc.errno, exc.strerror or str(exc)) from exc
        try:
            if self._dirty:  # cut off what a failed write left before adding to it
                ops.truncate(fd, self._offset)
                self._dirty = False
            self._dirty = True
            view = memoryview(data)
            while view:
                view = view[ops.write(fd, view) :]
            ops.fsync(fd)
            self._dirty = False
        except OSError as exc:
            if self._dirty:
                try:
                    ops.truncate(fd, self._offset)
                    self._dirty = False
                except OSError:
                    pass  # tried again before the next write
            raise LogWriteError(exc.errno, exc.strerror or str(exc)) from exc

    def _append_fd(self) -> int:
        # None after a compaction that swapped the file but could not reopen it.
        if self._fd is None:
            assert self.data_dir is not None
            self._fd = os.open(self.data_dir / LOG_FILE, os.O_WRONLY | os.O_APPEND)
        return self._fd

    def probe(self) -> None:
        """A small durable write beside the log (then removed); raises OSError if it fails."""
        if self.data_dir is None:
            return
        path = self.data_dir / PROBE_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                self._ops.write(fd, memoryview(b"\0" * PROBE_BYTES))
                self._ops.fsync(fd)
            finally:
                os.close(fd)
        finally:
            path.unlink(missing_ok=True)

    def write_snapshot(self, state: State) -> None:
        """Record ``state`` (which must include every appended event) as the restart point; the
        snapshot it replaces becomes ``snapshot.prev.json``."""
        if state.last_event_applied_idx != self._last_idx:
            raise ValueError(
                f"snapshot of event {state.last_event_applied_idx} but the log is at "
                f"{self._last_idx}"
            )
        if self.data_dir is not None:
            newest = self.data_dir / SNAPSHOT_FILE
            previous = self.data_dir / PREVIOUS_SNAPSHOT_FILE
            if self._newest is not None and newest.exists():
                # A link, not a copy: snapshot.json is then replaced by a new file, so the two
                # names part at once and the old snapshot costs no second write.
                keep_as(newest, previous, link=True)
                self._previous = self._newest
            write_snapshot_file(newest, self._last_idx, self._offset, state.model_dump_json())
            self._newest = self._last_idx
            if self._previous is None:
                # The first snapshot (or none whole before it): a copy, so that damage to one
                # file in place leaves the other whole.
                keep_as(newest, previous, link=False)
                self._previous = self._last_idx
        self.events_since_snapshot = 0

    def compact(self, state: State, keep_history_from: int = 0) -> tuple[int, int]:
        """Drop what the snapshot of ``state`` (just written) covers, but for every event after
        the previous snapshot (so that it too rebuilds the State) and the history events from
        index ``keep_history_from`` on.

        Returns the log's size in bytes before and after."""
        if self.data_dir is None or self._fd is None:
            return 0, 0
        if state.last_event_applied_idx != self._last_idx:
            raise ValueError("compact right after the snapshot of the last event")
        log_path = self.data_dir / LOG_FILE
        temp = self.data_dir / COMPACT_TEMP
        before = self._offset
        step = self.compaction_step
        # write_snapshot has made the previous snapshot known; -1 (keep everything) otherwise.
        keep_all_after = self._previous if self._previous is not None else -1
        with log_path.open("rb") as source, temp.open("wb") as target:
            for line in source:
                idx = line_idx(line)
                if idx > keep_all_after or (is_history_line(line) and idx >= keep_history_from):
                    target.write(line)
            target.flush()
            step("temp written")
            os.fsync(target.fileno())
            after = target.tell()
        step("temp synced")
        os.replace(temp, log_path)
        step("log replaced")
        _fsync_dir(self.data_dir)
        step("directory synced")
        fd, self._fd = self._fd, None  # from here appends go to the compacted file
        os.close(fd)
        self._offset = after
        self._append_fd()
        write_snapshot_file(
            self.data_dir / SNAPSHOT_FILE, self._last_idx, after, state.model_dump_json()
        )
        step("snapshot points at the compacted log")
        return before, after

    def close(self) -> None:
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                try:
                    if not self._dirty:
                        os.fsync(fd)
                finally:
                    os.close(fd)
        finally:
            self._release_owner()

    def _release_owner(self) -> None:
        if self._owner is not None:
            self._owner.release()
            self._owner = None


def _no_step(_step: str) -> None:
    pass


def _refusal(data_dir: Path, found: Scan, corrupt: EventLogCorruptError) -> EventLogCorruptError:
    """The start's error: the damage, the snapshots passed over, and what a repair would drop
    (the figures ``exo-deploy log repair`` then reports, from ``log_choices``)."""
    message = str(corrupt)
    try:
        best = assess(data_dir).best
    except OSError:
        return corrupt  # what there is to read cannot be read: the damage alone, then
    if found.passed_over:
        message += "; not used: " + "; ".join(found.passed_over)
    message += (
        f". `exo-deploy log repair {data_dir}` would keep a backup and start from {best.name}: "
        f"it {best.loss()}"
    )
    return EventLogCorruptError(message, corrupt.path, corrupt.offset)


def _temp_of(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def keep_as(source: Path, target: Path, *, link: bool) -> None:
    """Make ``target`` a whole copy (or a hard link) of ``source``, atomically."""
    temp = _temp_of(target)
    temp.unlink(missing_ok=True)
    try:
        made = False
        if link:
            try:
                os.link(source, temp)
                made = True
            except OSError:
                pass  # no hard links here: copy instead
        if not made:
            shutil.copyfile(source, temp)
            with temp.open("rb") as file:
                os.fsync(file.fileno())
        os.replace(temp, target)
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)


def write_snapshot_file(path: Path, last_idx: int, offset: int, state_json: str) -> None:
    head = b'{"lastIdx":%d,"logOffset":%d,"state":' % (last_idx, offset)
    body = head + state_json.encode() + b"}"
    temp = _temp_of(path)
    try:
        with temp.open("wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except OSError:
        temp.unlink(missing_ok=True)  # a full disk must not keep half a snapshot around
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # The rename is durable only once the directory entry is; not every platform allows it.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
