"""Reading a data dir (snapshot + event log) without changing it: the one place that decides
what a log means.

Recovery (``keeper.runtime.event_log``), ``exo-deploy log check|repair``
(``keeper.runtime.log_repair``) and history readers (the soak's duplicate check) all read
through here, so a start and a check can never disagree about a file. ``scan_dir`` rebuilds the
State: a snapshot, then the events after it. The snapshot's byte offset is only a hint; when
it does not fit (a compaction was cut short, or it is the previous snapshot's, from before the
log was rewritten) the end of the snapshot is found by the events' indices from the start,
skipping, but still validating, the history lines it covers. What a crash can leave (a torn last
line) is reported as ``torn_at`` for the caller to truncate; anything else unreadable is
``corrupt``, with file, offset and the bytes found.

There are two snapshots (``SNAPSHOTS``, newest first): ``snapshot.json`` and the one before it,
``snapshot.prev.json``, with every event after the older one still in the log
(``keeper.runtime.event_log`` compacts so). A start takes the first that is readable and agrees
with the log, and says what was wrong with any it passed over (``Scan.passed_over``): so one
damaged or lost snapshot costs nothing. ``candidates`` and ``scan_from`` are the pieces, for
``keeper.runtime.log_choices``, which weighs every way of starting.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from keeper.model.apply import apply_all
from keeper.model.events import IndexedEvent
from keeper.model.state import State
from keeper.model.wire import first_validation_error

LOG_FILE = "events.jsonl"
SNAPSHOT_FILE = "snapshot.json"
PREVIOUS_SNAPSHOT_FILE = "snapshot.prev.json"
# The order a start tries the snapshots in: the newest, then the one it replaced.
SNAPSHOTS = (SNAPSHOT_FILE, PREVIOUS_SNAPSHOT_FILE)

# Event kinds compaction keeps: what per-deployment history and the soak's duplicate check read.
# The check allows one instance beyond the replicas while a move owns it (docs/design.md §5.17),
# so the records of the moves, and what they depend on in apply (a scale's replicas, a rolling
# change's instances to replace, a drain's start and end), are kept with the instances: rare
# events, a few per move.
HISTORY_KINDS = frozenset(
    {
        "DeploymentCreated",
        "DeploymentDeleted",
        "DeploymentPlaced",
        "DeploymentPlacementFailed",
        "DeploymentScaled",
        "DeploymentOptionsChanged",
        "DeploymentReplacementPlaced",
        "FailoverReplacementPlaced",
        "DeploymentRepairPlaced",
        "NodeDrainStarted",
        "DrainReplacementPlaced",
        "NodeDrainEnded",
        "InstanceCreated",
        "InstanceDeleted",
    }
)
_HISTORY_KIND_BYTES = frozenset(kind.encode() for kind in HISTORY_KINDS)
_EVENT_KEY = b'"event":{"'
_IDX_KEY = b'{"idx":'
# How much of a bad line an error quotes: enough to recognise it, short enough for one line.
_QUOTE_BYTES = 60
_WAY_OUT = "; `exo-deploy log check DIR` shows it and what each way out drops"


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
    snapshot_file: str | None = None  # the snapshot used (a name in SNAPSHOTS), None: none
    passed_over: tuple[str, ...] = ()  # what was wrong with each snapshot not used


@dataclass(frozen=True)
class Snapshot:
    """A snapshot file as read: the State after event ``last_idx``, and where the log then
    went on (a hint)."""

    file: str
    last_idx: int
    offset: int
    state: State


@dataclass(frozen=True)
class Candidate:
    """One snapshot file and what reading it found: ``snapshot`` if it is readable, else
    ``trouble`` says what is wrong (``missing`` is not trouble unless the other one is there)."""

    file: str
    snapshot: Snapshot | None
    trouble: str | None


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


def read_snapshot_file(data_dir: Path, file: str) -> Snapshot | str | None:
    """The snapshot in ``data_dir/file``; None if there is none, else what is wrong with it."""
    path = data_dir / file
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    try:
        raw: Any = json.loads(body)
        last_idx = int(raw["lastIdx"])
        offset = int(raw["logOffset"])
        state = State.model_validate(raw["state"])
    except ValidationError as exc:
        return f"unreadable (its state: {first_validation_error(exc)})"
    except (ValueError, KeyError, TypeError) as exc:
        what = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        return f"unreadable ({what or type(exc).__name__}; {len(body)} bytes)"
    if state.last_event_applied_idx != last_idx:
        at = state.last_event_applied_idx
        return f"inconsistent (its state is at event {at}, not {last_idx})"
    return Snapshot(file, last_idx, offset, state)


def read_snapshot(data_dir: Path) -> tuple[int, int, State] | None:
    """The newest snapshot's ``(lastIdx, logOffset, State)`` if it is whole, else None."""
    found = read_snapshot_file(data_dir, SNAPSHOT_FILE)
    return (found.last_idx, found.offset, found.state) if isinstance(found, Snapshot) else None


