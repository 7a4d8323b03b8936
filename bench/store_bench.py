"""Store benchmarks: what the data dir costs over a day, and JSONL against SQLite on one bench.

Run with ``make bench`` (``python -m bench store``). Figures are printed, never asserted.

1. A virtual soak (``keeper.sim.soak.virtual``, the same fault mix as ``make soak-sim``) for
   ``BENCH_SOAK_HOURS`` simulated hours (default 6; 24 takes about 3 minutes of wall time), then:
   the data dir's size, its parts, and a master's restart time on it. The 24-hour size is
   projected from the measured parts: the snapshot and the tail since the last compaction are
   bounded, the history (deployment/instance events, kept) grows linearly.
2. The two candidate stores with the same events and the same durability (an fsync per batch
   for the log; WAL with ``synchronous=FULL`` for SQLite, which fsyncs the WAL per commit):
   - events/s through the master's router (the log replaced by ``SqliteLog`` for SQLite);
   - restart at 1 M events: the snapshot plus the tail after it (the same 10 k events each);
   - compaction: steady state (a snapshot interval of churn + a day of history) and the first
     compaction of a 1 M-event log;
   - a history query: every deployment/instance event of one model in an index window, over a
     day of history (5 k history events among 10 k of churn).
   The decision and why are in ``docs/store.md``.

One module per subject (about 550 lines here, most of it the SQLite candidate that only this
comparison needs), so that one command measures the store and nothing else.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import anyio

from bench.master_bench import (  # pyright: ignore[reportPrivateUsage]
    _router_rate,  # pyright: ignore[reportPrivateUsage]
    churn,
    synthetic_cards,
    write_data_dir,
)
from keeper.model.apply import apply_all
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    IndexedEvent,
)
from keeper.model.state import Deployment, State
from keeper.runtime import event_store
from keeper.runtime.event_log import EventLog, FileOps, Recovery
from keeper.runtime.log_scan import (
    HISTORY_KINDS,
    LOG_FILE,
    SNAPSHOT_FILE,
    is_history_line,
    read_snapshot,
)
from keeper.sim.master.service import Master, MasterConfig

Row = tuple[str, str, str]

SOAK_HOURS = float(os.environ.get("BENCH_SOAK_HOURS", "6"))
# The target: a day of soak leaves the data dir under this, and a restart on it this fast.
SIZE_TARGET_MB = 20.0
RESTART_TARGET_S = 0.2
ROUTER_EVENTS = 20_000
BIG_LOG = int(os.environ.get("BENCH_BIG_LOG", "1000000"))
SNAPSHOT_EVERY = MasterConfig().snapshot_every_events
# A day of history in a busy soak: a few hundred deployment/instance events an hour.
HISTORY_EVENTS = 5_000
MODELS = 10


# --- 1. a day of soak --------------------------------------------------------------------


def _dir_bytes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in path.iterdir() if p.is_file()}


def bench_soak_size() -> list[Row]:
    from trio.testing import MockClock  # noqa: PLC0415 (a development dependency)

    from keeper.sim.soak.virtual import deterministic, run_virtual, virtual_settings  # noqa: PLC0415

    settings = virtual_settings(SOAK_HOURS, seed=1, nodes=4)
    # The in-process master and nodes log what real ones would; the soak's own figures suffice.
    logging.getLogger("keeper").setLevel(logging.ERROR)
    written = [0]
    peak = [0]
    real_write, real_compact = FileOps.write, EventLog.compact

    def counting_write(self: FileOps, fd: int, data: memoryview) -> int:
        count = real_write(self, fd, data)
        written[0] += count
        return count

    def measured_compact(self: EventLog, state: State, keep_from: int = 0) -> tuple[int, int]:
        # The dir is at its largest just before compaction swaps the log in: the old log and the
        # temp copy (the compacted log's size) side by side.
        assert self.data_dir is not None
        before = sum(_dir_bytes(self.data_dir).values())
        sizes = real_compact(self, state, keep_from)
        peak[0] = max(peak[0], before + sizes[1])
        return sizes

    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-") as tmp,
        deterministic(1),
        mock.patch.object(FileOps, "write", counting_write),
        mock.patch.object(EventLog, "compact", measured_compact),
    ):
        data_dir = Path(tmp)
        started = time.perf_counter()
        anyio.run(
            run_virtual,
            settings,
            data_dir,
            lambda _message: None,
            backend="trio",
            backend_options={"clock": MockClock(autojump_threshold=0)},
        )
        wall = time.perf_counter() - started
        sizes = _dir_bytes(data_dir)
        log_lines = (data_dir / LOG_FILE).read_bytes().splitlines(keepends=True)
        history = sum(len(line) for line in log_lines if is_history_line(line))
        snapshot = read_snapshot(data_dir)
        events = snapshot[0] + 1 if snapshot is not None else len(log_lines)
        restart = min(anyio.run(_restart_seconds, data_dir) for _ in range(3))
    total = sum(sizes.values())
    line_bytes = written[0] / max(1, events)
    per_day = 24 / SOAK_HOURS
    # At its largest, a day's dir holds: the day's history, two snapshot intervals of other
    # events (the log keeps every event after the previous snapshot), the two snapshots, and
    # compaction's temp copy of the history and of the interval it keeps.
    projected = (
        2 * sizes.get(SNAPSHOT_FILE, 0) + 2 * history * per_day + 3 * SNAPSHOT_EVERY * line_bytes
    )
    return [
        (
            f"soak-sim {SOAK_HOURS:g} h ({wall:.0f} s wall), {events:,} events: data dir",
            f"{total / 1e6:.2f} MB",
            f"logged {written[0] / 1e6:.1f} MB in all (~{line_bytes:.0f} B/event)",
        ),
        (
            "  at the end: history in the log / snapshot",
            f"{history / 1e6:.2f} / {sizes.get(SNAPSHOT_FILE, 0) / 1e6:.2f} MB",
            "",
        ),
        ("  largest during the run (before a compaction)", f"{peak[0] / 1e6:.2f} MB", ""),
        (
            "  projected largest over 24 h",
            f"{projected / 1e6:.1f} MB",
            f"< {SIZE_TARGET_MB:g} MB (uncompacted: {written[0] * per_day / 1e6:.0f} MB)",
        ),
        ("  restart on that data dir after its clean stop", f"{restart:.3f} s", "<= 0.2 s"),
    ]


async def _restart_seconds(data_dir: Path) -> float:
    started = time.perf_counter()
    elapsed = 0.0
    master = Master(data_dir)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        elapsed = time.perf_counter() - started
        group.cancel_scope.cancel()
    return elapsed


# --- 2. SQLite, as the master would use it -----------------------------------------------

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    idx INTEGER PRIMARY KEY, kind TEXT NOT NULL, model TEXT, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_model ON events (model, idx) WHERE model IS NOT NULL;
CREATE TABLE IF NOT EXISTS snapshot (id INTEGER PRIMARY KEY CHECK (id = 0),
    last_idx INTEGER NOT NULL, state TEXT NOT NULL);
"""
DB_FILE = "events.sqlite3"


