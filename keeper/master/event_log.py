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

Appends go straight to the file descriptor (no Python buffer that would retry a failed write
behind our back). A failed or partial write is cut off again, so a full disk never leaves half
a line in the middle of the log, and the batch counts as not written (``LogWriteError``).

Compaction (``compact``, run after a periodic snapshot) keeps the log from growing forever: it
rewrites the log with only the covered events that are history (deployment and instance events,
which the soak's duplicate check and per-deployment history read; node reports and runner
statuses, nearly all of the volume, live on in the snapshot) and swaps it in with
``os.replace``. A crash at any step leaves the old log or the compacted one, each consistent
with the snapshot; recovery finds where the snapshot ends by the events' indices when its byte
offset no longer fits. A compacted log has gaps, so without its snapshot it refuses to start
instead of starting from a shorter history.

Recovery tolerates what a crash can leave: a torn last line (a write cut short, with or without
its newline) is truncated with a warning. Anything else unreadable (a bad line with more lines
after it, a gap in the indices) is damage and stops the start with an error naming the file,
the byte offset and what is there (``keeper.master.log_repair`` checks and repairs offline).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from keeper.apply import apply_all
from keeper.events import IndexedEvent
from keeper.state import State
from keeper.wire import first_validation_error

log = logging.getLogger(__name__)

LOG_FILE = "events.jsonl"
SNAPSHOT_FILE = "snapshot.json"
COMPACT_TEMP = "events.jsonl.compacting"
PROBE_FILE = ".write-probe"
# A probe writes this much: one filesystem block, about what a small batch needs.
PROBE_BYTES = 4096

# Event kinds compaction keeps: what per-deployment history and the soak's duplicate check read.
HISTORY_KINDS = frozenset(
    {
        "DeploymentCreated",
        "DeploymentDeleted",
        "DeploymentPlaced",
        "DeploymentPlacementFailed",
        "InstanceCreated",
        "InstanceDeleted",
    }
)
_HISTORY_KIND_BYTES = frozenset(kind.encode() for kind in HISTORY_KINDS)
_EVENT_KEY = b'"event":{"'
# How much of a bad line an error quotes: enough to recognise it, short enough for one line.
_QUOTE_BYTES = 60
_WAY_OUT = "; `exo-deploy log check DIR` shows it, `exo-deploy log repair DIR` cuts it off"


