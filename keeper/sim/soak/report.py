"""The soak's report: the JSON document a run writes, and the table it prints.

The JSON fields are the soak's contract (``minutes, nodes, seed, requests, results, errors, lost,
duplicates, faults, recovery, serving_at_end``) plus what explains them: which run it was, the
deployed models, the keeper-added latency, what the errors were, how many events the log check
replayed. Times inside a run are seconds since fault injection began, on the run's clock (the
real one, or the simulated one of a virtual run), so a virtual report is the same whenever and
wherever it is replayed: nothing in it depends on the wall clock.

``summarize`` turns the fault records into per-kind recovery figures (p50 / p95 / worst),
``summarize_broken`` the broken-instance kinds' into how many were recognised and repaired and
how long fault → recognised and fault → serving took; ``percentile`` is the
nearest-rank percentile (an observed value, never an interpolated one); ``format_table`` prints
reports as rows of the table the seed's hardware result was given in, and ``format_models`` each
model's own outcomes (a replicated model's availability is read there).

``by_fault`` splits each model's requests sent under faults by the fault whose span they were in
flight in (``fault_span``: from its injection until it settled; a request sent before a fault
and cut by it is the fault's), so a figure is read on exactly what it claims: the replicated
model's availability across node faults is ``excluding_master_restarts``, its requests under
faults less those in flight during a master restart's span (from the kill until the restarted
master had every node back and every model answering). Pure functions of the records, so a
test states every case.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict

from keeper.sim.soak.faults import BROKEN_KINDS, FaultKind, FaultProgress, give_up_at

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
    # From injection until it had settled: over and recovered, every node connected to the
    # master, every deployment with all its replicas ready (keeper.sim.soak.faults). None when it
    # had not by its deadline, SETTLE_WAIT_S after it was over.
    settled_after_s: float | None
    # The fault before it had not settled when this one struck (in a one-at-a-time run: only
    # once waiting for it had passed its deadline).
    started_unsettled: bool
    # From injection until the keeper judged an instance the fault hit broken (a repair placed
    # for it, or its deployment's health naming it; docs/design.md §5.19), and until such an
    # instance was gone from the State. None: never.
    recognised_after_s: float | None = None
    repaired_after_s: float | None = None


class RecoveryStats(_ReportModel):
    """One fault kind's recoveries (``recovered_after_s``): nearest-rank percentiles."""

    count: int
    recovered: int
    median_s: float | None
    p95_s: float | None
    max_s: float | None


class BrokenStats(_ReportModel):
    """One broken-instance kind: how many were injected, recognised and repaired, and how long
    from the fault to recognised (``recognised_after_s``) and to serving again
    (``recovered_after_s``), median and worst."""

    injected: int
    recognised: int
    repaired: int
    recognised_median_s: float | None
    recognised_max_s: float | None
    serving_median_s: float | None
    serving_max_s: float | None


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
    # Gaps that waited by design, not on the keeper's step: by reason (see keeper.sim.soak.watch).
    excluded: dict[str, int]


class Deployed(_ReportModel):
    model_id: str
    min_nodes: int
    replicas: int = 1  # instances kept on nodes apart (docs/design.md §5.11)


# The ``by_fault`` key of requests sent outside every fault's span.
BETWEEN_FAULTS = "between_faults"
# A request's outcome label for one that got neither a reply nor an error by its deadline.
LOST = "lost"


class Sent(_ReportModel):
    """One request sent once fault injection began, and its outcome."""

    model: str
    at: float  # sent, s since fault injection began
    ended: float  # its outcome came (or its deadline passed), on the same clock
    error: str | None  # None: a reply; else the error's label, or LOST


class Share(_ReportModel):
    """Some of a model's requests: how many, how many got a reply, what the others got."""

    requests: int
    results: int
    answered: float | None  # results / requests; None when there was no request
    errors: dict[str, int]  # by label, lost requests under LOST


