"""Reading a data dir (snapshot + event log) without changing it: the one place that decides
what a log means.

Recovery (``keeper.runtime.event_log``), ``exo-deploy log check|repair``
(``keeper.runtime.log_repair``) and history readers (the soak's duplicate check) all read
through here, so a start and a check can never disagree about a file. ``scan_dir`` rebuilds the
State: the snapshot, then the events after it. The snapshot's byte offset is only a hint; when
it does not fit (a compaction was cut short) the end of the snapshot is found by the events'
indices, skipping, but still validating, the history lines it covers. What a crash can leave (a
torn last line) is reported as ``torn_at`` for the caller to truncate; anything else unreadable
is ``corrupt``, with file, offset and the bytes found.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from keeper.model.apply import apply_all
from keeper.model.events import IndexedEvent
from keeper.model.state import State
from keeper.model.wire import first_validation_error

log = logging.getLogger(__name__)

LOG_FILE = "events.jsonl"
SNAPSHOT_FILE = "snapshot.json"

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
_IDX_KEY = b'{"idx":'
# How much of a bad line an error quotes: enough to recognise it, short enough for one line.
_QUOTE_BYTES = 60
_WAY_OUT = "; `exo-deploy log check DIR` shows it, `exo-deploy log repair DIR` cuts it off"


class EventLogCorruptError(Exception):
    """The log holds something a crash cannot explain; the message names file and offset."""

    def __init__(self, message: str, path: Path, offset: int) -> None:
        super().__init__(message)
        self.path = path
        self.offset = offset


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


def line_idx(line: bytes) -> int:
    """The index of a line our log wrote (``{"idx":N,...``), read without parsing; -1 if not."""
    if not line.startswith(_IDX_KEY):
        return -1
    end = line.find(b",", len(_IDX_KEY))
    digits = line[len(_IDX_KEY) : end]
    return int(digits) if digits.isdigit() else -1


def is_history_line(line: bytes) -> bool:
    """Whether a log line is a deployment or instance event (read from its tag, not parsed)."""
    start = line.find(_EVENT_KEY)
    if start < 0:
        return False
    start += len(_EVENT_KEY)
    return line[start : line.find(b'"', start)] in _HISTORY_KIND_BYTES


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
