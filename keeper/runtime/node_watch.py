"""A service's half of fast failover: what it observed of each node, judged every check.

The rule is pure (``keeper.model.liveness``, docs/design.md §5.18); this is the little state a
service must keep to feed it: its own running clock (so a master that was paused blames itself),
each node's report arrivals on that clock and on the wall (the wall time is where an incident
caused by the node starts), whether its session is closed, and when it last flapped (suspected,
then heard again). ``check`` returns the verdict events the membership emits; the master acts on
them once they are in the State (a dead node's instances are deleted by the sweep).

The master feeds it from its node sessions (``keeper.sim.master.membership``: every message is a
report, a session closing is a sign); the bridge from exo's ``lastSeen`` moving between its own
polls (``keeper.bridge.node_liveness``). It needs no sessions, no channel and no event loop:
plain calls with the times the service passes, which a test can drive.

Its running clock is ticked by each ``check``, and also by ``beat`` for a service whose checks
wait on I/O: the bridge's check follows a read of exo's State that may take its whole deadline,
and that wait is exo's, not the bridge's pause, so a heartbeat of the bridge's own loop ticks
the clock between checks and only the loop's own lateness counts as a pause (docs/design.md
§5.18). The master, whose checks wait on nothing, never beats: its clock is as before.
"""

from __future__ import annotations

import dataclasses
import logging
import math

from keeper.model.events import AnyEvent, NodeHeardAgain
from keeper.model.liveness import (
    LivenessConfig,
    NodeHeard,
    ObserverClock,
    Phase,
    ProbeAnswer,
    flaps_within,
    heard,
    judge,
    next_threshold,
    paused,
    report_time,
    running_at,
    started_clock,
    suspect_after,
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
        # Running time each node's last report was read (the bridge dates a report read late
        # from the one before it: ``report_time``).
        self._arrived: dict[NodeId, float] = {}
        self._phases: dict[NodeId, Phase] = {}  # the last check's judgement
        self._cleared: dict[NodeId, list[float]] = {}  # monotonic times of its clearances
        # Why the last check did not trust its view (a pause, most of the nodes at once).
        self.stale: str | None = None
        # The same reason when it was most of the nodes falling silent together (not this
        # service's pause): a view another copy of the State may not share (the bridge reads
        # another: §8.3); None otherwise.
        self.silent_together: str | None = None

    def heard(self, node_id: NodeId, now: float, wall: float, step_s: float | None = None) -> None:
        """A message of the node arrived (monotonic ``now``, Unix ``wall``); ``step_s``: how
        long after its previous report the node made this one, by its own clock, when the
        report says (exo's ``lastSeen``; ``report_time``)."""
        arrived = running_at(self._clock, now)
        previous = self._nodes.get(node_id)
        made = report_time(arrived, self._arrived.get(node_id), step_s)
        if previous is not None:
            made = max(made, previous.last_heard)  # none before the one it follows
        fault_s = math.inf if previous is None else suspect_after(self.config, previous)
        self._nodes[node_id] = heard(previous, made, fault_s)
        self._arrived[node_id] = arrived
        self._wall[node_id] = wall

    def probed(self, node_id: NodeId, answer: ProbeAnswer) -> None:
        """What the node's own API answered a probe (the bridge's second sign)."""
        node = self._nodes.get(node_id)
        if node is not None:
            self._nodes[node_id] = dataclasses.replace(node, probe=answer)

    def closed(self, node_id: NodeId) -> None:
        """The node's session closed (a second sign once it is also silent)."""
        node = self._nodes.get(node_id)
        if node is not None:
            self._nodes[node_id] = dataclasses.replace(node, closed=True)

    def beat(self, now: float) -> None:
        """The service's own loop ran at monotonic ``now`` (its heartbeat): the running clock
        is ticked as by a check, so a check late only because it waited on I/O is no pause."""
        self._clock = ticked(self._clock, now)

    def running_at(self, now: float) -> float:
        """The master's running time at monotonic ``now`` (its own pauses cut short)."""
        return running_at(self._clock, now)

    def silent_s(self, node_id: NodeId, now: float) -> float | None:
        """How long the node has been silent, on the running clock (None: never heard)."""
        node = self._nodes.get(node_id)
        return None if node is None else max(0.0, running_at(self._clock, now) - node.last_heard)

    def next_check_in(self, now: float) -> float | None:
        """Seconds from monotonic ``now`` until the next node's silence reaches a threshold of
        the rule (``next_threshold``), or None: a service that checks on a poll checks then."""
        running = running_at(self._clock, now)
        due = next_threshold(self._nodes, self._phases, running, self.config)
        return None if due is None else due - running

    def check(self, state: State, now: float, wall: float) -> list[AnyEvent]:
        """Judge the nodes in the topology at ``now`` and return the verdict events."""
        self._clock = ticked(self._clock, now)
        running = self._clock.running
        present = state.topology.nodes
        # Forget nodes gone from the topology; one that reached it unheard starts now.
        self._nodes = {n: h for n, h in self._nodes.items() if n in present}
        self._wall = {n: t for n, t in self._wall.items() if n in present}
        self._arrived = {n: t for n, t in self._arrived.items() if n in present}
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
        pause = paused(self._clock)
        if pause is not None:
            # Settling after our own pause: every node counts as heard now (docs/design.md
            # §5.18). A session closed by the pause is reopened within the settling time; one
            # still closed after it counts as the sign it is.
            self._nodes = {
                n: dataclasses.replace(h, last_heard=running) for n, h in self._nodes.items()
            }
        judgement = judge(self._nodes, running, self.config, pause)
        self._phases = judgement.phases
        self.silent_together = judgement.stale if pause is None else None
        if judgement.stale != self.stale:
            if judgement.stale is not None:
                log.warning("fast failover: %s", judgement.stale)
            else:
                log.info("fast failover: the view is fresh again: nodes are judged")
            self.stale = judgement.stale
        events = watch_events(state, judgement, self._wall, wall)
        for event in events:
            if isinstance(event, NodeHeardAgain):
                self._cleared.setdefault(event.node_id, []).append(now)
        return events