def share(sent: Iterable[Sent]) -> Share:
    requests = results = 0
    errors: Counter[str] = Counter()
    for request in sent:
        requests += 1
        if request.error is None:
            results += 1
        else:
            errors[request.error] += 1
    return Share(
        requests=requests,
        results=results,
        answered=round(results / requests, 5) if requests else None,
        errors=dict(sorted(errors.items())),
    )


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
    # The same less the requests in flight during a master restart's span (``fault_span``):
    # what node faults cost, the figure a replicated model's availability target is read on.
    excluding_master_restarts: Share | None
    # The requests under faults by the kind of the latest fault whose span they were in flight
    # in (``attribute``), BETWEEN_FAULTS for the rest.
    by_fault: dict[str, Share]


def model_outcomes(
    requests: int,
    results: int,
    errors: int,
    lost: int,
    under_faults: tuple[int, int] = (0, 0),
    errors_under_faults: dict[str, int] | None = None,
    sent: Sequence[Sent] = (),
    faults: Sequence[FaultRecord] = (),
) -> ModelOutcomes:
    """``under_faults``: (requests, results) sent since fault injection began; ``sent``: those
    requests one by one, split by ``faults``' spans."""
    count, answered = under_faults
    restarts = [fault_span(f) for f in faults if f.kind is FaultKind.MASTER_CRASH]
    by_fault: dict[str, list[Sent]] = {}
    for request in sent:
        by_fault.setdefault(attribute(request, faults), []).append(request)
    return ModelOutcomes(
        requests=requests,
        results=results,
        errors=errors,
        lost=lost,
        requests_under_faults=count,
        answered_under_faults=round(answered / count, 5) if count else None,
        errors_under_faults=dict(sorted((errors_under_faults or {}).items())),
        excluding_master_restarts=share(
            r for r in sent if not any(in_flight(r, span) for span in restarts)
        )
        if sent
        else None,
        by_fault={key: share(by_fault[key]) for key in sorted(by_fault)},
    )


def fault_span(fault: FaultRecord) -> tuple[float, float]:
    """[start, end) of the requests a fault may have cost: from its injection until it settled,
    or until waiting for it gave up (``keeper.sim.soak.faults.give_up_at``) when it never did."""
    if fault.settled_after_s is not None:
        return fault.at, fault.at + fault.settled_after_s
    progress = FaultProgress(
        at=fault.at,
        duration_s=fault.duration_s,
        ended_at=fault.ended_at,
        recovered=False,
        nodes_connected=False,
        replicas_ready=False,
    )
    return fault.at, give_up_at(progress)


def in_flight(request: Sent, span: tuple[float, float]) -> bool:
    """Whether the request was in flight at some moment of ``span``: sent before it ended, and
    ended at or after it began."""
    start, end = span
    return request.at < end and request.ended >= start


def attribute(request: Sent, faults: Sequence[FaultRecord]) -> str:
    """The kind of the latest fault (in injection order) during whose span the request was in
    flight, else BETWEEN_FAULTS."""
    for fault in reversed(faults):
        if in_flight(request, fault_span(fault)):
            return fault.kind.value
    return BETWEEN_FAULTS


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
    # After the faults: every deployment serving and every model answering a chat again.
    serving_at_end: bool
    # ... and every deployment with all its replicas ready.
    replicas_at_end: bool
    settle_s: float | None  # from every process being back until both held
    # The schedule's rule: a fault starts only once the one before it settled.
    one_fault_at_a_time: bool
    # The master's fast failover thresholds for the run (0: off, exo's rule alone).
    suspect_after_s: float
    dead_after_s: float
    # The broken-instance kinds, by kind (every one of BROKEN_KINDS, 0 injected included).
    broken: dict[str, BrokenStats]
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
            p95_s=_rounded(percentile(times, 0.95)),
            max_s=_rounded(max(times)) if times else None,
        )
    return stats


def _median(values: Sequence[float]) -> float | None:
    return _rounded(statistics.median(values)) if values else None


def _worst(values: Sequence[float]) -> float | None:
    return _rounded(max(values)) if values else None


