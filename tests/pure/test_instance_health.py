"""The recognition rules of broken instances (docs/design.md §5.19): a stalled start against its
phase's bound (size, measured rate, floor, ceiling), hollow instances (a runner gone, shut down,
never reported, failing again and again), failing chats, and what they leave alone (a node
suspect or gone: the failover's). Every boundary is checked on both sides."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import build_instance, card, link_events, node_info

from keeper.model.apply import apply
from keeper.model.durations import compact_duration
from keeper.model.events import (
    AnyEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeDownloadProgress,
    NodeSuspected,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.instance_health import (
    CONNECT_BOUND_S,
    FAILED_STILL_S,
    FAILED_WINDOW_S,
    FAILING_CHATS,
    GB,
    GONE_GRACE_S,
    NO_MARKS,
    NO_STATUS_GRACE_S,
    STALL_CEILING_S,
    STALL_FLOOR_S,
    WARM_UP_BOUND_S,
    Marks,
    NodeRates,
    Verdict,
    chats_failing,
    judged,
    phase_of,
    rate_words,
    shard_bytes,
    stall_bound,
    time_judged,
    track,
    verdict,
    verdicts,
)
from keeper.model.state import (
    AnyInstance,
    AnyRunnerStatus,
    DownloadCompleted,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Memory,
    PipelineShardMetadata,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerWarmingUp,
    State,
)


class Watch:
    """A State and its marks, advanced event by event at chosen times."""

    def __init__(self, *nodes: str, size_gb: float = 1.0) -> None:
        self.state = State()
        for node in nodes:
            self.state = apply(self.state, node_info(node))
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                for event in link_events(a, b):
                    self.state = apply(self.state, event)
        self.card = card("m", size_gb=size_gb)
        self.marks: Marks = NO_MARKS

    def place(self, *nodes: str, instance_id: str = "i1", now: float = 0.0) -> AnyInstance:
        instance = build_instance(self.card, list(nodes), instance_id)
        self.at(now, InstanceCreated(instance=instance))
        return instance

    def at(self, now: float, *events: AnyEvent) -> Marks:
        for event in events:
            self.state = apply(self.state, event)
        self.marks = track(self.marks, self.state, now)
        return self.marks

    def runners(self, instance_id: str = "i1") -> list[str]:
        return list(self.state.instances[instance_id].shard_assignments.node_to_runner.values())

    def status(self, now: float, status: AnyRunnerStatus, instance_id: str = "i1") -> None:
        self.at(
            now,
            *(
                RunnerStatusUpdated(runner_id=r, runner_status=status)
                for r in self.runners(instance_id)
            ),
        )

    def judge(self, now: float, instance_id: str = "i1") -> str | None:
        found = verdict(self.state.instances[instance_id], self.state, self.marks, now)
        return None if found is None else f"{found.problem}: {found.why}"


def loaded_at_half_a_gb_per_s() -> Watch:
    """node-a loads the 1 GB model in 2 s (0.5 GB/s measured), then warms up from t=4."""
    watch = Watch("node-a", "node-b")
    watch.place("node-a")
    watch.status(1.0, RunnerLoading(layers_loaded=0, total_layers=16))
    watch.status(3.0, RunnerLoaded())
    watch.status(4.0, RunnerWarmingUp())
    return watch


# --- the bound ------------------------------------------------------------------------------


def test_the_bound_is_three_times_size_over_rate_between_the_floor_and_the_ceiling() -> None:
    assert stall_bound(17 * GB, 0.1 * GB, "x").seconds == 510.0
    assert stall_bound(17 * GB, 0.1 * GB, "x").basis == "for 17 GB at 0.1 GB/s"
    assert stall_bound(1 * GB, 1.0 * GB, "x").seconds == STALL_FLOOR_S  # 3 s: the floor
    assert stall_bound(400 * GB, 0.1 * GB, "x").seconds == STALL_CEILING_S  # 12000 s: the ceiling
    assert stall_bound(20 * GB, 1.0 * GB, "x").seconds == STALL_FLOOR_S  # exactly 60 s
    assert stall_bound(301 * GB, 1.0 * GB, "x").seconds == STALL_CEILING_S  # 903 s
    assert stall_bound(299 * GB, 1.0 * GB, "x").seconds == 897.0


def test_an_unknown_rate_is_the_ceiling_and_says_so() -> None:
    for rate in (None, 0.0, -1.0):
        bound = stall_bound(GB, rate, "mini-b's load")
        assert (bound.seconds, bound.basis) == (
            STALL_CEILING_S,
            "the ceiling: mini-b's load rate unknown",
        )


def test_rates_read_in_the_unit_that_shows_them() -> None:
    assert [rate_words(r) for r in (1.2 * GB, GB / 10, GB / 10 - 1, 10 * 1024**2)] == [
        "1.2 GB/s",
        "0.1 GB/s",
        "102 MB/s",
        "10 MB/s",
    ]


def test_durations_read_as_an_operator_writes_them() -> None:
    seconds = (-3, 0, 59.9, 60, 252, 3599, 3600, 3720, 86399, 86400, 93600)
    assert [compact_duration(s) for s in seconds] == [
        "0s",
        "0s",
        "59s",
        "1m00s",
        "4m12s",
        "59m59s",
        "1h00m",
        "1h02m",
        "23h59m",
        "1d00h",
        "1d02h",
    ]


def test_phases_in_the_order_a_runner_goes_through_them() -> None:
    assert phase_of(None, downloading=True) == "downloading"
    assert phase_of(RunnerIdle(), downloading=False) == "connecting"
    assert phase_of(RunnerConnecting(), downloading=True) == "downloading"
    assert phase_of(RunnerLoading(), downloading=True) == "loading"
    assert phase_of(RunnerLoaded(), downloading=False) == "loading"
    assert phase_of(RunnerWarmingUp(), downloading=False) == "warming"
    for done in (RunnerReady(), RunnerRunning(), RunnerFailed(), RunnerShutdown()):
        assert phase_of(done, downloading=True) is None


def test_a_shard_holds_its_layers_share_of_the_model() -> None:
    instance = build_instance(card("m", size_gb=16.0), ["a", "b", "c", "d"], "i")
    runners = list(instance.shard_assignments.node_to_runner.values())
    assert [shard_bytes(instance, r) for r in runners] == [4 * GB] * 4
    assert shard_bytes(instance, "no-such-runner") == 0


# --- stalled starts ---------------------------------------------------------------------------


def test_a_warm_up_silent_past_its_bound_is_stalled_in_words() -> None:
    """A warm-up's bound is fixed: the load rate measured says nothing of it."""
    watch = loaded_at_half_a_gb_per_s()
    assert watch.marks.rates["node-a"] == NodeRates(download=None, load=0.5 * GB)
    watch.at(4.0 + WARM_UP_BOUND_S - 0.1)
    assert watch.judge(4.0 + WARM_UP_BOUND_S - 0.1) is None
    assert watch.judge(4.0 + WARM_UP_BOUND_S) == (
        "stalled: runner on node-a silent in RunnerWarmingUp for 2m00s "
        "(expected ≤ 2m00s to warm up)"
    )
    found = verdict(watch.state.instances["i1"], watch.state, watch.marks, 4.0 + WARM_UP_BOUND_S)
    assert found is not None
    assert (found.since, found.gone, found.nodes) == (4.0, False, frozenset({"node-a"}))


