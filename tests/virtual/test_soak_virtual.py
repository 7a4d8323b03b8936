"""The soak in virtual time, short enough for every ``make test``: faults under load against a
master and four in-process nodes, then the promises checked on its report.

``make soak-sim`` runs the same thing for 24 simulated hours; this is its half-hour cut (eight
fault kinds, each injected at least three times) with fast failover off, so that the keeper's
own re-placement latency is there to time, plus a replay check (the same seed gives the same
report) on a shorter run that still meets every fault kind, also with fast failover off. Both
are sized to what they check, not longer: the soak's CPU is the suite's (docs/design.md §10).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import TaskGroup, TaskStatus

from keeper.model.apply import apply_indexed
from keeper.model.catalog import catalog_by_id
from keeper.model.events import (
    DeploymentCreated,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    RunnerStatusUpdated,
)
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.state import (
    Deployment,
    MlxRingInstance,
    PipelineShardMetadata,
    RunnerReady,
    Shard,
    ShardAssignments,
    State,
)
from keeper.sim.soak import faults
from keeper.sim.soak.faults import BROKEN_KINDS, MASTER, TAKES_A_NODE_AWAY, FaultKind, FaultSpec
from keeper.sim.soak.load import LoadSettings
from keeper.sim.soak.report import Deployed, FaultRecord, RunKind, SoakReport
from keeper.sim.soak.run import (
    PIPELINE_MODEL,
    PROBE_S,
    REPLICATED_MODEL,
    SOAK_MODELS,
    DeploymentHealth,
    Soak,
    SoakSettings,
)
from keeper.sim.soak.virtual import deterministic, run_virtual, seeded_ids, virtual_settings

# Half an hour: a fault every 20-60 s is at least 30 faults (asserted below), and the fault bag
# deals each of the eight kinds once per eight, so every kind at least three times, each broken
# kind repaired, node and master crashes both ways. An hour ran the same checks over twice the
# faults for 25 s of CPU instead of 13 (``make soak-sim`` is the long run).
HOURS = 0.5
SEED = 11
# The replay's run: six minutes of seed 3 are eight faults, one of each kind (asserted), so each
# fault's path is replayed; a quarter hour (23 faults) took 15 s of CPU for the pair, this 6.
REPLAY_HOURS = 0.1


async def _soak(
    hours: float, seed: int, data_dir: Path, liveness: LivenessConfig | None = None
) -> SoakReport:
    lines: list[str] = []
    settings = virtual_settings(hours, seed, nodes=4, liveness=liveness)
    with deterministic(seed):
        return await run_virtual(settings, data_dir, lines.append)


@pytest.mark.slow
@pytest.mark.anyio
async def test_hours_of_faults_under_load_lose_nothing_and_never_double(tmp_path: Path) -> None:
    report = await _soak(HOURS, SEED, tmp_path, OFF)

    assert report.run == "virtual"
    assert report.minutes == HOURS * 60
    assert [m.model_id for m in report.models] == [m.model_id for m in SOAK_MODELS]
    # The promises.
    assert report.lost == 0, report.lost_examples
    assert report.duplicates == 0, report.duplicate_examples
    assert report.duplicates_seen_live == 0
    assert report.serving_at_end
    # The checks had something to check: load, faults of every kind, a full log.
    assert report.requests == report.results + report.errors + report.lost
    assert report.results > 500 * HOURS
    # Each model's own outcomes add up to the totals; the replicated one kept two replicas.
    assert set(report.per_model) == {m.model_id for m in SOAK_MODELS}
    for name in ("requests", "results", "errors", "lost"):
        total = sum(getattr(outcomes, name) for outcomes in report.per_model.values())
        assert total == getattr(report, name), name
    assert all(outcomes.requests > 0 for outcomes in report.per_model.values())
    assert report.models[-1].replicas == REPLICATED_MODEL.replicas == 2
    assert report.errors > 0  # faults do cost requests (answered with an error, never lost)
    injected = {fault.kind for fault in report.faults}
    assert injected == set(FaultKind), f"not injected: {set(FaultKind) - injected}"
    assert len(report.faults) >= HOURS * 60  # one every 20-60 s
    assert all(fault.ended_at is not None for fault in report.faults)
    assert all(fault.recovered_after_s is not None for fault in report.faults)
    assert sum(stats.count for stats in report.recovery.values()) == len(report.faults)
    # Node crashes cost the instances they held; the keeper re-placed them at its next step.
    crashes = [f for f in report.faults if f.kind is FaultKind.NODE_CRASH]
    assert any(fault.instance_survived is False for fault in crashes)
    # The compacted log keeps every deployment and instance event: at least the two deployments,
    # their first instances, and a new instance for each one a crash took.
    lost = sum(1 for fault in crashes if fault.instance_survived is False)
    assert report.events_checked >= 4 + lost
    latency = report.keeper_added_latency
    assert latency.samples > 0
    assert latency.alone_p99_s is not None and latency.alone_p99_s <= 1.1
    # A master crash by itself loses no instance: the new master rebuilds them from its log
    # (one that overlaps a node fault may lose that node's instance).
    restarts = [f for f in report.faults if f.kind is FaultKind.MASTER_CRASH]
    assert any(fault.instance_survived for fault in restarts)
    # The broken instances: each kind recognised by the keeper and repaired, at least once.
    assert report.suspect_after_s == 0
    assert set(report.broken) == {kind.value for kind in BROKEN_KINDS}
    for kind, stats in report.broken.items():
        assert stats.injected > 0, kind
        assert 0 < stats.repaired <= stats.recognised <= stats.injected, kind
        assert stats.recognised_max_s is not None and stats.serving_max_s is not None


def test_seeded_ids_repeat_for_a_seed_and_differ_between_seeds() -> None:
    first, again, other = seeded_ids(3), seeded_ids(3), seeded_ids(4)
    ids = [first() for _ in range(5)]
    assert ids == [again() for _ in range(5)]
    assert ids != [other() for _ in range(5)]
    assert len(set(ids)) == 5


@pytest.mark.anyio
async def test_the_same_seed_replays_the_same_report(tmp_path: Path) -> None:
    # Fast failover off: with it on, two runs of one seed do not yet give the same faults
    # (not yet explained; see the README's soak section).
    first = await _soak(REPLAY_HOURS, 3, tmp_path / "first", OFF)
    second = await _soak(REPLAY_HOURS, 3, tmp_path / "second", OFF)
    assert first.faults  # something happened worth replaying
    assert {fault.kind for fault in first.faults} == set(FaultKind)  # every kind of it
    assert first.model_dump() == second.model_dump()


# --- the run's bookkeeping, against a scripted cluster -------------------------------------------

BIG_NODE = "n1"  # holds the pipeline model's instance
SMALL_NODE = "n4"
# The scripted cluster's answer to losing BIG_NODE for longer than the node timeout: the
# instance is deleted at the timeout, and the model serves again this long after.
TIMEOUT_S = 30.0
REPLACE_S = 12.0


class ScriptedCluster:
    """A SoakTarget whose only reaction to a fault is the one a test can predict exactly."""

    run_kind: RunKind = "virtual"

    def __init__(self) -> None:
        self.down: set[str] = set()  # models that cannot serve
        self.away: set[str] = set()  # nodes not connected
        self.state = State()
        self._on_event: Callable[[IndexedEvent], None] | None = None
        self._idx = 0
        self._generation = 0
        self._group: TaskGroup | None = None

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            await anyio.sleep_forever()

    def node_names(self) -> list[str]:
        return ["n1", "n2", "n3", "n4"]

    def node_id(self, name: str) -> str:
        return name

    async def deploy(self, model: Deployed) -> None:
        card = catalog_by_id()[model.model_id]
        deployment = Deployment(deployment_id=f"d-{model.model_id}", model_card=card)
        self._emit(DeploymentCreated(deployment=deployment))
        node = BIG_NODE if model.min_nodes > 1 else SMALL_NODE
        self._place(model.model_id, node)

    def _place(self, model_id: str, node: str) -> None:
        self._generation += 1
        instance = instance_on(f"i{self._generation}", model_id, node)
        self._emit(InstanceCreated(instance=instance))
        runner = instance.shard_assignments.node_to_runner[node]
        self._emit(RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()))

    def _emit(self, event: Any) -> None:
        indexed = IndexedEvent(idx=self._idx, event=event)
        self._idx += 1
        self.state = apply_indexed(self.state, indexed)
        if self._on_event is not None:
            self._on_event(indexed)

    async def chat(self, model_id: str) -> str | None:
        await anyio.sleep(0.1)
        return "HTTP 404" if model_id in self.down else None

    async def follow(
        self, on_state: Callable[[State], None], on_event: Callable[[IndexedEvent], None]
    ) -> None:
        on_state(self.state)
        self._on_event = on_event
        await anyio.sleep_forever()

    async def statuses(self) -> dict[str, DeploymentHealth]:
        return {
            d.model_card.model_id: DeploymentHealth("placing", 1, 0)
            if d.model_card.model_id in self.down
            else DeploymentHealth("serving", 1, 1)
            for d in self.state.deployments.values()
        }

    async def connected_nodes(self) -> int:
        return len(self.node_names()) - len(self.away)

    async def inject(self, fault: FaultSpec) -> None:
        if fault.kind in TAKES_A_NODE_AWAY:
            self.away.add(fault.node)
        long = fault.kind in TAKES_A_NODE_AWAY and fault.duration_s >= TIMEOUT_S
        if fault.node == BIG_NODE and long:
            assert self._group is not None
            self._group.start_soon(self._lose_big_instance)

    async def _lose_big_instance(self) -> None:
        await anyio.sleep(TIMEOUT_S)
        big = PIPELINE_MODEL.model_id
        (instance_id,) = [
            iid for iid, i in self.state.instances.items() if i.shard_assignments.model_id == big
        ]
        self._emit(InstanceDeleted(instance_id=instance_id))
        self.down.add(big)
        await anyio.sleep(REPLACE_S)
        self._place(big, BIG_NODE)
        self.down.discard(big)

    async def wait_over(self, fault: FaultSpec) -> None:
        await anyio.sleep(fault.duration_s)
        self.away.discard(fault.node)

    def master_log(self) -> Path | None:
        return None


def long_faults_on_the_pipeline_node(report: SoakReport) -> list[FaultRecord]:
    """The faults that took the pipeline model's node away for longer than the node timeout."""
    long_on_big = [
        fault
        for fault in report.faults
        if fault.node == BIG_NODE
        and fault.kind in TAKES_A_NODE_AWAY
        and fault.duration_s >= TIMEOUT_S
    ]
    assert long_on_big, "the seed should take the pipeline model's node away for long"
    return long_on_big


