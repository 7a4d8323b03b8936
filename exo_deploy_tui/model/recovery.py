"""Where a recovery's time went: the parts of "serving again after 94 s".

The dashboard's model notes the moments it sees (a deployment stop serving and its instances
deleted and created, ``outages.py``; its model's downloads start and complete on each node,
``download_moments.py``) and, when the deployment serves again, ``recovery_parts`` splits the
outage into what it saw:

- detected: from when serving really stopped (its node last heard of) to the broken instance's
  deletion, the cluster's reaction;
- placed: from that deletion to the creation of the instance that now serves;
- downloaded: from the first download start to the last completion on that instance's nodes;
- loaded: from the last of those (placement, download) to the runners' ready.

A part whose either end was not seen (the dashboard connected mid-recovery, or was away when
it happened) is left out rather than guessed, so the parts need not add up to the whole. Times
are as exact as what the dashboard sees: a frame of events, or a poll. Pure: every moment comes
in as a value.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from exo_deploy_tui.model.format import part_duration


@dataclass(frozen=True)
class NodeDownload:
    """What was seen of one node's download of the model: when it started and completed (our
    clock), each None when not seen."""

    started: float | None
    done: float | None


def recovery_parts(
    *,
    outage_since: float,
    stopped_at: float | None,
    deletions: Iterable[float],
    placements: Iterable[float],
    downloads: Sequence[NodeDownload],
    ready_at: float | None,
) -> list[tuple[str, float]]:
    """The parts of an outage that began at ``outage_since``, seen to stop serving at
    ``stopped_at`` and serving again at ``ready_at`` (None when either was not seen as it
    happened). ``deletions`` and ``placements`` are when instances of the model were deleted
    and created; ``downloads`` are the serving instance's nodes' downloads of it."""
    if stopped_at is None:
        return []
    end = ready_at if ready_at is not None else float("inf")
    deleted = sorted(t for t in deletions if stopped_at <= t <= end)
    placed = [t for t in placements if stopped_at <= t <= end]
    parts: list[tuple[str, float]] = []
    if deleted and deleted[0] > outage_since:
        parts.append(("detected", deleted[0] - outage_since))
    last_placed = max(placed) if placed else None
    if last_placed is not None:
        before = [t for t in deleted if t <= last_placed]
        if before:
            parts.append(("placed", last_placed - before[-1]))
    # Downloads that completed during the outage; one whose start was not seen, or came before
    # the outage, leaves the download's length unknown.
    completed = [d for d in downloads if d.done is not None and stopped_at <= d.done <= end]
    downloaded_at: float | None = None
    if completed:
        downloaded_at = max(d.done for d in completed if d.done is not None)
        starts = [d.started for d in completed]
        if all(s is not None and s >= stopped_at for s in starts):
            first = min(s for s in starts if s is not None)
            parts.append(("downloaded", downloaded_at - first))
    loading_from = max(
        (t for t in (last_placed, downloaded_at) if t is not None),
        default=None,
    )
    if loading_from is not None and ready_at is not None:
        parts.append(("loaded", ready_at - loading_from))
    return parts


def parts_text(parts: Sequence[tuple[str, float]]) -> str:
    """``detected 31 s, placed 0.01 s, downloaded 52 s, loaded 11 s``; empty without parts."""
    return ", ".join(f"{name} {part_duration(seconds)}" for name, seconds in parts)