def test_a_warm_up_or_connect_with_no_load_rate_is_bounded_all_the_same() -> None:
    """On the bridge a load shorter than a poll is never seen: no load rate, once the 15 min
    ceiling; a warm-up and a connect take what they take, whatever the model's bytes."""
    for status, bound, words in (
        (RunnerWarmingUp(), WARM_UP_BOUND_S, "to warm up"),
        (RunnerConnecting(), CONNECT_BOUND_S, "to connect"),
        (RunnerConnected(), CONNECT_BOUND_S, "to connect"),
    ):
        watch = Watch("node-a", size_gb=400.0)
        watch.place("node-a")
        watch.status(1.0, status)
        assert watch.marks.rates.get("node-a", NodeRates()).load is None
        assert watch.judge(1.0 + bound - 0.1) is None
        name = type(status).__name__
        assert watch.judge(1.0 + bound) == (
            f"stalled: runner on node-a silent in {name} for 2m00s (expected ≤ 2m00s {words})"
        )


def test_a_load_is_still_bounded_by_its_bytes_at_the_nodes_rate() -> None:
    watch = Watch("node-a", size_gb=17.0)
    watch.place("node-a")
    watch.status(1.0, RunnerLoading(layers_loaded=0, total_layers=16))
    assert watch.judge(1.0 + WARM_UP_BOUND_S) is None  # no rate: the ceiling, not two minutes
    assert watch.judge(1.0 + STALL_CEILING_S) is not None


