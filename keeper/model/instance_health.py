"""Instances that look alive but serve nothing: the recognition rules (docs/design.md §5.19).

exo counts an instance as present as long as it is registered, whatever its runners do: a
runner can hang in ``RunnerLoading`` or ``RunnerWarmingUp``, die with the instance still listed,
or fail again and again. The State shows each of these, but only across States: "no progress for
four minutes" needs to know when each instance last moved. So the rules come in two parts, both
pure:

- ``track`` folds one State into ``Marks`` at a time given as a value (``now``, never a clock
  read): when each instance last moved (its runners' statuses, layers loaded, and the download
  bytes of its model on its nodes), when each of its runners was last seen and last failed, and
  each node's measured download and load rates. The marks are bounded by the State: an instance
  or node it no longer shows is forgotten.
- ``verdicts`` reads the State and the marks and says, per instance, what is wrong and why in
  words, or nothing: a *stalled* start (no progress for longer than its phase allows: for a
  download or a load, the bound from the model's size and the node's measured rate, between a
  floor and a ceiling; for connecting and warming up, which move no bytes, a fixed one), a
  *hollow* instance (a runner with no status, shut down while its node is alive, or failing
  again and again), and *failing* chats (``chats_failing``, from the master's own record of the
  last chats to each instance).

An instance on a node the service suspects or found dead (``State.node_watch``) or one that left
the topology is the failover's business (§5.18): none of these rules judges it. The TUI's
instance rule (``exo_deploy_tui.model.health``) calls these too, so it says the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from keeper.model.durations import compact_duration
from keeper.model.runner_failure import failure_words
from keeper.model.state import (
    AnyInstance,
    AnyRunnerStatus,
    DownloadCompleted,
    DownloadOngoing,
    DownloadPending,
    InstanceId,
    NodeId,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerId,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerWarmingUp,
    State,
    download_entry,
    node_name,
)

Problem = Literal["stalled", "hollow", "unfulfilled", "failing"]

# The least a phase is allowed to sit still: a small model loads in seconds, but a runner also
# waits on its peers and exo's own steps (connect, warm up) take tens of seconds on a busy Mac.
# A 0.6 B model still for a minute is stuck; the bound grows with size above it.
STALL_FLOOR_S = 60.0
# The most a phase is allowed to sit still, and the bound when no rate was ever measured on the
# node: a 400 GB model read at 0.5 GB/s takes about 13 minutes, and no healthy phase moves
# nothing for longer than that.
STALL_CEILING_S = 15 * 60.0
# The most a warm-up may sit still. A warm-up runs one short generation on a model already in
# memory: on the real cluster about 2 s for a tiny model, and the largest models exo runs,
# sharded over several Macs, take tens of seconds for it. What it takes follows neither the
# model's bytes nor the node's disk (the load rate, often never measured on the bridge, which
# left the 15 min ceiling), so the bound is fixed: two minutes, several times the slowest
# healthy warm-up, and a false "stalled" costs a replacement that would warm up alike.
WARM_UP_BOUND_S = 120.0
# The most connecting may sit still: a runner's process starting (Python and MLX imported,
# ~10 s on a busy Mac) and opening its links to its peers, seconds on a LAN. Nothing in it
# grows with the model either; two minutes, as for the warm-up.
CONNECT_BOUND_S = 120.0
# How many times the expected time a phase may take before it is stalled: rates vary with what
# else the node does (another model loading, the OS paging), and a false "stalled" costs a
# replacement, so the margin is wide.
STALL_SLACK = 3.0
# A runner exo lists in the instance but never reported a status for is hollow after this long:
# a node reports a new runner within a second or two of its instance.
NO_STATUS_GRACE_S = 60.0
# A runner that went to RunnerShuttingDown/RunnerShutdown (or lost its status) on a live node is
# hollow once it stayed so this long: exo's own deletion of an instance passes through those
# statuses for a moment before the instance leaves the State.
GONE_GRACE_S = 5.0
# RunnerFailed this many times within FAILED_WINDOW_S makes an instance hollow: exo retries a
# failed runner, and one failure can be a passing fault; three in ten minutes is a pattern.
FAILED_TIMES = 3
FAILED_WINDOW_S = 10 * 60.0
# A runner still RunnerFailed after this long is hollow on its own (exo did not retry it).
FAILED_STILL_S = 60.0
# Failing chats: the last this many chats to an instance all failed while its runners read
# Ready. One failure is a client's problem or a cut stream; five in a row on a "ready" instance
# is the instance.
FAILING_CHATS = 5

GB = 1024**3

# The statuses a load is timed between: from the first of these a runner was seen in to the
# first of the others (``track``).
PRE_LOAD = (RunnerConnecting, RunnerConnected, RunnerLoading)
LOADED = (RunnerLoaded, RunnerWarmingUp, RunnerReady, RunnerRunning)

# The phases of a start, in the order a runner goes through them (the earliest of an instance's
# runners is the instance's phase: the others wait on it).
Phase = Literal["downloading", "connecting", "loading", "warming"]
PHASES: tuple[Phase, ...] = ("downloading", "connecting", "loading", "warming")


@dataclass(frozen=True)
class NodeRates:
    """A node's measured rates, bytes per second (None: never measured)."""

    download: float | None = None
    load: float | None = None


