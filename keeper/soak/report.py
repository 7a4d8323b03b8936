"""The soak's report: the JSON document a run writes, and the table it prints.

The JSON fields are the soak's contract (``minutes, nodes, seed, requests, results, errors, lost,
duplicates, faults, recovery, serving_at_end``) plus what explains them: which run it was, the
deployed models, the keeper-added latency, what the errors were, how many events the log check
replayed. Times inside a run are seconds since fault injection began, on the run's clock (the
real one, or the simulated one of a virtual run), so a virtual report is the same whenever and
wherever it is replayed: nothing in it depends on the wall clock.

``summarize`` turns the fault records into per-kind recovery figures; ``percentile`` is the
nearest-rank percentile (an observed value, never an interpolated one); ``format_table`` prints
reports as rows of the table the seed's hardware result was given in, and ``format_models`` each
model's own outcomes (a replicated model's availability is read there).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from keeper.soak.faults import FaultKind

RunKind = Literal["processes", "virtual"]


class _ReportModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FaultRecord(_ReportModel):
    kind: FaultKind
    node: str  # a node name, or "master"
    at: float  # when it was injected, s since fault injection began
    ended_at: float | None  # when it was over (process back, SIGCONT, link healed)
    # From injection until every deployed model had answered a chat sent after the injection
    # (or after the deletion of an instance the fault hit, when that came later).
    recovered_after_s: float | None
    # Whether every instance with a runner where the fault struck (every instance, for a master
    # crash) was still there once it had recovered; None when the fault struck no instance.
    instance_survived: bool | None
    duration_s: float  # the planned length (freeze, partition, time down)


class RecoveryStats(_ReportModel):
    count: int
    recovered: int
    median_s: float | None
    max_s: float | None


class LatencyStats(_ReportModel):
    """Keeper-added latency: a model's last instance deleted -> the keeper's InstanceCreated."""

    samples: int
    p50_s: float | None
    p99_s: float | None
    max_s: float | None
    # The samples during which no other model was placed first: one step's own latency. The
    # rest queued behind another model's placement (the keeper places one per step).
    alone_samples: int
    alone_p99_s: float | None
    # Gaps that waited by design, not on the keeper's step: by reason (see keeper.soak.watch).
    excluded: dict[str, int]


class Deployed(_ReportModel):
    model_id: str
    min_nodes: int
    replicas: int = 1  # instances kept on nodes apart (docs/design.md §5.11)


class ModelOutcomes(_ReportModel):
    """One model's requests and their outcomes over the whole run, and its availability: the
    share of its requests sent once fault injection began that got a reply (before, the master's
    startup grace and the first loads answer 404s that say nothing about faults)."""

    requests: int
    results: int
    errors: int
    lost: int
    requests_under_faults: int
    answered_under_faults: float | None  # None when the model got no request then
    # What the errors under faults were (a refused connection: the master was restarting).
    errors_under_faults: dict[str, int]


def model_outcomes(
    requests: int,
    results: int,
    errors: int,
    lost: int,
    under_faults: tuple[int, int] = (0, 0),
    errors_under_faults: dict[str, int] | None = None,
) -> ModelOutcomes:
    """``under_faults``: (requests, results) sent since fault injection began."""
    sent, answered = under_faults
    return ModelOutcomes(
        requests=requests,
        results=results,
        errors=errors,
        lost=lost,
        requests_under_faults=sent,
        answered_under_faults=round(answered / sent, 5) if sent else None,
        errors_under_faults=dict(sorted((errors_under_faults or {}).items())),
    )


class SoakReport(_ReportModel):
    run: RunKind
    minutes: float  # of fault injection
    nodes: int
    seed: int
    models: list[Deployed]
    clients: int
    request_deadline_s: float
    requests: int
    results: int
    errors: int
    lost: int
    per_model: dict[str, ModelOutcomes]  # the same outcomes, by model id
    # Moments (episodes) a model had more instances than its deployment's replicas (two, for a
    # model deployed once), over every logged State.
    duplicates: int
    duplicates_seen_live: int  # the same, over the States the event stream showed
    # Events of the master's log replayed for the duplicate check (its deployment and instance
    # events once it has been compacted: all the check reads).
    events_checked: int
    faults: list[FaultRecord]
    recovery: dict[str, RecoveryStats]  # by fault kind
    serving_at_end: bool
    settle_s: float | None  # from every process being back to every model serving again
    keeper_added_latency: LatencyStats
    error_kinds: dict[str, int]
    lost_examples: list[str]
    duplicate_examples: list[str]


def percentile(values: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (``fraction`` in [0, 1]) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def latency_stats(
    samples: Sequence[float], alone: Sequence[float], excluded: dict[str, int]
) -> LatencyStats:
    return LatencyStats(
        samples=len(samples),
        p50_s=_rounded(percentile(samples, 0.50)),
        p99_s=_rounded(percentile(samples, 0.99)),
        max_s=_rounded(max(samples)) if samples else None,
        alone_samples=len(alone),
        alone_p99_s=_rounded(percentile(alone, 0.99)),
        excluded=dict(sorted(excluded.items())),
    )


def summarize(faults: Iterable[FaultRecord]) -> dict[str, RecoveryStats]:
    """Recovery figures per fault kind, for every kind (a kind never injected has count 0)."""
    by_kind: dict[str, list[FaultRecord]] = {kind.value: [] for kind in FaultKind}
    for fault in faults:
        by_kind[fault.kind.value].append(fault)
    stats: dict[str, RecoveryStats] = {}
    for kind, records in by_kind.items():
        times = [r.recovered_after_s for r in records if r.recovered_after_s is not None]
        stats[kind] = RecoveryStats(
            count=len(records),
            recovered=len(times),
            median_s=_rounded(statistics.median(times)) if times else None,
            max_s=_rounded(max(times)) if times else None,
        )
    return stats


def _duration(report: SoakReport) -> str:
    if report.minutes >= 120:
        return f"{report.minutes / 60:g} h"
    return f"{report.minutes:g} min"


def _run_label(report: SoakReport) -> str:
    where = "virtual time" if report.run == "virtual" else "processes"
    return f"{where}, {report.nodes} nodes, seed {report.seed}"


def _aligned(rows: Sequence[tuple[str, ...]]) -> str:
    """Rows as columns: the first left-aligned, the rest right-aligned, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def format_table(reports: Sequence[SoakReport]) -> str:
    """The seed's table: run, duration, requests, faults, lost (plus duplicates and serving)."""
    header = ("run", "duration", "requests", "faults", "lost", "duplicates", "serving at end")
    rows: list[tuple[str, ...]] = [header]
    for report in reports:
        rows.append(
            (
                _run_label(report),
                _duration(report),
                str(report.requests),
                str(len(report.faults)),
                str(report.lost),
                str(report.duplicates),
                "yes" if report.serving_at_end else "NO",
            )
        )
    return _aligned(rows)


