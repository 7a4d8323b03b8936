"""Node liveness as the dashboard sees it: which nodes are heard, suspect, dead, silent or gone.

The State says when each node was last heard of (``lastSeen``), which nodes are in the topology
(it forgets a node that timed out) and, from a service with fast failover, its verdict on each
node gone quiet (``State.node_watch``: suspect, then dead; docs/design.md §5.18). Against a
stock exo, which has no verdicts, the model writes the dashboard's own into the State it holds
(``verdicts.py``, by the data model's same rule), so this part reads one shape whatever the
master. The dashboard remembers more: the nodes it saw leave (their names, when they left and
when they were last heard of, ``GONE_NODES_KEPT`` of them) and what it last told the timeline of
each node (suspect, dead, silent), so each of those is said once, and so is its end. Every
judgement of a node in the cluster (``judge``) is made here, once, for the nodes tab, the
header's counts, the timeline and the start of an outage.

A verdict wins over the coarse rule (``SILENT_AFTER_S``, the one ``GET /metrics`` counts by):
a service with fast failover judges sooner and on more than ``lastSeen`` (a closed connection,
a probe), and a node it has not judged is ``silent`` only past the coarse threshold (fast
failover off, or a service that has not said yet).

Pure: the time comes in as ``now`` and the master's clock as a ``MasterClock`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exo_deploy_tui.model.draining import handle_of
from exo_deploy_tui.model.format import precise_duration
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.rows import Liveness
from exo_deploy_tui.model.timeline import Level, TimelineEntry, node_name
from keeper.model.events import NodeGatheredInfo, NodeTimedOut
from keeper.model.liveness import SILENT_AFTER_S, departed_nodes
from keeper.model.state import NodeId, NodeWatch, State

# Gone nodes are remembered so the operator sees what left; this many is a whole rack's worth
# while keeping memory flat when nodes churn for days.
GONE_NODES_KEPT = 32


# What the timeline tells of a node when it enters each phase, and how loud.
_TOLD_LEVEL: dict[Liveness, Level] = {"suspect": "warn", "dead": "error", "silent": "warn"}


@dataclass(frozen=True)
class Heard:
    """A node of the topology as we hear it now."""

    liveness: Liveness
    # Since it was last heard: its verdict's ``last_heard`` when it has one, else its lastSeen;
    # None when it has neither we can read.
    quiet_for_s: float | None
    watch: NodeWatch | None = None  # the verdict it has, if any


@dataclass(frozen=True)
class Gone:
    """A node seen leaving the cluster."""

    name: str
    at: float  # when it left, our clock
    last_seen: float | None  # when it was last heard of, our clock


def judge(quiet_for_s: float | None, watch: NodeWatch | None = None) -> Liveness:
    """A node in the topology quiet for ``quiet_for_s``: its verdict (``suspect`` / ``dead``)
    if it has one; else ``silent`` from ``SILENT_AFTER_S``, else ``alive`` (never dated counts
    as alive: nothing says otherwise)."""
    if watch is not None:
        return watch.phase
    return "silent" if quiet_for_s is not None and quiet_for_s >= SILENT_AFTER_S else "alive"


def quiet_of(
    state: State, node_id: NodeId, clock: MasterClock, now: float
) -> tuple[float | None, NodeWatch | None]:
    """How long the node has been quiet, and its verdict: a verdict dates the silence from the
    last report the service saw arrive (what it judged by), else the State's lastSeen does."""
    watch = state.node_watch.get(node_id)
    if watch is not None:
        return clock.silent_since(watch.last_heard, now), watch
    return clock.quiet_for(state.last_seen.get(node_id), now), None