def test_progress_restarts_the_count() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerLoading(layers_loaded=1, total_layers=16))
    watch.status(800.0, RunnerLoading(layers_loaded=2, total_layers=16))  # a layer more
    assert watch.judge(1699.0) is None  # 899 s still: within the ceiling
    assert watch.judge(1700.0) == (
        "stalled: runner on node-a silent in RunnerLoading for 15m00s "
        "(expected ≤ 15m00s the ceiling: node-a's load rate unknown)"
    )


def test_the_least_advanced_runner_names_the_phase() -> None:
    watch = Watch("node-a", "node-b")
    watch.place("node-a", "node-b")
    a, b = watch.runners()
    watch.at(
        1.0,
        RunnerStatusUpdated(runner_id=a, runner_status=RunnerWarmingUp()),
        RunnerStatusUpdated(runner_id=b, runner_status=RunnerConnecting()),
    )
    assert watch.judge(1.0 + CONNECT_BOUND_S) == (
        "stalled: runner on node-b silent in RunnerConnecting for 2m00s "
        "(expected ≤ 2m00s to connect)"
    )


def downloading(node: str, model: Watch, done_gb: float, speed: float) -> NodeDownloadProgress:
    shard = PipelineShardMetadata(
        model_card=model.card, device_rank=0, world_size=1, start_layer=0, end_layer=16, n_layers=16
    )
    return NodeDownloadProgress(
        download_progress=DownloadOngoing(
            node_id=node,
            shard_metadata=shard,
            download_progress=DownloadProgressData(
                total=Memory.from_gb(1.0), downloaded=Memory.from_gb(done_gb), speed=speed
            ),
        )
    )


def test_a_download_is_bounded_by_the_model_at_the_nodes_measured_speed() -> None:
    watch = Watch("node-a", size_gb=1.0)
    watch.place("node-a")
    watch.status(1.0, RunnerIdle())
    watch.at(2.0, downloading("node-a", watch, 0.1, speed=0.01 * GB))
    assert watch.marks.rates["node-a"].download == 0.01 * GB
    watch.at(50.0, downloading("node-a", watch, 0.2, speed=0.0))  # bytes moved: progress
    assert watch.marks.rates["node-a"].download == 0.01 * GB  # a zero speed measures nothing
    assert watch.judge(349.0) is None  # 3 * 100 s = 300 s from t=50
    assert watch.judge(350.0) == (
        "stalled: runner on node-a silent in RunnerIdle for 5m00s "
        "(expected ≤ 5m00s for 1 GB at 10 MB/s)"
    )


def test_no_status_at_all_is_not_stalled_and_a_ready_instance_never_is() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    assert watch.judge(10 * STALL_CEILING_S) is None  # a State whose nodes report no runner
    watch.status(1.0, RunnerReady())
    assert watch.judge(10 * STALL_CEILING_S) is None


# --- hollow instances -------------------------------------------------------------------------


def test_a_runner_shut_down_on_a_live_node_is_hollow_and_gone_after_a_moment() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerReady())
    watch.status(10.0, RunnerShuttingDown())
    assert watch.judge(10.0 + GONE_GRACE_S - 0.1) is None
    assert watch.judge(10.0 + GONE_GRACE_S) == (
        "hollow: runner on node-a shut down for 5s while node-a is alive"
    )
    found = verdict(watch.state.instances["i1"], watch.state, watch.marks, 15.0)
    assert found is not None and found.gone and found.since == 10.0


def test_a_runner_whose_status_went_away_is_hollow_and_gone() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerReady())
    watch.status(20.0, RunnerShutdown())  # exo drops the runner's entry; the instance stays
    assert watch.runners()[0] not in watch.state.runners
    assert watch.judge(24.9) is None
    assert watch.judge(25.0) == "hollow: runner on node-a gone for 5s while node-a is alive"


