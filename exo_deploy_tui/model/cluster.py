"""A pure model of the cluster as the master describes it, for the dashboard to render.

The client feeds it ``Update``s (a State snapshot, events to apply, the keeper's timers, the
connection's fate) and the widgets read rows from it. It reads no clock: every method that
needs the time takes ``now`` (epoch seconds), so tests and snapshots freeze it, and the
countdowns tick by asking again with a later ``now`` rather than by refetching.

``ClusterModel`` is thin on purpose: it applies what arrives to the State it holds (snapshots
replace it, events apply with ``keeper.model.apply``, a hole in the events waits for a snapshot)
and hands each change, with the States before and after, to the parts that remember what the
State does not say, each with one job and its own tests:

- ``liveness.py``: nodes gone (remembered), suspect, dead and silent (told once), and the one
  judgement of a node's liveness that the rows, the header and the outages read;
- ``verdicts.py``: against a stock exo, the dashboard's own verdicts on its nodes (suspect,
  dead), by the services' rule, written into the State it holds as a service writes its own;
- ``tracking.py``: since when each deployment is in its status (the changes the timeline tells);
- ``outages.py``: each outage, from when serving really stopped, and the moments of its recovery
  (deletion, placement), so that "serving again after 37.2 s" can say where the time went;
- ``seeding.py``: what happened before it connected, from the master's serving records
  (``State.serving_history``): each deployment's last 24 hours and the incidents it seeds the
  timeline with, each told once;
- ``download_moments.py``: when each node's download of a model started and completed;
- ``readings.py``: each node's last GPU readings, for the nodes view's sparkline;
- ``health.InstanceMarks``: the data model's marks of each instance (when it last moved, its
  runners' changes, the nodes' rates), for its stalled and hollow rule;
- ``moves.py``: the drains (with what ``GET /nodes`` says they have left, a ``NodesUpdate``)
  and the rolling changes under way;
- ``timers.py``: the keeper's timers from ``GET /deployments``;
- ``chat_news.py``: each deployment's last count of its chats by outcome (the same answer),
  to tell the held, continued and failed ones as they come;
- ``connection_changes.py``: what losing and regaining the master does to the connection held
  and what the timeline says of it;
- ``master_quiet.py``: a master that stops speaking before the connection notices
  (``MasterWord``: every update dates its last word, ``HeardUpdate`` too, and the nodes are
  judged as of that word).

The rows are derived from the State and those parts by pure functions (``derive.py`` for the
deployments and instances, ``node_rows.py`` for the nodes and the header's counts) into the
frozen shapes of ``rows.py``, which this module re-exports: the widgets import from here. The
per-State facts every view needs (statuses, ready nodes, names) are derived once per State,
cached by the State object (they are immutable). The timeline's wording is ``timeline.py``'s.

A stock exo master's State keeps what ours drops, and the rules read it as exo means it: a node
that timed out leaves the topology but keeps its identity and backends (``departed_nodes``:
shown as gone, never alive), and a deleted instance's runners stay in ``runners`` with their last
status (only the runners of live instances are counted or shown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from exo_deploy_tui.model.availability import window_end
from exo_deploy_tui.model.chat_news import ChatReadings
from exo_deploy_tui.model.connection_changes import connection_changed
from exo_deploy_tui.model.derive import Derived, deployment_rows, derive, instance_rows
from exo_deploy_tui.model.download_moments import DownloadMoments
from exo_deploy_tui.model.draining import DrainPlan
from exo_deploy_tui.model.failover import failover_facts
from exo_deploy_tui.model.gpu_readings import GPU_READINGS_KEPT, GpuReadings
from exo_deploy_tui.model.health import InstanceMarks
from exo_deploy_tui.model.liveness import GONE_NODES_KEPT, NodeLiveness
from exo_deploy_tui.model.master_clock import (
    CLOCK_SKEW_IGNORED_S,
    MasterClock,
    offset_taken,
    parse_iso,
)
from exo_deploy_tui.model.master_quiet import MasterWord
from exo_deploy_tui.model.moves import Moves
from exo_deploy_tui.model.node_rows import node_rows, summary
from exo_deploy_tui.model.outages import Outages, outage_start
from exo_deploy_tui.model.rows import (
    Connection,
    DeploymentRow,
    FailoverFacts,
    InstanceRow,
    Liveness,
    NodeRow,
    RunnerRow,
    SortKey,
    Summary,
    runner_status_word,
    sort_rows,
)
from exo_deploy_tui.model.seeding import HISTORY_SEEDED_MAX, ServingHistory
from exo_deploy_tui.model.timeline import (
    Timeline,
    TimelineEntry,
    entries_for_event,
    events_between,
    node_name,
)
from exo_deploy_tui.model.timers import Timer, keeper_timers
from exo_deploy_tui.model.tracking import StatusTracking
from exo_deploy_tui.model.unread_parts import UnreadParts
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    DeploymentsUpdate,
    EventUpdate,
    HeardUpdate,
    NodesUpdate,
    SnapshotUpdate,
    Update,
)
from exo_deploy_tui.model.verdicts import OwnVerdicts
from keeper.model.api_models import DeploymentView, RequestsView
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
from keeper.model.master_change import master_change_words, master_changed
from keeper.model.state import Deployment, DeploymentId, NodeId, State

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
    "FailoverFacts",
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
    # The index of the first event we are missing: an event came that was not the next one, so
    # nothing more is applied until a snapshot fills the hole (the app asks the client for one).
    missing_from: int | None = None
    # The parts (see the module's docstring), each remembering one thing the State does not say.
    _liveness: NodeLiveness = field(default_factory=NodeLiveness)
    _verdicts: OwnVerdicts = field(default_factory=OwnVerdicts)
    _statuses: StatusTracking = field(default_factory=StatusTracking)
    _outages: Outages = field(default_factory=Outages)
    _history: ServingHistory = field(default_factory=ServingHistory)
    _downloads: DownloadMoments = field(default_factory=DownloadMoments)
    _readings: GpuReadings = field(default_factory=GpuReadings)
    _marks: InstanceMarks = field(default_factory=InstanceMarks)
    _moves: Moves = field(default_factory=Moves)
    _word: MasterWord = field(default_factory=MasterWord)
    _unread: UnreadParts = field(default_factory=UnreadParts)
    _timers: dict[DeploymentId, Timer] = field(default_factory=dict)
    _chats: ChatReadings = field(default_factory=ChatReadings)
    # The keeper's view of each deployment as the master last sent it (for describe's raw JSON).
    _views: dict[DeploymentId, DeploymentView] = field(default_factory=dict)
    _derived: Derived | None = None
    _derived_from: State | None = None
    # When the last State arrived (snapshot or event), and whether this batch's snapshot came
    # after a gap (``MOMENTS_WINDOW_S``): then what changed is not dated.
    _observed_at: float | None = None
    _blind: bool = False

    # -- input ------------------------------------------------------------------------------

    def handle(self, updates: Update | Sequence[Update], now: float) -> None:
        """Take in what the client said, in order; derived facts are settled once at the end."""
        batch = [updates] if not isinstance(updates, Sequence) else updates
        self._blind = False
        for update in batch:
            if _relays_the_cluster(update):
                self._word.heard(now)  # a word from the master, whatever it says
            match update:
                case SnapshotUpdate():
                    self._on_snapshot(update, now)
                case EventUpdate():
                    self._on_event(update, now)
                case DeploymentsUpdate(deployments=views):
                    self._set_timers(views, now)
                case ConnectionUpdate():
                    self._on_connection(update, now)
                case HeardUpdate():
                    pass  # the master is alive as of now: dated above, nothing else to take
                case NodesUpdate(nodes=nodes):
                    self._moves.answered(nodes)
        self._settle(now)

    def tick(self, now: float) -> bool:
        """Time passed: notice nodes going suspect, dead or silent (against a stock exo, with
        the dashboard's own verdicts, which may change what serves). True if the timeline
        grew."""
        before = self.timeline.appended
        if self._judge_own(now):
            self._settle(now)
        else:
            self._check_quiet(now)
            self._check_silence(now)
        return self.timeline.appended != before

    @property
    def judges_own(self) -> bool:
        """Whether the dashboard reaches its own verdicts on the nodes: against a stock exo
        (no deployments API), which reaches none before its 30 s timeout."""
        return self.has_data and not self.has_timers

    def _judge_own(self, now: float) -> bool:
        """Against a stock exo, bring the dashboard's verdicts to ``now``; True if the State
        changed."""
        if not self.judges_own:
            return False
        judged = self._verdicts.judged(self.state, self.clock, now)
        changed = judged is not self.state
        self.state = judged
        return changed

    @property
    def needs_snapshot(self) -> bool:
        return self.missing_from is not None

    @property
    def clock(self) -> MasterClock:
        """The master's clock as we know it now (its offset, its last word, and whether it is
        out of reach)."""
        return self._word.clock(self.master_clock_offset_s, self.connection.stale_since)

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
            if update.deployments is None:
                after = self._verdicts.carried(before, after)
            observed = self._observed_at
            self._blind = self._blind or observed is None or now - observed > MOMENTS_WINDOW_S
            self.timeline.extend(self._seed(before, after, now))
            # exo's master changed: said first, in the history's words, as what explains the
            # instances and nodes gone below (``keeper.model.master_change``).
            change = master_changed(before, after)
            if change is not None:
                words = master_change_words(change, before)
                self.timeline.extend([TimelineEntry(now, "error", words)])
            names = self.remembered_names()
            for event in events_between(before, after):
                self._note_moments(event, before, now)
                starts = self._downloads.starts(self._blind)
                self.timeline.extend(entries_for_event(event, before, after, now, names, starts))
                self._note_membership(event, before, now)
            self._readings.note_snapshot(before, after)
            self.state = after
        self._observed_at = now
        self.timeline.extend(self._unread.took(update.unreadable, now))
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
        after = self.state = apply_indexed(before, indexed)
        self._observed_at = now
        event = indexed.event
        if isinstance(event, DeploymentServingChanged):
            # Seen live: the status change it records is told by ``_settle`` as it happens.
            self._history.told_live(event.deployment_id, event.record.at)
        self._note_moments(event, before, now)
        self._note_membership(event, before, now)
        names, starts = self.remembered_names(), self._downloads.starts(self._blind)
        self.timeline.extend(entries_for_event(event, before, after, now, names, starts))
        if (
            isinstance(event, NodeGatheredInfo)
            and event.system is not None
            and event.node_id in after.node_system
        ):
            self._readings.reading(event.node_id, event.system)

    def _note_membership(self, event: object, before: State, now: float) -> None:
        """A node left or joined: liveness remembers it, and what was kept of it goes."""
        self._liveness.note(event, before, now, self.clock)
        if isinstance(event, NodeTimedOut) and event.node_id in before.topology.nodes:
            self._readings.forget(event.node_id)
            self._downloads.forget_node(event.node_id)

    def _note_moments(self, event: object, before: State, now: float) -> None:
        """Date what a recovery's parts are made of: instances deleted and created, downloads
        started and completed. Not after a gap: then we know only that they happened."""
        if isinstance(event, NodeDownloadProgress):
            self._downloads.note(event, before, now, self._blind)
        elif not self._blind:
            self._outages.note(event, before, now)

    def _seed(self, before: State | None, after: State, now: float) -> list[TimelineEntry]:
        offset = self.master_clock_offset_s
        return self._history.seed(before, after, now, offset, self._statuses)

    def _set_timers(self, views: Sequence[DeploymentView], now: float) -> None:
        self._timers = keeper_timers(views, now, self.clock)
        self._views = {view.deployment.deployment_id: view for view in views}
        self.timeline.extend(self._chats.took(views, now))

    def _on_connection(self, update: ConnectionUpdate, now: float) -> None:
        self.connection, entries = connection_changed(
            self.connection, update, now, has_data=self.has_data
        )
        self.timeline.extend(entries)
        if self.connection.stale:
            self._chats.forget()  # what ended while away would read as one burst on return

    def _settle(self, now: float) -> None:
        """After a batch: the nodes' verdicts and silence (told first: they are the cause),
        then date the status changes and tell the outages they begin or end, then the
        instances' marks."""
        self._judge_own(now)
        self._check_quiet(now)
        self._check_silence(now)
        derived = self.derived()
        statuses, ready_nodes = derived.statuses, derived.ready_nodes
        model_of = {d_id: d.model_card.model_id for d_id, d in self.state.deployments.items()}
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
        self._marks.note(self.state, now)

    def _outage_start(self, nodes: tuple[NodeId, ...], now: float) -> float:
        state, clock = self.state, self.clock
        return outage_start(now, (self._liveness.last_heard(n, state, clock) for n in nodes))

    def _check_quiet(self, now: float) -> None:
        lost = self.connection.stale or not self.has_data
        self.timeline.extend(self._word.check(lost=lost, now=now))

    def _check_silence(self, now: float) -> None:
        self.timeline.extend(self._liveness.check(self.state, self.clock, now))

    # -- output -----------------------------------------------------------------------------

    def derived(self) -> Derived:
        """What every view needs of the State held now, derived once per State."""
        if self._derived is None or self._derived_from is not self.state:
            self._derived = derive(self.state, self.remembered_names())
            self._derived_from = self.state
        return self._derived

    def name_of(self, node_id: NodeId) -> str:
        return self.derived().name_of(node_id)

    def remembered_names(self) -> dict[NodeId, str]:
        """Names of nodes that have left, which the State no longer carries."""
        return self._liveness.remembered_names()

    def deployment(self, deployment_id: DeploymentId) -> Deployment | None:
        return self.state.deployments.get(deployment_id)

    def view(self, deployment_id: DeploymentId) -> DeploymentView | None:
        return self._views.get(deployment_id)

    def timer(self, deployment_id: DeploymentId) -> Timer | None:
        return self._timers.get(deployment_id)

    def requests(self, deployment_id: DeploymentId) -> RequestsView | None:
        """Its chats through the service's front door over the last window, as last received;
        None when none ended then, or the service has no front door."""
        view = self._views.get(deployment_id)
        return None if view is None else view.requests

    def deployment_rows(self, now: float) -> list[DeploymentRow]:
        state = self.state
        end = window_end(now, self.master_clock_offset_s)

        def availability(d_id: DeploymentId) -> float | None:
            records = state.serving_history.get(d_id, ())
            return self._history.day(d_id, records, end).availability

        derived, clock = self.derived(), self.clock

        def failover(d_id: DeploymentId) -> FailoverFacts | None:
            view = self._views.get(d_id)
            why = view.failover.why if view is not None and view.failover is not None else None
            return failover_facts(state.deployments[d_id], state, derived.names, clock, now, why)

        return deployment_rows(
            state,
            derived,
            now,
            tracked=self._statuses.get,
            timer=self._timers.get,
            availability=availability,
            moves=self._moves,
            failover=failover,
            requests=self.requests,
        )

    def node_rows(self, now: float) -> list[NodeRow]:
        return node_rows(
            self.state,
            self.derived(),
            now,
            liveness=self._liveness,
            clock=self.clock,
            readings=self._readings,
            moves=self._moves,
            unread=self._unread.marks(),
        )

    def instance_rows(self, now: float) -> list[InstanceRow]:
        state, clock = self.state, self.clock
        return instance_rows(
            state,
            self.derived(),
            quiet_for=lambda node_id: clock.quiet_for(state.last_seen.get(node_id), now),
            broken=lambda instance: self._marks.why(instance, state, now),
        )

    def summary(self, now: float) -> Summary:
        return summary(
            self.state,
            self.derived(),
            now,
            liveness=self._liveness,
            clock=self.clock,
            deployments_api=self.has_timers or not self.has_data,
            master_quiet_s=self._word.quiet_s(now, lost=self.connection.stale),
        )

    def drain_plan(self, name: str) -> DrainPlan:
        """What draining the node called ``name`` would move, and leave alone, now."""
        return self._moves.plan(self.state, name, self.name_of)

    def history(self, deployment_id: DeploymentId) -> list[TimelineEntry]:
        deployment = self.state.deployments.get(deployment_id)
        if deployment is None:
            return []
        return self.timeline.about_model(deployment.model_card.model_id)

    def day_history(self, deployment_id: DeploymentId, now: float) -> History:
        """The deployment's last 24 h from the master's serving records, on our clock
        (``availability`` None when the master keeps no records of it)."""
        offset = self.master_clock_offset_s
        return self._history.day_on_our_clock(deployment_id, self.state, now, offset)


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


def _relays_the_cluster(update: Update) -> bool:
    """Whether ``update`` is a word from the master on the channel that brings its State (the
    stream or the poll), so the cluster is known as of its arrival. ``GET /nodes`` is read
    apart and says nothing of whether that channel still flows; a connection that went down or
    cannot be read is not the master speaking."""
    match update:
        case ConnectionUpdate(mode=mode):
            return mode in ("live", "polling")
        case NodesUpdate():
            return False
        case _:
            return True