def candidates(data_dir: Path) -> Iterator[Candidate]:
    """Both snapshot files, newest first, each read only when asked for (a start that takes
    the newest never parses the other). A missing one is trouble only beside the other: the
    newest is never removed once written; the previous one is written with the first snapshot,
    but a dir from before there were two lacks it."""
    for file in SNAPSHOTS:
        snapshot = read_snapshot_file(data_dir, file)
        if isinstance(snapshot, Snapshot):
            yield Candidate(file, snapshot, None)
        elif isinstance(snapshot, str):
            yield Candidate(file, None, snapshot)
        elif file == SNAPSHOT_FILE and (data_dir / PREVIOUS_SNAPSHOT_FILE).exists():
            yield Candidate(file, None, f"missing (but {PREVIOUS_SNAPSHOT_FILE} is there)")
        else:
            yield Candidate(file, None, None)


def scan_from(data_dir: Path, snapshot: Snapshot | None) -> Scan | str:
    """The State from ``snapshot`` (None: from nothing) and the log after it; a string saying
    how the two disagree if the log does not go on where the snapshot ends."""
    log_path = data_dir / LOG_FILE
    if snapshot is None:
        return _scan(log_path, State(), 0, None)
    size = log_path.stat().st_size if log_path.exists() else 0
    offset = snapshot.offset
    start = offset if offset <= size and _at_line_start(log_path, offset) else 0
    try:
        found = _scan(log_path, snapshot.state, start, snapshot.last_idx)
    except _SnapshotMismatchError as exc:
        if start == 0:
            return str(exc)
        # The hint landed on a line start past where the snapshot ends (an offset into the log
        # from before a compaction): look for the end by index from the start.
        try:
            found = _scan(log_path, snapshot.state, 0, snapshot.last_idx)
        except _SnapshotMismatchError as again:
            return str(again)
    return replace(found, snapshot_file=snapshot.file)


def scan_dir(data_dir: Path) -> Scan:
    """Rebuild the State of a data dir as a start does, changing nothing on disk: from the
    newest snapshot that is readable and agrees with the log, else from the log alone."""
    passed_over: list[str] = []
    for candidate in candidates(data_dir):
        if candidate.trouble is not None:
            passed_over.append(f"{data_dir / candidate.file} is {candidate.trouble}")
        if candidate.snapshot is None:
            continue
        found = scan_from(data_dir, candidate.snapshot)
        if isinstance(found, Scan):
            return replace(found, passed_over=tuple(passed_over))
        passed_over.append(f"{data_dir / candidate.file} disagrees with {LOG_FILE} ({found})")
    found = scan_from(data_dir, None)
    assert isinstance(found, Scan)  # from nothing there is no snapshot to disagree with
    return replace(found, passed_over=tuple(passed_over))


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
        "order (a compacted log also reads so without its snapshots)" + _WAY_OUT,
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