def test_a_runner_never_reported_is_hollow_once_its_node_reports_others() -> None:
    watch = Watch("node-a", "node-b")
    watch.place("node-a", "node-b")
    a, _ = watch.runners()
    watch.at(1.0, RunnerStatusUpdated(runner_id=a, runner_status=RunnerLoading()))
    assert watch.judge(NO_STATUS_GRACE_S) is None  # node-b reports no runner at all
    other = build_instance(watch.card, ["node-b"], "i2")
    watch.at(2.0, InstanceCreated(instance=other))
    watch.status(2.0, RunnerReady(), instance_id="i2")
    assert watch.judge(NO_STATUS_GRACE_S - 0.1) is None
    assert watch.judge(NO_STATUS_GRACE_S) == (
        "hollow: runner on node-b never reported a status in 1m00s"
    )


def test_a_runner_failing_three_times_in_ten_minutes_is_hollow() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    for t in (1.0, 100.0):
        watch.status(t, RunnerFailed(error_message="oom"))
        watch.status(t + 1, RunnerLoading())
    assert watch.judge(102.0) is None  # twice
    watch.status(200.0, RunnerFailed(error_message="oom"))
    assert watch.judge(200.0) == "hollow: runner on node-a failed 3 times in 10 min: oom"
    found = verdict(watch.state.instances["i1"], watch.state, watch.marks, 200.0)
    assert found is not None and found.since == 1.0 and not found.gone
    # Retried once more, loading: the failures are said, with no error of the moment.
    watch.status(201.0, RunnerLoading())
    assert watch.judge(201.0) == "hollow: runner on node-a failed 3 times in 10 min"


def test_failures_older_than_the_window_are_forgotten() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    for t in (1.0, 100.0):
        watch.status(t, RunnerFailed())
        watch.status(t + 1, RunnerLoading())
    watch.status(1.0 + FAILED_WINDOW_S + 0.1, RunnerFailed())  # the first has aged out
    assert len(watch.marks.runners[watch.runners()[0]].failures) == 2
    assert watch.judge(1.0 + FAILED_WINDOW_S + 0.1) is None


def test_a_runner_left_failed_is_hollow_after_a_minute() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(5.0, RunnerFailed(error_message="Metal out of memory"))
    assert watch.judge(5.0 + FAILED_STILL_S - 0.1) is None
    assert watch.judge(5.0 + FAILED_STILL_S) == (
        "hollow: runner on node-a failed 1m00s ago: Metal out of memory"
    )
    watch.status(70.0, RunnerFailed())  # the same status again is no new failure
    assert len(watch.marks.runners[watch.runners()[0]].failures) == 1


# --- the failover's, not these rules' -------------------------------------------------------


def test_an_instance_on_a_suspect_or_departed_node_is_not_judged() -> None:
    watch = Watch("node-a", "node-b")
    watch.place("node-a")
    watch.status(1.0, RunnerShuttingDown())
    assert watch.judge(100.0) is not None
    watch.at(100.0, NodeSuspected(node_id="node-a", last_heard=90.0, at=100.0))
    assert watch.judge(100.0) is None
    assert verdicts(watch.state, watch.marks, 100.0) == {}
    watch = Watch("node-a", "node-b")
    watch.place("node-a")
    watch.status(1.0, RunnerShuttingDown())
    watch.at(2.0, NodeTimedOut(node_id="node-a"))
    assert "i1" in watch.state.instances and watch.judge(100.0) is None


# --- failing chats ----------------------------------------------------------------------------


def test_the_last_chats_all_failing_on_a_ready_instance_is_failing() -> None:
    watch = Watch("node-a")
    instance = watch.place("node-a")
    watch.status(1.0, RunnerReady())
    failed = ["timeout", "timeout", "error: reset", "timeout", "timeout"]
    found = chats_failing(instance, watch.state, [None, *failed], since=7.0)
    assert found is not None
    assert (found.problem, found.since, found.nodes) == ("failing", 7.0, frozenset({"node-a"}))
    assert found.why == (
        "last 5 chats to instance i1 all failed (error: reset: 1, timeout: 4) "
        "while its runners read Ready"
    )
    assert chats_failing(instance, watch.state, failed[1:], since=7.0) is None  # four
    assert chats_failing(instance, watch.state, [*failed[:4], None], since=7.0) is None
    watch.status(2.0, RunnerLoading())
    assert chats_failing(instance, watch.state, failed, since=7.0) is None  # not ready
    assert len(failed) == FAILING_CHATS


