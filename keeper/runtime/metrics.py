"""``GET /metrics`` for the master and the bridge alike: Prometheus families built at scrape time
from what the service already publishes (docs/design.md §7.8).

A scrape reads a ``MetricsSnapshot``: the State the service serves ``GET /state`` from and the
deployment views it serves ``GET /deployments`` from, with the wall time. States are immutable,
so reading one takes no lock: a scrape never waits on the keeper's step, and never delays it.
Every number is computed by the rule the API and the TUI use (``deployment_status``,
``ready_replicas`` through the views, ``keeper.model.history.summarize`` and ``serving_since``,
``keeper.model.liveness.nodes_by_state``), so ``exo-deploy-tui``, ``GET /deployments`` and
``GET /metrics`` cannot disagree.

Two things cannot be read off a snapshot, and are kept here:

- *Monotonic totals over the serving records.* Records age out after 31 days (and past 2,000 per
  deployment), and a Prometheus counter must never go down. So incidents and recoveries are
  tallied as they are first seen in the records (``IncidentTally``), counting from when the
  service started: a restarted service starts its counters at zero, like any exporter. Each
  recovery's phases (``keeper.model.history``) go into one histogram per phase, over all
  deployments (``PhaseCounts``).
- *What the shell measures:* the keeper's step time and its placements by result
  (``StepMetrics``, fed by ``keeper.runtime.hosted_keeper.HostedKeeper``, which wraps the step of
  both services).

Each service has its own ``CollectorRegistry`` (never the process-wide default), so several
services in one process (the tests' clusters) do not collide. What only one service knows
(the master's chats, the bridge's view of exo) is an extra ``Collector`` it adds with
``ServiceMetrics.add``; a later feature adds its families the same way.
"""

from __future__ import annotations

import bisect
import gzip
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import anyio
import anyio.to_thread
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from keeper.model.api_models import DeploymentStatus, DeploymentView, WebhooksHealth
from keeper.model.events import AnyEvent, DeploymentPlaced, DeploymentPlacementFailed
from keeper.model.history import History, serving_since, summarize
from keeper.model.liveness import nodes_by_state
from keeper.model.state import DeploymentId, NodeId, RecoveryPhases, State

