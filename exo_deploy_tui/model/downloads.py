"""A node's download of a model, in the few facts the views show and the words they show it in.

exo reports each (node, model) as one entry (``keeper.model.state.DownloadEntry``): pending,
ongoing with its progress, completed, or failed with exo's message. ``download_facts`` reads an
entry into plain numbers once; ``download_words`` says it as an operator reads it
(``downloading 43% · 7.3/17.0 GB · 210 MB/s · ETA 46s``), dropping the least needed parts
when a column is narrower; ``download_mark`` is the few characters a crowded cell has room for.
Pure: no clock, no Textual.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from exo_deploy_tui.model.format import duration, rate, size_gb, sizes_gb
from keeper.model.state import (
    AnyDownload,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    ModelId,
    download_model_id,
)

DownloadPhase = Literal["queued", "downloading", "downloaded", "failed"]


@dataclass(frozen=True)
class DownloadFacts:
    model_id: ModelId
    phase: DownloadPhase
    downloaded: int = 0  # bytes
    total: int = 0  # bytes; 0 when neither the entry nor the model card says
    speed: float = 0.0  # bytes per second, while downloading
    eta_s: float | None = None  # while downloading, when it can be told
    error: str = ""  # exo's message, when it failed

    @property
    def fraction(self) -> float | None:
        if self.phase == "downloaded":
            return 1.0
        if self.total <= 0:
            return None
        return max(0.0, min(1.0, self.downloaded / self.total))


def download_facts(entry: AnyDownload) -> DownloadFacts:
    model = download_model_id(entry)
    card_size = entry.shard_metadata.model_card.storage_size.in_bytes
    match entry:
        case DownloadOngoing(download_progress=progress):
            total = progress.total.in_bytes or card_size
            done = progress.downloaded.in_bytes
            if progress.eta_ms > 0:
                eta: float | None = progress.eta_ms / 1000
            elif progress.speed > 0 and total > done:
                eta = (total - done) / progress.speed
            else:
                eta = None
            return DownloadFacts(model, "downloading", done, total, progress.speed, eta)
        case DownloadPending():
            return DownloadFacts(model, "queued", entry.downloaded.in_bytes, entry.total.in_bytes)
        case DownloadCompleted():
            total = entry.total.in_bytes or card_size
            return DownloadFacts(model, "downloaded", total, total)
        case DownloadFailed():
            return DownloadFacts(model, "failed", 0, card_size, error=entry.error_message)


def _percent(facts: DownloadFacts) -> str:
    fraction = facts.fraction
    # Rounded down: "100%" only once it is complete, never for the last few megabytes.
    return "" if fraction is None else f"{int(fraction * 100)}%"


def download_words(facts: DownloadFacts, width: int | None = None) -> str:
    """The download in words. Within ``width`` (when given), the least needed parts go first:
    the sizes, then the speed, then the word; the percentage and the ETA stay longest."""
    if facts.phase == "queued":
        return "download queued"
    if facts.phase == "failed":
        return f"download failed: {facts.error}" if facts.error else "download failed"
    if facts.phase == "downloaded":
        return f"downloaded {size_gb(facts.total)}" if facts.total > 0 else "downloaded"
    percent = _percent(facts)
    head = f"downloading {percent}".strip()
    size = sizes_gb(facts.downloaded, facts.total) if facts.total > 0 else ""
    speed = rate(facts.speed) if facts.speed > 0 else ""
    eta = f"ETA {duration(facts.eta_s)}" if facts.eta_s is not None else ""
    short = f"↓ {percent}".strip()
    candidates = [
        (head, size, speed, eta),
        (head, speed, eta),
        (head, eta),
        (short, eta),
        (short,),
    ]
    texts = [" · ".join(p for p in parts if p) for parts in candidates]
    if width is None:
        return texts[0]
    return next((t for t in texts if len(t) <= width), texts[-1])


def download_mark(facts: DownloadFacts) -> str:
    """A few characters for a crowded cell: ``↓43%``, ``↓queued``, ``↓failed``, ``on disk``."""
    if facts.phase == "downloading":
        return f"↓{_percent(facts) or '…'}"
    if facts.phase == "queued":
        return "↓queued"
    if facts.phase == "failed":
        return "↓failed"
    return "on disk"


_GATING_ORDER: dict[DownloadPhase, int] = {
    "failed": 0,
    "downloading": 1,
    "queued": 2,
    "downloaded": 3,
}


def gating_download(
    downloads: Iterable[tuple[str, DownloadFacts]],
) -> tuple[str, DownloadFacts] | None:
    """Of an instance's downloads (each with the node it is on), the one it waits for: a failed
    one first (it never comes up without help), else the one furthest from done (the longest
    ETA, then the least fraction), else a queued one. None when none is still to come."""
    waiting = [(node, facts) for node, facts in downloads if facts.phase != "downloaded"]
    if not waiting:
        return None

    def key(item: tuple[str, DownloadFacts]) -> tuple[int, float, float]:
        facts = item[1]
        eta = facts.eta_s if facts.eta_s is not None else 0.0
        return (_GATING_ORDER[facts.phase], -eta, facts.fraction or 0.0)

    return min(waiting, key=key)