def test_the_states_verdict_wins_over_the_chats() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerShuttingDown())
    state_says = verdicts(watch.state, watch.marks, 10.0)
    chats = {"i1": Verdict("i1", "failing", "chats", 0.0), "i2": Verdict("i2", "failing", "c", 0.0)}
    merged = judged(state_says, chats)
    assert (merged["i1"].problem, merged["i2"].problem) == ("hollow", "failing")


# --- the marks are bounded by the State ---------------------------------------------------------


def test_the_marks_forget_what_the_state_no_longer_shows() -> None:
    watch = Watch("node-a", "node-b")
    watch.place("node-a")
    watch.status(1.0, RunnerLoading())
    watch.status(2.0, RunnerReady())
    assert watch.marks.rates["node-a"].load is not None
    watch.at(3.0, InstanceDeleted(instance_id="i1"))
    assert (dict(watch.marks.instances), dict(watch.marks.runners)) == ({}, {})
    watch.at(4.0, NodeTimedOut(node_id="node-a"))
    assert "node-a" not in watch.marks.rates


def test_download_entries_count_as_progress_whatever_their_kind() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerIdle())
    shard = PipelineShardMetadata(
        model_card=watch.card, device_rank=0, world_size=1, start_layer=0, end_layer=16, n_layers=16
    )
    pending = DownloadPending(node_id="node-a", shard_metadata=shard, downloaded=Memory(in_bytes=5))
    watch.at(10.0, NodeDownloadProgress(download_progress=pending))
    assert watch.marks.instances["i1"].progress_at == 10.0
    done = DownloadCompleted(node_id="node-a", shard_metadata=shard, total=Memory(in_bytes=9))
    watch.at(20.0, NodeDownloadProgress(download_progress=done))
    assert watch.marks.instances["i1"].progress_at == 20.0
    watch.at(30.0)
    assert watch.marks.instances["i1"].progress_at == 20.0


# --- properties -------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=0.1, max_value=STALL_FLOOR_S - 0.1), min_size=1, max_size=30))
def test_a_start_that_keeps_moving_within_the_floor_is_never_stalled(gaps: list[float]) -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    now = 0.0
    for layer, gap in enumerate(gaps):
        now += gap
        watch.status(now, RunnerLoading(layers_loaded=layer, total_layers=len(gaps)))
        assert watch.judge(now + STALL_FLOOR_S - 0.1) is None


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from([RunnerLoading(), RunnerWarmingUp(), RunnerConnecting(), RunnerLoaded()]),
    st.floats(min_value=0.0, max_value=10 * STALL_CEILING_S),
)
def test_still_past_the_ceiling_is_always_stalled_and_never_before_the_floor(
    status: AnyRunnerStatus, still: float
) -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(0.0, status)
    said = watch.judge(still)
    if still >= STALL_CEILING_S:
        assert said is not None and said.startswith("stalled: ")
    if still < STALL_FLOOR_S:
        assert said is None


# --- every field of every verdict, and the edges the marks keep ---------------------------------


def test_each_hollow_verdict_in_full() -> None:
    on_a = frozenset({"node-a"})
    gone = Watch("node-a")
    gone.place("node-a", now=100.0)
    gone.status(101.0, RunnerReady())
    gone.status(110.0, RunnerShuttingDown())
    assert verdict(gone.state.instances["i1"], gone.state, gone.marks, 115.0) == Verdict(
        "i1",
        "hollow",
        "runner on node-a shut down for 5s while node-a is alive",
        110.0,
        gone=True,
        nodes=on_a,
    )
    failing = Watch("node-a")
    failing.place("node-a", now=100.0)
    for t in (101.0, 200.0, 300.0):
        failing.status(t, RunnerFailed(error_message="oom"))
        failing.status(t + 1, RunnerLoading())
    assert verdict(failing.state.instances["i1"], failing.state, failing.marks, 302.0) == Verdict(
        "i1", "hollow", "runner on node-a failed 3 times in 10 min", 101.0, nodes=on_a
    )
    left = Watch("node-a")
    left.place("node-a", now=100.0)
    left.status(105.0, RunnerFailed())
    assert verdict(left.state.instances["i1"], left.state, left.marks, 165.0) == Verdict(
        "i1", "hollow", "runner on node-a failed 1m00s ago: no message", 105.0, nodes=on_a
    )