PREFIX = "exo_deploy_"
# The classic text format (0.0.4): what every Prometheus version, and promtool, reads.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
DEPLOYMENT_LABELS = ("deployment", "model")
STATUSES: tuple[DeploymentStatus, ...] = ("serving", "starting", "placing", "cant_place")
# Availability is shown over the window the TUI's AVAIL column and `exo-deploy history` use.
AVAILABILITY_WINDOW_S = 24 * 3600.0
# Detection to serving again, seconds: exo's node timeout alone is 30 s, a staged failover
# (detection + load) about 40 s, a recovery that downloads tens of GB minutes.
# Few buckets, because each is a series per deployment (a fifth of the body at 200 of them).
RECOVERY_BUCKETS_S: tuple[float, ...] = (5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)
# One phase of a recovery, seconds (docs/design.md 3.5): placing takes tens of milliseconds,
# loading a staged model a few seconds, detection from 3 s (a suspicion) to 50 s (exo's own
# timeout and sweep), a download minutes. A histogram, not a summary: Prometheus aggregates its
# buckets across services and computes quantiles over any range (histogram_quantile), where a
# summary's quantiles cannot be added up (and prometheus_client's Summary exports none).
# One series per phase, not per deployment, so buckets can be fine.
PHASE_BUCKETS_S: tuple[float, ...] = (
    0.1,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
)
PHASES = ("detected", "placed", "downloaded", "loaded")
# One keeper step, seconds: about 60 µs for 64 serving deployments, milliseconds when many are
# due at once (README, Measured); a step near a second would delay every placement.
STEP_BUCKETS_S: tuple[float, ...] = (
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
PLACEMENT_RESULTS = ("placed", "failed")
# A body is built at most once in this long (the service's clock): at 200 deployments it is
# about 600 kB and tens of milliseconds of CPU, the keeper steps once a second and Prometheus
# scrapes every 15 s or so, so a second-old body says nothing stale, while 20 scrapers at once
# (several Prometheus servers, an operator's curl) cost one build, not twenty.
METRICS_MAX_AGE_S = 1.0
# ... and a body is kept at least this many times as long as it took to build, so however many
# scrape and however loaded the machine, building bodies takes at most a tenth of a core from
# the service (a 250 ms build is kept 2.5 s).
KEPT_PER_BUILD_TIME = 10.0
# gzip's fastest level: the 600 kB body of 200 deployments shrinks about tenfold in a few
# milliseconds; a higher level costs more CPU for a few kB less.
GZIP_LEVEL = 1


@dataclass(frozen=True)
class MetricsSnapshot:
    """What one scrape reads: the service's published State and deployment views (built from
    that State), the wall time now and when the service started (Unix seconds)."""

    state: State
    deployments: Sequence[DeploymentView]
    now: float
    started_at: float


# --- monotonic totals over the serving records --------------------------------------------


@dataclass
class RecoveryCounts:
    """One deployment's incidents and recoveries seen since the service started."""

    incidents: int = 0
    # Cumulative per bucket of RECOVERY_BUCKETS_S, then +Inf; and their sum.
    buckets: list[int] = field(default_factory=lambda: [0] * (len(RECOVERY_BUCKETS_S) + 1))
    recovered_s: float = 0.0
    # The newest incident start counted and incident end observed, so each is taken once.
    last_start: float = -math.inf
    last_end: float = -math.inf

    def observe(self, seconds: float) -> None:
        first = bisect.bisect_left(RECOVERY_BUCKETS_S, seconds)
        for index in range(first, len(self.buckets)):
            self.buckets[index] += 1
        self.recovered_s += seconds


@dataclass
class PhaseCounts:
    """The phases of every recovery seen since the service started, over all deployments (a
    deployment deleted keeps its part: the totals never go down)."""

    # Per phase: cumulative per bucket of PHASE_BUCKETS_S, then +Inf; and their sum.
    buckets: dict[str, list[int]] = field(
        default_factory=lambda: {phase: [0] * (len(PHASE_BUCKETS_S) + 1) for phase in PHASES}
    )
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    def observe(self, phases: RecoveryPhases) -> None:
        for phase, seconds in zip(
            PHASES,
            (phases.detected, phases.placed, phases.downloaded, phases.loaded),
            strict=True,
        ):
            first = bisect.bisect_left(PHASE_BUCKETS_S, seconds)
            counts = self.buckets[phase]
            for index in range(first, len(counts)):
                counts[index] += 1
            self.sums[phase] += seconds


def tally(
    counts: RecoveryCounts,
    history: History,
    started_at: float,
    phases: PhaseCounts | None = None,
) -> None:
    """Count into ``counts`` what ``history`` shows that was not counted yet: each incident that
    began at or after ``started_at``, once; and each recovery (an incident's end) at or after
    it, once, observed as the incident's down time (its start to serving again), and its phases
    into ``phases`` when it has them."""
    for incident in history.incidents:  # oldest first
        if incident.start >= started_at and incident.start > counts.last_start:
            counts.incidents += 1
            counts.last_start = incident.start
        end = incident.end
        if end is not None and end >= started_at and end > counts.last_end:
            counts.observe(incident.downtime_s)
            counts.last_end = end
            if phases is not None and incident.phases is not None:
                phases.observe(incident.phases)


class IncidentTally:
    """``tally`` for every deployment; a deployment deleted is forgotten with its series."""

    def __init__(self) -> None:
        self._counts: dict[DeploymentId, RecoveryCounts] = {}
        self.phases = PhaseCounts()

    def update(
        self, histories: Mapping[DeploymentId, History], started_at: float
    ) -> dict[DeploymentId, RecoveryCounts]:
        counts = {
            deployment_id: self._counts.get(deployment_id) or RecoveryCounts()
            for deployment_id in histories
        }
        for deployment_id, history in histories.items():
            tally(counts[deployment_id], history, started_at, self.phases)
        self._counts = counts
        return counts


# --- the families of a snapshot -----------------------------------------------------------


def last_heard(state: State) -> dict[NodeId, float]:
    """Each node's ``lastSeen`` as Unix seconds (a time that does not parse is left out)."""
    heard: dict[NodeId, float] = {}
    for node_id, text in state.last_seen.items():
        try:
            moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            continue
        if moment.tzinfo is not None:
            heard[node_id] = moment.timestamp()
    return heard


def _gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, documentation, labels=list(labels))


