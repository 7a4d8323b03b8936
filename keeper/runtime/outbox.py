"""The alert webhooks' outbox: the notices not yet delivered to every webhook, on disk, and how
far each webhook has got (docs/design.md, "Alert webhooks").

``DATA_DIR/webhooks/notices.jsonl`` holds one line per notice (``{"seq", "id", "body"}``),
appended with one ``write`` + ``fsync`` per batch, so what is queued survives a restart;
``cursors.json`` the last sequence number each webhook took, by a digest of its URL (a
webhook's path is often its secret), rewritten through a temp file and a rename after each
delivery. A crash between a webhook's 2xx and that rewrite sends the notice again: hence the
ids. Delivered lines are compacted away once they are as many as the live ones (and at least
``COMPACT_MIN_DEAD``), so the file holds at most twice the bound; past ``MAX_QUEUED_NOTICES``
undelivered, or ``MAX_QUEUED_BYTES`` of them, the oldest are dropped, per webhook, counted and
logged. The bytes are bounded as well as the count: what a notice holds comes from outside (a
placement's reason, node names), and a count alone bounds nothing if each grew. The delivering
itself is ``keeper.runtime.webhooks``; this module only keeps the queue.

Nothing here raises for the disk: a write that fails is counted and logged once, and the
notices stay in memory, to be delivered all the same.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from keeper.model.notices import AnyNotice

log = logging.getLogger(__name__)

# The most notices the outbox keeps undelivered. A notice is under 1 KiB, so this bounds the
# outbox at about 10 MB (20,000 lines at most between compactions) while a webhook is down;
# 10,000 is days of a cluster in trouble, and what is older than that is stale news: it is
# dropped, oldest first, counted (``dropped_total``) and logged.
MAX_QUEUED_NOTICES = 10_000
# The most bytes of notices (their JSON bodies) kept undelivered: 10,000 notices of 1 KiB, the
# size the count's bound was chosen for, so neither bound is reached long before the other.
MAX_QUEUED_BYTES = 10 * 1024 * 1024
# Delivered lines kept in the outbox before it is rewritten without them, at least: so a steady
# trickle of notices does not rewrite the file on every delivery.
COMPACT_MIN_DEAD = 1_000
# How often a drop past the bound is logged again while drops go on (the first always is).
DROP_LOG_EVERY = 1_000
# The same in bytes: a few large notices delivered (or dropped) make the file worth rewriting
# once they are as large as the live ones, but not for less than this.
COMPACT_MIN_DEAD_BYTES = 1024 * 1024

NOTICES_FILE = "notices.jsonl"
CURSORS_FILE = "cursors.json"


def endpoint_label(url: str) -> str:
    """A webhook as ``/healthz`` and the log show it: scheme, host and port, and ``/…`` for a
    path (Slack's and Discord's paths are their secret)."""
    parsed = httpx.URL(url)
    port = f":{parsed.port}" if parsed.port is not None else ""
    rest = "/…" if parsed.raw_path not in {b"", b"/"} else ""
    return f"{parsed.scheme}://{parsed.host}{port}{rest}"


def _key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:24]


def notice_json(notice: AnyNotice) -> bytes:
    return notice.model_dump_json().encode()


# --- the outbox -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Queued:
    seq: int
    notice_id: str
    body: bytes  # the notice's JSON, as POSTed


@dataclass
class EndpointCounters:
    label: str
    cursor: int  # the last seq delivered (or dropped)
    delivered_total: int = 0
    dropped_total: int = 0
    failed_attempts_total: int = 0
    last_error: str | None = None


class Outbox:
    """The notices not yet delivered to every webhook, on disk in ``directory`` (None: memory
    only), and each webhook's place in them."""

    def __init__(
        self,
        directory: Path | None,
        urls: Sequence[str],
        *,
        max_queued: int = MAX_QUEUED_NOTICES,
        max_bytes: int = MAX_QUEUED_BYTES,
    ) -> None:
        self.directory = directory
        self.urls = tuple(urls)
        self.max_queued = max_queued
        self.max_bytes = max_bytes
        self._queued: deque[Queued] = deque()
        self._queued_bytes = 0  # of the bodies in ``_queued``
        self._last_seq = 0
        self._dead_lines = 0  # delivered (or dropped) lines still in the file
        self._dead_bytes = 0  # their bodies' size
        # Each webhook's place and counters (its place is read from disk by ``open``).
        self.endpoints = {url: EndpointCounters(endpoint_label(url), 0) for url in self.urls}
        self.write_failures_total = 0
        self._write_failing = False
        self._cursor_failing = False
        self._dropped_since_log = 0
        self._file: int | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Read what a previous run left; webhooks it did not know start at its end."""
        cursors: dict[str, int] = {}
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            cursors = _read_cursors(self.directory / CURSORS_FILE)
            for item in _read_notices(self.directory / NOTICES_FILE):
                self._queued.append(item)
                self._queued_bytes += len(item.body)
                self._last_seq = max(self._last_seq, item.seq)
        for url, counters in self.endpoints.items():
            counters.cursor = min(cursors.get(_key(url), self._last_seq), self._last_seq)
        self._forget_delivered()
        self._bound()
        if self.directory is not None:
            self._rewrite()
            self._write_cursors()
        if self._queued:
            log.info("webhooks: %d notice(s) queued from before the start", len(self._queued))

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                os.close(self._file)
            self._file = None

    # --- producing -------------------------------------------------------------------------

    def append(self, found: Sequence[AnyNotice]) -> None:
        """Queue ``found`` for every webhook: written and fsync'd first when the outbox is on
        disk. Never raises for the disk: a failed write is counted and logged once, and the
        notices are still delivered (from memory)."""
        if not found or not self.endpoints:
            return
        items: list[Queued] = []
        for notice in found:
            self._last_seq += 1
            items.append(Queued(self._last_seq, notice.id, notice_json(notice)))
        self._queued.extend(items)
        self._queued_bytes += sum(len(item.body) for item in items)
        if self.directory is not None:
            self._write_lines(items)
        self._bound()

    def _write_lines(self, items: Sequence[Queued]) -> None:
        data = b"".join(_line(item) for item in items)
        try:
            fd = self._open_file()
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
            os.fsync(fd)
        except OSError as exc:
            self.write_failures_total += len(items)
            self.close()  # reopened (and a torn line cut by the next start) on the next write
            if not self._write_failing:
                log.error(
                    "webhooks: outbox %s not writable (%s): notices are delivered from memory "
                    "only, and lost if the service stops before they are",
                    self.directory,
                    exc,
                )
            self._write_failing = True
            return
        if self._write_failing:
            log.warning("webhooks: outbox %s writable again", self.directory)
            self._write_failing = False

    def _open_file(self) -> int:
        if self._file is None:
            assert self.directory is not None
            path = self.directory / NOTICES_FILE
            self._file = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return self._file

    def _byte_floor(self) -> int:
        """The last seq to drop for the notices kept to be at most ``max_bytes``: 0 for none."""
        excess = self._queued_bytes - self.max_bytes
        floor = 0
        for item in self._queued:  # the oldest first
            if excess <= 0:
                break
            excess -= len(item.body)
            floor = item.seq
        return floor

    def _bound(self) -> None:
        """Past ``max_queued`` notices undelivered to a webhook, or ``max_bytes`` of them kept,
        the oldest are dropped."""
        floor = max(self._last_seq - self.max_queued, self._byte_floor())
        dropped = 0
        for counters in self.endpoints.values():
            if counters.cursor < floor:
                dropped += floor - counters.cursor
                counters.dropped_total += floor - counters.cursor
                counters.cursor = floor
        if dropped:
            if self._dropped_since_log == 0 or self._dropped_since_log >= DROP_LOG_EVERY:
                log.warning(
                    "webhooks: outbox over %d undelivered notices or %d bytes: the oldest "
                    "dropped (%d in all so far)",
                    self.max_queued,
                    self.max_bytes,
                    sum(c.dropped_total for c in self.endpoints.values()),
                )
                self._dropped_since_log = 0
            self._dropped_since_log += dropped
            self._forget_delivered()
            if self.directory is not None and self._compact_due():
                self._rewrite()

    # --- delivering ------------------------------------------------------------------------

    def next_for(self, url: str) -> Queued | None:
        """The oldest notice not yet delivered to ``url``."""
        cursor = self.endpoints[url].cursor
        if not self._queued:
            return None
        # Sequence numbers run on without gaps (but for a damaged line skipped at a start), so
        # the next one is found by position rather than by a walk from the oldest.
        index = max(0, cursor + 1 - self._queued[0].seq)
        if index < len(self._queued) and self._queued[index].seq == cursor + 1:
            return self._queued[index]
        return next((item for item in self._queued if item.seq > cursor), None)

    def delivered(self, url: str, item: Queued) -> None:
        counters = self.endpoints[url]
        if item.seq <= counters.cursor:
            return  # dropped past the bound while it was being sent
        counters.cursor = item.seq
        counters.delivered_total += 1
        counters.last_error = None
        self._forget_delivered()
        if self.directory is not None:
            self._write_cursors()
            if self._compact_due():
                self._rewrite()

    def pending(self, url: str) -> int:
        return self._last_seq - self.endpoints[url].cursor

    @property
    def queued(self) -> int:
        return len(self._queued)

    @property
    def queued_bytes(self) -> int:
        return self._queued_bytes

    def _forget_delivered(self) -> None:
        low = min((c.cursor for c in self.endpoints.values()), default=self._last_seq)
        while self._queued and self._queued[0].seq <= low:
            size = len(self._queued.popleft().body)
            self._queued_bytes -= size
            self._dead_lines += 1
            self._dead_bytes += size

    def _compact_due(self) -> bool:
        """Whether the dead lines are as many, or as large, as the live ones (and not few)."""
        lines = self._dead_lines >= max(COMPACT_MIN_DEAD, len(self._queued))
        size = self._dead_bytes >= max(COMPACT_MIN_DEAD_BYTES, self._queued_bytes)
        return lines or size

    def _rewrite(self) -> None:
        """The notices file with only the live lines (via a temp file and a rename)."""
        assert self.directory is not None
        path = self.directory / NOTICES_FILE
        try:
            write_atomically(path, b"".join(_line(item) for item in self._queued))
        except OSError as exc:
            log.warning("webhooks: outbox not compacted (%s); retried later", exc)
            return
        self.close()
        self._dead_lines = 0
        self._dead_bytes = 0

    def _write_cursors(self) -> None:
        assert self.directory is not None
        cursors = {_key(url): c.cursor for url, c in self.endpoints.items()}
        try:
            write_atomically(self.directory / CURSORS_FILE, json.dumps(cursors).encode())
        except OSError as exc:
            # The deliveries go on; after a restart they may be sent once more.
            if not self._cursor_failing:
                log.error("webhooks: delivery cursors not written (%s)", exc)
            self._cursor_failing = True
            return
        self._cursor_failing = False


def _line(item: Queued) -> bytes:
    notice_id = json.dumps(item.notice_id).encode()
    return b'{"seq":%d,"id":%s,"body":%s}\n' % (item.seq, notice_id, item.body)


def _read_notices(path: Path) -> list[Queued]:
    """The outbox's lines; a torn or damaged line (a crash mid-write) is skipped, and said."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    items: list[Queued] = []
    for number, line in enumerate(raw.splitlines(), start=1):
        try:
            record = json.loads(line)
            items.append(
                Queued(int(record["seq"]), str(record["id"]), json.dumps(record["body"]).encode())
            )
        except (ValueError, KeyError, TypeError):
            log.warning("webhooks: %s line %d is damaged; skipped", path, number)
    return sorted(items, key=lambda item: item.seq)


def _read_cursors(path: Path) -> dict[str, int]:
    try:
        loaded: Any = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError:
        loaded = None
    if not isinstance(loaded, dict):
        log.warning("webhooks: %s is damaged: every webhook starts at the outbox's end", path)
        return {}
    cursors: dict[str, Any] = loaded  # pyright: ignore[reportUnknownVariableType]
    return {str(k): v for k, v in cursors.items() if isinstance(v, int)}


def write_atomically(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        written = 0
        while written < len(data):
            written += os.write(fd, data[written:])
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, path)
