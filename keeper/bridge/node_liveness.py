"""Fast failover beside a stock exo (docs/design.md §5.18): each node's liveness from exo's
``lastSeen`` moving between the bridge's own polls.

exo's nodes report about once a second and each report moves the node's ``lastSeen``; the
bridge polls exo's State once a second. A node whose ``lastSeen`` has not moved is silent, on
the bridge's own running clock (``keeper.runtime.node_watch``: a bridge that was paused blames
itself). The bridge has no session to a node, so its second sign is the node's own API not
answering, or refusing the connection (a probe, when a ``--exo`` URL is that node's:
``keeper.bridge.node_probes``; a refusal confirms a node dead at once), or, otherwise,
``--dead-after-s`` of silence while the others are heard. A report read late (the bridge
could not read a State for a while) is dated from the one before it by the step of the node's
own ``lastSeen`` (``keeper.model.liveness.report_time``), not from the read. The verdicts are
kept here, not in the bridge's log: they are judged again from exo's State within seconds of
a restart, and the bridge's own State has no topology to hold them against. A State without
``lastSeen`` (an older exo) or with one that does not read as a date turns fast failover off
for that State, and ``/healthz`` says why; exo's own detection works as before.

The bridge's own pauses are measured by a heartbeat (``heartbeat``: a task that sleeps a
quarter second and ticks the watcher's running clock), not by the gaps between its checks: a
check comes after a read of exo's State, which may wait out its deadline on a frozen exo (and
then on the next URL), and that wait is exo's failure, not the bridge's. Timing the checks, a
followed node frozen for 15 s made the bridge judge itself paused and judge nobody through the
freeze; timing its own loop, only a loop that could not run (SIGSTOP, a blocking step) is a
pause.
"""

from __future__ import annotations

import logging
from datetime import datetime

from keeper.model.apply import apply
from keeper.model.liveness import LivenessConfig, ProbeAnswer
from keeper.model.state import NodeId, NodeWatch, State
from keeper.model.wire import JsonObject
from keeper.runtime.clock import Clock
from keeper.runtime.node_watch import NodeWatcher

log = logging.getLogger(__name__)

# How often the heartbeat ticks the watcher's running clock: a quarter of the bridge's
# one-second poll, so its own loop falling MAX_OBSERVER_GAP_S (2 s) behind is eight beats late
# and unmistakable, while a beat costs one subtraction.
HEARTBEAT_S = 0.25

NO_LAST_SEEN = (
    "exo's State has no lastSeen (an older exo): fast failover is off, exo's own timeout applies"
)


def last_seen_refusal(state: State, raw: JsonObject) -> str | None:
    """Why this State's ``lastSeen`` cannot be judged on (missing, or a date that does not
    read), or None."""
    if "lastSeen" not in raw and "last_seen" not in raw:
        return NO_LAST_SEEN
    for node_id in state.topology.nodes:
        text = state.last_seen.get(node_id)
        if text is None:
            return f"exo's State has no lastSeen for node {node_id}: fast failover is off"
        if parsed(text) is None:
            shown = repr(text[:40])
            return f"exo's lastSeen of node {node_id} is not a date ({shown}): fast failover is off"
    return None


