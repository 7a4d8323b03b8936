"""One event store for the master and the bridge: number, log durably, apply, snapshot, compact.

Both services keep a State that only events change, and both must never apply an event they
could not write (a restart would forget it). Before this module each spelled that out itself;
now the service hands its events to ``commit`` and gets back the numbered events it may publish.

The shape, and why:
- ``commit`` numbers the events, appends them in one write + fsync (in a worker thread when
  ``io_in_thread``, so the event loop keeps serving meanwhile and what queues up forms the next
  batch), and only then applies them. A failed write raises ``LogNotWritableError`` (a 503 naming
  the cause) with NOTHING applied, and marks the store unwritable (``write_error``) until a write
  or a ``probe`` succeeds again. Callers pause what must be logged to be safe (the keeper's
  placements) while ``write_error`` is set, and carry on by themselves afterwards.
- ``snapshot_if_due`` writes a snapshot every ``snapshot_every`` events and then compacts the log
  (``EventLog.compact``), so restart time and disk use stay bounded. A snapshot that cannot be
  written is retried after a further tenth of the interval: the log alone still holds everything.
- Compaction keeps deployment and instance events for ``history_keep_s`` (a week): enough for
  per-deployment history over a day and for any soak's duplicate check, while the log and the
  cost of rewriting it stay bounded. Events carry no time, so the store remembers when each
  compaction happened and at which index (in memory: after a restart, history is kept whole
  until a week of marks has built up again).
- With ``track_serving`` (the master, whose State is the whole cluster's) each batch that may
  change whether a deployment serves is followed, in the same write, by the serving records it
  calls for (``keeper.model.history.serving_changes``, timed with ``wall_time``). The bridge, whose
  own State holds only its deployments, records them itself from exo's States.
- The keeper-stepping loops stay in the services.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import anyio
import anyio.to_thread

from keeper.model.apply import apply_all
from keeper.model.events import AnyEvent, IndexedEvent
from keeper.model.history import may_change_serving, serving_changes
from keeper.model.refusals import RefusalError
from keeper.model.state import State
from keeper.runtime.event_log import EventLog, FileOps, LogWriteError, Recovery, iter_events

log = logging.getLogger(__name__)

_T = TypeVar("_T")

# How long compaction keeps deployment and instance events: per-deployment history needs a day;
# a week leaves room for a soak or an investigation that looks further back.
HISTORY_KEEP_S = 7 * 24 * 3600.0


class LogNotWritableError(RefusalError):
    """A mutation refused because its events could not be written; nothing of it happened."""

    status_code = 503


class EventStore:
    """The State of one service and the log behind it. ``data_dir`` None keeps nothing."""

    def __init__(
        self,
        data_dir: Path | None,
        *,
        snapshot_every: int,
        io_in_thread: bool = False,
        compact: bool = True,
        file_ops: FileOps | None = None,
        history_keep_s: float = HISTORY_KEEP_S,
        wall_time: Callable[[], float] = time.time,
        track_serving: bool = False,
    ) -> None:
        self.data_dir = data_dir
        self.snapshot_every = snapshot_every
        self.io_in_thread = io_in_thread and data_dir is not None
        self.compact_after_snapshot = compact
        self._log = EventLog(data_dir, file_ops)
        self._state = State()
        self._retry_at: int | None = None  # after a failed snapshot: events before the next try
        self.recovery: Recovery | None = None
        self.write_error: str | None = None  # why the log cannot be written now, if it cannot
        self.compactions = 0
        self.history_keep_s = history_keep_s
        self._wall_time = wall_time
        self._marks: list[tuple[float, int]] = []  # (when, last index) of each compaction
        self.track_serving = track_serving

    # --- reading ---------------------------------------------------------------------------

    @property
    def state(self) -> State:
        return self._state

    @property
    def next_idx(self) -> int:
        return self._log.last_idx + 1

    @property
    def durable(self) -> bool:
        return self._log.durable

    @property
    def event_log(self) -> EventLog:
        return self._log

    def iter_events(self) -> Iterator[IndexedEvent]:
        """Every event on disk, oldest first (see ``keeper.runtime.event_log.iter_events``)."""
        if self.data_dir is None:
            return iter(())
        return iter_events(self.data_dir)

    # --- lifecycle -------------------------------------------------------------------------

    def open(self) -> Recovery:
        """Rebuild the State from disk; raises ``EventLogCorruptError`` on damage."""
        self.recovery = self._log.open()
        self._state = self.recovery.state
        return self.recovery

    def record_serving(self) -> None:
        """With ``track_serving``, at a start: the serving records the State calls for although
        no change explains them, such as a deployment with none (its log was written before
        records existed). Without this, a deployment serving steadily would have no history
        until something changed. A log that refuses them is no reason not to start: the next
        change that may alter serving records them."""
        if not self.track_serving:
            return
        changes = serving_changes(None, self._state, self._wall_time())
        try:
            self.commit_now(changes)
        except LogNotWritableError as exc:
            log.warning("serving records not written at start: %s", exc)

    def close(self) -> None:
        """Snapshot what the last snapshot misses (so the next start is quick) and compact, then
        close. Compacting here too matters: a service restarted more often than every
        ``snapshot_every`` events would otherwise never compact."""
        try:
            if self._log.events_since_snapshot and self.write_error is None:
                self._log.write_snapshot(self._state)
                if self.compact_after_snapshot:
                    self._compact(self._state, self._wall_time())
        except OSError as exc:
            log.warning("no snapshot on stopping (%s); the log holds every event", exc)
        finally:
            self._log.close()

    # --- writing ---------------------------------------------------------------------------

    def number(self, events: Sequence[AnyEvent], *, after: int = 0) -> list[IndexedEvent]:
        """``events`` numbered from the next index (plus ``after``, for a batch's tail)."""
        # model_construct: the events are validated models already; numbering them needs no
        # second validation (a third of the router's time otherwise).
        first = self.next_idx + after
        return [
            IndexedEvent.model_construct(idx=first + offset, event=event)
            for offset, event in enumerate(events)
        ]

    async def commit(self, events: Sequence[AnyEvent]) -> list[IndexedEvent]:
        """Number, append durably and apply ``events``; return them numbered, to publish.

        Shielded: once a batch is on its way to disk it is also applied, so the State and the
        log agree wherever the caller can be cancelled."""
        indexed, state = self._prepared(events)
        if not indexed:
            return indexed
        with anyio.CancelScope(shield=True):
            await self._io(self._log.append, indexed)
        self._state = state
        return indexed

    def commit_now(self, events: Sequence[AnyEvent]) -> list[IndexedEvent]:
        """``commit`` in the caller's thread, for a service that logs a few events at a time."""
        indexed, state = self._prepared(events)
        if not indexed:
            return indexed
        self._guarded(self._log.append, indexed)
        self._state = state
        return indexed

    def _prepared(self, events: Sequence[AnyEvent]) -> tuple[list[IndexedEvent], State]:
        """The batch to write, numbered, and the State once it is applied. With
        ``track_serving`` the batch ends with the serving records its events call for
        (``keeper.model.history``), so a change and its record are written together or not at
        all."""
        indexed = self.number(events)
        state = apply_all(self._state, indexed)
        if self.track_serving and any(may_change_serving(event, self._state) for event in events):
            changes = serving_changes(self._state, state, self._wall_time())
            if changes:
                records = self.number(changes, after=len(indexed))
                state = apply_all(state, records)
                indexed.extend(records)
        return indexed, state

    async def _io(self, call: Callable[[_T], None], argument: _T) -> None:
        if self.io_in_thread:
            await anyio.to_thread.run_sync(self._guarded, call, argument)
        else:
            self._guarded(call, argument)

    def _guarded(self, call: Callable[[_T], None], argument: _T) -> None:
        try:
            call(argument)
        except LogWriteError as exc:
            self._unwritable(exc)
            raise LogNotWritableError(
                f"{self.write_error} ({self.data_dir}); nothing was changed"
            ) from None
        self._writable()

    def _unwritable(self, exc: OSError) -> None:
        cause = os.strerror(exc.errno) if exc.errno else (exc.strerror or str(exc))
        described = f"event log not writable: {cause}"
        if described != self.write_error:
            log.error("%s in %s; refusing changes until it is", described, self.data_dir)
        self.write_error = described

    def _writable(self) -> None:
        if self.write_error is not None:
            log.warning("event log in %s writable again (was: %s)", self.data_dir, self.write_error)
            self.write_error = None

    def probe(self, *, always: bool = False) -> bool:
        """While unwritable (or ``always``), try a small durable write beside the log; True if
        the log is writable as far as one can tell before writing to it."""
        if self.data_dir is None or (self.write_error is None and not always):
            return self.write_error is None
        try:
            self._log.probe()
        except OSError as exc:
            self._unwritable(exc)
            return False
        self._writable()
        return True

    # --- snapshots -------------------------------------------------------------------------

    async def snapshot_if_due(self) -> None:
        """Snapshot (then compact) once ``snapshot_every`` events have been logged since."""
        if not self._snapshot_is_due():
            return
        # The time is read here, on the event loop: ``wall_time`` may be the service's clock,
        # which only the loop can read (the worker thread below cannot).
        now = self._wall_time()
        with anyio.CancelScope(shield=True):
            if self.io_in_thread:
                # States are immutable, so serialising this one in a thread is safe.
                await anyio.to_thread.run_sync(self._snapshot, self._state, now)
            else:
                self._snapshot(self._state, now)

    def snapshot_now_if_due(self) -> None:
        if self._snapshot_is_due():
            self._snapshot(self._state, self._wall_time())

    def _compact(self, state: State, now: float) -> tuple[int, int]:
        expired = [mark for mark in self._marks if mark[0] <= now - self.history_keep_s]
        keep_from = expired[-1][1] + 1 if expired else 0
        sizes = self._log.compact(state, keep_from)
        self._marks = [mark for mark in self._marks if mark[0] > now - self.history_keep_s]
        self._marks.append((now, state.last_event_applied_idx))
        self.compactions += 1
        return sizes

    def _snapshot_is_due(self) -> bool:
        due = self._retry_at if self._retry_at is not None else self.snapshot_every
        return self._log.events_since_snapshot >= due and self.write_error is None

    def _snapshot(self, state: State, now: float) -> None:
        try:
            self._log.write_snapshot(state)
            if self.compact_after_snapshot:
                before, after = self._compact(state, now)
                log.info("log compacted from %d to %d bytes", before, after)
        except OSError as exc:
            # The log still holds every event; try again after a further tenth of the interval.
            self._retry_at = self._log.events_since_snapshot + max(1, self.snapshot_every // 10)
            log.warning("snapshot or compaction failed (%s); retrying later", exc)
        else:
            self._retry_at = None