@dataclass(frozen=True)
class RunnerMark:
    """What the marks keep of one runner of an instance in the State."""

    seen: bool = False  # it had a status at some point
    changed_at: float = 0.0  # when its status last changed (or it lost it)
    loading_since: float | None = None  # when it entered RunnerLoading, for the load rate
    failures: tuple[float, ...] = ()  # when it turned RunnerFailed, within FAILED_WINDOW_S


@dataclass(frozen=True)
class InstanceMark:
    first_seen: float
    progress: object  # what moves while it comes up (``progress_signature``)
    progress_at: float  # when that last changed


@dataclass(frozen=True)
class Marks:
    """The memory the rules need across States (module doc): bounded by the State."""

    instances: Mapping[InstanceId, InstanceMark] = field(
        default_factory=dict[InstanceId, InstanceMark]
    )
    runners: Mapping[RunnerId, RunnerMark] = field(default_factory=dict[RunnerId, RunnerMark])
    statuses: Mapping[RunnerId, AnyRunnerStatus | None] = field(
        default_factory=dict[RunnerId, AnyRunnerStatus | None]
    )
    rates: Mapping[NodeId, NodeRates] = field(default_factory=dict[NodeId, NodeRates])


NO_MARKS = Marks()
NO_RUNNER_MARK = RunnerMark()


@dataclass(frozen=True)
class Verdict:
    """What is wrong with an instance: the problem, why in words, since when (the caller's
    clock), and whether its node itself reports a runner gone (then it may go at once)."""

    instance_id: InstanceId
    problem: Problem
    why: str
    since: float
    gone: bool = False
    nodes: frozenset[NodeId] = frozenset()  # the nodes the problem was seen on


def progress_signature(instance: AnyInstance, state: State) -> object:
    """What moves while an instance comes up: its runners' statuses (layers loaded included) and
    the download bytes of its model on its nodes. A difference between two States is
    progress."""
    assignments = instance.shard_assignments
    statuses = tuple(state.runners.get(r) for r in assignments.node_to_runner.values())
    model = assignments.model_id
    downloads = tuple(
        _downloaded(download_entry(state, node_id, model)) for node_id in assignments.node_to_runner
    )
    return statuses, downloads


def _downloaded(entry: object) -> int:
    if isinstance(entry, DownloadOngoing):
        return entry.download_progress.downloaded.in_bytes
    if isinstance(entry, DownloadPending):
        return entry.downloaded.in_bytes
    if isinstance(entry, DownloadCompleted):
        return entry.total.in_bytes
    return -1  # no entry, or a failed one  # pragma: no mutate (any sentinel below 0 is the same)


