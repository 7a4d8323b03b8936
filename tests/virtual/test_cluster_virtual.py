"""The master with in-process simulated nodes, in virtual time: the keeper's story end to end.

Everything runs under trio's MockClock: the master's 15 s grace, 30 s node timeout and 10 s sweep
pass in milliseconds. Every test also watches every State the master goes through (a
subscription applies each event in order) and checks the invariant the keeper exists to keep
without breaking: a model never has two instances at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import pytest
from anyio.abc import TaskGroup
from model_ids import QWEN as MODEL
from waiting import wait_until

from keeper import STARTUP_GRACE, deployment_status
from keeper.model.apply import apply_indexed
from keeper.model.catalog import catalog_by_id
from keeper.model.events import InstanceCreated
from keeper.model.refusals import NotFoundError
from keeper.model.state import (
    SERVING_RUNNER_TYPES,
    AnyDownload,
    AnyInstance,
    DownloadCompleted,
    DownloadOngoing,
    DownloadPending,
    Memory,
    State,
    download_model_id,
)
from keeper.sim.cluster.demo import (
    DEMO_MODELS,
    DEMO_NODE_TIMEOUT_S,
    DEMO_NODES,
    DEMO_SWEEP_INTERVAL_S,
)
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.downloads import whole_model_shard
from keeper.sim.node.sim_node import DEFAULT_DISK_GB, DEFAULT_DOWNLOAD_MB_PER_S, NodeConfig

QWEN_30B = "mlx-community/Qwen3-30B-A3B-4bit"
NODES = [
    NodeConfig(name="big", memory_gb=64, load_gb_per_s=2.0),
    NodeConfig(name="mid", memory_gb=32, load_gb_per_s=2.0),
    NodeConfig(name="small", memory_gb=16, load_gb_per_s=2.0),
]


def instances_of(state: State, model_id: str = MODEL) -> list[AnyInstance]:
    return [i for i in state.instances.values() if i.shard_assignments.model_id == model_id]


def serving(state: State, model_id: str = MODEL) -> AnyInstance | None:
    for instance in instances_of(state, model_id):
        runners = instance.shard_assignments.node_to_runner.values()
        if all(isinstance(state.runners.get(r), SERVING_RUNNER_TYPES) for r in runners):
            return instance
    return None


def node_names(state: State, instance: AnyInstance) -> set[str]:
    return {
        state.node_identities[node].friendly_name
        for node in instance.shard_assignments.node_to_runner
        if node in state.node_identities
    }


@dataclass
class Watch:
    """Every State a master goes through, checked as it goes: never two instances of a model."""

    states_seen: int = 0
    created: list[tuple[float, str]] = field(default_factory=list[tuple[float, str]])
    violations: list[str] = field(default_factory=list[str])

    async def follow(self, master: Master) -> None:
        async with master.subscribe() as subscription:
            state = subscription.state
            self.check(state)
            async for indexed in subscription:
                state = apply_indexed(state, indexed)
                self.check(state)
                if isinstance(indexed.event, InstanceCreated):
                    self.created.append((anyio.current_time(), indexed.event.instance.instance_id))

    def check(self, state: State) -> None:
        self.states_seen += 1
        models = [i.shard_assignments.model_id for i in state.instances.values()]
        doubled = sorted({m for m in models if models.count(m) > 1})
        if doubled:
            self.violations.append(f"event {state.last_event_applied_idx}: two of {doubled}")


async def until(condition: Callable[[], bool], within: float, what: str) -> float:
    """Wait (virtual time) until ``condition`` holds; returns when it did."""
    await wait_until(condition, within, what)
    return anyio.current_time()


@asynccontextmanager
async def master_running(
    group: TaskGroup, data_dir: Path | None, watch: Watch
) -> AsyncIterator[tuple[Master, anyio.CancelScope]]:
    """A master running in ``group`` (cancel the returned scope to stop it), watched."""
    master = Master(data_dir)
    scope = anyio.CancelScope()

    async def run(*, task_status: anyio.abc.TaskStatus[None]) -> None:
        with scope:
            async with anyio.create_task_group() as inner:
                await inner.start(master.run)
                inner.start_soon(watch.follow, master)
                task_status.started()

    await group.start(run)
    yield master, scope


@asynccontextmanager
async def cluster_running(
    watch: Watch,
) -> AsyncIterator[tuple[TaskGroup, Master, InProcessCluster]]:
    """A watched in-memory master with the NODES joined to it; cancel the group to stop both."""
    async with (
        anyio.create_task_group() as group,
        master_running(group, None, watch) as (master, _),
    ):
        cluster = InProcessCluster(master, NODES)
        await group.start(cluster.run)
        yield group, master, cluster


@pytest.mark.anyio
async def test_deploy_delete_instance_replaced_then_undeploy_leaves_nothing() -> None:
    watch = Watch()
    async with cluster_running(watch) as (group, master, cluster):
        started = anyio.current_time()
        created = await master.create_deployment(MODEL)
        deployment_id = created.deployment_id
        assert deployment_id is not None

        placed_at = await until(lambda: bool(instances_of(master.state)), 30, "placed")
        assert placed_at - started >= STARTUP_GRACE  # the new master's grace is kept
        ready_at = await until(lambda: serving(master.state) is not None, 30, "serving")
        first = serving(master.state)
        assert first is not None
        deployment = master.state.deployments[deployment_id]
        assert deployment.instance_id == first.instance_id
        assert deployment_status(deployment, master.state) == "serving"
        assert ready_at - placed_at < 5

        # Someone deletes the instance once the keeper has stepped and seen it ready (one
        # lost before the keeper saw it ready counts as a failed placement and backs off):
        # it is placed again at once.
        await anyio.sleep(2)
        await master.delete_instance(first.instance_id)
        again_at = await until(
            lambda: any(i.instance_id != first.instance_id for i in instances_of(master.state)),
            10,
            "placed again",
        )
        await until(lambda: serving(master.state) is not None, 30, "serving again")
        assert again_at - ready_at < 2 + 2

        # Undeploy: the keeper's instance goes, and nothing comes back.
        await master.delete_deployment(deployment_id)
        await until(lambda: not instances_of(master.state), 10, "instance deleted")
        quiet_from = anyio.current_time()
        await anyio.sleep(120)
        assert instances_of(master.state) == []
        assert master.state.deployments == {}
        assert [at for at, _ in watch.created if at > quiet_from] == []
        # Runners were shut down on their nodes, not only forgotten by the State.
        for name in cluster.node_names():
            assert cluster.node(name).running_instances() == []
        assert master.state.runners == {}
        group.cancel_scope.cancel()
    assert watch.violations == []
    assert len(watch.created) == 2
    assert watch.states_seen > 50


@pytest.mark.anyio
async def test_a_frozen_node_times_out_and_its_model_is_placed_on_the_others() -> None:
    watch = Watch()
    async with cluster_running(watch) as (group, master, cluster):
        await master.create_deployment(MODEL)
        await until(lambda: serving(master.state) is not None, 60, "serving")
        first = serving(master.state)
        assert first is not None
        (holder,) = node_names(master.state, first)
        holder_id = cluster.node(holder).node_id

        frozen_at = anyio.current_time()
        cluster.freeze(holder, 90)
        gone_at = await until(lambda: holder_id not in master.state.topology.nodes, 40, "timed out")
        assert gone_at - frozen_at == pytest.approx(30, abs=1.5)  # exo's 30 s of silence
        replaced_at = await until(
            lambda: (s := serving(master.state)) is not None and s.instance_id != first.instance_id,
            30,
            "serving on the others",
        )
        assert replaced_at - gone_at <= 10 + 5  # the sweep, one keeper step, the load
        second = serving(master.state)
        assert second is not None
        assert holder not in node_names(master.state, second)

        # The frozen node wakes, finds its session closed, rejoins and drops its old runner.
        await until(lambda: holder_id in master.state.topology.nodes, 90, "rejoined")
        await until(
            lambda: cluster.node(holder).running_instances() == [], 10, "old runner shut down"
        )
        await anyio.sleep(60)
        assert [i.instance_id for i in instances_of(master.state)] == [second.instance_id]
        group.cancel_scope.cancel()
    assert watch.violations == []
    assert len(watch.created) == 2


@pytest.mark.anyio
async def test_a_restarted_master_rebuilds_from_its_log_and_places_nothing_twice(
    tmp_path: Path,
) -> None:
    first_watch, second_watch = Watch(), Watch()
    async with anyio.create_task_group() as group:
        async with master_running(group, tmp_path, first_watch) as (first_master, first_scope):
            cluster = InProcessCluster(first_master, NODES)
            await group.start(cluster.run)
            created = await first_master.create_deployment(MODEL)
            await until(lambda: serving(first_master.state) is not None, 60, "serving")
            before = serving(first_master.state)
            assert before is not None
            first_scope.cancel()

        await anyio.sleep(2)  # the master is down for a moment
        async with master_running(group, tmp_path, second_watch) as (second_master, _):
            restarted_at = anyio.current_time()
            assert created.deployment_id in second_master.state.deployments  # from the log
            cluster.set_master(second_master)
            # The nodes report back well inside the grace period...
            back_at = await until(
                lambda: len(second_master.connected_nodes()) == 3, STARTUP_GRACE, "reconnected"
            )
            assert back_at - restarted_at < 2
            assert serving(second_master.state) is not None
            # ...so when the grace ends the keeper finds the instance and places nothing.
            await anyio.sleep(STARTUP_GRACE + 60)
            after = serving(second_master.state)
            assert after is not None
            assert after.instance_id == before.instance_id
            assert [i.instance_id for i in instances_of(second_master.state)] == [
                before.instance_id
            ]
            view = second_master.deployments_view().deployments
            assert [v.status for v in view] == ["serving"]
            group.cancel_scope.cancel()
    assert first_watch.violations == []
    assert second_watch.violations == []
    assert second_watch.created == []
    assert second_watch.states_seen > 3


@pytest.mark.anyio
async def test_a_crashed_node_comes_back_empty_and_a_partitioned_one_reconnects() -> None:
    watch = Watch()
    async with cluster_running(watch) as (group, master, cluster):
        await until(lambda: len(master.state.topology.nodes) == 3, 10, "joined")
        mid_id = cluster.node("mid").node_id
        sessions = cluster.sessions("mid")

        cluster.partition("mid", 5)
        await anyio.sleep(1)
        assert mid_id not in master.connected_nodes()
        await until(lambda: mid_id in master.connected_nodes(), 10, "reconnected")
        assert cluster.sessions("mid") == sessions + 1
        assert mid_id in master.state.topology.nodes  # 5 s is well under the timeout

        cluster.crash("small", 3)
        small_id = cluster.node("small").node_id
        await until(lambda: small_id in master.connected_nodes(), 10, "restarted")
        assert cluster.node("small").running_instances() == []
        with pytest.raises(KeyError, match="no node named 'nope'"):
            cluster.kill_runner("nope")
        group.cancel_scope.cancel()
    assert watch.violations == []


@pytest.mark.anyio
async def test_download_commands_reach_the_node_and_its_entries_reach_the_state() -> None:
    qwen_30b = catalog_by_id()[QWEN_30B]
    shard = whole_model_shard(qwen_30b)
    size = qwen_30b.storage_size.in_bytes
    disk = Memory.from_gb(DEFAULT_DISK_GB).in_bytes
    async with cluster_running(Watch()) as (group, master, cluster):
        await until(lambda: len(master.state.topology.nodes) == 3, 10, "joined")
        small = cluster.node("small").node_id

        def entry() -> AnyDownload | None:
            found = master.state.downloads.get(small, [])
            return next((e for e in found if download_model_id(e) == QWEN_30B), None)

        def available() -> int:
            return master.state.node_disk[small].available.in_bytes

        assert master.state.node_system[small].gpu_usage == 0.03
        assert available() == disk
        asked = anyio.current_time()
        answer = await master.start_download(small, shard)
        assert answer.command_id
        await until(lambda: isinstance(entry(), DownloadOngoing), 5, "downloading")
        done_at = await until(lambda: isinstance(entry(), DownloadCompleted), 20, "downloaded")
        rate = DEFAULT_DOWNLOAD_MB_PER_S * 1024**2
        assert done_at - asked == pytest.approx(size / rate, abs=0.1)  # 8.4 s, polled
        await until(lambda: available() == disk - size, 5, "the disk reported fuller")

        await master.delete_download(small, QWEN_30B)
        await until(lambda: isinstance(entry(), DownloadPending), 5, "deleted")
        await until(lambda: available() == disk, 5, "the disk reported freed")

        await master.start_download(small, shard)
        await until(lambda: isinstance(entry(), DownloadOngoing), 5, "downloading again")
        await anyio.sleep(3)
        await master.cancel_download(small, QWEN_30B)
        await until(lambda: isinstance(entry(), DownloadPending), 5, "cancelled")
        pending = entry()
        assert isinstance(pending, DownloadPending)
        assert 0 < pending.downloaded.in_bytes < size

        # A crashed node comes back with its files.
        cluster.crash("small", 1)
        await until(lambda: small not in master.connected_nodes(), 5, "crashed")
        await until(lambda: small in master.connected_nodes(), 10, "restarted")
        assert cluster.node("small").disk.entries(anyio.current_time())[QWEN_30B] == pending

        for refused in (
            master.start_download("nobody", shard),
            master.delete_download("nobody", QWEN_30B),
            master.cancel_download("nobody", QWEN_30B),
        ):
            with pytest.raises(NotFoundError, match="Node 'nobody' cannot be sent"):
                await refused
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_placed_runner_s_node_downloads_its_model_first() -> None:
    watch = Watch()
    async with cluster_running(watch) as (group, master, _):
        await master.create_deployment(MODEL)
        await until(lambda: serving(master.state) is not None, 40, "serving")
        instance = serving(master.state)
        assert instance is not None
        for node in instance.shard_assignments.node_to_runner:
            entries = [e for e in master.state.downloads[node] if download_model_id(e) == MODEL]
            assert [type(e) for e in entries] == [DownloadCompleted]
        group.cancel_scope.cancel()
    assert watch.violations == []


@pytest.mark.anyio
async def test_the_demo_stages_its_models_and_a_killed_node_s_serve_again_with_no_download() -> (
    None
):
    """Staged failover end to end (docs/design.md §5.12): the demo's models start from their
    nodes' disks, the keeper stages each where it would fail over to (Qwen3-30B's 17 GB download
    is seen), and when the studio dies its models come back on the staged nodes with no download
    in the way: detection, placement, load."""
    config = MasterConfig(
        node_timeout_s=DEMO_NODE_TIMEOUT_S, sweep_interval_s=DEMO_SWEEP_INTERVAL_S
    )
    master = Master(None, config=config)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        cluster = InProcessCluster(master, DEMO_NODES)
        await group.start(cluster.run)
        for model_id, replicas in DEMO_MODELS:
            await master.create_deployment(model_id, replicas=replicas)

        def entry(node: str, model_id: str) -> AnyDownload | None:
            entries = master.state.downloads.get(node, [])
            return next((e for e in entries if download_model_id(e) == model_id), None)

        def all_serving() -> bool:
            return all(serving(master.state, model_id) for model_id, _ in DEMO_MODELS[:3])

        def staged(model_id: str) -> tuple[str, ...]:
            (deployment,) = [
                d for d in master.state.deployments.values() if d.model_card.model_id == model_id
            ]
            return deployment.staged_on

        await until(all_serving, STARTUP_GRACE + 10, "the demo serving")
        studio = cluster.node("studio").node_id
        # What the keeper placed first was on its nodes' disks: the first instances downloaded
        # nothing. Then the 30B model is staged on a node apart, and that download is seen.
        await until(lambda: len(staged(QWEN_30B)) == 1, 30, "Qwen3-30B staged")
        (standby,) = staged(QWEN_30B)
        assert standby != studio
        started = await until(
            lambda: isinstance(entry(standby, QWEN_30B), DownloadOngoing), 30, "staging seen"
        )
        ended = await until(
            lambda: isinstance(entry(standby, QWEN_30B), DownloadCompleted), 60, "staged"
        )
        assert 10 < ended - started < 25  # 17 GB at the demo's rate
        await until(
            lambda: all(
                isinstance(entry(node, m), DownloadCompleted)
                for m, _ in DEMO_MODELS[:3]
                for node in staged(m)
            ),
            60,
            "every copy staged",
        )

        # The studio dies: its models come back on the staged nodes, with no download between.
        cluster.crash("studio", 120)
        crashed_at = anyio.current_time()
        await until(lambda: not all_serving(), DEMO_NODE_TIMEOUT_S + 10, "the loss seen")
        downloads_seen: list[str] = []

        def serving_again() -> bool:
            for node, entries in master.state.downloads.items():
                downloads_seen.extend(
                    f"{node}:{download_model_id(e)}"
                    for e in entries
                    if isinstance(e, DownloadOngoing)
                )
            return all_serving()

        back = await until(serving_again, 60, "serving again")
        instance = serving(master.state, QWEN_30B)
        assert instance is not None
        assert set(instance.shard_assignments.node_to_runner) == {standby}
        # (A copy for the next failover may be staged elsewhere meanwhile: not on this node.)
        assert f"{standby}:{QWEN_30B}" not in downloads_seen
        # Detection (the demo's 10 s timeout and 2 s sweep) plus the load, and no 17 s download.
        assert back - crashed_at < DEMO_NODE_TIMEOUT_S + DEMO_SWEEP_INTERVAL_S + 8
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_back_from_a_timeout_reports_its_downloads_again() -> None:
    shard = whole_model_shard(catalog_by_id()[MODEL])
    async with cluster_running(Watch()) as (group, master, cluster):
        await until(lambda: len(master.state.topology.nodes) == 3, 10, "joined")
        small = cluster.node("small").node_id

        def completed() -> bool:
            entries = master.state.downloads.get(small, [])
            return any(isinstance(e, DownloadCompleted) for e in entries)

        await master.start_download(small, shard)
        await until(completed, 5, "downloaded")
        cluster.freeze("small", 40)  # past the 30 s timeout: its entries go with it
        await until(lambda: small not in master.state.topology.nodes, 40, "timed out")
        assert small not in master.state.downloads
        back = await until(lambda: small in master.state.topology.nodes, 30, "back")
        reported = await until(completed, 10, "its download reported again")
        assert reported - back <= 5.0 + 1.0  # within one resend period
        group.cancel_scope.cancel()