def _connect(data_dir: Path) -> sqlite3.Connection:
    # One writer at a time (the router), from a worker thread: no same-thread check needed.
    connection = sqlite3.connect(data_dir / DB_FILE, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")  # fsync the WAL at every commit
    connection.executescript(_SCHEMA)
    return connection


def _row(indexed: IndexedEvent, models: dict[str, str]) -> tuple[int, str, str | None, str]:
    event = indexed.event
    kind = type(event).__name__
    model: str | None = None
    if isinstance(event, DeploymentCreated):
        models[event.deployment.deployment_id] = event.deployment.model_card.model_id
        model = event.deployment.model_card.model_id
    elif kind in HISTORY_KINDS:
        model = models.get(getattr(event, "deployment_id", ""))
    return indexed.idx, kind, model, indexed.model_dump_json()


class SqliteLog:
    """``EventLog``'s interface over SQLite (WAL, synchronous=FULL), for the router bench."""

    def __init__(self, data_dir: Path | None, file_ops: Any = None) -> None:
        assert data_dir is not None
        self.data_dir = data_dir
        self._db = _connect(data_dir)
        self._models: dict[str, str] = {}
        self._last_idx = -1
        self.events_since_snapshot = 0

    durable = True

    @property
    def last_idx(self) -> int:
        return self._last_idx

    def open(self) -> Recovery:
        state, tail = _sqlite_recover(self._db)
        self._last_idx = state.last_event_applied_idx
        return Recovery(state, None, tail, 0)

    def append(self, batch: Sequence[IndexedEvent]) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?)", [_row(i, self._models) for i in batch]
            )
        self._last_idx = batch[-1].idx
        self.events_since_snapshot += len(batch)

    def write_snapshot(self, state: State) -> None:
        with self._db:
            self._db.execute("BEGIN")
            self._db.execute(
                "INSERT OR REPLACE INTO snapshot VALUES (0, ?, ?)",
                (state.last_event_applied_idx, state.model_dump_json()),
            )
        self.events_since_snapshot = 0

    def compact(self, state: State, keep_history_from: int = 0) -> tuple[int, int]:
        _sqlite_compact(self._db, state.last_event_applied_idx)
        if keep_history_from:
            with self._db:
                self._db.execute("BEGIN")
                self._db.execute("DELETE FROM events WHERE idx < ?", (keep_history_from,))
        return 0, 0

    def probe(self) -> None:
        pass

    def close(self) -> None:
        self._db.close()