class SnapshotFamilies:
    """The deployments' and nodes' families of a snapshot. Reads only the snapshot (immutable),
    so it may run off the event loop; one build at a time (it keeps the incident tally)."""

    def __init__(self) -> None:
        self._tally = IncidentTally()

    def families(self, snap: MetricsSnapshot) -> Iterator[Metric]:
        state, now = snap.state, snap.now
        desired = _gauge(
            "deployment_replicas_desired", "Replicas the deployment asks for", DEPLOYMENT_LABELS
        )
        ready = _gauge(
            "deployment_replicas_ready",
            "Instances of the model with every runner ready (GET /deployments readyReplicas)",
            DEPLOYMENT_LABELS,
        )
        status = _gauge(
            "deployment_status",
            "1 for the deployment's status (serving, starting, placing, cant_place), 0 for others",
            (*DEPLOYMENT_LABELS, "status"),
        )
        standby_desired = _gauge(
            "deployment_standby_desired", "Standby sets the deployment asks for", DEPLOYMENT_LABELS
        )
        standby_staged = _gauge(
            "deployment_standby_staged",
            "Copies the keeper staged for failover that are completely downloaded",
            DEPLOYMENT_LABELS,
        )
        placement_error = _gauge(
            "deployment_placement_error",
            "1 while placement says why the deployment cannot be placed",
            DEPLOYMENT_LABELS,
        )
        # A broken instance of its model (docs/design.md §5.19), by problem.
        unhealthy = _gauge(
            "deployment_instance_unhealthy",
            "1 while an instance of the deployment's model is stalled, hollow, unfulfilled or "
            "failing chats, by problem",
            (*DEPLOYMENT_LABELS, "problem"),
        )
        failures = _gauge(
            "deployment_placement_failures",
            "Placements lost before they were ready, in a row (the keeper's backoff)",
            DEPLOYMENT_LABELS,
        )
        serving_for = _gauge(
            "deployment_serving_for_seconds",
            "Seconds since the deployment's current stretch of serving began (0 when not serving)",
            DEPLOYMENT_LABELS,
        )
        availability = _gauge(
            "deployment_availability_ratio",
            "Served time over served plus incident time in the last 24 h "
            "(GET /deployments/{id}/history); absent before the deployment first served",
            DEPLOYMENT_LABELS,
        )
        incidents = CounterMetricFamily(
            PREFIX + "deployment_incidents",
            "Incidents (not serving after having served, or unplaceable) begun since the "
            "service started",
            labels=list(DEPLOYMENT_LABELS),
        )
        recovery = HistogramMetricFamily(
            PREFIX + "deployment_recovery_seconds",
            "Incident length, from its start (a lost node's last heartbeat) to serving again, of "
            "incidents ended since the service started",
            labels=list(DEPLOYMENT_LABELS),
        )
        at_risk = _gauge(
            "deployment_at_risk",
            "1 while a ready instance of the model has a node the service suspects (it stops "
            "serving if that node is confirmed dead)",
            DEPLOYMENT_LABELS,
        )
        phase_seconds = HistogramMetricFamily(
            PREFIX + "recovery_phase_seconds",
            "Where the recoveries ended since the service started spent their time, by phase: "
            "detected (last heartbeat to the verdict, timeout or deletion), placed (to the "
            "replacement), downloaded (to its download done), loaded (to serving again)",
            labels=["phase"],
        )

        histories = {
            view.deployment.deployment_id: summarize(
                view.deployment.deployment_id,
                state.serving_history.get(view.deployment.deployment_id, ()),
                window_start=snap.started_at,
                window_end=now,
            )
            for view in snap.deployments
        }
        counts = self._tally.update(histories, snap.started_at)
        for view in snap.deployments:
            deployment = view.deployment
            deployment_id = deployment.deployment_id
            labels = [deployment_id, deployment.model_card.model_id]
            records = state.serving_history.get(deployment_id, ())
            desired.add_metric(labels, view.replicas)
            ready.add_metric(labels, view.ready_replicas)
            for value in STATUSES:
                status.add_metric([*labels, value], 1.0 if view.status == value else 0.0)
            at_risk.add_metric(labels, 1.0 if view.at_risk else 0.0)
            standby_desired.add_metric(labels, deployment.standby)
            standby_staged.add_metric(
                labels, sum(1 for copy in view.staged if copy.state == "completed")
            )
            placement_error.add_metric(labels, 0.0 if deployment.placement_error is None else 1.0)
            failures.add_metric(labels, view.failures)
            if view.health is not None:
                unhealthy.add_metric([*labels, view.health.problem], 1.0)
            since = serving_since(records)
            serving_for.add_metric(labels, max(0.0, now - since) if since is not None else 0.0)
            day = summarize(
                deployment_id, records, window_start=now - AVAILABILITY_WINDOW_S, window_end=now
            )
            if day.availability is not None:
                availability.add_metric(labels, day.availability)
            count = counts[deployment_id]
            incidents.add_metric(labels, count.incidents)
            bounds = [*(repr(bound) for bound in RECOVERY_BUCKETS_S), "+Inf"]
            recovery.add_metric(
                labels, list(zip(bounds, map(float, count.buckets), strict=True)), count.recovered_s
            )
        yield from (
            desired,
            ready,
            status,
            standby_desired,
            standby_staged,
            placement_error,
            unhealthy,
            failures,
            serving_for,
            availability,
            incidents,
            recovery,
            at_risk,
        )
        phase_bounds = [*(repr(bound) for bound in PHASE_BUCKETS_S), "+Inf"]
        phases = self._tally.phases
        for phase in PHASES:
            buckets = map(float, phases.buckets[phase])
            phase_seconds.add_metric(
                [phase], list(zip(phase_bounds, buckets, strict=True)), phases.sums[phase]
            )
        yield phase_seconds

        nodes = _gauge(
            "nodes",
            "Nodes by state: alive, silent (in the topology, not heard of for 8 s), gone (left "
            "the topology, still described); cordoned counts names",
            ("state",),
        )
        for node_state, count in nodes_by_state(state, last_heard(state), now).items():
            nodes.add_metric([node_state], count)
        yield nodes
        yield GaugeMetricFamily(
            PREFIX + "deployments", "Deployments the service keeps", value=len(state.deployments)
        )