def format_recovery(report: SoakReport) -> str:
    """Per fault kind: how many, how many recovered, median and max recovery; and the latency."""
    lines = ["fault          count  recovered  median s  max s"]
    for kind, stats in report.recovery.items():
        median = "-" if stats.median_s is None else f"{stats.median_s:.1f}"
        longest = "-" if stats.max_s is None else f"{stats.max_s:.1f}"
        lines.append(
            f"{kind:<14} {stats.count:>5}  {stats.recovered:>9}  {median:>8}  {longest:>5}"
        )
    latency = report.keeper_added_latency
    if latency.samples:
        lines.append(
            f"keeper-added latency: p50 {latency.p50_s:.3f} s, p99 {latency.p99_s:.3f} s, "
            f"max {latency.max_s:.3f} s over {latency.samples} re-placements"
        )
        if latency.alone_p99_s is not None:
            lines.append(
                f"  p99 {latency.alone_p99_s:.3f} s over the {latency.alone_samples} that did not "
                "queue behind another model's placement (one placement per step)"
            )
    else:
        lines.append("keeper-added latency: no re-placement to measure")
    if latency.excluded:
        waited = ", ".join(f"{reason} {count}" for reason, count in latency.excluded.items())
        lines.append(f"  not counted (waited by design): {waited}")
    return "\n".join(lines)


def format_models(report: SoakReport) -> str:
    """Per deployed model: its replicas, requests, results, errors, lost, and the share of its
    requests sent under faults that were answered."""
    header = (
        "model",
        "replicas",
        "requests",
        "results",
        "errors",
        "lost",
        "answered under faults",
    )
    rows: list[tuple[str, ...]] = [header]
    for model in report.models:
        outcomes = report.per_model.get(model.model_id) or model_outcomes(0, 0, 0, 0)
        share = outcomes.answered_under_faults
        answered = "-" if share is None else f"{share:.2%} of {outcomes.requests_under_faults}"
        rows.append(
            (
                model.model_id,
                str(model.replicas),
                str(outcomes.requests),
                str(outcomes.results),
                str(outcomes.errors),
                str(outcomes.lost),
                answered,
            )
        )
    return _aligned(rows)