def _sqlite_recover(db: sqlite3.Connection) -> tuple[State, int]:
    found = db.execute("SELECT last_idx, state FROM snapshot WHERE id = 0").fetchone()
    state = State.model_validate_json(found[1]) if found else State()
    last = found[0] if found else -1
    batch = [
        IndexedEvent.model_validate_json(body)
        for (body,) in db.execute("SELECT body FROM events WHERE idx > ? ORDER BY idx", (last,))
    ]
    return apply_all(state, batch), len(batch)


def _sqlite_compact(db: sqlite3.Connection, through: int) -> None:
    kinds = ",".join("?" * len(HISTORY_KINDS))
    with db:
        db.execute("BEGIN")
        db.execute(
            f"DELETE FROM events WHERE idx <= ? AND kind NOT IN ({kinds})",
            (through, *sorted(HISTORY_KINDS)),
        )
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


# --- 2a. router throughput ---------------------------------------------------------------


def bench_router() -> list[Row]:
    rows: list[Row] = []
    cases = [("bursts of 100", 100, 1), ("single events, 50 producers", 1, 50)]
    for label, per_emit, producers in cases:
        for store, patch in (("jsonl ", None), ("sqlite", SqliteLog)):
            with tempfile.TemporaryDirectory() as tmp:
                context = (
                    mock.patch.object(event_store, "EventLog", patch)
                    if patch is not None
                    else mock.patch.object(event_store, "EventLog", EventLog)
                )
                with context:
                    rate, dropped = anyio.run(
                        _router_rate, Path(tmp), per_emit, producers, True, ROUTER_EVENTS
                    )
            note = "its dashboard dropped as too slow" if dropped else ""
            rows.append((f"{store} router, {label}", f"{rate:,.0f} events/s", note))
    return rows


# --- 2b. restart at 1 M events -----------------------------------------------------------


def _sqlite_from_log(data_dir: Path, target: Path) -> None:
    """The same events and snapshot as a JSONL data dir, in SQLite."""
    db = _connect(target)
    models: dict[str, str] = {}
    with (data_dir / LOG_FILE).open("rb") as log, db:
        db.execute("BEGIN")
        chunk: list[tuple[int, str, str | None, str]] = []
        for line in log:
            raw = json.loads(line)
            kind = next(iter(raw["event"]))
            model = None
            if kind == "DeploymentCreated":
                deployment = raw["event"][kind]["deployment"]
                model = deployment["modelCard"]["modelId"]
                models[deployment["deploymentId"]] = model
            chunk.append((raw["idx"], kind, model, line.decode().rstrip("\n")))
            if len(chunk) >= 50_000:
                db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", chunk)
                chunk = []
        db.executemany("INSERT INTO events VALUES (?, ?, ?, ?)", chunk)
    snapshot = read_snapshot(data_dir)
    assert snapshot is not None
    with db:
        db.execute("BEGIN")
        db.execute(
            "INSERT INTO snapshot VALUES (0, ?, ?)", (snapshot[0], snapshot[2].model_dump_json())
        )
    db.close()


