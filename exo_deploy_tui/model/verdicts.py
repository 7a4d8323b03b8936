"""The dashboard's own verdicts on a stock exo's nodes: suspect and dead, by the services' rule.

Our master and the bridge judge their nodes and write each verdict into the State
(``State.node_watch``, docs/design.md §5.18); a stock exo judges nobody before its 30 s timeout,
so its State has none. Against it (the TUI knows it by ``/deployments`` answering 404: no
``deployments`` in the snapshot) the model reaches the verdicts itself, with the data model's
own rule (``keeper.model.liveness.judge`` and ``watch_events``) over what exo's State says of
each node: its ``lastSeen``, on the master's clock. The events that rule gives are applied to
the State the model holds, so every other part (the node rows, the header, the timeline, the
deployments' readiness and failover) reads one shape whatever the master.

What this part feeds the rule: each node's report times as exo dated them (a new ``lastSeen``
is a report; the gaps between them are its rhythm, so a busy Mac that reports irregularly gets
the slack its own record shows), how often it flapped, and the dashboard's own running clock
(``ObserverClock``: a dashboard that did not run for a while, a laptop asleep, has not been
watching). Silence is measured on the master's clock up to the moment we lost the master, so a
master out of reach makes nobody suspect; exo's master itself stalling freezes every
``lastSeen`` at once, which the rule's stale-view test refuses to take for a failover. A State
with a node whose ``lastSeen`` cannot be read (an older exo) gets no verdicts at all.

Pure: the time comes in as ``now`` and the master's clock as a ``MasterClock`` value.
"""

from __future__ import annotations

from exo_deploy_tui.model.master_clock import MasterClock, parse_iso
from keeper.model.apply import apply
from keeper.model.events import NodeHeardAgain
from keeper.model.liveness import (
    FLAP_MEMORY_S,
    LivenessConfig,
    NodeHeard,
    ObserverClock,
    flaps_within,
    heard,
    judge,
    paused,
    started_clock,
    ticked,
    watch_events,
)
from keeper.model.state import NodeId, State


class OwnVerdicts:
    """Each node's reports as a stock exo dated them, its flaps, and the dashboard's clock."""

    def __init__(self, config: LivenessConfig | None = None) -> None:
        # The services' defaults (--suspect-after-s 3, --dead-after-s 8): a stock exo has no
        # flags of ours, and the dashboard judges as a service started plainly would.
        self.config = config if config is not None else LivenessConfig()
        self._nodes: dict[NodeId, NodeHeard] = {}
        self._cleared: dict[NodeId, list[float]] = {}  # when each was heard again (master clock)
        self._observer: ObserverClock | None = None

    @staticmethod
    def carried(before: State, after: State) -> State:
        """A new snapshot of a stock exo, with the verdicts reached on ``before`` for the nodes
        still in its topology (exo's State never carries any of its own)."""
        nodes = set(after.topology.nodes)
        kept = {n: w for n, w in before.node_watch.items() if n in nodes}
        if not kept or after.node_watch:
            return after
        return after.model_copy(update={"node_watch": kept})

    def judged(self, state: State, clock: MasterClock, now: float) -> State:
        """``state`` with the verdicts brought to ``now`` (our clock); the same object when
        none changed."""
        observer = started_clock(now) if self._observer is None else ticked(self._observer, now)
        self._observer = observer
        if not self.config.enabled:
            return state
        seen: dict[NodeId, float] = {}
        for node_id in state.topology.nodes:
            at = parse_iso(state.last_seen.get(node_id))
            if at is None:
                # An older exo, or a date it cannot read: fast failover is off for this State.
                self._nodes = {}
                return state.model_copy(update={"node_watch": {}}) if state.node_watch else state
            seen[node_id] = at
        master_now = clock.known_until(now) + clock.offset_s
        self._nodes = {n: self._heard(n, at, master_now) for n, at in seen.items()}
        judgement = judge(self._nodes, master_now, self.config, paused(observer))
        events = watch_events(state, judgement, seen, master_now)
        for event in events:
            if isinstance(event, NodeHeardAgain):
                self._cleared.setdefault(event.node_id, []).append(master_now)
            state = apply(state, event)
        for node_id in [n for n in self._cleared if n not in seen]:
            del self._cleared[node_id]
        return state

    def _heard(self, node_id: NodeId, at: float, now: float) -> NodeHeard:
        """The node given its ``lastSeen`` ``at``: a later one than we knew is a report."""
        known = self._nodes.get(node_id)
        if known is None or at > known.last_heard:
            known = heard(known, at)
        cleared = [t for t in self._cleared.get(node_id, ()) if now - t < FLAP_MEMORY_S]
        if cleared:
            self._cleared[node_id] = cleared
        else:
            self._cleared.pop(node_id, None)
        flaps = flaps_within(cleared, now)
        if flaps == known.flaps:
            return known
        return NodeHeard(last_heard=known.last_heard, gaps=known.gaps, flaps=flaps)