def test_a_runner_never_reported_is_counted_from_when_its_instance_was_first_seen() -> None:
    watch = Watch("node-a", "node-b")
    watch.place("node-a", "node-b", now=100.0)
    a, _ = watch.runners()
    other = build_instance(watch.card, ["node-b"], "i2")
    watch.at(
        101.0,
        RunnerStatusUpdated(runner_id=a, runner_status=RunnerLoading()),
        InstanceCreated(instance=other),
    )
    watch.status(102.0, RunnerReady(), instance_id="i2")
    instance = watch.state.instances["i1"]
    assert verdict(instance, watch.state, watch.marks, 100.0 + NO_STATUS_GRACE_S - 0.1) is None
    assert verdict(instance, watch.state, watch.marks, 100.0 + NO_STATUS_GRACE_S) == Verdict(
        "i1",
        "hollow",
        "runner on node-b never reported a status in 1m00s",
        100.0,
        nodes=frozenset({"node-b"}),
    )


def test_failures_at_the_window_edge_still_count() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    for t in (1.0, 100.0, 150.0):
        watch.status(t, RunnerFailed())
        watch.status(t + 1, RunnerLoading())
    # At 100 + the window, the first (t=1) has aged out and the one at t=100 has not.
    watch.status(100.0 + FAILED_WINDOW_S, RunnerFailed())
    (runner,) = watch.runners()
    assert watch.marks.runners[runner].failures == (100.0, 150.0, 100.0 + FAILED_WINDOW_S)


def test_an_instance_first_seen_with_its_statuses_is_dated_then() -> None:
    watch = Watch("node-a")
    instance = build_instance(watch.card, ["node-a"], "i1")
    (runner,) = instance.shard_assignments.node_to_runner.values()
    watch.at(
        0.0,
        InstanceCreated(instance=instance),
        RunnerStatusUpdated(runner_id=runner, runner_status=RunnerWarmingUp()),
    )
    watch.at(30.0)  # the same State again: no progress
    assert watch.marks.instances["i1"].progress_at == 0.0
    assert watch.judge(STALL_CEILING_S) is not None


def test_a_load_is_timed_from_its_first_loading_or_else_from_the_status_before() -> None:
    # Loading seen twice (layers moving): timed from the first.
    twice = Watch("node-a")
    twice.place("node-a")
    twice.status(1.0, RunnerLoading(layers_loaded=0, total_layers=16))
    twice.status(2.0, RunnerLoading(layers_loaded=8, total_layers=16))
    twice.status(3.0, RunnerLoaded())
    assert twice.marks.rates["node-a"].load == 0.5 * GB
    # Loaded again later: timed from its own Loading, not the first load's.
    twice.status(10.0, RunnerLoading(layers_loaded=0, total_layers=16))
    twice.status(11.0, RunnerLoaded())
    assert twice.marks.rates["node-a"].load == 1.0 * GB
    # Never seen Loading: timed from when the status before Loaded was first seen.
    unseen = Watch("node-a")
    unseen.place("node-a")
    unseen.status(1.0, RunnerConnecting())
    unseen.status(2.0, RunnerConnected())
    unseen.status(3.0, RunnerLoaded())
    assert unseen.marks.rates["node-a"].load == 1.0 * GB
    # A load seen to start and end at the same moment measures nothing.
    instant = Watch("node-a")
    instant.place("node-a")
    instant.status(3.0, RunnerLoading())
    instant.status(3.0, RunnerLoaded())
    assert instant.marks.rates.get("node-a", NodeRates()).load is None


def test_a_nodes_download_and_load_rates_are_kept_together() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerLoading())
    watch.status(3.0, RunnerLoaded())  # load: 0.5 GB/s
    watch.at(4.0, downloading("node-a", watch, 0.1, speed=0.5))  # half a byte a second
    assert watch.marks.rates["node-a"] == NodeRates(download=0.5, load=0.5 * GB)
    watch.at(4.5, downloading("node-a", watch, 0.2, speed=0.0))  # measures nothing: kept
    watch.status(5.0, RunnerLoading())
    watch.status(6.0, RunnerLoaded())  # load again: 1 GB/s, the download rate kept
    assert watch.marks.rates["node-a"] == NodeRates(download=0.5, load=1.0 * GB)