class NodeLiveness:
    """The nodes seen leaving, and those told silent; everything else is read from the State."""

    def __init__(self) -> None:
        self._gone: dict[NodeId, Gone] = {}
        # What the timeline was last told of each node not heard (suspect, dead, silent), and
        # when: the next change is told once, and so is the end.
        self._told: dict[NodeId, tuple[Liveness, float]] = {}

    # -- judging ---------------------------------------------------------------------------

    def heard(self, state: State, clock: MasterClock, now: float) -> dict[NodeId, Heard]:
        """Each node of the topology, judged (``judge``)."""
        heard: dict[NodeId, Heard] = {}
        for node_id in state.topology.nodes:
            quiet, watch = quiet_of(state, node_id, clock, now)
            heard[node_id] = Heard(judge(quiet, watch), quiet, watch)
        return heard

    def last_heard(self, node_id: NodeId, state: State, clock: MasterClock) -> float | None:
        """When a node that is not heard now (gone, with a verdict, or told silent) was last
        heard of, on our clock; None for a node that is heard, or whose last report is unknown.
        What dates an outage it caused: the master only notices later."""
        gone = self._gone.get(node_id)
        if gone is not None:
            return gone.last_seen
        watch = state.node_watch.get(node_id)
        if watch is not None:
            return watch.last_heard - clock.offset_s
        if node_id in self._told:
            return clock.ours(state.last_seen.get(node_id))
        return None

    # -- remembering -----------------------------------------------------------------------

    def note(self, event: object, before: State, now: float, clock: MasterClock) -> None:
        """A node timed out (remember it, as ``before`` knew it) or joined (forget it)."""
        if isinstance(event, NodeTimedOut) and event.node_id in before.topology.nodes:
            node = event.node_id
            last_seen = self.last_heard(node, before, clock)
            if last_seen is None:
                last_seen = clock.ours(before.last_seen.get(node))
            self._gone[node] = Gone(node_name(node, before), now, last_seen)
            self._told.pop(node, None)
            while len(self._gone) > GONE_NODES_KEPT:
                del self._gone[next(iter(self._gone))]
        elif isinstance(event, NodeGatheredInfo):
            self._gone.pop(event.node_id, None)

    def check(self, state: State, clock: MasterClock, now: float) -> list[TimelineEntry]:
        """Time passed, or a State came: the nodes that became suspect, dead or silent, and
        those heard again, each told once."""
        entries: list[TimelineEntry] = []
        for node_id, heard in self.heard(state, clock, now).items():
            told = self._told.get(node_id)
            phase = heard.liveness
            if phase == "alive":
                if told is not None:
                    del self._told[node_id]
                    entries.append(self._heard_again(node_id, state, told, now))
            elif (told is None or told[0] != phase) and heard.quiet_for_s is not None:
                self._told[node_id] = (phase, now)
                text = _phase_words(node_name(node_id, state), phase, heard)
                entries.append(TimelineEntry(now, _TOLD_LEVEL[phase], text, node_id=node_id))
        for node_id in [n for n in self._told if n not in state.topology.nodes]:
            del self._told[node_id]
        return entries

    @staticmethod
    def _heard_again(
        node_id: NodeId, state: State, told: tuple[Liveness, float], now: float
    ) -> TimelineEntry:
        name = node_name(node_id, state)
        phase, since = told
        if phase == "silent":
            text = f"node {name} is reporting again"
        else:
            text = f"node {name} heard again ({phase} for {precise_duration(now - since)})"
        return TimelineEntry(now, "good", text, node_id=node_id)

    # -- what left ---------------------------------------------------------------------------

    def remembered_names(self) -> dict[NodeId, str]:
        """Names of nodes that have left, which the State no longer carries."""
        return {node_id: gone.name for node_id, gone in self._gone.items()}

    def gone(self, state: State) -> dict[NodeId, Gone]:
        """The nodes seen leaving that are not back, oldest departure first."""
        return {n: g for n, g in self._gone.items() if n not in state.topology.nodes}

    def departed_unseen(self, state: State) -> list[NodeId]:
        """Departed nodes the State still lists that we did not see leave (so we have no time
        for them): they had left before we connected."""
        return [n for n in departed_nodes(state) if n not in self._gone]

    def gone_count(self, state: State) -> int:
        return len(self.gone(state)) + len(self.departed_unseen(state))

    def away_names(self, state: State, name_of: Callable[[NodeId], str]) -> list[str]:
        """Cordoned names no node row goes by: their machines are away (cordoned before an
        update, say); the cordon waits for them by name."""
        if not state.cordoned:
            return []
        listed = {handle_of(state, n) for n in state.topology.nodes}
        listed.update(gone.name for gone in self.gone(state).values())
        listed.update(name_of(n) for n in self.departed_unseen(state))
        return [name for name in state.cordoned if name not in listed]


def _phase_words(name: str, phase: Liveness, heard: Heard) -> str:
    """What the timeline says as a node becomes suspect, dead or silent."""
    quiet = heard.quiet_for_s or 0.0
    if phase == "suspect":
        return f"node {name} is suspect (nothing heard for {quiet:.0f} s)"
    if phase == "dead":
        why = heard.watch.why if heard.watch is not None and heard.watch.why else ""
        return f"node {name} confirmed dead" + (f": {why}" if why else "")
    return f"node {name} went silent (nothing for {quiet:.0f} s)"