def instance_on(instance_id: str, model_id: str, node: str) -> MlxRingInstance:
    card = catalog_by_id()[model_id]
    shard: Shard = PipelineShardMetadata(
        model_card=card,
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=card.n_layers,
        n_layers=card.n_layers,
    )
    runner = f"r-{instance_id}"
    return MlxRingInstance(
        instance_id=instance_id,
        shard_assignments=ShardAssignments(
            model_id=model_id, runner_to_shard={runner: shard}, node_to_runner={node: runner}
        ),
    )


@pytest.mark.anyio
async def test_recovery_is_timed_from_a_late_deletion_and_survival_is_per_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Faults 100 s apart, so each one's effects are over before the next.
    monkeypatch.setattr(faults, "FAULT_GAP_S", (100.0, 100.0))
    load = LoadSettings(pause_after_result_s=5.0, pause_after_error_s=2.0)
    settings = SoakSettings(minutes=15, seed=7, nodes=4, load=load, say_faults=False)
    report = await _scripted(settings)

    assert report.lost == 0 and report.duplicates == 0 and report.serving_at_end
    assert {fault.kind for fault in report.faults} == set(FaultKind)
    long_on_big = long_faults_on_the_pipeline_node(report)
    for fault in report.faults:
        assert fault.ended_at == pytest.approx(fault.at + fault.duration_s, abs=0.01)
        assert fault.recovered_after_s is not None
        if fault in long_on_big:
            # Chats kept being answered until the deletion at the timeout; recovery counts from
            # there, to the first reply after the model was placed again (probes every second).
            expected = TIMEOUT_S + REPLACE_S
            assert expected <= fault.recovered_after_s <= expected + PROBE_S + 0.5
            assert fault.instance_survived is False
            continue
        assert fault.recovered_after_s <= PROBE_S + 0.5
        hit_something = fault.node in (BIG_NODE, SMALL_NODE, MASTER)
        assert fault.instance_survived is (True if hit_something else None)
    latency = report.keeper_added_latency
    assert latency.samples == len(long_on_big)  # the scripted "keeper" took REPLACE_S
    assert latency.p50_s == REPLACE_S