def _timed(call: Callable[[], Any], repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def bench_restart_and_compaction() -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, sqlite_dir = Path(tmp) / "jsonl", Path(tmp) / "sqlite"
        jsonl.mkdir()
        sqlite_dir.mkdir()
        write_data_dir(jsonl, BIG_LOG)
        _sqlite_from_log(jsonl, sqlite_dir)

        def open_jsonl() -> None:
            log = EventLog(jsonl)
            log.open()
            log.close()

        def open_sqlite() -> None:
            db = _connect(sqlite_dir)
            _sqlite_recover(db)
            db.close()

        log_mb = (jsonl / LOG_FILE).stat().st_size / 1e6
        db_mb = (sqlite_dir / DB_FILE).stat().st_size / 1e6
        rows.append(
            (
                "jsonl  restart at 1 M events (snapshot + tail)",
                f"{_timed(open_jsonl):.3f} s",
                f"{log_mb:.0f} MB log",
            )
        )
        rows.append(
            (
                "sqlite restart at 1 M events (snapshot + tail)",
                f"{_timed(open_sqlite):.3f} s",
                f"{db_mb:.0f} MB db",
            )
        )

        def check_sqlite() -> None:
            db = _connect(sqlite_dir)
            db.execute("PRAGMA quick_check").fetchall()
            db.close()

        rows.append(
            (
                "sqlite quick_check at 1 M events",
                f"{_timed(check_sqlite, 1):.2f} s",
                "(jsonl checks while replaying)",
            )
        )

        # First compaction of a 1 M-event store: nearly everything goes.
        log = EventLog(jsonl)
        state = log.open().state
        log.write_snapshot(state)
        started = time.perf_counter()
        log.compact(state)
        jsonl_first = time.perf_counter() - started
        log.close()
        db = _connect(sqlite_dir)
        started = time.perf_counter()
        _sqlite_compact(db, BIG_LOG - 1)
        sqlite_delete = time.perf_counter() - started
        started = time.perf_counter()
        db.execute("VACUUM")
        sqlite_vacuum = time.perf_counter() - started
        db.close()
        jsonl_kb = (jsonl / LOG_FILE).stat().st_size / 1e3
        db_kb = (sqlite_dir / DB_FILE).stat().st_size / 1e3
        rows.append(
            (
                "jsonl  first compaction of 1 M events",
                f"{jsonl_first:.2f} s",
                f"-> {jsonl_kb:.0f} kB",
            )
        )
        rows.append(
            (
                "sqlite first compaction of 1 M events",
                f"{sqlite_delete:.2f} s + {sqlite_vacuum:.2f} s",
                f"DELETE + VACUUM -> {db_kb:.0f} kB",
            )
        )
    return rows


# --- 2c. steady-state compaction and the history query -----------------------------------


def _day_of_history() -> list[AnyEvent]:
    """Deployments of MODELS models, then placements and failures among them."""
    cards = synthetic_cards(MODELS)
    events: list[AnyEvent] = [
        DeploymentCreated(deployment=Deployment(deployment_id=f"day-{n}", model_card=card))
        for n, card in enumerate(cards)
    ]
    for i in range(HISTORY_EVENTS - len(events)):
        deployment_id = f"day-{i % MODELS}"
        if i % 3 == 0:
            events.append(DeploymentPlacementFailed(deployment_id=deployment_id, error="full"))
        else:
            events.append(DeploymentPlaced(deployment_id=deployment_id, instance_id=f"i-{i}"))
    return events


def _history_query_jsonl(data_dir: Path, model: str, low: int, high: int) -> int:
    deployments: set[str] = set()
    found = 0
    with (data_dir / LOG_FILE).open("rb") as log:
        for line in log:
            if not is_history_line(line):
                continue
            indexed = IndexedEvent.model_validate_json(line)
            event = indexed.event
            if (
                isinstance(event, DeploymentCreated)
                and event.deployment.model_card.model_id == model
            ):
                deployments.add(event.deployment.deployment_id)
            if low <= indexed.idx <= high and getattr(event, "deployment_id", None) in deployments:
                found += 1
    return found


def _history_query_sqlite(db: sqlite3.Connection, model: str, low: int, high: int) -> int:
    rows = db.execute(
        "SELECT body FROM events WHERE model = ? AND idx BETWEEN ? AND ? ORDER BY idx",
        (model, low, high),
    ).fetchall()
    return len([IndexedEvent.model_validate_json(body) for (body,) in rows])


def bench_history() -> list[Row]:
    rows: list[Row] = []
    history = _day_of_history()
    # History and churn interleaved, as a day of a live cluster logs them.
    events: list[AnyEvent] = []
    for i, event in enumerate(history):
        events.append(event)
        events.extend(churn(2 * i + k) for k in range(2))
    indexed = [IndexedEvent(idx=i, event=e) for i, e in enumerate(events)]
    with tempfile.TemporaryDirectory() as tmp:
        jsonl, sqlite_dir = Path(tmp) / "jsonl", Path(tmp) / "sqlite"
        jsonl.mkdir()
        sqlite_dir.mkdir()
        log = EventLog(jsonl)
        log.open()
        for start in range(0, len(indexed), 500):
            log.append(indexed[start : start + 500])
        db = _connect(sqlite_dir)
        models: dict[str, str] = {}
        with db:
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO events VALUES (?, ?, ?, ?)", [_row(i, models) for i in indexed]
            )
        model = synthetic_cards(MODELS)[3].model_id
        low, high = len(indexed) // 4, 3 * len(indexed) // 4
        counts = (
            _history_query_jsonl(jsonl, model, low, high),
            _history_query_sqlite(db, model, low, high),
        )
        assert counts[0] == counts[1], counts
        # The query runs on a compacted log (history + one interval of churn), as it would.
        state = apply_all(State(), indexed)
        log.write_snapshot(state)
        started = time.perf_counter()
        log.compact(state)
        jsonl_compact = time.perf_counter() - started
        started = time.perf_counter()
        _sqlite_compact(db, len(indexed) - 1)
        sqlite_compact = time.perf_counter() - started
        log.close()
        jsonl_query = _timed(lambda: _history_query_jsonl(jsonl, model, low, high), 5)
        sqlite_query = _timed(lambda: _history_query_sqlite(db, model, low, high), 5)
        db.close()
    label = f"{len(history):,} history + {len(events) - len(history):,} churn events"
    rows.append((f"jsonl  compaction, {label}", f"{jsonl_compact * 1e3:.0f} ms", ""))
    rows.append(
        (f"sqlite compaction, {label}", f"{sqlite_compact * 1e3:.0f} ms", "DELETE + checkpoint")
    )
    rows.append(
        (
            f"jsonl  history query (one model, {counts[0]} events)",
            f"{jsonl_query * 1e3:.1f} ms",
            "full scan",
        )
    )
    rows.append(
        (
            f"sqlite history query (one model, {counts[1]} events)",
            f"{sqlite_query * 1e3:.1f} ms",
            "index",
        )
    )
    return rows


def _table(rows: list[Row]) -> None:
    width = max(len(row[0]) for row in rows)
    print(f"{'store benchmark':<{width}}  {'measured':>20}  target / note")
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>20}  {note}")


def run() -> None:
    # Each part is printed as it ends: the soak alone takes a while.
    for bench in (bench_soak_size, bench_router, bench_restart_and_compaction, bench_history):
        _table(bench())


if __name__ == "__main__":
    run()
