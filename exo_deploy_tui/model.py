"""A pure model of the cluster as the master describes it, for the dashboard to render.

The client feeds it ``Update``s (a State snapshot, events to apply, the keeper's timers, the
connection's fate) and the widgets read rows from it. It reads no clock: every method that
needs the time takes ``now`` (epoch seconds), so tests and snapshots freeze it, and the
countdowns tick by asking again with a later ``now`` rather than by refetching.

It also remembers what the master no longer says: nodes that have gone, when each deployment
entered its status, and when it stopped serving, which is how the timeline can say "serving
again after 37.2 s". What happened before it connected, it reads from the master's serving
records (``State.serving_history``): each deployment's last 24 hours (``availability``) and the
incidents it seeds the timeline with, each told once (``_seed_history``).

A stock exo master's State keeps what ours drops, and the rules here read it as exo means it: a
node that timed out leaves the topology but keeps its identity and backends (``departed_nodes``:
shown as gone, never alive), and a deleted instance's runners stay in ``runners`` with their last
status (only the runners of live instances are counted or shown).

Downloads are seen the same way: a runner waiting for its node's download of its model shows
the download instead of a bare status, the timeline tells each download's start and end, and
the moments of a recovery (deletion, placement, downloads, ready) are kept so that "serving
again after" can say where the time went (``recovery.py``). Each node's GPU readings are kept,
a few of them, for the nodes view's sparkline.

Cordons and drains are the State's (by friendly name): a node row says whether it is cordoned
or draining, a name cordoned while its machine is away gets a row of its own, and a deployment a
drain is moving reads ``draining``. What a drain has left and why it is stuck come from the
master's ``GET /nodes`` (a ``NodesUpdate``), for the drain that answer is about
(``draining.py``).

It is the TUI's largest module (about 1250 lines) because applying a batch and deriving the
rows from it happen together: the memory above is updated from the same before-and-after States
the rows are built from. The instance health rule (``health.py``), the timeline's wording
(``timeline.py``), the downloads' words (``downloads.py``), the recovery's parts
(``recovery.py``) and the drains' rules (``draining.py``) are already apart; the row
derivations are the next seam if it grows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from exo_deploy_tui.availability import window_end
from exo_deploy_tui.download_moments import DownloadMoments
from exo_deploy_tui.downloads import (
    DownloadFacts,
    download_facts,
    download_mark,
    gating_download,
)
from exo_deploy_tui.draining import (
    DrainPlan,
    DrainProgress,
    drain_plan,
    drain_progress,
    handle_of,
    moving_deployments,
)
from exo_deploy_tui.explain import explain_placement
from exo_deploy_tui.format import precise_duration, short_id, short_model
from exo_deploy_tui.health import progress_signature, unhealthy_reason
from exo_deploy_tui.liveness import GONE_NODES_KEPT, NodeLiveness
from exo_deploy_tui.master_clock import CLOCK_SKEW_IGNORED_S, MasterClock, offset_taken, parse_iso
from exo_deploy_tui.outages import Outages, outage_start
from exo_deploy_tui.readings import GPU_READINGS_KEPT, GpuReadings
from exo_deploy_tui.rows import (
    Connection,
    DeploymentRow,
    InstanceRow,
    Liveness,
    NodeRow,
    RunnerRow,
    SortKey,
    Summary,
    runner_status_word,
    sort_rows,
)
from exo_deploy_tui.seeding import HISTORY_SEEDED_MAX, ServingHistory
from exo_deploy_tui.timeline import (
    Timeline,
    TimelineEntry,
    entries_for_event,
    events_between,
    node_name,
)
from exo_deploy_tui.tracking import StatusTracking
from exo_deploy_tui.updates import (
    ConnectionUpdate,
    DeploymentsUpdate,
    EventUpdate,
    NodesUpdate,
    SnapshotUpdate,
    Update,
)
from keeper.model.api_models import DeploymentStatus, DeploymentView, NodeView, WaitReason
from keeper.model.apply import apply_indexed
from keeper.model.events import (
    DeploymentServingChanged,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
)
from keeper.model.history import History

# Silence and departure are judged once, in the data model, for this model and GET /metrics.
from keeper.model.liveness import SILENT_AFTER_S, departed_nodes
from keeper.model.readiness import (
    instance_is_ready,
    ready_on_present_nodes,
    status_of,
)
from keeper.model.rollout import update_progress
from keeper.model.state import (
    AnyInstance,
    AnyRunnerStatus,
    Deployment,
    DeploymentId,
    DownloadCompleted,
    InstanceId,
    MlxJacclInstance,
    ModelId,
    NodeId,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerWarmingUp,
    State,
    download_entry,
    download_model_id,
)

# What the TUI imports from here: the model, its rows (from ``rows.py``) and the constants and
# helpers its tests read.
__all__ = [
    "CLOCK_SKEW_IGNORED_S",
    "GONE_NODES_KEPT",
    "GPU_READINGS_KEPT",
    "HISTORY_SEEDED_MAX",
    "MOMENTS_WINDOW_S",
    "SILENT_AFTER_S",
    "ClusterModel",
    "Connection",
    "DeploymentRow",
    "InstanceRow",
    "Liveness",
    "NodeRow",
    "RunnerRow",
    "SortKey",
    "Summary",
    "Timer",
    "departed_nodes",
    "parse_iso",
    "runner_status_word",
    "sort_rows",
]

# A State that arrives more than this long after the last one we saw (a poll after a gap, a
# reconnection) happened some time in between: the moments its differences tell are not noted
# for a recovery's parts. Polls come every second.
MOMENTS_WINDOW_S = 2.5
# A runner in one of these has all its layers in memory.
_LOADED_RUNNER_TYPES = (RunnerLoaded, RunnerWarmingUp, RunnerReady, RunnerRunning)
# A runner in one of these (or with no status yet) has not started loading: if its node is
# downloading its model, that download is what it waits for.
_BEFORE_LOADING_TYPES = (RunnerIdle, RunnerConnecting, RunnerConnected)


@dataclass(frozen=True)
class Timer:
    failures: int
    due_at: float | None  # epoch seconds on our clock
    waiting: WaitReason | None


@dataclass
class _Progress:
    """What an instance's runners and downloads last showed, and since when (our clock)."""

    signature: object
    since: float