async def _scripted(settings: SoakSettings) -> SoakReport:
    cluster = ScriptedCluster()
    report: SoakReport | None = None
    async with anyio.create_task_group() as group:
        await group.start(cluster.run)
        report = await Soak(cluster, settings, lambda _: None).run()
        group.cancel_scope.cancel()
    assert report is not None
    return report


@pytest.mark.anyio
async def test_one_fault_at_a_time_starts_each_only_once_the_last_has_settled(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Faults every 20 s: shorter than most faults last, so without the rule they overlap.
    monkeypatch.setattr(faults, "FAULT_GAP_S", (20.0, 20.0))
    load = LoadSettings(pause_after_result_s=5.0, pause_after_error_s=2.0)
    settings = SoakSettings(minutes=20, seed=3, nodes=4, load=load, say_faults=False)

    overlapping = await _scripted(replace(settings, one_fault_at_a_time=False))
    assert not overlapping.one_fault_at_a_time
    assert any(fault.started_unsettled for fault in overlapping.faults)

    report = await _scripted(settings)
    assert report.one_fault_at_a_time
    assert report.lost == 0 and report.serving_at_end and report.replicas_at_end
    assert len(report.faults) >= 5
    for before, after in itertools.pairwise(report.faults):
        assert before.settled_after_s is not None and before.ended_at is not None
        # Settled once over, every node back and every model answering again (the probes
        # look every second, the run every STATUS_POLL_S).
        assert before.settled_after_s >= before.ended_at - before.at
        assert before.settled_after_s >= (before.recovered_after_s or 0.0)
        assert after.at >= before.at + before.settled_after_s
        assert after.at >= before.at + 20.0  # the seeded gap still applies
        assert not after.started_unsettled
    # The long fault on the pipeline model's node settled only once the model was placed
    # again, TIMEOUT_S + REPLACE_S after it struck.
    long_on_big = long_faults_on_the_pipeline_node(report)
    for fault in long_on_big:
        assert fault.settled_after_s is not None
        assert fault.settled_after_s >= TIMEOUT_S + REPLACE_S
