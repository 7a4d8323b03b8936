"""The soak's fault schedule: which fault comes next, where, for how long, all chosen by the seed.

The schedule is a pure object over ``random.Random(seed)``: the run asks it for the pause before
the next fault and for the fault itself, telling it which nodes are healthy right now and which
hold runners. Given the same seed and the same answers it makes the same choices, which is what
makes a virtual-time soak replayable.

Kinds are drawn from a shuffled bag holding each kind once, refilled when empty, so every kind
comes up within any fifteen faults in a row (a bag of eight: a ten-minute run injects each kind
about twice) rather than leaving one out by bad luck. A kind that cannot be injected right now
stays in the bag for a later turn: a fault that takes a node away is skipped while it would
leave fewer than ``MIN_HEALTHY_NODES`` healthy nodes (the two-node pipeline model needs two), a
runner kill or a broken-instance fault needs a healthy node that holds a runner, and a master
crash needs a master that is up.

The three broken-instance kinds (``BROKEN_KINDS``, docs/design.md §5.19) tell a node to
misbehave as ``exo-deploy node --fault`` does, for a while, then heal it: its runners restart and
hang in warm-up (stalled), die with the instance still registered (hollow), or read Ready and
fail every chat (failing). The node stays connected and heard, so these are the keeper's to
recognise and repair, not exo's timeout's or the failover's. A stalled warm-up lasts longer than
the stall rule's floor (60 s for a small model), or it would heal before it could be recognised.

One fault at a time (``may_start_next``, the process soak's rule): a fault of any kind, master
crash included, starts only once the one before it has *settled*: it is over (process back,
node thawed, link healed), every model has answered a chat sent after it, every node is
connected to the master and every deployment has all its replicas ready again. So the soak
measures what it claims, recovery from a single fault, rather than the seed's luck in stacking
two. Waiting for a fault that never settles ends ``SETTLE_WAIT_S`` after it was over, so a soak
never hangs on one; the next fault then starts and the report counts it as started unsettled.
The rule is pure: the run polls the cluster and hands it what it saw (``FaultProgress``).
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

from keeper.sim.node.sim_node import SimFault


class FaultKind(StrEnum):
    NODE_CRASH = "node_crash"  # kill -9, restarted NODE_DOWN_S later with no runners
    MASTER_CRASH = "master_crash"  # kill -9, restarted MASTER_DOWN_S later from its log
    FREEZE = "freeze"  # SIGSTOP, SIGCONT after FREEZE_S
    RUNNER_KILL = "runner_kill"  # every runner of one node dies; exo's worker retries them
    PARTITION = "partition"  # the node's link to the master is cut for PARTITION_S
    # The broken instances (see the module docstring), each for a while, then healed.
    STALL_WARMUP = "stall_warmup"  # its runners restart and hang in RunnerWarmingUp
    LOSE_RUNNER = "lose_runner"  # its runners die, their instances still registered
    FAIL_CHATS = "fail_chats"  # its runners read Ready and fail every chat


# A fault every 20-60 s: often enough that recoveries overlap, rarely enough to see each one.
FAULT_GAP_S = (20.0, 60.0)
# Freeze lengths: short ones the master rides out, long ones past its 30 s node timeout.
FREEZE_S = (5.0, 45.0)
# Partitions on both sides of the 30 s node timeout too, up to a full minute.
PARTITION_S = (10.0, 60.0)
# A stalled warm-up outlasts the stall rule's warm-up bound (WARM_UP_BOUND_S, 120 s) plus a
# keeper step and the time to place and load a replacement elsewhere, so it is recognised while
# it lasts; at most half a bound more.
STALL_WARMUP_S = (135.0, 180.0)
# A lost runner is recognised within seconds (a 5 s grace); a node failing chats within five
# chats. Long enough for either, short enough to keep a soak's faults coming.
LOSE_RUNNER_S = (10.0, 40.0)
FAIL_CHATS_S = (10.0, 40.0)
# A crashed node comes back after the local cluster's default restart delay: longer than exo's
# 30 s node timeout plus the 10 s sweep, so its instance is lost and the keeper must re-place it.
NODE_DOWN_S = 60.0
# A killed master is restarted after the local cluster's delay (keeper.sim.cluster.local).
MASTER_DOWN_S = 1.0
# Faults that take a node away leave at least this many healthy: the pipeline model needs two.
MIN_HEALTHY_NODES = 2
# A fault not over this long after its planned end (a process that does not come back) is given
# up on: the run records it with ended_at null rather than wait for it.
FAULT_END_TIMEOUT_S = 120.0
# The next fault waits at most this long after one is over for it to settle. A lost instance is
# back within about a minute (30 s node timeout, up to 10 s until the sweep, a placement and a
# load of a few seconds); twice that means it is stuck, and the report shows which fault it was.
SETTLE_WAIT_S = 120.0

MASTER = "master"  # the ``node`` of a master crash in the report

# Faults during which their node counts as unhealthy (a runner kill is over at once).
TAKES_A_NODE_AWAY = frozenset({FaultKind.NODE_CRASH, FaultKind.FREEZE, FaultKind.PARTITION})
# The broken-instance kinds, each with the simulated node's fault it turns on
# (``keeper.sim.node.sim_node.SimFault``). Their node stays up and connected, but no other fault
# is put on it while one lasts (one misbehaviour per node at a time).
BROKEN_KINDS: dict[FaultKind, SimFault] = {
    FaultKind.STALL_WARMUP: "stall-warmup",
    FaultKind.LOSE_RUNNER: "lose-runner",
    FaultKind.FAIL_CHATS: "fail-chats",
}
_BROKEN_S = {
    FaultKind.STALL_WARMUP: STALL_WARMUP_S,
    FaultKind.LOSE_RUNNER: LOSE_RUNNER_S,
    FaultKind.FAIL_CHATS: FAIL_CHATS_S,
}


@dataclass(frozen=True)
class FaultSpec:
    kind: FaultKind
    node: str  # a node name, or MASTER
    duration_s: float  # how long until the fault ends (is healed) by itself; 0: a runner kill


@dataclass(frozen=True)
class FaultProgress:
    """Where an injected fault stands as the run last saw it (times on the run's clock)."""

    at: float  # injected
    duration_s: float  # planned length
    ended_at: float | None  # over (process back, thawed, healed); None until then
    recovered: bool  # every model has answered a chat sent after it
    nodes_connected: bool  # every node is connected to the master
    replicas_ready: bool  # every deployment has all its replicas ready


def is_settled(progress: FaultProgress) -> bool:
    """Over, answered after, every node connected, every deployment at its replicas."""
    return (
        progress.ended_at is not None
        and progress.recovered
        and progress.nodes_connected
        and progress.replicas_ready
    )


def give_up_at(progress: FaultProgress) -> float:
    """When waiting for the fault to settle ends: ``SETTLE_WAIT_S`` after it was over, or after
    the run stopped waiting for it to be over."""
    over = progress.ended_at
    if over is None:
        over = progress.at + progress.duration_s + FAULT_END_TIMEOUT_S
    return over + SETTLE_WAIT_S


def may_start_next(latest: FaultProgress | None, settled: bool, now: float) -> bool:
    """One fault at a time: the next may start once the latest (None: no fault yet) has settled
    (``settled``: ``is_settled`` held at some point after it struck), or once waiting for it is
    past ``give_up_at``."""
    return latest is None or settled or now >= give_up_at(latest)


class FaultPlan:
    """Seeded choices of faults; see the module docstring."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)
        self._bag: list[FaultKind] = []

    def next_gap(self) -> float:
        low, high = FAULT_GAP_S
        return round(self._rng.uniform(low, high), 3)

    def next_fault(
        self, healthy: Sequence[str], holding_runners: Collection[str], master_up: bool
    ) -> FaultSpec | None:
        """The next fault, or None when no kind can be injected now (try again next turn).

        ``healthy``: nodes with no fault in progress, in a stable order; ``holding_runners``:
        which of them hold a runner; ``master_up``: no master crash in progress.
        """
        if not self._bag:
            self._bag = list(FaultKind)
            self._rng.shuffle(self._bag)
        for position, kind in enumerate(self._bag):
            spec = self._spec(kind, healthy, holding_runners, master_up)
            if spec is not None:
                del self._bag[position]
                return spec
        return None

    def _spec(
        self,
        kind: FaultKind,
        healthy: Sequence[str],
        holding_runners: Collection[str],
        master_up: bool,
    ) -> FaultSpec | None:
        if kind is FaultKind.MASTER_CRASH:
            return FaultSpec(kind, MASTER, MASTER_DOWN_S) if master_up else None
        if kind is FaultKind.RUNNER_KILL or kind in BROKEN_KINDS:
            candidates = [node for node in healthy if node in holding_runners]
            if not candidates:
                return None
            node = self._rng.choice(candidates)
            if kind is FaultKind.RUNNER_KILL:
                return FaultSpec(kind, node, 0.0)
            low, high = _BROKEN_S[kind]
            return FaultSpec(kind, node, round(self._rng.uniform(low, high), 3))
        if len(healthy) - 1 < MIN_HEALTHY_NODES:
            return None
        node = self._rng.choice(list(healthy))
        if kind is FaultKind.NODE_CRASH:
            return FaultSpec(kind, node, NODE_DOWN_S)
        low, high = FREEZE_S if kind is FaultKind.FREEZE else PARTITION_S
        return FaultSpec(kind, node, round(self._rng.uniform(low, high), 3))
