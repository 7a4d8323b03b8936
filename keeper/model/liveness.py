"""Whether each node of the cluster is alive, silent or gone, and how many are in each state.

The TUI shows a node as *alive*, *silent* (still in the topology, but it has not reported for a
while: trouble coming) or *gone* (left the topology); ``GET /metrics`` counts nodes the same
way, so a dashboard built on Prometheus and the operator's terminal cannot disagree. The rule
is written here once, pure: the caller passes when each node was last heard of (the State's
``lastSeen``, parsed by the shell, which owns dates) and its own "now".

*Gone* is what the State still says of a node that left the topology: a stock exo keeps its
identity, memory and backends after it times out (``departed_nodes``), and our master keeps the
instances that ran on it until the sweep deletes them. A node the State no longer mentions at
all is not counted: nothing is known of it any more. *Cordoned* counts names, not nodes: a name
cordoned while its Mac is away (being updated) is cordoned all the same.

Fast failover's finer rule, ``alive -> suspect -> dead -> gone`` (docs/design.md §5.18), is
below: ``judge`` turns what a service observed of each node into phases, and ``watch_events``
into the verdicts the State records (``State.node_watch``). It is here, beside the coarse rule,
because both answer one question from the same facts, and the TUI computes it for a stock exo
from ``lastSeen`` just as the bridge does. A node with a verdict counts as *silent* above.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from keeper.model.events import AnyEvent, NodeConfirmedDead, NodeHeardAgain, NodeSuspected
from keeper.model.state import NodeId, State

# Nodes report their info about once a second (keeper.sim.link.protocol.INFO_REFRESH_S; exo's every
# second or so), and each report moves lastSeen; a dashboard that shows "silent" after 8 s leaves
# the finer verdicts below (suspect after 3 s by default) to say more, sooner. exo's master gives up
# on a node after 30 s (the demo after 10 s), so this leaves time to see it coming.
SILENT_AFTER_S = 8.0

Liveness = Literal["alive", "silent", "gone"]
# The states ``nodes_by_state`` counts, in the order they are shown.
NodeCountState = Literal["alive", "silent", "gone", "cordoned"]
NODE_COUNT_STATES: tuple[NodeCountState, ...] = ("alive", "silent", "gone", "cordoned")


def departed_nodes(state: State) -> list[NodeId]:
    """Nodes the State still describes (identity, backends, memory) but whose place in the
    topology is gone: a stock exo keeps those entries after a node times out."""
    present = state.topology.nodes
    known = dict.fromkeys([*state.node_identities, *state.node_backends, *state.node_memory])
    return [node_id for node_id in known if node_id not in present]


def node_liveness(
    state: State, last_heard: Mapping[NodeId, float], now: float
) -> dict[NodeId, Liveness]:
    """Each node the State knows of: ``alive`` (in the topology, heard of less than
    ``SILENT_AFTER_S`` before ``now``, or never dated), ``silent`` (in the topology, quiet for
    longer) or ``gone`` (out of the topology, still described or still running instances)."""
    liveness: dict[NodeId, Liveness] = {}
    for node_id in state.topology.nodes:
        heard = last_heard.get(node_id)
        quiet = now - heard if heard is not None else 0.0
        # A node the service suspects or found dead (State.node_watch) is silent already.
        watched = node_id in state.node_watch
        liveness[node_id] = "silent" if watched or quiet >= SILENT_AFTER_S else "alive"
    for node_id in departed_nodes(state):
        liveness[node_id] = "gone"
    for instance in state.instances.values():
        for node_id in instance.shard_assignments.node_to_runner:
            liveness.setdefault(node_id, "gone")
    return liveness


def nodes_by_state(
    state: State, last_heard: Mapping[NodeId, float], now: float
) -> dict[NodeCountState, int]:
    """How many nodes are alive, silent and gone (``node_liveness``), and how many names are
    cordoned; every state present, zero included, so a series never vanishes."""
    counts: dict[NodeCountState, int] = dict.fromkeys(NODE_COUNT_STATES, 0)
    for liveness in node_liveness(state, last_heard, now).values():
        counts[liveness] += 1
    counts["cordoned"] = len(state.cordoned)
    return counts


# --- fast failover: alive -> suspect -> dead -> gone (docs/design.md §5.18) ----------------
#
# The rule below is what the master and the bridge run every check to reach the verdicts they
# write into the State (NodeSuspected, NodeConfirmedDead, NodeHeardAgain). The shell owns the
# clock and the sockets; it hands in, per node, what it observed (``NodeHeard``) on its own
# *running* clock (``ObserverClock``: only the time during which the observer itself ran
# counts), and gets back each node's phase and whether its view is to be trusted at all.

Phase = Literal["alive", "suspect", "dead", "gone"]
# What a probe of a node's own API (the bridge's ``GET /node_id``) answered: its id; nothing
# within the deadline (or an error); or a connection refused, which only a port nobody listens
# on gives (the node's exo process is gone).
ProbeAnswer = Literal["answered", "unanswered", "refused"]

# A gap between two of the observer's own checks longer than this is the observer's pause (GC,
# SIGSTOP, a slow step), not the nodes' silence: it checks about once a second, so two seconds
# is already twice late. Only this much of such a gap is counted as time the nodes were heard
# from (or not).
MAX_OBSERVER_GAP_S = 2.0
# After such a pause the observer judges nobody for this long, and counts every node as heard
# meanwhile: the reports the nodes sent while it slept are still queued in its sockets, and a
# node whose connection dropped while it slept reconnects with a backoff of up to 5 s
# (keeper.sim.node.ws_client; exo's nodes retry likewise). Eight seconds cover the longest backoff
# and the reconnection after it.
PAUSE_SETTLE_S = 8.0
# More than half of the nodes falling silent within this many seconds of each other is one
# fault of the observer's view (its network, exo's master), not many faults of the nodes:
# independent failures two seconds apart are rare, a partition of the observer is not.
STALE_WINDOW_S = 2.0
# A node suspected and heard again is suspected later the next time (the threshold doubles for
# each such flap remembered), up to this: a flaky Mac cannot churn the cluster faster than once
# in half a minute, and 30 s is still sooner than exo's own timeout.
FLAP_CAP_S = 30.0
# How long a flap is remembered: ten minutes of steady reports make a node trusted again.
FLAP_MEMORY_S = 600.0
# The node's own rhythm (phi-accrual's idea, kept simple): suspect no sooner than the mean of
# its recent report gaps plus this many standard deviations. A node that reports every second
# like clockwork is judged on the flag alone; one whose reports come irregularly (a busy Mac)
# gets the slack its own record shows. Four deviations leave a false suspicion of a normal
# rhythm at about 3e-5 per gap.
RHYTHM_SIGMAS = 4.0
# Gaps kept per node for its rhythm, and the fewest that say anything about it.
RHYTHM_SAMPLES = 16
RHYTHM_MIN_SAMPLES = 4
# ``--dead-after-s`` below this would confirm a node dead on a couple of lost heartbeats.
MIN_DEAD_AFTER_S = 2.0
# The defaults of ``--suspect-after-s`` and ``--dead-after-s``: three missed one-second reports
# are a suspicion, eight are a death when the other nodes are still heard.
DEFAULT_SUSPECT_AFTER_S = 3.0
DEFAULT_DEAD_AFTER_S = 8.0


@dataclass(frozen=True)
class LivenessConfig:
    """``--suspect-after-s`` / ``--dead-after-s``. ``suspect_after_s == 0`` turns fast failover
    off: nobody is ever suspected and exo's own timeout is the only rule. ``dead_after_s == 0``
    never confirms by silence alone (a closed connection or a probe still do)."""

    suspect_after_s: float = DEFAULT_SUSPECT_AFTER_S
    dead_after_s: float = DEFAULT_DEAD_AFTER_S

    @property
    def enabled(self) -> bool:
        return self.suspect_after_s > 0


OFF = LivenessConfig(suspect_after_s=0.0, dead_after_s=0.0)


def liveness_flags_refusal(suspect_after_s: float, dead_after_s: float) -> str | None:
    """What is wrong with the two flags, naming the flag, or None (the CLI exits 2 on it)."""
    for flag, value in (("--suspect-after-s", suspect_after_s), ("--dead-after-s", dead_after_s)):
        if not math.isfinite(value) or value < 0:
            return f"{flag} must be a number of seconds, 0 or more (got {value:g})"
    if dead_after_s == 0:
        return None
    if dead_after_s < MIN_DEAD_AFTER_S:
        return (
            f"--dead-after-s must be at least {MIN_DEAD_AFTER_S:g} s, or 0 for never by silence "
            f"alone (got {dead_after_s:g})"
        )
    if suspect_after_s > dead_after_s:
        return (
            f"--suspect-after-s ({suspect_after_s:g}) must not be above --dead-after-s "
            f"({dead_after_s:g})"
        )
    return None


@dataclass(frozen=True)
class ObserverClock:
    """The observer's running time: its monotonic clock with its own pauses cut short. ``at``
    is the monotonic time of its last check; ``running`` the running time then; ``paused_at``
    the monotonic time of the last check that followed a pause, and how long it was."""

    at: float
    running: float = 0.0
    paused_at: float = -math.inf
    pause_s: float = 0.0


def started_clock(now: float) -> ObserverClock:
    return ObserverClock(at=now)


def running_at(clock: ObserverClock, now: float) -> float:
    """The running time at monotonic ``now`` (a report's arrival, stamped between checks)."""
    return clock.running + min(max(now - clock.at, 0.0), MAX_OBSERVER_GAP_S)


def ticked(clock: ObserverClock, now: float) -> ObserverClock:
    """The clock after a check at ``now``: a gap past MAX_OBSERVER_GAP_S is the observer's own
    pause, counted only up to that bound, and remembered (``paused``)."""
    gap = now - clock.at
    if gap > MAX_OBSERVER_GAP_S:
        return ObserverClock(now, running_at(clock, now), paused_at=now, pause_s=gap)
    return ObserverClock(now, running_at(clock, now), clock.paused_at, clock.pause_s)


def paused(clock: ObserverClock) -> str | None:
    """Why the observer does not trust its view now (it was paused itself), or None."""
    if clock.at - clock.paused_at < PAUSE_SETTLE_S:
        return f"this service was paused for {clock.pause_s:.1f} s; nodes are not judged meanwhile"
    return None


@dataclass(frozen=True)
class NodeHeard:
    """What the observer saw of one node: when its last report arrived (running time), its
    recent gaps between reports, whether its connection is closed (our master), what a probe of
    its own API answered (the bridge), and how many flaps it has to its name."""

    last_heard: float
    gaps: tuple[float, ...] = ()
    closed: bool = False
    probe: ProbeAnswer | None = None
    flaps: int = 0


def heard(previous: NodeHeard | None, at: float, fault_s: float = math.inf) -> NodeHeard:
    """The node after a report arriving at running time ``at``: its gap recorded, its
    connection open, any probe answer forgotten (it speaks for itself again). A gap of
    ``fault_s`` or more (the node's suspicion threshold when the gap began: ``suspect_after``)
    is a fault the rule judged, not the node's rhythm, and is not recorded: on a real cluster a
    15 s freeze counted as rhythm put the node's next suspicion 18 s after its next fault
    (docs/design.md §5.18). Flaps are what make a node that keeps failing wait longer."""
    if previous is None:
        return NodeHeard(last_heard=at)
    gap = at - previous.last_heard
    recorded = 0 < gap < fault_s
    gaps = (*previous.gaps, gap)[-RHYTHM_SAMPLES:] if recorded else previous.gaps
    return NodeHeard(last_heard=at, gaps=gaps, flaps=previous.flaps)


def report_time(arrived: float, previous_arrival: float | None, step_s: float | None) -> float:
    """When a report read at running time ``arrived`` was made, as far as the observer can
    tell: ``step_s`` after the node's previous report (its own clock's step between the two,
    exo's ``lastSeen``; None: not known), counted from when that one arrived, and never later
    than this one's own arrival. A report read late (the observer could not read for a while:
    the node it reads the State from froze) is then not taken for a fresh one: the silence of
    the node that froze runs from its last report, not from the moment the observer could read
    again (docs/design.md §5.18). Anchored on the previous *arrival*, never on a previous
    estimate, so a node's clock running slow shifts one step by its drift and no error builds
    up; a step that goes back (its clock set back) dates nothing, and the arrival counts."""
    if previous_arrival is None or step_s is None or step_s < 0:
        return arrived
    return min(arrived, max(previous_arrival, previous_arrival + step_s))


def next_threshold(
    nodes: Mapping[NodeId, NodeHeard],
    phases: Mapping[NodeId, Phase],
    now: float,
    config: LivenessConfig,
) -> float | None:
    """The running time, after ``now``, at which the next node's silence reaches a threshold
    of the rule as it stands (an alive node its ``suspect_after``, a suspect one its
    ``dead_after``), or None: the observer checks then rather than at its next poll, so a
    verdict is not up to a poll late (docs/design.md §5.18). A node the rule judged otherwise
    (dead, or left out of a stale view) has no threshold ahead of it."""
    if not config.enabled:
        return None
    due: list[float] = []
    for node_id, node in nodes.items():
        phase = phases.get(node_id)
        if phase == "alive":
            due.append(node.last_heard + suspect_after(config, node))
        elif phase == "suspect":
            due.append(node.last_heard + dead_after(config, node))
    ahead = [at for at in due if now < at < math.inf]
    return min(ahead) if ahead else None


def flaps_within(cleared_at: Sequence[float], now: float) -> int:
    """How many of a node's clearances (suspected, then heard again) are still remembered."""
    return sum(1 for at in cleared_at if now - at < FLAP_MEMORY_S)


def rhythm_s(gaps: Sequence[float]) -> float:
    """The silence the node's own record makes unremarkable: mean + RHYTHM_SIGMAS deviations of
    its recent gaps; 0 with too few of them to say."""
    if len(gaps) < RHYTHM_MIN_SAMPLES:
        return 0.0
    mean = sum(gaps) / len(gaps)
    deviation = math.sqrt(sum((gap - mean) ** 2 for gap in gaps) / len(gaps))
    return mean + RHYTHM_SIGMAS * deviation


def suspect_after(config: LivenessConfig, node: NodeHeard) -> float:
    """The silence after which this node is suspect: the flag, doubled per remembered flap, no
    less than its own rhythm, and never more than FLAP_CAP_S (but never below the flag)."""
    flapped = config.suspect_after_s * 2.0 ** min(node.flaps, 16)
    wanted = max(flapped, rhythm_s(node.gaps))
    return max(config.suspect_after_s, min(wanted, FLAP_CAP_S))


def dead_after(config: LivenessConfig, node: NodeHeard) -> float:
    """The silence after which a suspect node is dead while others are heard: the flag, moved
    out as far as this node's suspicion was; inf when silence alone never confirms."""
    if config.dead_after_s == 0:
        return math.inf
    return config.dead_after_s + suspect_after(config, node) - config.suspect_after_s


@dataclass(frozen=True)
class Judgement:
    """Each node's phase (``alive``, ``suspect``, ``dead``; a node left out keeps the verdict
    it had), the second sign of each dead one, and why the view is stale (or None)."""

    phases: dict[NodeId, Phase]
    why_dead: dict[NodeId, str]
    stale: str | None = None


def judge(
    nodes: Mapping[NodeId, NodeHeard],
    now: float,
    config: LivenessConfig,
    observer_paused: str | None = None,
) -> Judgement:
    """The liveness rule (docs/design.md §5.18), at running time ``now``, for the nodes in the
    topology. Off: everyone alive. A paused observer, or more than half of the nodes silent
    within STALE_WINDOW_S of each other: a stale view, in which only nodes actually heard are
    judged (alive), so no verdict is reached nor taken back on it. Otherwise a node silent past
    its ``suspect_after``, or whose connection closed, is suspect; dead on a second sign: its
    connection closed and silent past ``suspect_after``, its probe unanswered or refused, or
    silent past ``dead_after`` while another node is heard. A node whose probe was refused is
    dead at once, suspect or not, unless heard since: the OS refuses a connection only when
    nobody listens on the port, which a killed exo leaves and a freeze or a slow network never
    does; exo serves its API from the node's own process, so a node that runs does not refuse;
    and a restarted exo comes back under a new node id, so the old one is dead either way."""
    if not config.enabled:
        return Judgement(dict.fromkeys(nodes, "alive"), {})
    silent = {node_id: now - node.last_heard for node_id, node in nodes.items()}
    quiet = {
        node_id
        for node_id, node in nodes.items()
        if node.closed or silent[node_id] >= suspect_after(config, node) or node.probe == "refused"
    }
    heard_ones: dict[NodeId, Phase] = {n: "alive" for n in nodes if n not in quiet}
    stale = observer_paused or _stale_view(nodes, quiet)
    if stale is not None:
        return Judgement(heard_ones, {}, stale)
    others_heard = bool(heard_ones)
    phases = dict(heard_ones)
    why_dead: dict[NodeId, str] = {}
    for node_id in sorted(quiet):
        node = nodes[node_id]
        why = _second_sign(node, silent[node_id], config, others_heard)
        phases[node_id] = "suspect" if why is None else "dead"
        if why is not None:
            why_dead[node_id] = why
    return Judgement(phases, why_dead)


def _second_sign(
    node: NodeHeard, silent_s: float, config: LivenessConfig, others_heard: bool
) -> str | None:
    if node.probe == "refused":
        return (
            f"its own API refused the connection (its exo process is gone) after "
            f"{silent_s:.1f} s of silence"
        )
    if node.probe == "unanswered":
        return "its own API did not answer GET /node_id"
    if node.closed and silent_s >= suspect_after(config, node):
        return f"its connection closed and it was silent for {silent_s:.1f} s"
    if others_heard and silent_s >= dead_after(config, node):
        return f"silent for {silent_s:.1f} s while the other nodes were heard"
    return None


def wants_probe(phase: Phase, silent_s: float | None) -> bool:
    """Whether a node's own API is to be probed now (the bridge): a suspect node (any answer
    counts, ``probe_sign``), or one alive that has been heard (``silent_s`` not None; only a
    refusal counts: a kill is seen at the next probe, not after the reports have stopped long
    enough to tell); never a dead or gone one, nor one never heard."""
    if phase == "suspect":
        return True
    return phase == "alive" and silent_s is not None


def probe_sign(suspect: bool, answer: ProbeAnswer) -> ProbeAnswer | None:
    """What a probe's answer tells the rule (None: nothing). Every answer of a suspect node's
    API; of a node not yet suspect, a refusal alone: a deadline passing before the suspicion is
    what a freeze of a few seconds or a slow network gives too, and a false "dead" costs the
    node's instances, so a timeout counts only once the node has been silent its full
    ``suspect_after``."""
    return answer if suspect or answer == "refused" else None


def _stale_view(nodes: Mapping[NodeId, NodeHeard], quiet: set[NodeId]) -> str | None:
    """Why the view is stale: more than half of the nodes fell silent within STALE_WINDOW_S of
    each other (their last reports that close together); None otherwise. A node whose own API
    refused before the window began is dead and was no part of the view that went quiet: exo
    keeps a killed node in its topology for its own 30 s timeout, and on a real cluster that
    fourth node let the election exo holds when a node rejoins (no report applied for 4 s)
    have the other three suspected."""
    if not quiet:
        return None
    silent = sorted(quiet, key=lambda node_id: (nodes[node_id].last_heard, node_id))
    times = [nodes[node_id].last_heard for node_id in silent]
    gone = sorted(node.last_heard for node in nodes.values() if node.probe == "refused")
    # Each window of STALE_WINDOW_S ending at a silent node: how many it holds, and where it
    # starts (negated, so that of windows equally full the earliest is the one named), when it
    # holds more than half of the nodes not refused before it began.
    windows: list[tuple[int, int, int]] = []
    start = 0
    for end, last in enumerate(times):
        while last - times[start] > STALE_WINDOW_S:
            start += 1
        count = end - start + 1
        members = len(nodes) - bisect_left(gone, times[start])
        if 2 * count > members:
            windows.append((count, -start, members))
    if not windows:
        return None
    most, earliest, members = max(windows)
    together = ", ".join(sorted(silent[-earliest : most - earliest]))
    return (
        f"{most} of {members} nodes fell silent within {STALE_WINDOW_S:g} s of each "
        f"other ({together}): the view is stale (this service or the cluster's master is "
        "the one missing), so nobody is suspected"
    )


def watch_events(
    state: State,
    judgement: Judgement,
    last_heard_wall: Mapping[NodeId, float],
    now_wall: float,
) -> list[AnyEvent]:
    """The verdict events that bring ``state.node_watch`` to the judgement: NodeSuspected for a
    node newly suspect, NodeConfirmedDead for one newly dead, NodeHeardAgain for one judged
    alive that had a verdict. A dead node judged suspect stays dead; a node the judgement
    leaves out (a stale view) keeps what it had. Times are Unix seconds (``last_heard_wall``:
    each node's last report, as the service saw it arrive)."""
    events: list[AnyEvent] = []
    for node_id in state.topology.nodes:
        phase = judgement.phases.get(node_id)
        known = state.node_watch.get(node_id)
        last = last_heard_wall.get(node_id, now_wall)
        if phase == "alive" and known is not None:
            events.append(NodeHeardAgain(node_id=node_id, at=now_wall))
        elif phase == "suspect" and known is None:
            events.append(NodeSuspected(node_id=node_id, last_heard=last, at=now_wall))
        elif phase == "dead" and (known is None or known.phase == "suspect"):
            last = known.last_heard if known is not None else last
            why = judgement.why_dead[node_id]
            events.append(NodeConfirmedDead(node_id=node_id, last_heard=last, at=now_wall, why=why))
    return events


def watched_liveness(state: State, node_id: NodeId) -> Phase:
    """A node's phase as the State records it: ``gone`` out of the topology, its verdict
    (``suspect`` / ``dead``) if it has one, else ``alive``."""
    if node_id not in state.topology.nodes:
        return "gone"
    watch = state.node_watch.get(node_id)
    return "alive" if watch is None else watch.phase