def parsed(text: str) -> float | None:
    """A ``lastSeen`` as Unix seconds, or None when it does not read as a date."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None  # a date without its zone cannot be compared with ours
    return moment.timestamp()


class BridgeLiveness:
    """The bridge's verdicts on exo's nodes, judged on each poll (module doc)."""

    def __init__(self, config: LivenessConfig) -> None:
        self.config = config
        self._watcher: NodeWatcher | None = None
        # Each node's newest lastSeen read (Unix seconds): a report is a newer one.
        self._seen: dict[NodeId, float] = {}
        # The current verdicts (an empty mapping: none); a new object only when they change.
        self.verdicts: dict[NodeId, NodeWatch] = {}
        # Why fast failover is off for the last State read, or None while it is on.
        self.off_why: str | None = None if config.enabled else "off (--suspect-after-s 0)"

    @property
    def stale(self) -> str | None:
        return self._watcher.stale if self._watcher is not None else None

    @property
    def silent_together(self) -> str | None:
        """Why the last State read is stale when it showed most nodes fallen silent together
        (that copy of exo's State may be the one left behind, its node cut off from exo's
        master), else None."""
        return self._watcher.silent_together if self._watcher is not None else None

    def silent_s(self, node_id: NodeId, now: float) -> float | None:
        return self._watcher.silent_s(node_id, now) if self._watcher is not None else None

    def silences(self, now: float) -> dict[NodeId, float]:
        """Each node's silence at monotonic ``now`` on the running clock (``node_probes``
        probes every node heard for a refused connection)."""
        watcher = self._watcher
        if watcher is None:
            return {}
        silent = {node_id: watcher.silent_s(node_id, now) for node_id in self._seen}
        return {node_id: s for node_id, s in silent.items() if s is not None}

    def probed(self, node_id: NodeId, answer: ProbeAnswer) -> None:
        """What a probe of the node's own API answered (``keeper.bridge.node_probes``): no answer
        or a refusal is the second sign the next poll's check confirms it dead on."""
        if self._watcher is not None:
            self._watcher.probed(node_id, answer)

    def next_check_in(self, now: float) -> float | None:
        """Seconds from monotonic ``now`` until a node's silence reaches a threshold, or None
        (the ticks check then rather than at the next poll: ``BridgeTicks``)."""
        return self._watcher.next_check_in(now) if self._watcher is not None else None

    def beat(self, now: float) -> None:
        """The bridge's own loop ran at monotonic ``now`` (module doc)."""
        if self._watcher is not None:
            self._watcher.beat(now)

    async def heartbeat(self, clock: Clock) -> None:
        """Beat every HEARTBEAT_S until cancelled: the bridge's pause is its loop's lateness."""
        while True:
            await clock.sleep(HEARTBEAT_S)
            self.beat(clock.monotonic())

    def _reported(self, node_id: NodeId, last_seen: float) -> bool:
        """Whether a node's ``lastSeen`` (its own clock's, stamped on each report) read now is a
        report. A newer one is. An older one is not, for a node suspect or dead: exo's State can
        show its lastSeen go back and then forward from there (on a real cluster, 26 minutes
        back the second a killed node's API refused, exo replaying old reports), and taking
        each change for a report judged the dead node heard again, then dead, every second, its
        instance in and out of the keeper's view. For a node alive it is one: its clock was set
        back (a step of NTP), and it goes on reporting from there."""
        newest = self._seen.get(node_id)
        if newest is None or last_seen > newest:
            return True
        watch = self.verdicts.get(node_id)
        return last_seen < newest and watch is None  # no verdict: alive

    def observe(self, state: State, raw: JsonObject, now: float, wall: float) -> None:
        """One poll's State (readable), at monotonic ``now`` and Unix ``wall``."""
        if not self.config.enabled:
            return
        refusal = last_seen_refusal(state, raw)
        if refusal is not None:
            if refusal != self.off_why:
                log.warning("%s", refusal)
            self.off_why = refusal
            self.verdicts = {}
            self._watcher = None
            self._seen = {}
            return
        self.off_why = None
        watcher = self._watcher
        if watcher is None:
            watcher = self._watcher = NodeWatcher(self.config, now)
        for node_id in state.topology.nodes:
            heard_at = parsed(state.last_seen[node_id])
            if heard_at is not None and self._reported(node_id, heard_at):
                before = self._seen.get(node_id)
                self._seen[node_id] = heard_at
                step_s = None if before is None else heard_at - before
                watcher.heard(node_id, now, heard_at, step_s)
        self._seen = {n: t for n, t in self._seen.items() if n in state.topology.nodes}
        judged = state.model_copy(update={"node_watch": self.verdicts})
        events = watcher.check(judged, now, wall)
        for event in events:
            log.info("fast failover: %s %s", type(event).__name__, event)
            judged = apply(judged, event)
        if judged.node_watch != self.verdicts:
            self.verdicts = dict(judged.node_watch)