@dataclass(frozen=True)
class _Derived:
    """What every view needs from one State, computed once per State (States are immutable,
    so the object itself is the cache key)."""

    statuses: dict[DeploymentId, DeploymentStatus]
    ready_nodes: dict[str, tuple[NodeId, ...]]  # per model: the nodes of a ready instance
    ready_count: dict[str, int]  # per model: its ready instances (``ready_replicas``)
    instances_of: dict[str, list[AnyInstance]]  # per model
    names: dict[NodeId, str]  # friendly names, gone nodes included


# --- pure helpers ---------------------------------------------------------------------------


# --- the model ----------------------------------------------------------------------------


@dataclass
class ClusterModel:
    """Everything the dashboard knows; mutated only through ``handle`` and ``tick``."""

    state: State = field(default_factory=State)
    connection: Connection = field(default_factory=lambda: Connection("connecting"))
    timeline: Timeline = field(default_factory=Timeline)
    has_data: bool = False
    # False against a master without the deployments API: no timers to show.
    has_timers: bool = True
    master_clock_offset_s: float = 0.0
    _timers: dict[DeploymentId, Timer] = field(default_factory=dict)
    # The keeper's view of each deployment as the master last sent it (for describe's raw JSON).
    _views: dict[DeploymentId, DeploymentView] = field(default_factory=dict)
    # Since when each deployment has been in its status (``tracking.py``).
    _statuses: StatusTracking = field(default_factory=StatusTracking)
    # Each deployment's outage and its recovery's moments (``outages.py``).
    _outages: Outages = field(default_factory=Outages)
    # What the master's serving records say, and what of them the timeline has told.
    _history: ServingHistory = field(default_factory=ServingHistory)
    # The nodes seen leaving and those told silent (``liveness.py``).
    _liveness: NodeLiveness = field(default_factory=NodeLiveness)
    # Per instance not yet ready: what its runners and downloads last showed, and since when.
    _progress: dict[InstanceId, _Progress] = field(default_factory=dict)
    _derived: _Derived | None = None
    _derived_from: State | None = None
    # The index of the first event we are missing: an event came that was not the next one, so
    # nothing more is applied until a snapshot fills the hole (the app asks the client for one).
    missing_from: int | None = None
    # When each (node, model) download was seen to start and to complete (``download_moments.py``).
    _downloads: DownloadMoments = field(default_factory=DownloadMoments)
    # When the last State arrived (snapshot or event), and whether this batch's snapshot came
    # after a gap (``MOMENTS_WINDOW_S``): then what changed is not dated.
    _observed_at: float | None = None
    _blind: bool = False
    # Per node: its last GPU readings (``readings.py``).
    _readings: GpuReadings = field(default_factory=GpuReadings)
    # The master's GET /nodes as last read, by name (read while a drain is under way); None
    # when the last read failed or none was made.
    _nodes_view: dict[str, NodeView] | None = None

    # -- input ------------------------------------------------------------------------------

    def handle(self, updates: Update | Sequence[Update], now: float) -> None:
        """Take in what the client said, in order; derived facts are settled once at the end."""
        batch = [updates] if not isinstance(updates, Sequence) else updates
        self._blind = False
        for update in batch:
            match update:
                case SnapshotUpdate():
                    self._on_snapshot(update, now)
                case EventUpdate():
                    self._on_event(update, now)
                case DeploymentsUpdate(deployments=views):
                    self._set_timers(views, now)
                case ConnectionUpdate():
                    self._on_connection(update, now)
                case NodesUpdate(nodes=nodes):
                    self._nodes_view = None if nodes is None else {n.name: n for n in nodes}
        self._settle(now)

    def tick(self, now: float) -> bool:
        """Time passed: notice nodes going silent. True if the timeline grew."""
        before = self.timeline.appended
        self._check_silence(now)
        return self.timeline.appended != before

    @property
    def needs_snapshot(self) -> bool:
        return self.missing_from is not None

    def _on_snapshot(self, update: SnapshotUpdate, now: float) -> None:
        self.missing_from = None
        if update.master_clock_offset_s is not None:
            self.master_clock_offset_s = offset_taken(update.master_clock_offset_s)
        if not self.has_data:
            self.state = update.state
            self.has_data = True
            self.timeline.extend(self._seed(None, update.state, now))
            self.timeline.extend(_connected_entries(update, now))
            self._readings.note_snapshot(None, update.state)
        else:
            before, after = self.state, update.state
            observed = self._observed_at
            self._blind = self._blind or observed is None or now - observed > MOMENTS_WINDOW_S
            self.timeline.extend(self._seed(before, after, now))
            names = self.remembered_names()
            for event in events_between(before, after):
                self._note_moments(event, before, now)
                self.timeline.extend(
                    entries_for_event(event, before, after, now, names, self._starts())
                )
                self._note_membership(event, before, now)
            self._readings.note_snapshot(before, after)
            self.state = after
        self._observed_at = now
        if update.deployments is None:
            self.has_timers = False
            self._timers = {}
            self._views = {}
        else:
            self.has_timers = True
            self._set_timers(update.deployments, now)

    def _on_event(self, update: EventUpdate, now: float) -> None:
        indexed = update.indexed
        if self.has_data and indexed.idx <= self.state.last_event_applied_idx:
            return  # already part of the snapshot we hold
        expected = self.state.last_event_applied_idx + 1
        if self.missing_from is not None or (self.has_data and indexed.idx != expected):
            # A hole: applying on top of it would leave our State wrong for good.
            if self.missing_from is None:
                self.missing_from = expected
            return
        before = self.state
        self.state = apply_indexed(before, indexed)
        self._observed_at = now
        event = indexed.event
        if isinstance(event, DeploymentServingChanged):
            # Seen live: the status change it records is told by ``_settle`` as it happens.
            self._history.told_live(event.deployment_id, event.record.at)
        self._note_moments(event, before, now)
        self._note_membership(event, before, now)
        self.timeline.extend(
            entries_for_event(
                event, before, self.state, now, self.remembered_names(), self._starts()
            )
        )
        if (
            isinstance(event, NodeGatheredInfo)
            and event.system is not None
            and event.node_id in self.state.node_system
        ):
            self._readings.reading(event.node_id, event.system)

    def _note_membership(self, event: object, before: State, now: float) -> None:
        self._liveness.note(event, before, now, self.clock)
        if isinstance(event, NodeTimedOut) and event.node_id in before.topology.nodes:
            self._readings.forget(event.node_id)
            self._downloads.forget_node(event.node_id)

    def _starts(self) -> Mapping[tuple[NodeId, ModelId], float]:
        return self._downloads.starts(self._blind)

    def _note_moments(self, event: object, before: State, now: float) -> None:
        """Date what a recovery's parts are made of: instances deleted and created, downloads
        started and completed. Not after a gap: then we know only that they happened."""
        if isinstance(event, NodeDownloadProgress):
            self._downloads.note(event, before, now, self._blind)
            return
        if not self._blind:
            self._outages.note(event, before, now)

    def _seed(self, before: State | None, after: State, now: float) -> list[TimelineEntry]:
        offset = self.master_clock_offset_s
        return self._history.seed(before, after, now, offset, self._statuses)

    def day_history(self, deployment_id: DeploymentId, now: float) -> History:
        """The deployment's last 24 h from the master's serving records, on our clock
        (``availability`` None when the master keeps no records of it)."""
        offset = self.master_clock_offset_s
        return self._history.day_on_our_clock(deployment_id, self.state, now, offset)

    def derived(self) -> _Derived:
        state = self.state
        if self._derived is not None and self._derived_from is state:
            return self._derived
        instances_of: dict[str, list[AnyInstance]] = {}
        ready_nodes: dict[str, tuple[NodeId, ...]] = {}
        ready_count: dict[str, int] = {}
        for instance in state.instances.values():
            model = instance.shard_assignments.model_id
            instances_of.setdefault(model, []).append(instance)
            if instance_is_ready(instance, state):
                # keeper.model.readiness.ready_replicas counts these: what GET /deployments shows as
                # readyReplicas, here as fresh as the State (and as the status beside it).
                ready_count[model] = ready_count.get(model, 0) + 1
                if model not in ready_nodes:
                    ready_nodes[model] = tuple(instance.shard_assignments.node_to_runner)
        statuses: dict[DeploymentId, DeploymentStatus] = {
            d_id: status_of(d, instances_of, ready_nodes) for d_id, d in state.deployments.items()
        }
        names = self.remembered_names()
        names.update(
            (node_id, identity.friendly_name)
            for node_id, identity in state.node_identities.items()
            if identity.friendly_name
        )
        self._derived = _Derived(statuses, ready_nodes, ready_count, instances_of, names)
        self._derived_from = state
        return self._derived

    def name_of(self, node_id: NodeId) -> str:
        return self.derived().names.get(node_id) or short_id(node_id)

    def remembered_names(self) -> dict[NodeId, str]:
        """Names of nodes that have left, which the State no longer carries."""
        return self._liveness.remembered_names()

    @property
    def clock(self) -> MasterClock:
        """The master's clock as we know it now (its offset, and whether it is out of reach)."""
        return MasterClock(self.master_clock_offset_s, self.connection.stale_since)

    def _set_timers(self, views: Iterable[DeploymentView], now: float) -> None:
        timers: dict[DeploymentId, Timer] = {}
        for view in views:
            if view.next_attempt_in_s is not None:
                due: float | None = now + view.next_attempt_in_s
            else:
                due = self.clock.ours(view.next_attempt_at)
            timers[view.deployment.deployment_id] = Timer(view.failures, due, view.waiting)
        self._timers = timers
        self._views = {view.deployment.deployment_id: view for view in views}

    def _on_connection(self, update: ConnectionUpdate, now: float) -> None:
        old = self.connection
        if update.mode in ("live", "polling"):
            if old.stale_since is not None and self.has_data:
                lost_for = precise_duration(now - old.stale_since)
                how = "live" if update.mode == "live" else "polling"
                again = "readable" if old.mode == "unreadable" else "reachable"
                self.timeline.extend(
                    [TimelineEntry(now, "good", f"master {again} again after {lost_for} ({how})")]
                )
            self.connection = Connection(update.mode, update.detail)
            return
        stale_since = old.stale_since
        if stale_since is None and self.has_data:
            stale_since = now
            detail = f": {update.detail}" if update.detail else ""
            lost = "cannot read the master" if update.mode == "unreadable" else "lost the master"
            self.timeline.extend([TimelineEntry(now, "error", f"{lost}{detail}")])
        self.connection = Connection(update.mode, update.detail, update.retry_in_s, stale_since)

    def _settle(self, now: float) -> None:
        """After a batch: date the status changes and tell the outages they begin or end, then
        the nodes' silence and the instances' progress."""
        derived = self.derived()
        statuses, ready_nodes = derived.statuses, derived.ready_nodes
        deployments = self.state.deployments
        model_of = {d_id: d.model_card.model_id for d_id, d in deployments.items()}
        self._history.keep(statuses)
        self._outages.keep(statuses, set(model_of.values()))
        outages, blind = self._outages, self._blind
        entries: list[TimelineEntry] = []
        for change in self._statuses.settle(statuses, now):
            d_id = change.deployment_id
            model = model_of[d_id]
            if change.old == "serving":
                start = self._outage_start(outages.serving_on(d_id), now)
                entries.append(outages.stopped(d_id, model, start, now, blind))
            elif change.new == "serving":
                seen = [self._downloads.of(n, model) for n in ready_nodes.get(model, ())]
                entries.append(outages.serving_again(d_id, model, now, seen, blind))
        for d_id, status in statuses.items():
            if status == "serving":
                outages.serving(d_id, ready_nodes.get(model_of[d_id], ()))
        self.timeline.extend(entries)
        if self.has_data:
            self._statuses.watch()
        self._check_silence(now)
        self._note_progress(now)

    def _note_progress(self, now: float) -> None:
        """Date each not-ready instance's last progress. An instance first seen is dated now:
        how long it stood still before we connected cannot be known."""
        state = self.state
        progress = self._progress
        for instance_id in [i for i in progress if i not in state.instances]:
            del progress[instance_id]
        for instance_id, instance in state.instances.items():
            if instance_is_ready(instance, state):
                progress.pop(instance_id, None)
                continue
            signature = progress_signature(instance, state)
            known = progress.get(instance_id)
            if known is None or known.signature != signature:
                progress[instance_id] = _Progress(signature, now)

    def _outage_start(self, nodes: tuple[NodeId, ...], now: float) -> float:
        state, clock = self.state, self.clock
        return outage_start(now, (self._liveness.last_heard(n, state, clock) for n in nodes))

    def _check_silence(self, now: float) -> None:
        self.timeline.extend(self._liveness.check(self.state, self.clock, now))

    def _quiet_for(self, node_id: NodeId, now: float) -> float | None:
        return self.clock.quiet_for(self.state.last_seen.get(node_id), now)

    # -- output -----------------------------------------------------------------------------

    def deployment(self, deployment_id: DeploymentId) -> Deployment | None:
        return self.state.deployments.get(deployment_id)

    def view(self, deployment_id: DeploymentId) -> DeploymentView | None:
        return self._views.get(deployment_id)

    def timer(self, deployment_id: DeploymentId) -> Timer | None:
        return self._timers.get(deployment_id)

    def deployment_rows(self, now: float) -> list[DeploymentRow]:
        state = self.state
        derived = self.derived()
        statuses = derived.statuses
        by_model = derived.instances_of
        names = derived.names
        end = window_end(now, self.master_clock_offset_s)
        moving = moving_deployments(state) if state.drains else {}
        rows: list[DeploymentRow] = []
        for d_id, deployment in state.deployments.items():
            model = deployment.model_card.model_id
            instances = by_model.get(model, [])
            instance = _instance_for(deployment, instances)
            status = statuses[d_id]
            tracked = self._statuses.get(d_id)
            timer = self._timers.get(d_id)
            due_in = None
            if timer is not None and timer.due_at is not None and status != "serving":
                due_in = max(0.0, timer.due_at - now)
            gating = None
            if status == "starting" and instance is not None and state.downloads:
                gating = gating_download(
                    (names.get(n) or short_id(n), facts)
                    for n, facts in _waiting_downloads(instance, state)
                )
            rows.append(
                DeploymentRow(
                    deployment_id=d_id,
                    model_id=model,
                    status=status,
                    instance_id=instance.instance_id if instance else None,
                    nodes=_node_names(instance, names) if instance else (),
                    in_status_s=now - tracked.since if tracked else 0.0,
                    in_status_known=tracked.known if tracked else False,
                    placement_error=deployment.placement_error,
                    placement_why=explain_placement(deployment, state, names),
                    waiting=timer.waiting if timer and status != "serving" else None,
                    next_attempt_in_s=due_in,
                    failures=timer.failures if timer else 0,
                    load_progress=_progress(instance, state) if status == "starting" else None,
                    sharding=str(deployment.sharding),
                    instance_meta=str(deployment.instance_meta),
                    min_nodes=deployment.min_nodes,
                    replicas=deployment.replicas,
                    ready_replicas=derived.ready_count.get(model, 0),
                    replica_nodes=tuple(
                        _node_names(i, names)
                        for i in sorted(instances, key=lambda i: i is not instance)
                    ),
                    availability=self._history.day(
                        d_id, state.serving_history.get(d_id, ()), end
                    ).availability,
                    download=gating[1] if gating else None,
                    download_on=gating[0] if gating else None,
                    updating=update_progress(deployment),
                    moving_off=moving.get(d_id),
                    priority=deployment.priority,
                )
            )
        return rows

    def _departed_unseen(self) -> list[NodeId]:
        return self._liveness.departed_unseen(self.state)

    def node_rows(self, now: float) -> list[NodeRow]:
        state = self.state
        runners_on: dict[NodeId, list[str]] = {}
        # Per node: each runner's model, and what it shows (its status, or the download it
        # waits for). Without downloads in the State, that is what its runners show.
        downloads = state.downloads
        held_on: dict[NodeId, dict[ModelId, str]] = {}
        for instance in state.instances.values():
            model_id = instance.shard_assignments.model_id
            model = short_model(model_id)
            for node_id, runner_id in instance.shard_assignments.node_to_runner.items():
                status = state.runners.get(runner_id)
                text = f"{model} {runner_status_word(status)}"
                runners_on.setdefault(node_id, []).append(text)
                if node_id not in downloads:
                    continue
                waiting = _waiting_download(state, node_id, model_id, status)
                if waiting is not None:
                    text = f"{model} {download_mark(waiting)}"
                held_on.setdefault(node_id, {}).setdefault(model_id, text)
        rows: list[NodeRow] = []
        for node_id, heard in self._liveness.heard(state, self.clock, now).items():
            memory = state.node_memory.get(node_id)
            identity = state.node_identities.get(node_id)
            sinks = state.topology.connections.get(node_id, {})
            disk = state.node_disk.get(node_id)
            runners = tuple(runners_on.get(node_id, ()))
            models = runners
            if node_id in downloads:
                held = held_on.get(node_id, {})
                listed = list(held.values())
                for entry in sorted(
                    downloads[node_id], key=lambda e: isinstance(e, DownloadCompleted)
                ):
                    model_id = download_model_id(entry)
                    if model_id not in held:
                        mark = download_mark(download_facts(entry))
                        listed.append(f"{short_model(model_id)} {mark}")
                models = tuple(listed)
            handle = handle_of(state, node_id)
            rows.append(
                NodeRow(
                    node_id=node_id,
                    name=self.name_of(node_id),
                    liveness=heard.liveness,
                    quiet_for_s=heard.quiet_for_s,
                    ram_used=(
                        memory.ram_total.in_bytes - memory.ram_available.in_bytes
                        if memory
                        else None
                    ),
                    ram_total=memory.ram_total.in_bytes if memory else None,
                    backends=tuple(str(b) for b in state.node_backends.get(node_id, [])),
                    links=tuple(self.name_of(s) for s, edges in sinks.items() if edges),
                    runners=runners,
                    chip=identity.chip_id if identity else "",
                    disk_free=disk.available.in_bytes if disk else None,
                    disk_total=disk.total.in_bytes if disk else None,
                    models=models,
                    vitals=state.node_system.get(node_id),
                    gpu_history=self._readings.of(node_id),
                    handle=handle,
                    cordoned=handle in state.cordoned,
                    drain=self._drain_of(handle),
                )
            )
        rows.sort(key=lambda r: (r.name, r.node_id))
        # A cordon is by name: a row of a node not in the cluster shows it only while no node
        # of that name is back.
        present = {r.handle for r in rows}
        for node_id, gone in self._liveness.gone(state).items():
            rows.append(self._absent(node_id, gone.name, "gone", now - gone.at, present))
        departed: list[NodeRow] = []
        for node_id in self._departed_unseen():
            identity = state.node_identities.get(node_id)
            row = self._absent(node_id, self.name_of(node_id), "gone", None, present)
            departed.append(
                replace(
                    row,
                    backends=tuple(str(b) for b in state.node_backends.get(node_id, [])),
                    chip=identity.chip_id if identity else "",
                )
            )
        departed.sort(key=lambda r: (r.name, r.node_id))
        away = [self._absent(n, n, "away", None, present) for n in self._away_names()]
        return rows + departed + away

    def _absent(
        self, node_id: NodeId, name: str, liveness: Liveness, quiet: float | None, present: set[str]
    ) -> NodeRow:
        """The row of a node not in the cluster, with its cordon and drain if no node of its
        name (``present``) is back."""
        mine = name not in present
        return NodeRow(
            node_id,
            name,
            liveness,
            quiet,
            None,
            None,
            (),
            (),
            (),
            "",
            handle=name,
            cordoned=mine and name in self.state.cordoned,
            drain=self._drain_of(name) if mine else None,
        )

    def _drain_of(self, name: str) -> DrainProgress | None:
        drain = self.state.drains.get(name)
        if drain is None:
            return None
        answer = self._nodes_view.get(name) if self._nodes_view is not None else None
        return drain_progress(drain, answer)

    def _away_names(self) -> list[str]:
        return self._liveness.away_names(self.state, self.name_of)

    def drain_plan(self, name: str) -> DrainPlan:
        """What draining the node called ``name`` would move, and leave alone, now."""
        return drain_plan(self.state, name, self.name_of)

    def instance_rows(self, now: float) -> list[InstanceRow]:
        state = self.state
        deployment_of = {d.model_card.model_id: d_id for d_id, d in state.deployments.items()}
        present = set(state.topology.nodes)
        rows: list[InstanceRow] = []
        for instance in state.instances.values():
            assignments = instance.shard_assignments
            runners: list[RunnerRow] = []
            for node_id, runner_id in assignments.node_to_runner.items():
                shard = assignments.runner_to_shard.get(runner_id)
                status = state.runners.get(runner_id)
                progress = None
                if isinstance(status, RunnerLoading) and status.total_layers > 0:
                    progress = status.layers_loaded / status.total_layers
                waiting = (
                    _waiting_download(state, node_id, assignments.model_id, status)
                    if node_id in state.downloads
                    else None
                )
                runners.append(
                    RunnerRow(
                        runner_id=runner_id,
                        node_id=node_id,
                        node_name=self.name_of(node_id),
                        rank=shard.device_rank if shard else 0,
                        start_layer=shard.start_layer if shard else 0,
                        end_layer=shard.end_layer if shard else 0,
                        status=runner_status_word(status),
                        progress=progress,
                        error=status.error_message if isinstance(status, RunnerFailed) else None,
                        node_present=node_id in present,
                        download=waiting,
                    )
                )
            runners.sort(key=lambda r: r.rank)
            ready = ready_on_present_nodes(instance, state)
            progress = self._progress.get(instance.instance_id)
            quiet = {
                node_id: self._quiet_for(node_id, now) for node_id in assignments.node_to_runner
            }
            rows.append(
                InstanceRow(
                    instance_id=instance.instance_id,
                    model_id=assignments.model_id,
                    deployment_id=deployment_of.get(assignments.model_id),
                    kind="MlxJaccl" if isinstance(instance, MlxJacclInstance) else "MlxRing",
                    ready=ready,
                    runners=tuple(runners),
                    unhealthy=unhealthy_reason(
                        runners,
                        ready=ready,
                        quiet_s=quiet,
                        last_progress_at=progress.since if progress else None,
                        now=now,
                    ),
                )
            )
        rows.sort(key=lambda r: (r.model_id, r.instance_id))
        return rows

    def summary(self, now: float) -> Summary:
        heard = self._liveness.heard(self.state, self.clock, now).values()
        silent = sum(1 for h in heard if h.liveness == "silent")
        present = set(self.state.topology.nodes)
        by_status: dict[DeploymentStatus, int] = {}
        for status in self.derived().statuses.values():
            by_status[status] = by_status.get(status, 0) + 1
        return Summary(
            nodes_alive=len(present) - silent,
            nodes_silent=silent,
            nodes_gone=self._liveness.gone_count(self.state),
            by_status=by_status,
            deployments=len(self.state.deployments),
            instances=len(self.state.instances),
            nodes_away=len(self._away_names()),
            deployments_api=self.has_timers or not self.has_data,
        )

    def history(self, deployment_id: DeploymentId) -> list[TimelineEntry]:
        deployment = self.state.deployments.get(deployment_id)
        if deployment is None:
            return []
        return self.timeline.about_model(deployment.model_card.model_id)


