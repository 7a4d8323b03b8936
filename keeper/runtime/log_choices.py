"""What each way of starting a data dir keeps and what it loses: the figures a start's refusal,
``exo-deploy log check`` and ``exo-deploy log repair`` all state.

A data dir can start from ``snapshot.json``, from ``snapshot.prev.json`` or from its log alone
(``keeper.runtime.log_scan``). While the way a start takes works, nothing is lost. When a
snapshot or the log is damaged, each way ends somewhere else: at the end of the log, or where
damage would have to be cut off. This module reads each way (changing nothing) and measures it
against the furthest any of them, or any readable line of the log, reaches: the events it would
lose (by index) and the deployments (lost, or deleted ones that would come back). A repair takes
the way that loses least, so an operator is told the cost before anything is cut, and the
figures a refusal gives are the ones the repair then reports.

It only reads; ``keeper.runtime.log_repair`` acts on what it finds.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from keeper.model.events import DeploymentCreated, DeploymentDeleted, IndexedEvent
from keeper.runtime.log_scan import (
    LOG_FILE,
    Scan,
    candidates,
    line_idx,
    scan_dir,
    scan_from,
)

_DEPLOYMENT_TAGS = (b'"event":{"DeploymentCreated"', b'"event":{"DeploymentDeleted"')
# Deployment ids a line names at most: a report stays one line long however many are lost.
_NAMED_AT_MOST = 10


@dataclass(frozen=True)
class Choice:
    """Starting from one snapshot (``source``; None: the log alone), cutting off any damage."""

    source: str | None
    scan: Scan  # what reading from it found; ``corrupt`` is where a repair would cut
    lost: tuple[int, int] | None  # first and last index of the events this way loses
    lost_deployments: tuple[str, ...]
    revived_deployments: tuple[str, ...]  # deleted in the events lost: they would come back

    @property
    def name(self) -> str:
        return self.source if self.source is not None else f"{LOG_FILE} alone"

    @property
    def reached(self) -> int:
        return self.scan.state.last_event_applied_idx

    @property
    def lost_events(self) -> int:
        return 0 if self.lost is None else self.lost[1] - self.lost[0] + 1

    def loss(self) -> str:
        """What taking this way loses, in one clause: events, then deployments."""
        if self.lost is None:
            return "drops nothing"
        text = f"drops {self.lost_events} events (indices {self.lost[0]}..{self.lost[1]})"
        if self.lost_deployments:
            text += f", losing deployments {_names(self.lost_deployments)}"
        if self.revived_deployments:
            text += f", bringing back deleted deployments {_names(self.revived_deployments)}"
        return text

    def describe(self) -> str:
        """The way, where it ends, and what it loses."""
        start = (
            f"from {self.source} (event {self.scan.snapshot_idx}) + {self.scan.replayed} "
            "events after it"
            if self.source is not None
            else f"from {self.name} ({self.scan.replayed} events)"
        )
        state = self.scan.state
        text = (
            f"{start}: reaches event {self.reached} with {len(state.deployments)} "
            f"deployments; {self.loss()}"
        )
        if self.scan.corrupt is not None:
            text += f"; cuts {LOG_FILE} at byte {self.scan.corrupt.offset}"
        return text


@dataclass(frozen=True)
class Assessment:
    """Every way of starting ``data_dir``, what is damaged, and what a start does now."""

    data_dir: Path
    damaged: tuple[str, ...]  # one line per damaged file: the file and what is wrong
    choices: tuple[Choice, ...]  # the ways that can be taken, in the order a start tries them
    start: Scan  # what a start does (``log_scan.scan_dir``)

    @property
    def best(self) -> Choice:
        """The way a repair takes: the one that loses fewest events, the start's order first."""
        return min(self.choices, key=lambda choice: choice.lost_events)


def assess(data_dir: Path) -> Assessment:
    """Read ``data_dir`` every way it can start, changing nothing."""
    damaged: list[str] = []
    scans: list[tuple[str | None, Scan]] = []
    for candidate in candidates(data_dir):
        if candidate.trouble is not None:
            damaged.append(f"{data_dir / candidate.file}: {candidate.trouble}")
        if candidate.snapshot is None:
            continue
        found = scan_from(data_dir, candidate.snapshot)
        if isinstance(found, str):
            damaged.append(f"{data_dir / candidate.file}: disagrees with {LOG_FILE} ({found})")
        else:
            scans.append((candidate.file, found))
    alone = scan_from(data_dir, None)
    assert isinstance(alone, Scan)  # from nothing there is no snapshot to disagree with
    scans.append((None, alone))
    # Damage in the log is what a start from a snapshot meets; the log alone meets the gaps
    # compaction leaves too, so it speaks only when no snapshot can be read.
    with_snapshot = [scan for source, scan in scans if source is not None]
    for scan in with_snapshot or [alone]:
        if scan.corrupt is not None:
            line = f"{scan.corrupt}"
            if line not in damaged:
                damaged.append(line)
    return Assessment(data_dir, tuple(damaged), _weigh(data_dir, scans), scan_dir(data_dir))


def _weigh(data_dir: Path, scans: list[tuple[str | None, Scan]]) -> tuple[Choice, ...]:
    lines = list(_readable_lines(data_dir / LOG_FILE))
    furthest = max(scan.state.last_event_applied_idx for _, scan in scans)
    last = max([furthest, *(idx for idx, _ in lines)])
    # The deployments the furthest State holds, carried on through any readable line after it
    # (past damage, say): the ones a way that stops short would lose.
    ahead = next(scan for _, scan in scans if scan.state.last_event_applied_idx == furthest)
    known = set(ahead.state.deployments)
    for idx, event in lines:
        if idx > furthest and event is not None:
            _follow(known, event)
    choices: list[Choice] = []
    for source, scan in scans:
        reached = scan.state.last_event_applied_idx
        held = set(scan.state.deployments)
        choices.append(
            Choice(
                source,
                scan,
                (reached + 1, last) if last > reached else None,
                tuple(sorted(known - held)),
                tuple(sorted(held - known)),
            )
        )
    return tuple(choices)


def _follow(deployments: set[str], event: DeploymentCreated | DeploymentDeleted) -> None:
    if isinstance(event, DeploymentCreated):
        deployments.add(event.deployment.deployment_id)
    else:
        deployments.discard(event.deployment_id)


def _readable_lines(
    log_path: Path,
) -> Iterator[tuple[int, DeploymentCreated | DeploymentDeleted | None]]:
    """The index of each whole line that has one, with its event when it creates or deletes a
    deployment (only those lines are parsed: the rest need only their index)."""
    if not log_path.exists():
        return
    with log_path.open("rb") as file:
        for line in file:
            if not line.endswith(b"\n"):
                continue  # a torn last line: never acknowledged
            idx = line_idx(line)
            if idx < 0:
                continue
            if not any(tag in line for tag in _DEPLOYMENT_TAGS):
                yield idx, None
                continue
            try:
                event = IndexedEvent.model_validate_json(line).event
            except ValidationError:
                yield idx, None
                continue
            yield idx, event if isinstance(event, DeploymentCreated | DeploymentDeleted) else None


def _names(ids: tuple[str, ...]) -> str:
    shown = ", ".join(ids[:_NAMED_AT_MOST])
    more = len(ids) - _NAMED_AT_MOST
    return shown + (f" and {more} more" if more > 0 else "")
