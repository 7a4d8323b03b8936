"""Node liveness as the dashboard sees it: which nodes are heard, which went silent, which left.

The State says when each node was last heard of (``lastSeen``) and which nodes are in the
topology; it forgets a node that timed out. The dashboard remembers more: the nodes it saw leave
(their names, when they left and when they were last heard of, ``GONE_NODES_KEPT`` of them) and
the nodes it has told the timeline went silent, so it says "went silent" and "reporting again"
once each. Every judgement of a node in the cluster (``judge``) is made here, once, for the
nodes tab, the header's counts, the timeline and the start of an outage, so a finer rule (a
node *suspect* before it is *dead*) changes what all of them say by changing this part alone.
The rule itself is the data model's (``keeper.model.liveness``), which ``GET /metrics`` reads too.

Pure: the time comes in as ``now`` and the master's clock as a ``MasterClock`` value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from exo_deploy_tui.draining import handle_of
from exo_deploy_tui.master_clock import MasterClock
from exo_deploy_tui.rows import Liveness
from exo_deploy_tui.timeline import TimelineEntry, node_name
from keeper.model.events import NodeGatheredInfo, NodeTimedOut
from keeper.model.liveness import SILENT_AFTER_S, departed_nodes
from keeper.model.state import NodeId, State

# Gone nodes are remembered so the operator sees what left; this many is a whole rack's worth
# while keeping memory flat when nodes churn for days.
GONE_NODES_KEPT = 32


@dataclass(frozen=True)
class Heard:
    """A node of the topology as we hear it now."""

    liveness: Liveness
    quiet_for_s: float | None  # since its lastSeen; None when it has none we can read


@dataclass(frozen=True)
class Gone:
    """A node seen leaving the cluster."""

    name: str
    at: float  # when it left, our clock
    last_seen: float | None  # when it was last heard of, our clock


def judge(quiet_for_s: float | None) -> Liveness:
    """A node in the topology quiet for ``quiet_for_s``: ``silent`` from ``SILENT_AFTER_S``,
    else ``alive`` (never dated counts as alive: nothing says otherwise)."""
    return "silent" if quiet_for_s is not None and quiet_for_s >= SILENT_AFTER_S else "alive"


class NodeLiveness:
    """The nodes seen leaving, and those told silent; everything else is read from the State."""

    def __init__(self) -> None:
        self._gone: dict[NodeId, Gone] = {}
        self._silent: set[NodeId] = set()

    # -- judging ---------------------------------------------------------------------------

    def heard(self, state: State, clock: MasterClock, now: float) -> dict[NodeId, Heard]:
        """Each node of the topology, judged (``judge``)."""
        heard: dict[NodeId, Heard] = {}
        for node_id in state.topology.nodes:
            quiet = clock.quiet_for(state.last_seen.get(node_id), now)
            heard[node_id] = Heard(judge(quiet), quiet)
        return heard

    def last_heard(self, node_id: NodeId, state: State, clock: MasterClock) -> float | None:
        """When a node that is not heard now (gone, or told silent) was last heard of, on our
        clock; None for a node that is heard, or whose last report is unknown. What dates an
        outage it caused: the master only notices later."""
        gone = self._gone.get(node_id)
        if gone is not None:
            return gone.last_seen
        if node_id in self._silent:
            return clock.ours(state.last_seen.get(node_id))
        return None

    # -- remembering -----------------------------------------------------------------------

    def note(self, event: object, before: State, now: float, clock: MasterClock) -> None:
        """A node timed out (remember it, as ``before`` knew it) or joined (forget it)."""
        if isinstance(event, NodeTimedOut) and event.node_id in before.topology.nodes:
            node = event.node_id
            last_seen = clock.ours(before.last_seen.get(node))
            self._gone[node] = Gone(node_name(node, before), now, last_seen)
            self._silent.discard(node)
            while len(self._gone) > GONE_NODES_KEPT:
                del self._gone[next(iter(self._gone))]
        elif isinstance(event, NodeGatheredInfo):
            self._gone.pop(event.node_id, None)

    def check(self, state: State, clock: MasterClock, now: float) -> list[TimelineEntry]:
        """Time passed, or a State came: the nodes that went silent or report again, each told
        once."""
        entries: list[TimelineEntry] = []
        for node_id, heard in self.heard(state, clock, now).items():
            if heard.quiet_for_s is None:
                continue
            name = node_name(node_id, state)
            silent = heard.liveness == "silent"
            if silent and node_id not in self._silent:
                self._silent.add(node_id)
                text = f"node {name} went silent (nothing for {heard.quiet_for_s:.0f} s)"
                entries.append(TimelineEntry(now, "warn", text, node_id=node_id))
            elif not silent and node_id in self._silent:
                self._silent.discard(node_id)
                text = f"node {name} is reporting again"
                entries.append(TimelineEntry(now, "good", text, node_id=node_id))
        for node_id in [n for n in self._silent if n not in state.topology.nodes]:
            self._silent.discard(node_id)
        return entries

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
