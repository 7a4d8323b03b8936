"""The soak's parts that decide its verdict, each on its own: the seeded fault plan, the watch
that counts duplicates and the keeper's latency, the load's outcomes and deadline, the log
check, the report's figures and table, and the commands' refusals of bad arguments."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from model_ids import QWEN as SMALL

from keeper.model.catalog import catalog_by_id
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    DeploymentCreated,
    DeploymentPlacementFailed,
    DeploymentRepairPlaced,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    RunnerStatusUpdated,
)
from keeper.model.readiness import instance_is_ready
from keeper.model.state import (
    Deployment,
    InstanceMove,
    MlxRingInstance,
    PipelineShardMetadata,
    RunnerLoading,
    RunnerReady,
    Shard,
    ShardAssignments,
    State,
)
from keeper.runtime.log_scan import is_history_line
from keeper.sim.node.node_process import read_fault_file, write_fault_file
from keeper.sim.soak.faults import (
    BROKEN_KINDS,
    FAIL_CHATS_S,
    FAULT_END_TIMEOUT_S,
    FREEZE_S,
    LOSE_RUNNER_S,
    MASTER,
    MIN_HEALTHY_NODES,
    PARTITION_S,
    SETTLE_WAIT_S,
    STALL_WARMUP_S,
    TAKES_A_NODE_AWAY,
    FaultKind,
    FaultPlan,
    FaultProgress,
    give_up_at,
    is_settled,
    may_start_next,
)
from keeper.sim.soak.load import Load, LoadSettings, error_label
from keeper.sim.soak.main import soak_main, soak_sim_main
from keeper.sim.soak.report import (
    BETWEEN_FAULTS,
    LOST,
    Deployed,
    FaultRecord,
    Sent,
    SoakReport,
    attribute,
    fault_span,
    format_by_fault,
    format_models,
    format_recovery,
    format_table,
    latency_stats,
    model_outcomes,
    percentile,
    summarize,
    summarize_broken,
)
from keeper.sim.soak.watch import ClusterWatch, ExclusionReason, check_log, model_of

BIG = "mlx-community/Qwen3-30B-A3B-4bit"
NODES = ["node-1", "node-2", "node-3", "node-4"]


# --- the fault plan ------------------------------------------------------------------------------


def _draw(plan: FaultPlan, turns: int, healthy: list[str] | None = None) -> list[Any]:
    nodes = healthy if healthy is not None else NODES
    return [(plan.next_gap(), plan.next_fault(nodes, {"node-2"}, True)) for _ in range(turns)]


def test_the_same_seed_gives_the_same_plan_and_another_seed_another() -> None:
    assert _draw(FaultPlan(7), 40) == _draw(FaultPlan(7), 40)
    assert _draw(FaultPlan(7), 40) != _draw(FaultPlan(8), 40)


def test_every_kind_comes_up_within_each_bag_of_faults_and_durations_stay_in_range() -> None:
    plan = FaultPlan(3)
    kinds = len(FaultKind)
    drawn = _draw(plan, 6 * kinds)
    faults = [fault for _, fault in drawn]
    assert all(fault is not None for fault in faults)
    for start in range(0, 6 * kinds, kinds):
        assert {f.kind for f in faults[start : start + kinds]} == set(FaultKind)
    broken_ranges = {
        FaultKind.STALL_WARMUP: STALL_WARMUP_S,
        FaultKind.LOSE_RUNNER: LOSE_RUNNER_S,
        FaultKind.FAIL_CHATS: FAIL_CHATS_S,
    }
    for gap, fault in drawn:
        assert 20 <= gap <= 60
        if fault.kind is FaultKind.FREEZE:
            assert FREEZE_S[0] <= fault.duration_s <= FREEZE_S[1]
        if fault.kind is FaultKind.PARTITION:
            assert PARTITION_S[0] <= fault.duration_s <= PARTITION_S[1]
        if fault.kind is FaultKind.RUNNER_KILL:
            assert fault.node == "node-2"  # the only node holding a runner
            assert fault.duration_s == 0.0
        if fault.kind in BROKEN_KINDS:
            assert fault.node == "node-2"  # a broken instance needs an instance there
            low, high = broken_ranges[fault.kind]
            assert low <= fault.duration_s <= high
        if fault.kind is FaultKind.MASTER_CRASH:
            assert fault.node == MASTER


def test_a_fault_that_takes_a_node_away_never_leaves_fewer_than_two_healthy() -> None:
    plan = FaultPlan(5)
    healthy = NODES[:MIN_HEALTHY_NODES]
    kinds = [f.kind for _, f in _draw(plan, 30, healthy) if f is not None]
    assert kinds
    assert not set(kinds) & TAKES_A_NODE_AWAY
    # What could not be injected waits in the bag: with nodes back, it comes up next.
    after = [plan.next_fault(NODES, set(), True) for _ in range(3)]
    assert {f.kind for f in after if f is not None} <= TAKES_A_NODE_AWAY


def test_broken_kinds_need_a_node_holding_a_runner_and_wait_in_the_bag() -> None:
    plan = FaultPlan(2)
    kinds = [f.kind for _, f in ((0, plan.next_fault(NODES, set(), True)) for _ in range(20)) if f]
    assert kinds
    assert not set(kinds) & (BROKEN_KINDS.keys() | {FaultKind.RUNNER_KILL})
    # Once a node holds a runner, what waited comes up, on that node.
    after = [plan.next_fault(NODES, {"node-3"}, True) for _ in range(4)]
    assert {f.kind for f in after if f is not None} == BROKEN_KINDS.keys() | {FaultKind.RUNNER_KILL}
    assert {f.node for f in after if f is not None} == {"node-3"}


def test_nothing_to_inject_gives_none_and_the_master_is_not_crashed_twice() -> None:
    plan = FaultPlan(1)
    assert plan.next_fault(NODES[:2], set(), master_up=False) is None
    assert all(
        f is None or f.kind is not FaultKind.MASTER_CRASH
        for f in (plan.next_fault(NODES, set(), master_up=False) for _ in range(20))
    )


# --- one fault at a time ------------------------------------------------------------------------

SETTLED = FaultProgress(
    at=100.0,
    duration_s=20.0,
    ended_at=120.0,
    recovered=True,
    nodes_connected=True,
    replicas_ready=True,
)


def test_a_fault_settles_once_over_answered_with_every_node_and_replica_back() -> None:
    assert is_settled(SETTLED)
    for unmet in (
        {"ended_at": None},
        {"recovered": False},
        {"nodes_connected": False},
        {"replicas_ready": False},
    ):
        assert not is_settled(replace(SETTLED, **unmet)), unmet


def test_the_next_fault_waits_for_the_latest_to_settle_until_its_deadline() -> None:
    assert may_start_next(None, settled=False, now=0.0)  # the first fault
    assert may_start_next(SETTLED, settled=True, now=121.0)
    unsettled = replace(SETTLED, replicas_ready=False)
    deadline = 120.0 + SETTLE_WAIT_S  # counted from the moment it was over
    assert give_up_at(unsettled) == deadline
    assert not may_start_next(unsettled, settled=False, now=deadline - 0.001)
    assert may_start_next(unsettled, settled=False, now=deadline)
    # Never over: the run stops waiting for its end FAULT_END_TIMEOUT_S after the planned one.
    never_over = replace(unsettled, ended_at=None)
    assert give_up_at(never_over) == 100.0 + 20.0 + FAULT_END_TIMEOUT_S + SETTLE_WAIT_S


# --- the watch -----------------------------------------------------------------------------------


def _card(model: str) -> Any:
    return catalog_by_id()[model]


def _instance(instance_id: str, model: str, nodes: dict[str, str]) -> MlxRingInstance:
    card = _card(model)
    shards: dict[str, Shard] = {
        runner: PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=len(nodes),
            start_layer=0,
            end_layer=card.n_layers,
            n_layers=card.n_layers,
        )
        for rank, runner in enumerate(nodes.values())
    }
    return MlxRingInstance(
        instance_id=instance_id,
        shard_assignments=ShardAssignments(
            model_id=model, runner_to_shard=shards, node_to_runner=nodes
        ),
    )


class _Feed:
    """Indexed events into a watch at chosen times."""

    def __init__(self, watch: ClusterWatch) -> None:
        self.watch = watch
        self.idx = 0

    def __call__(self, event: Any, at: float) -> None:
        self.watch.event(IndexedEvent(idx=self.idx, event=event), at)
        self.idx += 1


def _deployed(feed: _Feed, model: str, at: float = 0.0, replicas: int = 1) -> None:
    deployment = Deployment(deployment_id=f"d-{model}", model_card=_card(model), replicas=replicas)
    feed(DeploymentCreated(deployment=deployment), at)


def _ready(feed: _Feed, instance: MlxRingInstance, at: float) -> None:
    feed(InstanceCreated(instance=instance), at)
    for runner in instance.shard_assignments.node_to_runner.values():
        feed(RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()), at)


def serving_models(watch: ClusterWatch) -> set[str]:
    """The models with a ready instance in the State the watch holds."""
    return {
        model_of(instance)
        for instance in watch.state.instances.values()
        if instance_is_ready(instance, watch.state)
    }


def test_the_watch_times_the_keeper_from_deletion_to_the_new_instance() -> None:
    watch = ClusterWatch()
    feed = _Feed(watch)
    _deployed(feed, SMALL)
    first = _instance("i1", SMALL, {"n1": "r1"})
    _ready(feed, first, at=20.0)
    assert serving_models(watch) == {SMALL}
    assert watch.nodes_holding_runners() == {"n1"}
    assert watch.instances_on("n1") == ["i1"] and watch.instances_on("n2") == []
    feed(InstanceDeleted(instance_id="i1"), 50.0)
    assert watch.deleted_at == {"i1": 50.0}
    assert serving_models(watch) == set()
    feed(InstanceCreated(instance=_instance("i2", SMALL, {"n2": "r2"})), 50.4)
    assert watch.latencies == pytest.approx([0.4])
    assert watch.latencies_alone == pytest.approx([0.4])
    assert watch.duplicates.episodes == 0


def test_gaps_that_wait_by_design_are_counted_apart_not_timed() -> None:
    watch = ClusterWatch()
    feed = _Feed(watch)
    _deployed(feed, SMALL)
    # Lost before ready: the keeper backs off on purpose.
    feed(InstanceCreated(instance=_instance("i1", SMALL, {"n1": "r1"})), 20.0)
    feed(RunnerStatusUpdated(runner_id="r1", runner_status=RunnerLoading()), 20.5)
    feed(InstanceDeleted(instance_id="i1"), 21.0)
    feed(InstanceCreated(instance=_instance("i2", SMALL, {"n1": "r2"})), 31.0)
    # Nothing fit: it waited for the cluster to change.
    for runner in ("r2",):
        feed(RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()), 33.0)
    feed(InstanceDeleted(instance_id="i2"), 40.0)
    feed(DeploymentPlacementFailed(deployment_id=f"d-{SMALL}", error="No cycles"), 40.5)
    feed(InstanceCreated(instance=_instance("i3", SMALL, {"n2": "r3"})), 70.0)
    # A new master's grace.
    _ready(feed, _instance("i4", SMALL, {"n3": "r4"}), 71.0)  # a second instance appears
    feed(InstanceDeleted(instance_id="i3"), 72.0)
    watch.master_started(100.0)
    feed(InstanceDeleted(instance_id="i4"), 100.0 + STARTUP_GRACE / 2)
    feed(InstanceCreated(instance=_instance("i5", SMALL, {"n2": "r5"})), 100.0 + STARTUP_GRACE)
    assert watch.latencies == []
    assert watch.excluded == {
        ExclusionReason.BACKOFF: 1,
        ExclusionReason.NO_CAPACITY: 1,
        ExclusionReason.GRACE: 1,
    }
    assert watch.duplicates.episodes == 1  # i3 and i4 were both there from 71 to 72


def test_a_gap_behind_another_models_placement_is_timed_but_not_alone() -> None:
    watch = ClusterWatch()
    feed = _Feed(watch)
    _deployed(feed, SMALL)
    _deployed(feed, BIG)
    _ready(feed, _instance("s1", SMALL, {"n1": "r1"}), 20.0)
    _ready(feed, _instance("b1", BIG, {"n1": "r2", "n2": "r3"}), 20.0)
    feed(InstanceDeleted(instance_id="s1"), 60.0)
    feed(InstanceDeleted(instance_id="b1"), 60.0)
    feed(InstanceCreated(instance=_instance("s2", SMALL, {"n3": "r4"})), 60.3)
    feed(InstanceCreated(instance=_instance("b2", BIG, {"n3": "r5", "n2": "r6"})), 61.3)
    assert watch.latencies == pytest.approx([0.3, 1.3])
    assert watch.latencies_alone == pytest.approx([0.3])


def test_a_lost_replica_is_timed_to_its_replacement_and_two_replicas_are_no_duplicate() -> None:
    watch = ClusterWatch()
    feed = _Feed(watch)
    _deployed(feed, SMALL, replicas=2)
    _ready(feed, _instance("a", SMALL, {"n1": "r1"}), 20.0)
    _ready(feed, _instance("b", SMALL, {"n2": "r2"}), 21.0)
    assert watch.duplicates.episodes == 0  # two instances is what replicas 2 asks for
    # One replica lost while the other serves: a gap all the same, closed by the replacement.
    feed(InstanceDeleted(instance_id="a"), 50.0)
    assert serving_models(watch) == {SMALL}
    feed(InstanceCreated(instance=_instance("c", SMALL, {"n3": "r3"})), 50.6)
    assert watch.latencies == pytest.approx([0.6])
    # Both lost at once: two gaps, closed oldest first, the second queued behind the first.
    feed(RunnerStatusUpdated(runner_id="r3", runner_status=RunnerReady()), 52.0)
    feed(InstanceDeleted(instance_id="b"), 80.0)
    feed(InstanceDeleted(instance_id="c"), 80.5)
    feed(InstanceCreated(instance=_instance("d", SMALL, {"n1": "r4"})), 81.0)
    feed(InstanceCreated(instance=_instance("e", SMALL, {"n2": "r5"})), 82.0)
    assert watch.latencies == pytest.approx([0.6, 1.0, 1.5])
    assert watch.latencies_alone == pytest.approx([0.6, 1.0])
    # A third instance is more than its replicas: a duplicate.
    feed(InstanceCreated(instance=_instance("f", SMALL, {"n3": "r6"})), 90.0)
    assert watch.duplicates.episodes == 1
    assert "3 instances of" in watch.duplicates.examples[-1]
    assert "(replicas 2)" in watch.duplicates.examples[-1]
    watch.finish()
    assert watch.excluded == {}


def test_a_snapshot_short_of_replicas_opens_a_gap_per_missing_instance() -> None:
    watch = ClusterWatch()
    deployment = Deployment(deployment_id="d", model_card=_card(SMALL), replicas=2)
    watch.snapshot(State(deployments={"d": deployment}, last_event_applied_idx=5), 10.0)
    watch.finish()
    assert watch.excluded == {ExclusionReason.UNFINISHED: 2}


def test_duplicates_are_counted_once_per_episode_and_a_snapshot_counts_too() -> None:
    watch = ClusterWatch()
    feed = _Feed(watch)
    _deployed(feed, SMALL)
    for episode in range(2):
        feed(InstanceCreated(instance=_instance(f"a{episode}", SMALL, {"n1": "r1"})), 1.0)
        feed(InstanceCreated(instance=_instance(f"b{episode}", SMALL, {"n2": "r2"})), 2.0)
        feed(RunnerStatusUpdated(runner_id="r2", runner_status=RunnerReady()), 2.5)
        feed(InstanceDeleted(instance_id=f"a{episode}"), 3.0)
        feed(InstanceDeleted(instance_id=f"b{episode}"), 3.0)
    assert watch.duplicates.episodes == 2
    doubled = State(
        instances={
            "x": _instance("x", BIG, {"n1": "r1"}),
            "y": _instance("y", BIG, {"n2": "r2"}),
        },
        last_event_applied_idx=feed.idx + 10,
    )
    watch.snapshot(doubled, 9.0)
    assert watch.duplicates.episodes == 3
    assert "2 instances of" in watch.duplicates.examples[-1]
    feed.idx = 0
    feed(InstanceDeleted(instance_id="x"), 9.5)  # an index already in the snapshot: ignored
    assert set(watch.state.instances) == {"x", "y"}


def test_the_log_check_replays_every_state_and_skips_a_torn_last_line(tmp_path: Path) -> None:
    events = [
        InstanceCreated(instance=_instance("a", SMALL, {"n1": "r1"})),
        InstanceCreated(instance=_instance("b", SMALL, {"n2": "r2"})),
        InstanceDeleted(instance_id="a"),
    ]
    lines = [IndexedEvent(idx=i, event=e).model_dump_json() + "\n" for i, e in enumerate(events)]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(lines) + lines[0][:20])  # a kill -9 mid-write
    checked = check_log(log)
    assert (checked.events, checked.duplicates) == (3, 1)
    log.write_text(lines[0] + lines[2])
    assert check_log(log).duplicates == 0


def test_a_compacted_log_keeps_the_repair_that_owned_the_extra_instance(tmp_path: Path) -> None:
    # Compaction keeps only some kinds (keeper.runtime.log_scan.HISTORY_KINDS); a repair's record
    # dropped while its instances stay would read as a second instance no move owned.
    deployment = Deployment(deployment_id="d", model_card=_card(SMALL))
    move = InstanceMove(deployment_id="d", old_instance_id="a", new_instance_id="b")
    events = [
        DeploymentCreated(deployment=deployment),
        InstanceCreated(instance=_instance("a", SMALL, {"n1": "r1"})),
        DeploymentRepairPlaced(deployment_id="d", move=move),
        InstanceCreated(instance=_instance("b", SMALL, {"n2": "r2"})),
        RunnerStatusUpdated(runner_id="r2", runner_status=RunnerReady()),
        InstanceDeleted(instance_id="a"),
    ]
    lines = [IndexedEvent(idx=i, event=e).model_dump_json() + "\n" for i, e in enumerate(events)]
    log = tmp_path / "events.jsonl"
    log.write_text("".join(line for line in lines if is_history_line(line.encode())))
    checked = check_log(log)
    assert (checked.events, checked.duplicates) == (len(events) - 1, 0)


# --- the load ------------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_load_counts_results_errors_and_lost_requests_by_its_deadline() -> None:
    hanging = "a model whose requests never end"
    answers: dict[str, str | None] = {SMALL: None, BIG: "HTTP 404"}
    served: list[tuple[str, float, float]] = []

    async def send(model: str) -> str | None:
        if model == hanging:
            await anyio.sleep_forever()
        await anyio.sleep(1.0)
        return answers[model]

    settings = LoadSettings(
        clients=6, deadline_s=10.0, pause_after_result_s=0.0, pause_after_error_s=0.0
    )
    load = Load(send, [SMALL, BIG, hanging], settings, lambda m, s, a: served.append((m, s, a)))
    load.count_from(anyio.current_time() + 9.5)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(20.5)
        load.stop()
    stats = load.stats
    # Two clients per model, each sending again as soon as it has an outcome. SMALL and BIG:
    # sent at 0, 1, ... 20, the last answered after the stop. The hanging model: sent at 0, 10
    # and 20, all lost at their deadline; the run waits for the last one's.
    assert (stats.results, stats.errors, stats.lost) == (42, 42, 6)
    assert stats.error_kinds == {"HTTP 404": 42}
    assert stats.requests == stats.results + stats.errors + stats.lost
    assert stats.in_flight == 0
    assert len(stats.lost_examples) == 6
    by_model = {
        model: (c.requests, c.results, c.errors, c.lost) for model, c in stats.per_model.items()
    }
    assert by_model == {SMALL: (42, 42, 0, 0), BIG: (42, 0, 42, 0), hanging: (6, 0, 0, 6)}
    # Sent at 10, 11, ... 20 (two clients each), and the hanging model's at 10 and 20.
    since = {
        model: (c.requests, c.results, c.errors, c.lost)
        for model, c in stats.per_model_since.items()
    }
    assert since == {SMALL: (22, 22, 0, 0), BIG: (22, 0, 22, 0), hanging: (4, 0, 0, 4)}
    assert stats.per_model_since[BIG].error_kinds == {"HTTP 404": 22}
    assert all(model == SMALL and answered - sent == 1.0 for model, sent, answered in served)
    assert anyio.current_time() == pytest.approx(30.0)


async def _send_times(seed: int) -> list[float]:
    sent: list[float] = []

    async def send(model: str) -> str | None:
        sent.append(anyio.current_time())
        return None

    settings = LoadSettings(clients=1, pause_after_result_s=10.0)
    load = Load(send, [SMALL], settings, lambda *_: None, seed=seed)
    async with anyio.create_task_group() as group:
        group.start_soon(load.run)
        await anyio.sleep(200.0)
        load.stop()
    return sent


@pytest.mark.anyio
async def test_pauses_are_jittered_by_the_seed_so_clients_do_not_march_in_step() -> None:
    first = await _send_times(seed=1)
    gaps = [later - earlier for earlier, later in itertools.pairwise(first)]
    assert all(5.0 <= gap <= 15.0 for gap in gaps)
    assert len(set(gaps)) == len(gaps)  # not one fixed period
    start = anyio.current_time()
    again = [t - start for t in await _send_times(seed=1)]
    assert again == pytest.approx([t - first[0] for t in first])
    other = await _send_times(seed=2)
    assert [t - other[0] for t in other] != pytest.approx([t - first[0] for t in first])


def test_the_load_needs_a_model() -> None:
    with pytest.raises(ValueError, match="at least one model"):
        Load(lambda _: anyio.sleep(0), [], LoadSettings(), lambda *_: None)  # type: ignore[arg-type, return-value]


# --- the report ----------------------------------------------------------------------------------


def _fault(
    kind: FaultKind,
    at: float,
    recovered: float | None,
    settled: float | None = None,
    recognised: float | None = None,
    repaired: float | None = None,
) -> FaultRecord:
    return FaultRecord(
        recognised_after_s=recognised,
        repaired_after_s=repaired,
        kind=kind,
        node=MASTER if kind is FaultKind.MASTER_CRASH else "node-1",
        at=at,
        ended_at=at + 5,
        recovered_after_s=recovered,
        instance_survived=True,
        duration_s=5.0,
        settled_after_s=settled,
        started_unsettled=False,
    )


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.99) is None
    assert percentile([3.0], 0.5) == 3.0
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.5) == 50.0
    assert percentile([5.0, 1.0, 3.0], 0.99) == 5.0


def test_recovery_is_summarized_per_kind_with_every_kind_listed() -> None:
    faults = [
        _fault(FaultKind.FREEZE, 10, 4.0),
        _fault(FaultKind.FREEZE, 50, 8.0),
        _fault(FaultKind.FREEZE, 90, 6.0),
        _fault(FaultKind.NODE_CRASH, 130, None),
    ]
    stats = summarize(faults)
    assert set(stats) == {kind.value for kind in FaultKind}
    freeze = stats["freeze"]
    assert (freeze.count, freeze.median_s, freeze.p95_s, freeze.max_s) == (3, 6.0, 8.0, 8.0)
    assert (stats["node_crash"].count, stats["node_crash"].recovered) == (1, 0)
    assert stats["node_crash"].median_s is None
    assert stats["partition"].count == 0


def test_p95_is_the_nearest_rank_below_the_worst_when_there_are_enough() -> None:
    faults = [_fault(FaultKind.PARTITION, 10.0 * i, float(i)) for i in range(1, 41)]
    stats = summarize(faults)["partition"]
    assert (stats.median_s, stats.p95_s, stats.max_s) == (20.5, 38.0, 40.0)


def test_broken_kinds_are_counted_injected_recognised_repaired_with_their_times() -> None:
    faults = [
        _fault(FaultKind.STALL_WARMUP, 10, 90.0, recognised=62.0, repaired=70.0),
        _fault(FaultKind.STALL_WARMUP, 200, 80.0, recognised=61.0, repaired=None),
        _fault(FaultKind.STALL_WARMUP, 400, 70.0, recognised=64.0, repaired=68.0),
        _fault(FaultKind.LOSE_RUNNER, 600, None, recognised=None),
        _fault(FaultKind.FREEZE, 800, 5.0, recognised=3.0, repaired=4.0),  # not a broken kind
    ]
    stats = summarize_broken(faults)
    assert set(stats) == {kind.value for kind in BROKEN_KINDS}
    stall = stats["stall_warmup"]
    assert (stall.injected, stall.recognised, stall.repaired) == (3, 3, 2)
    assert (stall.recognised_median_s, stall.recognised_max_s) == (62.0, 64.0)
    assert (stall.serving_median_s, stall.serving_max_s) == (80.0, 90.0)
    lose = stats["lose_runner"]
    assert (lose.injected, lose.recognised, lose.repaired) == (1, 0, 0)
    assert lose.recognised_median_s is None and lose.serving_max_s is None
    assert stats["fail_chats"].injected == 0


def _report(**changes: Any) -> SoakReport:
    faults = [_fault(FaultKind.FREEZE, 10, 4.0), _fault(FaultKind.MASTER_CRASH, 40, 3.0)]
    fields: dict[str, Any] = {
        "run": "processes",
        "minutes": 10.0,
        "nodes": 4,
        "seed": 1,
        "models": [Deployed(model_id=SMALL, min_nodes=1)],
        "clients": 12,
        "request_deadline_s": 60.0,
        "requests": 1234,
        "results": 1200,
        "errors": 34,
        "lost": 0,
        "per_model": {SMALL: model_outcomes(1234, 1200, 34, 0)},
        "duplicates": 0,
        "duplicates_seen_live": 0,
        "events_checked": 999,
        "faults": faults,
        "recovery": summarize(faults),
        "serving_at_end": True,
        "replicas_at_end": True,
        "settle_s": 12.5,
        "one_fault_at_a_time": True,
        "suspect_after_s": 3.0,
        "dead_after_s": 8.0,
        "broken": summarize_broken(faults),
        "keeper_added_latency": latency_stats([0.5, 0.9, 1.8], [0.5, 0.9], {"nothing_fit": 2}),
        "error_kinds": {"HTTP 404": 34},
        "lost_examples": [],
        "duplicate_examples": [],
    }
    fields.update(changes)
    return SoakReport(**fields)


def test_the_report_has_the_issues_fields_and_round_trips() -> None:
    report = _report()
    document = report.model_dump(mode="json")
    for name in ("minutes", "nodes", "seed", "requests", "results", "errors", "lost"):
        assert name in document
    for name in ("duplicates", "faults", "recovery", "serving_at_end"):
        assert name in document
    fault = document["faults"][0]
    assert set(fault) >= {"kind", "node", "at", "ended_at", "recovered_after_s"}
    assert "instance_survived" in fault
    assert document["keeper_added_latency"]["p99_s"] == 1.8
    assert SoakReport.model_validate_json(report.model_dump_json()) == report


def test_the_table_shows_run_duration_requests_faults_and_lost() -> None:
    table = format_table(
        [_report(), _report(run="virtual", minutes=24 * 60, lost=2, serving_at_end=False)]
    )
    header, rule, processes, virtual = table.splitlines()
    assert header.split()[:5] == ["run", "duration", "requests", "faults", "lost"]
    assert set(rule) <= {"-", " "}
    assert "processes, 4 nodes, seed 1" in processes and "10 min" in processes
    assert processes.split()[-5:] == ["1234", "2", "0", "0", "yes"]
    assert "virtual time" in virtual and "24 h" in virtual
    assert virtual.split()[-3:] == ["2", "0", "NO"]
    recovery = format_recovery(_report())
    assert "freeze" in recovery and "p99 1.800 s" in recovery and "nothing_fit 2" in recovery
    assert "fast failover 3 / 8 s" in recovery
    freeze = next(line for line in recovery.splitlines() if line.startswith("freeze"))
    assert freeze.split() == ["freeze", "1", "1", "4.0", "4.0", "4.0"]
    stall_recovery, stall_broken = [
        line.split() for line in recovery.splitlines() if line.startswith("stall_warmup")
    ]
    assert stall_recovery == ["stall_warmup", "0", "0", "-", "-", "-"]
    assert stall_broken == ["stall_warmup", "0", "0", "0", "-", "/", "-", "-", "/", "-"]
    assert "fast failover off" in format_recovery(_report(suspect_after_s=0.0))


def test_each_model_has_its_own_outcomes_and_share_answered() -> None:
    replicated = Deployed(model_id=BIG, min_nodes=1, replicas=2)
    report = _report(
        models=[Deployed(model_id=SMALL, min_nodes=1), replicated],
        per_model={
            SMALL: model_outcomes(
                1000, 990, 10, 0, under_faults=(800, 792), errors_under_faults={"HTTP 404": 8}
            ),
            BIG: model_outcomes(234, 210, 24, 0),
        },
    )
    document = report.model_dump(mode="json")
    assert document["per_model"][SMALL] == {
        "requests": 1000,
        "results": 990,
        "errors": 10,
        "lost": 0,
        "requests_under_faults": 800,
        "answered_under_faults": 0.99,
        "errors_under_faults": {"HTTP 404": 8},
        "excluding_master_restarts": None,  # no request one by one in this report
        "by_fault": {},
    }
    assert document["models"][1]["replicas"] == 2
    assert model_outcomes(3, 2, 1, 0, under_faults=(3, 2)).answered_under_faults == 0.66667
    assert model_outcomes(1, 1, 0, 0).answered_under_faults is None  # no request under faults
    header, rule, small, big = format_models(report).splitlines()
    assert header.split()[:6] == ["model", "replicas", "requests", "results", "errors", "lost"]
    assert header.endswith("answered under faults  less master restarts")
    assert set(rule) <= {"-", " "}
    assert small.split() == [SMALL, "1", "1000", "990", "10", "0", "99.00%", "of", "800", "-"]
    assert big.split() == [BIG, "2", "234", "210", "24", "0", "-", "-"]


def test_a_faults_span_runs_until_it_settled_or_waiting_for_it_gave_up() -> None:
    assert fault_span(_fault(FaultKind.FREEZE, 10, 4.0, settled=7.5)) == (10, 17.5)
    # Never settled: until SETTLE_WAIT_S after it was over (ended_at is at + 5 here).
    assert fault_span(_fault(FaultKind.FREEZE, 10, 4.0)) == (10, 15 + SETTLE_WAIT_S)
    never_over = _fault(FaultKind.NODE_CRASH, 10, None).model_copy(update={"ended_at": None})
    assert fault_span(never_over) == (10, 10 + 5 + FAULT_END_TIMEOUT_S + SETTLE_WAIT_S)


def _sent(at: float, ended: float, error: str | None = None) -> Sent:
    return Sent(model=SMALL, at=at, ended=ended, error=error)


def test_a_request_is_the_latest_faults_whose_span_it_was_in_flight_in() -> None:
    faults = [
        _fault(FaultKind.NODE_CRASH, 10, 1.0, settled=50.0),  # [10, 60)
        _fault(FaultKind.MASTER_CRASH, 40, 3.0, settled=5.0),  # [40, 45), overlapping it
    ]
    assert attribute(_sent(9.0, 9.999), faults) == BETWEEN_FAULTS
    assert attribute(_sent(9.0, 10.0), faults) == "node_crash"  # cut by it
    assert attribute(_sent(10.0, 10.4), faults) == "node_crash"
    assert attribute(_sent(39.0, 40.2), faults) == "master_crash"  # the latest
    assert attribute(_sent(45.0, 45.1), faults) == "node_crash"  # the end is open
    assert attribute(_sent(59.9, 61.0), faults) == "node_crash"
    assert attribute(_sent(60.0, 60.1), faults) == BETWEEN_FAULTS


def test_availability_less_master_restarts_drops_what_was_in_flight_in_their_span() -> None:
    faults = [
        _fault(FaultKind.FREEZE, 10, 4.0, settled=10.0),  # [10, 20)
        _fault(FaultKind.MASTER_CRASH, 40, 3.0, settled=5.0),  # [40, 45)
    ]
    sent = [
        _sent(1.0, 1.4),
        _sent(12.0, 13.0, "HTTP 503 (node silent)"),
        _sent(15.0, 15.4),
        _sent(39.0, 39.4),
        _sent(39.8, 40.1, "connection lost"),  # in flight at the kill
        _sent(40.0, 40.0, "connection refused"),
        _sent(44.9, 104.9, LOST),
        _sent(45.0, 45.1, "HTTP 404"),
        _sent(46.0, 46.4),
    ]
    outcomes = model_outcomes(10, 5, 4, 1, under_faults=(9, 4), sent=sent, faults=faults)
    less = outcomes.excluding_master_restarts
    assert less is not None
    assert (less.requests, less.results, less.answered) == (6, 4, 0.66667)
    assert less.errors == {"HTTP 404": 1, "HTTP 503 (node silent)": 1}
    by_fault = outcomes.by_fault
    assert set(by_fault) == {"freeze", "master_crash", BETWEEN_FAULTS}
    assert (by_fault["freeze"].requests, by_fault["freeze"].results) == (2, 1)
    assert by_fault["master_crash"].errors == {
        LOST: 1,
        "connection lost": 1,
        "connection refused": 1,
    }
    assert by_fault["master_crash"].answered == 0.0
    assert (by_fault[BETWEEN_FAULTS].requests, by_fault[BETWEEN_FAULTS].results) == (4, 3)
    assert sum(part.requests for part in by_fault.values()) == len(sent)
    assert model_outcomes(1, 1, 0, 0).excluding_master_restarts is None  # nothing one by one

    report = _report(faults=faults, per_model={SMALL: outcomes})
    assert SoakReport.model_validate_json(report.model_dump_json()) == report
    small = format_models(report).splitlines()[2].split()
    assert small[-6:] == ["44.44%", "of", "9", "66.67%", "of", "6"]
    by_kind = format_by_fault(report)
    header, _, row, errors, *notes = by_kind.splitlines()
    assert header.split() == ["model", *(k.value for k in FaultKind), BETWEEN_FAULTS]
    assert row.split() == [
        SMALL,
        "-",
        "0.00%",
        "of",
        "3",
        "50.00%",
        "of",
        "2",
        "-",
        "-",
        *["-"] * len(BROKEN_KINDS),  # no broken-instance fault in this run
        "75.00%",
        "of",
        "4",
    ]
    assert errors == "errors:"
    assert f"  {SMALL}, freeze: HTTP 503 (node silent) 1" in notes


def test_a_503_is_labelled_with_its_cause_when_the_message_says_it() -> None:
    assert error_label(404, "No instance of m is ready") == "HTTP 404"
    assert error_label(503, "node n sent nothing for 30 s; the request was abandoned") == (
        "HTTP 503 (node silent)"
    )
    assert error_label(503, "node n disconnected during the request") == (
        "HTTP 503 (node disconnected)"
    )
    assert error_label(503, "the runner for i on node-1 died mid-request") == (
        "HTTP 503 (runner died)"
    )
    assert error_label(503, "something new") == "HTTP 503"


# --- the commands refuse bad arguments clearly ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--minutes", "0", "--report", "r.json"], "must be more than 0"),
        (["--minutes", "ten", "--report", "r.json"], "not a number"),
        (["--minutes", "1", "--nodes", "2", "--report", "r.json"], "at least 3 nodes"),
        (["--minutes", "1", "--seed", "x", "--report", "r.json"], "not a whole number"),
        (["--minutes", "1"], "--report"),
    ],
)
def test_soak_refuses_bad_arguments_with_exit_code_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        soak_main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--suspect-after-s", "-1"], "--suspect-after-s must be a number of seconds"),
        (["--suspect-after-s", "soon"], "not a number of seconds"),
        (["--suspect-after-s", "9", "--dead-after-s", "8"], "must not be above --dead-after-s"),
        (["--dead-after-s", "1"], "--dead-after-s must be at least"),
    ],
)
def test_both_soaks_refuse_bad_failover_flags_naming_the_flag(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for main, length in ((soak_main, "--minutes"), (soak_sim_main, "--hours")):
        with pytest.raises(SystemExit) as exited:
            main([length, "1", "--report", "r.json", *flags])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err


def test_soak_sim_refuses_bad_arguments_with_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        soak_sim_main(["--hours", "-1", "--report", "r.json"])
    assert exited.value.code == 2
    assert "must be more than 0" in capsys.readouterr().err


# --- the node's fault file (the process soak's broken-instance faults) ---------------------------


def test_the_fault_file_says_the_fault_or_heals_and_refuses_anything_else(
    tmp_path: Path,
) -> None:
    path = tmp_path / "nodes" / "node-1.fault"
    assert read_fault_file(path) is None  # no file yet: no fault
    for fault in ("stall-warmup", "lose-runner", "fail-chats", None):
        write_fault_file(path, fault)
        assert read_fault_file(path) == fault
    path.write_text("melt\n")
    with pytest.raises(ValueError, match=r"node-1\.fault: not a fault"):
        read_fault_file(path)
