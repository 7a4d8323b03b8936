"""The master's half of fast failover: what it observed of each node, judged every check.

The rule is pure (``keeper.model.liveness``, docs/design.md §5.18); this is the little state a
service must keep to feed it: its own running clock (so a master that was paused blames itself),
each node's report arrivals on that clock and on the wall (the wall time is where an incident
caused by the node starts), whether its session is closed, and when it last flapped (suspected,
then heard again). ``check`` returns the verdict events the membership emits; the master acts on
them once they are in the State (a dead node's instances are deleted by the sweep).

It stands apart from ``keeper.master.membership`` because it needs no sessions, no channel and
no event loop: plain calls with the times the membership passes, which a test can drive.
"""

from __future__ import annotations

import dataclasses
import logging

from keeper.model.events import AnyEvent, NodeHeardAgain
from keeper.model.liveness import (
    LivenessConfig,
    NodeHeard,
    ObserverClock,
    flaps_within,
    heard,
    judge,
    paused,
    running_at,
    started_clock,
    ticked,
    watch_events,
)
from keeper.model.state import NodeId, State

log = logging.getLogger(__name__)


class NodeWatcher:
    """Each node's reports as the master saw them arrive, judged on each ``check``."""

    def __init__(self, config: LivenessConfig, now: float) -> None:
        self.config = config
        self._clock: ObserverClock = started_clock(now)
        self._nodes: dict[NodeId, NodeHeard] = {}
        self._wall: dict[NodeId, float] = {}  # Unix time of each node's last report
        self._cleared: dict[NodeId, list[float]] = {}  # monotonic times of its clearances
        # Why the last check did not trust its view (a pause, most of the nodes at once).
        self.stale: str | None = None

    def heard(self, node_id: NodeId, now: float, wall: float) -> None:
        """A message of the node arrived (monotonic ``now``, Unix ``wall``)."""
        self._nodes[node_id] = heard(self._nodes.get(node_id), running_at(self._clock, now))
        self._wall[node_id] = wall

    def closed(self, node_id: NodeId) -> None:
        """The node's session closed (a second sign once it is also silent)."""
        node = self._nodes.get(node_id)
        if node is not None:
            self._nodes[node_id] = dataclasses.replace(node, closed=True)

    def running_at(self, now: float) -> float:
        """The master's running time at monotonic ``now`` (its own pauses cut short)."""
        return running_at(self._clock, now)

    def silent_s(self, node_id: NodeId, now: float) -> float | None:
        """How long the node has been silent, on the running clock (None: never heard)."""
        node = self._nodes.get(node_id)
        return None if node is None else max(0.0, running_at(self._clock, now) - node.last_heard)

    def check(self, state: State, now: float, wall: float) -> list[AnyEvent]:
        """Judge the nodes in the topology at ``now`` and return the verdict events."""
        self._clock = ticked(self._clock, now)
        running = self._clock.running
        present = state.topology.nodes
        # Forget nodes gone from the topology; one that reached it unheard starts now.
        self._nodes = {n: h for n, h in self._nodes.items() if n in present}
        self._wall = {n: t for n, t in self._wall.items() if n in present}
        for node_id in present:
            if node_id not in self._nodes:
                self._nodes[node_id] = NodeHeard(last_heard=running)
                self._wall[node_id] = wall
        for node_id, cleared in list(self._cleared.items()):
            flaps = flaps_within(cleared, now)
            self._cleared[node_id] = cleared[len(cleared) - flaps :]
            if not self._cleared[node_id]:
                del self._cleared[node_id]
            if node_id in self._nodes:
                self._nodes[node_id] = dataclasses.replace(self._nodes[node_id], flaps=flaps)
        judgement = judge(self._nodes, running, self.config, paused(self._clock))
        if judgement.stale != self.stale:
            if judgement.stale is not None:
                log.warning("fast failover: %s", judgement.stale)
            self.stale = judgement.stale
        events = watch_events(state, judgement, self._wall, wall)
        for event in events:
            if isinstance(event, NodeHeardAgain):
                self._cleared.setdefault(event.node_id, []).append(now)
        return events