def track(marks: Marks, state: State, now: float) -> Marks:
    """The marks brought up to date with ``state`` seen at ``now`` (module doc)."""
    instances: dict[InstanceId, InstanceMark] = {}
    runners: dict[RunnerId, RunnerMark] = {}
    statuses: dict[RunnerId, AnyRunnerStatus | None] = {}
    rates = {node: r for node, r in marks.rates.items() if node in state.topology.nodes}
    for instance_id, instance in state.instances.items():
        signature = progress_signature(instance, state)
        old = marks.instances.get(instance_id)
        if old is None:
            instances[instance_id] = InstanceMark(now, signature, now)
        elif old.progress != signature:
            instances[instance_id] = replace(old, progress=signature, progress_at=now)
        else:
            instances[instance_id] = old
        assignments = instance.shard_assignments
        for node_id, runner_id in assignments.node_to_runner.items():
            status = state.runners.get(runner_id)
            mark = marks.runners.get(runner_id, RunnerMark(changed_at=now))
            before = marks.statuses.get(runner_id)
            # When the status before this one was first seen: a load seen to end from a
            # status before it is timed from there (a load shorter than a step may never be
            # seen as RunnerLoading; timed from its connecting, the rate is lower than the
            # truth, and so is the bound's verdict: later, never sooner).
            previous_at = mark.changed_at
            if runner_id in marks.statuses and before != status:
                mark = replace(mark, changed_at=now)
            if status is not None:
                mark = replace(mark, seen=True)
            if isinstance(status, RunnerLoading) and mark.loading_since is None:
                mark = replace(mark, loading_since=now)
            elif isinstance(status, LOADED) and isinstance(before, PRE_LOAD):
                start = mark.loading_since if mark.loading_since is not None else previous_at
                took = now - start
                if took > 0:
                    size = shard_bytes(instance, runner_id)
                    known = rates.get(node_id, NodeRates())
                    rates[node_id] = replace(known, load=size / took)
                mark = replace(mark, loading_since=None)
            if isinstance(status, RunnerFailed) and not isinstance(before, RunnerFailed):
                mark = replace(mark, failures=(*mark.failures, now))
            # (A shortcut: the filter below is the rule, so this test's mutants are equivalent.)
            if mark.failures and mark.failures[0] < now - FAILED_WINDOW_S:  # pragma: no mutate
                mark = replace(
                    mark, failures=tuple(t for t in mark.failures if t >= now - FAILED_WINDOW_S)
                )
            runners[runner_id] = mark
            statuses[runner_id] = status
    for node_id in state.topology.nodes:
        for entry in state.downloads.get(node_id, ()):
            if isinstance(entry, DownloadOngoing) and entry.download_progress.speed > 0:
                known = rates.get(node_id, NodeRates())
                rates[node_id] = replace(known, download=entry.download_progress.speed)
    return Marks(instances, runners, statuses, rates)


def shard_bytes(instance: AnyInstance, runner_id: RunnerId) -> int:
    """The bytes of the model the runner's shard holds (its layers' share of the model)."""
    shard = instance.shard_assignments.runner_to_shard.get(runner_id)
    if shard is None:
        return 0
    card = shard.model_card
    layers = max(shard.n_layers, 1)
    return card.storage_size.in_bytes * (shard.end_layer - shard.start_layer) // layers


def phase_of(status: AnyRunnerStatus | None, downloading: bool) -> Phase | None:
    """The phase of a start a runner is in, or None when it is not starting (ready, failed,
    shutting down)."""
    if status is None or isinstance(status, RunnerIdle | RunnerConnecting | RunnerConnected):
        return "downloading" if downloading else "connecting"
    if isinstance(status, RunnerLoading | RunnerLoaded):
        return "loading"
    if isinstance(status, RunnerWarmingUp):
        return "warming"
    return None


@dataclass(frozen=True)
class Bound:
    """How long a phase may sit still, and the words that say where it comes from."""

    seconds: float
    basis: str


def stall_bound(size: int, rate: float | None, what: str) -> Bound:
    """``STALL_SLACK`` times ``size`` at ``rate``, between the floor and the ceiling; the
    ceiling when the rate is unknown (``what``: which rate, for the words)."""
    gb = size / GB
    if rate is None or rate <= 0:
        return Bound(STALL_CEILING_S, f"the ceiling: {what} rate unknown")
    expected = STALL_SLACK * size / rate
    seconds = min(max(expected, STALL_FLOOR_S), STALL_CEILING_S)
    return Bound(seconds, f"for {gb:.0f} GB at {rate_words(rate)}")


