"""Keeper-added latency: an instance's deletion applied -> its replacement's InstanceCreated
applied, when no backoff applies (the instance was ready when lost, docs/design.md §5.4).

A real master (event log on disk, written in a worker thread, as ``run_master`` does; then
again with the log in memory, to tell the fsyncs from the rest) runs in this process with
simulated nodes on memory channels (``keeper.sim.cluster.in_process``), on the real clock. Two
deployments (Qwen3-0.6B, Llama 3.2 1B) are kept on five nodes; samples delete the ready
instance of one (a single loss), or of both in one batch (two models lost at once: the second
replacement needs a second step, which waits for the first step's events to be applied).
Times are taken as a dashboard subscriber receives the events, so both ends of a sample carry
the same publish-to-reader delay. Printed, never asserted; the target is beside.

Before prompt stepping (docs/design.md §6.6) the keeper ran once a second: p50 1.0 s, p99 2.0 s.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import anyio

from keeper.model.events import InstanceCreated, InstanceDeleted
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

MODELS = ("mlx-community/Qwen3-0.6B-4bit", "mlx-community/Llama-3.2-1B-Instruct-4bit")
SINGLE_SAMPLES = 60
DOUBLE_SAMPLES = 30  # two samples each
TARGET_P99_MS = 50.0
# Loads this fast make a replacement ready in milliseconds, so samples follow each other quickly.
LOAD_GB_PER_S = 200.0
# Each round waits this long for the replacement; far beyond any sane figure.
ROUND_DEADLINE_S = 10.0


class _Recorder:
    """When each model's InstanceCreated, and each InstanceDeleted, reached a subscriber."""

    def __init__(self) -> None:
        self.created: dict[str, list[float]] = {model: [] for model in MODELS}
        self.deleted: dict[str, float] = {}

    async def follow(self, master: Master) -> None:
        async with master.subscribe() as subscription:
            async for indexed in subscription:
                now = time.perf_counter()
                if isinstance(indexed.event, InstanceCreated):
                    model = indexed.event.instance.shard_assignments.model_id
                    self.created.setdefault(model, []).append(now)
                elif isinstance(indexed.event, InstanceDeleted):
                    self.deleted[indexed.event.instance_id] = now


def _instance_of(master: Master, model: str) -> str | None:
    ready = master.ready_instances(model)
    return ready[0][0] if ready else None


async def _until(condition: object, what: str) -> None:
    assert callable(condition)
    with anyio.fail_after(ROUND_DEADLINE_S):
        while not condition():
            await anyio.sleep(0.002)
    del what


async def _all_ready(master: Master) -> None:
    await _until(lambda: all(_instance_of(master, m) for m in MODELS), "all ready")
    # A step sees the new instances ready (RunnerReady calls for one) before the next loss, or
    # that loss would count as before ready and back off; a few ms cover it.
    await anyio.sleep(0.02)


async def _measure(on_disk: bool) -> tuple[list[float], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        config = MasterConfig(startup_grace_s=0.0, log_io_in_thread=on_disk)
        master = Master(Path(tmp) if on_disk else None, config=config)
        nodes = [
            NodeConfig(name=f"n{i}", memory_gb=64, load_gb_per_s=LOAD_GB_PER_S) for i in range(5)
        ]
        cluster = InProcessCluster(master, nodes)
        recorder = _Recorder()
        single: list[float] = []
        double: list[float] = []
        async with anyio.create_task_group() as group:
            await group.start(master.run)
            await group.start(cluster.run)
            group.start_soon(recorder.follow, master)
            await _until(lambda: len(master.connected_nodes()) == len(nodes), "nodes")
            for model in MODELS:
                await master.create_deployment(model)
            await _all_ready(master)
            for i in range(SINGLE_SAMPLES):
                model = MODELS[i % 2]
                lost = _instance_of(master, model)
                assert lost is not None
                seen = len(recorder.created[model])
                await master.delete_instance(lost)  # returns once the deletion is applied
                await _until(lambda m=model, s=seen: len(recorder.created[m]) > s, "replaced")
                single.append(recorder.created[model][-1] - recorder.deleted[lost])
                await _all_ready(master)
            for _ in range(DOUBLE_SAMPLES):
                lost_ids = [_instance_of(master, model) for model in MODELS]
                counts = {model: len(recorder.created[model]) for model in MODELS}
                # One emit: both deletions are applied in the same batch.
                await master.emit([InstanceDeleted(instance_id=i) for i in lost_ids if i])
                await _until(
                    lambda c=counts: all(len(recorder.created[m]) > c[m] for m in MODELS),
                    "replaced",
                )
                deleted_at = max(recorder.deleted[i] for i in lost_ids if i)
                double.extend(recorder.created[m][-1] - deleted_at for m in MODELS)
                await _all_ready(master)
            group.cancel_scope.cancel()
        return single, double


def _figures(label: str, seconds: list[float]) -> None:
    ms = sorted(s * 1000 for s in seconds)
    p50 = statistics.median(ms)
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    verdict = "ok" if p99 <= TARGET_P99_MS else "over target"
    print(
        f"{label:<44} n={len(ms):>3}  p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
        f"max {ms[-1]:6.1f} ms  (target p99 <= {TARGET_P99_MS:g} ms: {verdict})"
    )


def run() -> None:
    print("instance deletion applied -> replacement InstanceCreated applied (no backoff)")
    print("(before prompt stepping: once-a-second keeper, p50 1.0 s, p99 2.0 s)")
    for on_disk, title in (
        (True, "event log on disk (a real master: each step's events are fsynced first)"),
        (False, "log in memory (the keeper and the router alone)"),
    ):
        print(f"-- {title}")
        single, double = anyio.run(_measure, on_disk, backend="asyncio")
        _figures("single loss", single)
        _figures("two models lost at once (each model)", double)
        _figures("all", [*single, *double])


if __name__ == "__main__":
    run()