def test_a_download_from_nothing_is_progress() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerIdle())
    shard = PipelineShardMetadata(
        model_card=watch.card, device_rank=0, world_size=1, start_layer=0, end_layer=16, n_layers=16
    )
    one = DownloadPending(node_id="node-a", shard_metadata=shard, downloaded=Memory(in_bytes=1))
    watch.at(10.0, NodeDownloadProgress(download_progress=one))
    assert watch.marks.instances["i1"].progress_at == 10.0


def test_a_shard_share_rounds_down_and_a_one_layer_model_is_whole() -> None:
    three = build_instance(card("m", size_gb=1.0, n_layers=3), ["a", "b", "c"], "i")
    runners = list(three.shard_assignments.node_to_runner.values())
    shards = [three.shard_assignments.runner_to_shard[r] for r in runners]
    assert [shard_bytes(three, r) for r in runners] == [
        GB * (s.end_layer - s.start_layer) // 3 for s in shards
    ]
    assert all(isinstance(shard_bytes(three, r), int) for r in runners)
    one = build_instance(card("m", size_gb=1.0, n_layers=1), ["a"], "j")
    (runner,) = one.shard_assignments.node_to_runner.values()
    assert shard_bytes(one, runner) == GB


def test_a_rate_below_a_byte_a_second_is_still_a_rate() -> None:
    assert stall_bound(GB, 0.5, "x").basis == "for 1 GB at 0 MB/s"
    assert rate_words(99.6 * 1024**2) == "100 MB/s"


def test_the_phase_is_the_first_runner_of_the_least_advanced_phase() -> None:
    watch = Watch("node-a", "node-b", "node-c")
    watch.place("node-a", "node-b", "node-c")
    a, b, c = watch.runners()
    watch.at(
        1.0,
        RunnerStatusUpdated(runner_id=a, runner_status=RunnerReady()),
        RunnerStatusUpdated(runner_id=b, runner_status=RunnerWarmingUp()),
        RunnerStatusUpdated(runner_id=c, runner_status=RunnerWarmingUp()),
    )
    judged_words = watch.judge(901.0)
    assert judged_words is not None and judged_words.startswith(
        "stalled: runner on node-b silent in RunnerWarmingUp"
    )
    # A first runner with no status yet is skipped too.
    quiet = Watch("node-a", "node-b")
    quiet.place("node-a", "node-b")
    _, second = quiet.runners()
    quiet.at(1.0, RunnerStatusUpdated(runner_id=second, runner_status=RunnerWarmingUp()))
    still = quiet.judge(30.0)
    assert still is None  # (node-a reports no runner at all: not hollow)
    later = quiet.judge(901.0)
    assert later is not None and "runner on node-b silent in RunnerWarmingUp" in later


def test_a_download_phase_with_no_rate_says_which_rate() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerIdle())
    watch.at(2.0, downloading("node-a", watch, 0.1, speed=0.0))
    assert watch.judge(2.0 + STALL_CEILING_S) == (
        "stalled: runner on node-a silent in RunnerIdle for 15m00s "
        "(expected ≤ 15m00s the ceiling: node-a's download rate unknown)"
    )


def test_verdicts_among_instances_gone_are_none() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerShuttingDown())
    assert verdicts(watch.state, watch.marks, 10.0, ["gone"]) == {}
    assert list(verdicts(watch.state, watch.marks, 10.0, ["gone", "i1"])) == ["i1"]


def test_time_judges_a_ready_instance_only_with_failures_in_its_window() -> None:
    watch = Watch("node-a")
    watch.place("node-a")
    watch.status(1.0, RunnerReady())
    assert time_judged(watch.state, watch.marks) == frozenset()
    assert time_judged(watch.state, NO_MARKS) == frozenset()  # a runner with no marks yet
    watch.status(2.0, RunnerFailed())
    watch.status(3.0, RunnerReady())
    assert time_judged(watch.state, watch.marks) == frozenset({"i1"})
    watch.status(4.0, RunnerLoading())
    assert time_judged(watch.state, watch.marks) == frozenset({"i1"})


def test_failing_chats_in_full() -> None:
    watch = Watch("node-a")
    instance = watch.place("node-a")
    watch.status(1.0, RunnerReady())
    assert chats_failing(instance, watch.state, ["timeout"] * FAILING_CHATS, since=7.0) == Verdict(
        "i1",
        "failing",
        "last 5 chats to instance i1 all failed (timeout: 5) while its runners read Ready",
        7.0,
        nodes=frozenset({"node-a"}),
    )