def rate_words(rate: float) -> str:
    """``1.2 GB/s``, or ``10 MB/s`` below a tenth of a GB/s (where one decimal says 0.0)."""
    if rate >= GB / 10:
        return f"{rate / GB:.1f} GB/s"
    return f"{rate / 1024**2:.0f} MB/s"


def _alive(state: State, node_id: NodeId) -> bool:
    return node_id in state.topology.nodes and node_id not in state.node_watch


def verdict(instance: AnyInstance, state: State, marks: Marks, now: float) -> Verdict | None:
    """What is wrong with ``instance`` (module doc), the most certain first: hollow, then
    stalled; None when nothing is, or when one of its nodes is not alive (the failover's)."""
    assignments = instance.shard_assignments
    nodes = assignments.node_to_runner
    if not all(_alive(state, node) for node in nodes):
        return None
    mark = marks.instances.get(instance.instance_id)
    if mark is None:
        return None
    hollow = _hollow(instance, state, marks, mark, now)
    if hollow is not None:
        return hollow
    return _stalled(instance, state, marks, mark, now)


def _hollow(
    instance: AnyInstance, state: State, marks: Marks, mark: InstanceMark, now: float
) -> Verdict | None:
    instance_id = instance.instance_id
    for node_id, runner_id in instance.shard_assignments.node_to_runner.items():
        name = node_name(state, node_id)
        status = state.runners.get(runner_id)
        # (The default is never read: the marks of an instance hold its runners', tracked
        # together; its mutants are equivalent.)
        runner = marks.runners.get(runner_id, RunnerMark(changed_at=now))  # pragma: no mutate
        still = now - runner.changed_at
        on = frozenset({node_id})
        if isinstance(status, RunnerShutdown | RunnerShuttingDown) or (
            status is None and runner.seen
        ):
            if still >= GONE_GRACE_S:
                said = "shut down" if status is not None else "gone"
                why = f"runner on {name} {said} for {compact_duration(still)} while {name} is alive"
                return Verdict(instance_id, "hollow", why, runner.changed_at, gone=True, nodes=on)
        elif (
            status is None
            and now - mark.first_seen >= NO_STATUS_GRACE_S
            and _reports_runners(state, node_id)
        ):
            waited = compact_duration(now - mark.first_seen)
            why = f"runner on {name} never reported a status in {waited}"
            return Verdict(instance_id, "hollow", why, mark.first_seen, nodes=on)
        # A failure's words are its error's own line (``runner_failure``), not exo's traceback.
        if len(runner.failures) >= FAILED_TIMES:
            minutes = int(FAILED_WINDOW_S) // 60
            why = f"runner on {name} failed {len(runner.failures)} times in {minutes} min"
            if isinstance(status, RunnerFailed):
                why = f"{why}: {failure_words(status)}"
            return Verdict(instance_id, "hollow", why, runner.failures[0], nodes=on)
        if isinstance(status, RunnerFailed) and still >= FAILED_STILL_S:
            said = failure_words(status)
            why = f"runner on {name} failed {compact_duration(still)} ago: {said}"
            return Verdict(instance_id, "hollow", why, runner.changed_at, nodes=on)
    return None


def _reports_runners(state: State, node_id: NodeId) -> bool:
    """Whether the node reports a status for some runner: one it never reported is missing,
    not a node (or a test's State) that reports none at all."""
    return any(
        runner_id in state.runners
        for instance in state.instances.values()
        for node, runner_id in instance.shard_assignments.node_to_runner.items()
        if node == node_id
    )