def _connected_entries(update: SnapshotUpdate, now: float) -> list[TimelineEntry]:
    """What the timeline says on the first snapshot: what the cluster holds, and (a stock exo
    remembers them) the nodes that had already left."""
    state = update.state
    nodes = len(state.topology.nodes)
    counted = f"connected: {nodes} node{'s' if nodes != 1 else ''}, "
    if update.deployments is None:
        instances = len(state.instances)
        counted += f"{instances} instance{'s' if instances != 1 else ''}"
    else:
        deployments = len(state.deployments)
        counted += f"{deployments} deployment{'s' if deployments != 1 else ''}"
    entries = [TimelineEntry(now, "info", counted)]
    entries += [
        TimelineEntry(now, "warn", f"node {node_name(n, state)} had left the cluster", node_id=n)
        for n in departed_nodes(state)
    ]
    return entries


def _instance_for(deployment: Deployment, instances: list[AnyInstance]) -> AnyInstance | None:
    for instance in instances:
        if instance.instance_id == deployment.instance_id:
            return instance
    return instances[0] if instances else None


def _node_names(instance: AnyInstance, names: dict[NodeId, str]) -> tuple[str, ...]:
    return tuple(names.get(n) or short_id(n) for n in instance.shard_assignments.node_to_runner)


def _waiting_download(
    state: State, node_id: NodeId, model_id: ModelId, status: AnyRunnerStatus | None
) -> DownloadFacts | None:
    """The node's download of the model, if a runner in ``status`` waits for it: the runner has
    not started loading and the download is not complete."""
    if (status is not None and not isinstance(status, _BEFORE_LOADING_TYPES)) or (
        node_id not in state.downloads
    ):
        return None
    entry = download_entry(state, node_id, model_id)
    if entry is None or isinstance(entry, DownloadCompleted):
        return None
    return download_facts(entry)


def _waiting_downloads(
    instance: AnyInstance, state: State
) -> Iterable[tuple[NodeId, DownloadFacts]]:
    """The downloads the instance's runners wait for, each with its node."""
    model_id = instance.shard_assignments.model_id
    for node_id, runner_id in instance.shard_assignments.node_to_runner.items():
        waiting = _waiting_download(state, node_id, model_id, state.runners.get(runner_id))
        if waiting is not None:
            yield node_id, waiting


def _progress(instance: AnyInstance | None, state: State) -> float | None:
    if instance is None:
        return None
    loaded = total = 0
    for runner_id, shard in instance.shard_assignments.runner_to_shard.items():
        layers = shard.end_layer - shard.start_layer
        total += layers
        status = state.runners.get(runner_id)
        if isinstance(status, RunnerLoading):
            loaded += min(status.layers_loaded, layers)
        elif isinstance(status, _LOADED_RUNNER_TYPES):
            loaded += layers
    return loaded / total if total else None