class EventLogCorruptError(Exception):
    """The log holds something a crash cannot explain; the message names file and offset."""

    def __init__(self, message: str, path: Path, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


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


@dataclass(frozen=True)
class Scan:
    """What reading a log found, without changing it (recovery and ``log check`` share it)."""

    state: State
    snapshot_idx: int | None  # lastIdx of the snapshot used, None for a full replay
    replayed: int
    good_end: int  # byte offset just past the last good line
    torn_at: int | None  # where a torn last line starts
    corrupt: EventLogCorruptError | None
    lines_after: int  # whole lines from the damage to the end (what a repair drops)


def is_history_line(line: bytes) -> bool:
    """Whether a log line is a deployment or instance event (read from its tag, not parsed)."""
    start = line.find(_EVENT_KEY)
    if start < 0:
        return False
    start += len(_EVENT_KEY)
    return line[start : line.find(b'"', start)] in _HISTORY_KIND_BYTES


class EventLog:
    """The log of one master. With ``data_dir`` None it keeps nothing (an in-memory master)."""

    def __init__(self, data_dir: Path | None, file_ops: FileOps | None = None) -> None:
        self.data_dir = data_dir
        self._ops = file_ops if file_ops is not None else FileOps()
        self._fd: int | None = None
        self._dirty = False  # a failed write may have left bytes past _offset
        self._offset = 0  # bytes in the log file, all of them whole lines
        self._last_idx = -1
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
        log_path = self.data_dir / LOG_FILE
        log_path.touch(exist_ok=True)
        (self.data_dir / COMPACT_TEMP).unlink(missing_ok=True)  # a compaction cut short
        recovery = self._recover(log_path)
        self._fd = os.open(log_path, os.O_WRONLY | os.O_APPEND)
        self._offset = log_path.stat().st_size
        self._last_idx = recovery.state.last_event_applied_idx
        self.events_since_snapshot = recovery.events_replayed
        return recovery

    def _recover(self, log_path: Path) -> Recovery:
        found = scan_dir(log_path.parent)
        if found.corrupt is not None:
            raise found.corrupt
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
        return Recovery(found.state, found.snapshot_idx, found.replayed, torn_bytes)

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
        """Record ``state`` (which must include every appended event) as the restart point."""
        if state.last_event_applied_idx != self._last_idx:
            raise ValueError(
                f"snapshot of event {state.last_event_applied_idx} but the log is at "
                f"{self._last_idx}"
            )
        path = self.snapshot_path
        if path is not None:
            _write_snapshot_file(path, self._last_idx, self._offset, state.model_dump_json())
        self.events_since_snapshot = 0

    def compact(self, state: State) -> tuple[int, int]:
        """Drop what the snapshot of ``state`` (just written) covers, keeping history events.

        Returns the log's size in bytes before and after."""
        if self.data_dir is None or self._fd is None:
            return 0, 0
        if state.last_event_applied_idx != self._last_idx:
            raise ValueError("compact right after the snapshot of the last event")
        log_path = self.data_dir / LOG_FILE
        temp = self.data_dir / COMPACT_TEMP
        before = self._offset
        step = self.compaction_step
        with log_path.open("rb") as source, temp.open("wb") as target:
            for line in source:
                if is_history_line(line):
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
        _write_snapshot_file(
            self.data_dir / SNAPSHOT_FILE, self._last_idx, after, state.model_dump_json()
        )
        step("snapshot points at the compacted log")
        return before, after

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                if not self._dirty:
                    os.fsync(fd)
            finally:
                os.close(fd)


def _no_step(_step: str) -> None:
    pass


def _write_snapshot_file(path: Path, last_idx: int, offset: int, state_json: str) -> None:
    head = b'{"lastIdx":%d,"logOffset":%d,"state":' % (last_idx, offset)
    body = head + state_json.encode() + b"}"
    temp = path.with_suffix(".tmp")
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


# --- reading (recovery, ``log check``, history readers) -----------------------------------


def read_snapshot(data_dir: Path) -> tuple[int, int, State] | None:
    path = data_dir / SNAPSHOT_FILE
    if not path.exists():
        return None
    try:
        raw: Any = json.loads(path.read_bytes())
        last_idx = int(raw["lastIdx"])
        offset = int(raw["logOffset"])
        state = State.model_validate(raw["state"])
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as exc:
        log.warning("ignoring unreadable %s (%s); replaying the whole log", path, exc)
        return None
    if state.last_event_applied_idx != last_idx:
        log.warning(
            "ignoring %s: its state is at event %d, not %d",
            path,
            state.last_event_applied_idx,
            last_idx,
        )
        return None
    return last_idx, offset, state


def scan_dir(data_dir: Path) -> Scan:
    """Rebuild the State of a data dir from its snapshot and log, changing nothing on disk."""
    log_path = data_dir / LOG_FILE
    size = log_path.stat().st_size if log_path.exists() else 0
    snapshot = read_snapshot(data_dir)
    if snapshot is not None:
        last_idx, offset, state = snapshot
        # The offset is a hint: after a compaction cut short it may point into the other file;
        # then the snapshot's end is found by index from the start (a compacted log is small).
        start = offset if offset <= size and _at_line_start(log_path, offset) else 0
        try:
            return _scan(log_path, state, start, last_idx)
        except _SnapshotMismatchError as exc:
            log.warning(
                "%s disagrees with %s (%s); replaying the whole log", SNAPSHOT_FILE, LOG_FILE, exc
            )
    return _scan(log_path, State(), 0, None)


def _scan(log_path: Path, state: State, offset: int, snapshot_idx: int | None) -> Scan:
    skip_through = state.last_event_applied_idx  # covered by the snapshot
    expected = skip_through + 1
    previous = -1
    batch: list[IndexedEvent] = []
    replayed = 0
    good_end = offset
    bad: tuple[int, bytes, str] | None = None
    corrupt: EventLogCorruptError | None = None
    lines_after = 0
    if not log_path.exists():
        return Scan(state, snapshot_idx, 0, 0, None, None, 0)
    with log_path.open("rb") as file:
        file.seek(offset)
        for line_offset, line in _lines(file, offset):
            if corrupt is not None:
                lines_after += 1
                continue
            if bad is not None:  # a bad line with more after it: damage, not a torn write
                at, found, why = bad
                corrupt = EventLogCorruptError(
                    f"{log_path}: the line at byte {at} is not an event ({why}; it reads "
                    f"{found[:_QUOTE_BYTES]!r}), and more lines follow it, so it is damage "
                    "rather than a torn write" + _WAY_OUT,
                    log_path,
                    at,
                )
                lines_after = 2
                continue
            if not line.endswith(b"\n"):
                bad = (line_offset, line, "torn")
                break
            try:
                indexed = IndexedEvent.model_validate_json(line)
            except ValidationError as exc:
                bad = (line_offset, line, first_validation_error(exc))
                continue
            if indexed.idx <= skip_through:
                if indexed.idx <= previous:
                    corrupt = _out_of_order(log_path, line_offset, indexed.idx, previous)
                    lines_after = 1
                    continue
                previous = indexed.idx
                good_end = line_offset + len(line)
                continue
            if indexed.idx != expected:
                if snapshot_idx is not None and replayed == 0:
                    raise _SnapshotMismatchError(
                        f"the log continues at event {indexed.idx}, not {expected}"
                    )
                corrupt = _out_of_order(log_path, line_offset, indexed.idx, expected - 1)
                lines_after = 1
                continue
            batch.append(indexed)
            if len(batch) >= _APPLY_CHUNK:
                state = apply_all(state, batch)
                batch = []
            expected += 1
            replayed += 1
            good_end = line_offset + len(line)
    state = apply_all(state, batch)
    torn_at = bad[0] if bad is not None and corrupt is None else None
    return Scan(state, snapshot_idx, replayed, good_end, torn_at, corrupt, lines_after)


# Events applied per ``apply_all`` call during replay (bounds the list held in memory).
_APPLY_CHUNK = 4096


def _out_of_order(path: Path, at: int, idx: int, after: int) -> EventLogCorruptError:
    return EventLogCorruptError(
        f"{path}: event {idx} at byte {at} follows event {after}; the log has a gap or is out of "
        "order (a compacted log also reads so without its snapshot.json)" + _WAY_OUT,
        path,
        at,
    )


def iter_events(data_dir: Path) -> Iterator[IndexedEvent]:
    """Every event a data dir's log holds, oldest first (after compaction: the history events
    the snapshots cover, then every event since the last one).

    For readers such as the soak's duplicate check and history queries."""
    return iter_log_file(data_dir / LOG_FILE)


def iter_log_file(log_path: Path) -> Iterator[IndexedEvent]:
    """The events of one log file; stops at a torn or unreadable line, as recovery would."""
    if not log_path.exists():
        return
    with log_path.open("rb") as file:
        for line in file:
            if not line.endswith(b"\n"):
                return
            try:
                yield IndexedEvent.model_validate_json(line)
            except ValidationError:
                return


class _SnapshotMismatchError(Exception):
    pass


def _lines(file: IO[bytes], offset: int) -> Iterator[tuple[int, bytes]]:
    position = offset
    for line in file:
        yield position, line
        position += len(line)


def _at_line_start(path: Path, offset: int) -> bool:
    if offset == 0:
        return True
    with path.open("rb") as file:
        file.seek(offset - 1)
        return file.read(1) == b"\n"


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