def _stalled(
    instance: AnyInstance, state: State, marks: Marks, mark: InstanceMark, now: float
) -> Verdict | None:
    """The instance's least advanced runner names the phase; the bound is that phase's."""
    assignments = instance.shard_assignments
    model_id = assignments.model_id
    earliest: tuple[int, NodeId, RunnerId, AnyRunnerStatus] | None = None
    for node_id, runner_id in assignments.node_to_runner.items():
        entry = download_entry(state, node_id, model_id)
        downloading = isinstance(entry, DownloadOngoing | DownloadPending)
        status = state.runners.get(runner_id)
        if status is None:  # no status yet, which ``_hollow`` judges
            continue
        phase = phase_of(status, downloading)
        if phase is None:  # not starting
            continue
        rank = PHASES.index(phase)
        if earliest is None or rank < earliest[0]:
            earliest = (rank, node_id, runner_id, status)
    if earliest is None:
        return None
    rank, node_id, runner_id, status = earliest
    phase = PHASES[rank]
    still = now - mark.progress_at
    rates = marks.rates.get(node_id, NodeRates())
    name = node_name(state, node_id)
    if phase == "downloading":
        card = instance.shard_assignments.runner_to_shard[runner_id].model_card
        bound = stall_bound(card.storage_size.in_bytes, rates.download, f"{name}'s download")
    elif phase == "loading":
        bound = stall_bound(shard_bytes(instance, runner_id), rates.load, f"{name}'s load")
    elif phase == "warming":
        bound = Bound(WARM_UP_BOUND_S, "to warm up")
    else:
        bound = Bound(CONNECT_BOUND_S, "to connect")
    if still < bound.seconds:
        return None
    why = (
        f"runner on {name} silent in {type(status).__name__} for {compact_duration(still)} "
        f"(expected ≤ {compact_duration(bound.seconds)} {bound.basis})"
    )
    return Verdict(
        instance.instance_id, "stalled", why, mark.progress_at, nodes=frozenset({node_id})
    )


def verdicts(
    state: State, marks: Marks, now: float, among: Iterable[InstanceId] | None = None
) -> dict[InstanceId, Verdict]:
    """Every instance of ``state`` (or of ``among``) something is wrong with, and what
    (``verdict``)."""
    found: dict[InstanceId, Verdict] = {}
    # (Judging every instance rather than ``among`` gives the same verdicts, only slower: its
    # mutants are equivalent.)
    for instance_id in state.instances if among is None else among:  # pragma: no mutate
        instance = state.instances.get(instance_id)
        judged = verdict(instance, state, marks, now) if instance is not None else None
        if judged is not None:
            found[instance_id] = judged
    return found


def time_judged(state: State, marks: Marks) -> frozenset[InstanceId]:
    """The instances of ``state`` a verdict may come to with time alone, the State unchanged:
    all but those whose every runner reads Ready or Running with no failure in its window
    (such an instance is judged again only when the State changes, or by its chats)."""
    return frozenset(
        instance_id
        for instance_id, instance in state.instances.items()
        if not all(
            isinstance(state.runners.get(runner_id), RunnerReady | RunnerRunning)
            and not marks.runners.get(runner_id, NO_RUNNER_MARK).failures
            for runner_id in instance.shard_assignments.node_to_runner.values()
        )
    )


def chats_failing(
    instance: AnyInstance, state: State, outcomes: Sequence[str | None], since: float
) -> Verdict | None:
    """Failing chats: the last ``FAILING_CHATS`` chats to ``instance`` (``outcomes``, oldest
    first: None for one answered, else how it failed, "timeout" or an error's words) all failed
    while every runner reads Ready; ``since`` is when the first of them was sent."""
    last = outcomes[-FAILING_CHATS:]
    if len(last) < FAILING_CHATS or any(o is None for o in last):
        return None
    runners = instance.shard_assignments.node_to_runner.values()
    if not all(isinstance(state.runners.get(r), RunnerReady | RunnerRunning) for r in runners):
        return None
    counted: dict[str, int] = {}
    for outcome in last:
        if outcome is not None:
            counted[outcome] = counted.get(outcome, 0) + 1
    how = ", ".join(f"{what}: {n}" for what, n in sorted(counted.items()))
    why = (
        f"last {FAILING_CHATS} chats to instance {instance.instance_id} all failed ({how}) "
        "while its runners read Ready"
    )
    return Verdict(
        instance.instance_id,
        "failing",
        why,
        since,
        nodes=frozenset(instance.shard_assignments.node_to_runner),
    )


def judged(
    found: Mapping[InstanceId, Verdict], failing: Mapping[InstanceId, Verdict]
) -> dict[InstanceId, Verdict]:
    """The State's verdicts with the failing chats' added where the State saw nothing."""
    merged = dict(failing)
    merged.update(found)
    return merged