def summarize_broken(faults: Iterable[FaultRecord]) -> dict[str, BrokenStats]:
    """Per broken-instance kind (every one, 0 injected included): injected, recognised,
    repaired, fault → recognised and fault → serving (median, worst)."""
    by_kind: dict[str, list[FaultRecord]] = {kind.value: [] for kind in BROKEN_KINDS}
    for fault in faults:
        if fault.kind.value in by_kind:
            by_kind[fault.kind.value].append(fault)
    stats: dict[str, BrokenStats] = {}
    for kind, records in by_kind.items():
        recognised = [r.recognised_after_s for r in records if r.recognised_after_s is not None]
        serving = [r.recovered_after_s for r in records if r.recovered_after_s is not None]
        stats[kind] = BrokenStats(
            injected=len(records),
            recognised=len(recognised),
            repaired=sum(1 for r in records if r.repaired_after_s is not None),
            recognised_median_s=_median(recognised),
            recognised_max_s=_worst(recognised),
            serving_median_s=_median(serving),
            serving_max_s=_worst(serving),
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
    failover = (
        f"fast failover {report.suspect_after_s:g} / {report.dead_after_s:g} s"
        if report.suspect_after_s > 0
        else "fast failover off"
    )
    rows: list[tuple[str, ...]] = [("fault", "count", "recovered", "p50 s", "p95 s", "worst s")]
    for kind, stats in report.recovery.items():
        rows.append(
            (
                kind,
                str(stats.count),
                str(stats.recovered),
                _seconds(stats.median_s),
                _seconds(stats.p95_s),
                _seconds(stats.max_s),
            )
        )
    lines = [f"recovery by fault kind ({failover}), fault -> every model answering:"]
    lines.append(_aligned(rows))
    lines.append("broken instances: fault -> recognised -> serving (median / worst):")
    lines.append(format_broken(report))
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


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_broken(report: SoakReport) -> str:
    """Per broken-instance kind: injected, recognised, repaired, the times."""
    header = ("kind", "injected", "recognised", "repaired", "-> recognised s", "-> serving s")
    rows: list[tuple[str, ...]] = [header]
    for kind, stats in report.broken.items():
        rows.append(
            (
                kind,
                str(stats.injected),
                str(stats.recognised),
                str(stats.repaired),
                f"{_seconds(stats.recognised_median_s)} / {_seconds(stats.recognised_max_s)}",
                f"{_seconds(stats.serving_median_s)} / {_seconds(stats.serving_max_s)}",
            )
        )
    return _aligned(rows)


def _share_cell(answered: float | None, requests: int) -> str:
    return "-" if answered is None else f"{answered:.2%} of {requests}"


def format_models(report: SoakReport) -> str:
    """Per deployed model: its replicas, requests, results, errors, lost, the share of its
    requests sent under faults that were answered, and the same less master restarts."""
    header = (
        "model",
        "replicas",
        "requests",
        "results",
        "errors",
        "lost",
        "answered under faults",
        "less master restarts",
    )
    rows: list[tuple[str, ...]] = [header]
    for model in report.models:
        outcomes = report.per_model.get(model.model_id) or model_outcomes(0, 0, 0, 0)
        less = outcomes.excluding_master_restarts
        rows.append(
            (
                model.model_id,
                str(model.replicas),
                str(outcomes.requests),
                str(outcomes.results),
                str(outcomes.errors),
                str(outcomes.lost),
                _share_cell(outcomes.answered_under_faults, outcomes.requests_under_faults),
                "-" if less is None else _share_cell(less.answered, less.requests),
            )
        )
    return _aligned(rows)


def format_by_fault(report: SoakReport) -> str:
    """Per model, the share answered of the requests sent in each kind of fault's spans and
    between them, with the errors behind each share."""
    keys = [kind.value for kind in FaultKind] + [BETWEEN_FAULTS]
    rows: list[tuple[str, ...]] = [("model", *keys)]
    notes: list[str] = []
    for model in report.models:
        outcomes = report.per_model.get(model.model_id)
        by_fault = outcomes.by_fault if outcomes is not None else {}
        cells: list[str] = []
        for key in keys:
            part = by_fault.get(key)
            cells.append("-" if part is None else _share_cell(part.answered, part.requests))
            if part is not None and part.errors:
                errors = ", ".join(f"{label} {n}" for label, n in part.errors.items())
                notes.append(f"  {model.model_id}, {key}: {errors}")
        rows.append((model.model_id, *cells))
    lines = [_aligned(rows)]
    if notes:
        lines.append("errors:")
        lines.extend(notes)
    return "\n".join(lines)