# --- what the shell measures ---------------------------------------------------------------


class StepMetrics:
    """The keeper's step time and its placements by result, in a service's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._duration = Histogram(
            PREFIX + "keeper_step_duration_seconds",
            "Time one keeper step took (CPU-bound: the keeper reads no clock and does no I/O)",
            buckets=STEP_BUCKETS_S,
            registry=registry,
        )
        self._placements = Counter(
            PREFIX + "keeper_placements",
            "Placements the keeper's steps decided, by result: placed (an instance made) or "
            "failed (placement said why not)",
            ["result"],
            registry=registry,
        )
        for result in PLACEMENT_RESULTS:
            self._placements.labels(result)  # every result present from the start, at 0

    def stepped(self, seconds: float, events: Sequence[AnyEvent]) -> None:
        """A step took ``seconds`` and returned ``events``."""
        self._duration.observe(seconds)
        placed = sum(1 for event in events if isinstance(event, DeploymentPlaced))
        failed = sum(1 for event in events if isinstance(event, DeploymentPlacementFailed))
        if placed:
            self._placements.labels("placed").inc(placed)
        if failed:
            self._placements.labels("failed").inc(failed)


def timed_step(metrics: StepMetrics | None, step: Callable[[], list[AnyEvent]]) -> list[AnyEvent]:
    """``step()``, timed into ``metrics`` when there are any (a step that raises is timed too)."""
    if metrics is None:
        return step()
    started = time.perf_counter()
    events: list[AnyEvent] = []
    try:
        events = step()
    finally:
        metrics.stepped(time.perf_counter() - started, events)
    return events


@dataclass(frozen=True)
class _Body:
    plain: bytes
    gzipped: bytes  # what a scraper that accepts gzip gets (Prometheus does): a tenth the size
    built_at: float  # the service's monotonic clock
    keep_s: float  # how long it is served (``METRICS_MAX_AGE_S``, ``KEPT_PER_BUILD_TIME``)

    def stale(self, now: float) -> bool:
        return now - self.built_at >= self.keep_s


@dataclass(frozen=True)
class _Built:
    """Families already collected, in the shape ``generate_latest`` reads."""

    metrics: Sequence[Metric]

    def collect(self) -> Iterable[Metric]:
        return self.metrics


class ServiceMetrics:
    """One service's ``GET /metrics``: the snapshot's families, the step's, and any the service
    adds (``add``).

    A body is kept ``METRICS_MAX_AGE_S``, or ``KEPT_PER_BUILD_TIME`` times its build time if
    that is longer, by ``monotonic`` (the service's clock, read only when a body is asked for).
    With ``build_in_thread`` (a real server), only the snapshot and the service's own
    collectors are read on the event loop; the families of the snapshot are computed and
    written out in a worker thread, one build at a time, and scrapes that come meanwhile get
    the body before (at most a build older), so no scrape waits on a build but the first.
    Under a virtual clock (the tests) everything runs on the loop, which a thread would let
    the clock jump past."""

    def __init__(
        self,
        snapshot: Callable[[], MetricsSnapshot],
        monotonic: Callable[[], float],
        *,
        build_in_thread: bool = False,
    ) -> None:
        # The step's families and the service's own collectors: collected on the event loop.
        self.registry = CollectorRegistry(auto_describe=False)
        self.step = StepMetrics(self.registry)
        self._snapshot = snapshot
        self._families = SnapshotFamilies()
        self._monotonic = monotonic
        self._in_thread = build_in_thread
        self._body: _Body | None = None
        self._building: anyio.Event | None = None

    def add(self, collector: Collector) -> None:
        """More families in this service's ``GET /metrics``: ``collector.collect()`` is called
        on the event loop at each build, and must not block or take the keeper's lock."""
        self.registry.register(collector)

    def _build(self, snap: MetricsSnapshot, others: Sequence[Metric], at: float) -> _Body:
        started = time.perf_counter()
        plain = generate_latest(_Built([*self._families.families(snap), *others]))
        zipped = gzip.compress(plain, compresslevel=GZIP_LEVEL)
        took = time.perf_counter() - started
        return _Body(plain, zipped, at, max(METRICS_MAX_AGE_S, KEPT_PER_BUILD_TIME * took))

    def _build_here(self, at: float) -> _Body:
        body = self._build(self._snapshot(), list(self.registry.collect()), at)
        self._body = body
        return body

    def exposition_now(self) -> bytes:
        """The body (text format, ``CONTENT_TYPE``), built on the caller's thread if the one
        kept is too old."""
        at = self._monotonic()
        body = self._body
        if body is None or body.stale(at):
            body = self._build_here(at)
        return body.plain

    async def exposition(self, *, gzipped: bool = False) -> bytes:
        """The ``GET /metrics`` body, gzipped if asked (see the class doc for when it is
        built and where)."""
        at = self._monotonic()  # NotRunningError (a 503) before the service runs
        body = self._body
        if body is None or body.stale(at):
            if not self._in_thread:
                body = self._build_here(at)
            elif self._building is None:
                self._building = building = anyio.Event()
                try:
                    snap, others = self._snapshot(), list(self.registry.collect())
                    body = await anyio.to_thread.run_sync(self._build, snap, others, at)
                    self._body = body
                finally:
                    self._building = None
                    building.set()
            elif body is None:  # the first build is under way: wait for it
                await self._building.wait()
                body = self._body if self._body is not None else self._build_here(at)
        return body.gzipped if gzipped else body.plain


class WebhookCollector:
    """The alert webhooks' deliveries (``keeper.runtime.webhooks``), per webhook (its URL
    without the path, which often holds its secret): queued, delivered, dropped past the
    outbox's bound (never silently), attempts that failed; and notices the outbox could not
    write. Read from the counters ``/healthz`` shows too."""

    def __init__(self, health: Callable[[], WebhooksHealth]) -> None:
        self._health = health

    def collect(self) -> Iterator[Metric]:
        health = self._health()
        pending = GaugeMetricFamily(
            PREFIX + "webhook_pending", "Notices queued for the webhook", labels=["url"]
        )
        delivered = CounterMetricFamily(
            PREFIX + "webhook_delivered", "Notices the webhook accepted (2xx)", labels=["url"]
        )
        dropped = CounterMetricFamily(
            PREFIX + "webhook_dropped",
            "Notices dropped undelivered, the oldest past the outbox's bound",
            labels=["url"],
        )
        failed = CounterMetricFamily(
            PREFIX + "webhook_failed_attempts",
            "POSTs to the webhook that got no 2xx (retried with backoff)",
            labels=["url"],
        )
        for endpoint in health.endpoints:
            pending.add_metric([endpoint.url], endpoint.pending)
            delivered.add_metric([endpoint.url], endpoint.delivered_total)
            dropped.add_metric([endpoint.url], endpoint.dropped_total)
            failed.add_metric([endpoint.url], endpoint.failed_attempts_total)
        unwritten = CounterMetricFamily(
            PREFIX + "webhook_outbox_write_failures",
            "Notices the outbox could not write to disk (kept in memory)",
            value=health.outbox_write_failures_total,
        )
        yield from (pending, delivered, dropped, failed, unwritten)
