"""The master's durable memory: an append-only log of indexed events plus periodic snapshots.

Layout of ``data_dir``:
- ``events.jsonl``: one ``IndexedEvent`` JSON per line, in index order. The router appends a
  whole batch with one write, then flushes and fsyncs once, and only then applies and publishes
  it; an event is acknowledged (a command's HTTP response, a node seeing it) only after that, so
  a crash can lose unacknowledged events but never acknowledged ones. Batching keeps the fsync
  cost per event small under load while a lone event still goes to disk at once.
- ``snapshot.json``: ``{"lastIdx", "logOffset", "state"}``, the State after event ``lastIdx``
  and the byte offset in the log just past it. Written every N events via a temp file and
  ``os.replace``, so it is either the old snapshot or the new one, never half of either. Restart
  loads it and replays only the tail from ``logOffset``, which keeps restart time bounded however
  long the log grows.

Recovery tolerates what a crash can leave: a torn last line (a write cut short, with or without
its newline) is truncated with a warning. Anything else unreadable (a bad line with more lines
after it, a gap in the indices) is not a crash artefact but damage, and stops the start with an
error naming the file and byte offset rather than silently dropping history. A snapshot that
disagrees with the log is ignored in favour of a full replay.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from keeper.apply import apply
from keeper.events import IndexedEvent
from keeper.state import State
from keeper.wire import first_validation_error

log = logging.getLogger(__name__)

LOG_FILE = "events.jsonl"
SNAPSHOT_FILE = "snapshot.json"


class EventLogCorruptError(Exception):
    """The log holds something a crash cannot explain; the message names file and offset."""


@dataclass(frozen=True)
class Recovery:
    """What ``EventLog.open`` found, for the start-up log line and the restart benchmark."""

    state: State
    snapshot_idx: int | None  # lastIdx of the snapshot used, None for a full replay
    events_replayed: int
    torn_bytes: int  # bytes of a torn last line that were truncated


class EventLog:
    """The log of one master. With ``data_dir`` None it keeps nothing (an in-memory master)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.data_dir = data_dir
        self._file: IO[bytes] | None = None
        self._offset = 0  # bytes in the log file, all of them whole lines
        self._last_idx = -1
        self.events_since_snapshot = 0

    @property
    def durable(self) -> bool:
        return self.data_dir is not None

    @property
    def log_path(self) -> Path | None:
        return None if self.data_dir is None else self.data_dir / LOG_FILE

    @property
    def snapshot_path(self) -> Path | None:
        return None if self.data_dir is None else self.data_dir / SNAPSHOT_FILE

    # --- start-up ------------------------------------------------------------------------

    def open(self) -> Recovery:
        """Rebuild the State from the snapshot and the log, and open the log for appending."""
        if self.data_dir is None:
            return Recovery(State(), None, 0, 0)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.data_dir / LOG_FILE
        log_path.touch(exist_ok=True)
        recovery = self._recover(log_path)
        self._file = log_path.open("ab")
        self._offset = log_path.stat().st_size
        self._last_idx = recovery.state.last_event_applied_idx
        self.events_since_snapshot = recovery.events_replayed
        return recovery

    def _recover(self, log_path: Path) -> Recovery:
        snapshot = self._read_snapshot()
        size = log_path.stat().st_size
        if snapshot is not None:
            last_idx, offset, state = snapshot
            if offset <= size and _at_line_start(log_path, offset):
                try:
                    return self._replay(log_path, state, offset, last_idx)
                except _SnapshotMismatchError as exc:
                    log.warning(
                        "%s disagrees with %s (%s); replaying the whole log",
                        SNAPSHOT_FILE,
                        LOG_FILE,
                        exc,
                    )
            else:
                log.warning(
                    "%s does not point at a line of %s; replaying the whole log",
                    SNAPSHOT_FILE,
                    LOG_FILE,
                )
        return self._replay(log_path, State(), 0, None)

    def _read_snapshot(self) -> tuple[int, int, State] | None:
        path = self.snapshot_path
        if path is None or not path.exists():
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

    def _replay(
        self, log_path: Path, state: State, offset: int, snapshot_idx: int | None
    ) -> Recovery:
        expected = state.last_event_applied_idx + 1
        replayed = 0
        torn_at: int | None = None
        with log_path.open("rb") as file:
            file.seek(offset)
            pending_error: tuple[int, str] | None = None
            for line_offset, line in _lines(file, offset):
                if pending_error is not None:
                    at, why = pending_error
                    raise EventLogCorruptError(
                        f"{log_path}: the line at byte {at} is not an event ({why}), and more "
                        "lines follow it, so it is damage rather than a torn write"
                    )
                if not line.endswith(b"\n"):
                    torn_at = line_offset  # a write cut short: never acknowledged
                    break
                try:
                    indexed = IndexedEvent.model_validate_json(line)
                except ValidationError as exc:
                    pending_error = (line_offset, first_validation_error(exc))
                    torn_at = line_offset
                    continue
                if indexed.idx != expected:
                    if snapshot_idx is not None and replayed == 0:
                        raise _SnapshotMismatchError(
                            f"the log continues at event {indexed.idx}, not {expected}"
                        )
                    raise EventLogCorruptError(
                        f"{log_path}: event {indexed.idx} at byte {line_offset} follows "
                        f"event {expected - 1}; the log has a gap or is out of order"
                    )
                state = apply(state, indexed.event)
                expected += 1
                replayed += 1
        if replayed:
            state = state.model_copy(update={"last_event_applied_idx": expected - 1})
        torn_bytes = 0
        if torn_at is not None:
            torn_bytes = log_path.stat().st_size - torn_at
            log.warning(
                "%s: truncating a torn last line (%d bytes at byte %d), left by a crash",
                log_path,
                torn_bytes,
                torn_at,
            )
            with log_path.open("r+b") as file:
                file.truncate(torn_at)
                os.fsync(file.fileno())
        return Recovery(state, snapshot_idx, replayed, torn_bytes)

    # --- running -------------------------------------------------------------------------

    def append(self, batch: Sequence[IndexedEvent]) -> None:
        """Write a batch, flush and fsync it: when this returns the batch survives a crash."""
        if not batch:
            return
        if batch[0].idx != self._last_idx + 1:
            raise ValueError(f"event {batch[0].idx} appended after event {self._last_idx}")
        self._last_idx = batch[-1].idx
        self.events_since_snapshot += len(batch)
        if self._file is None:
            return
        data = b"".join(indexed.model_dump_json().encode() + b"\n" for indexed in batch)
        self._file.write(data)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._offset += len(data)

    def write_snapshot(self, state: State) -> None:
        """Record ``state`` (which must include every appended event) as the restart point."""
        if state.last_event_applied_idx != self._last_idx:
            raise ValueError(
                f"snapshot of event {state.last_event_applied_idx} but the log is at "
                f"{self._last_idx}"
            )
        self.events_since_snapshot = 0
        path = self.snapshot_path
        if path is None:
            return
        body = (
            b'{"lastIdx":%d,"logOffset":%d,"state":' % (self._last_idx, self._offset)
            + state.model_dump_json().encode()
            + b"}"
        )
        temp = path.with_suffix(".tmp")
        with temp.open("wb") as file:
            file.write(body)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
        _fsync_dir(path.parent)

    def close(self) -> None:
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None


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
