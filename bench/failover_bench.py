"""Fast failover (docs/design.md §5.18): kill -> serving with it on (3 s / 8 s) and off (exo's
rules only), for a model staged on a second node (standby 1), so the figure is detection and
load, not a download.

A real master with in-process simulated nodes, in virtual time (trio's MockClock), with exo's
membership timings (30 s of silence, a sweep every 10 s): three 64 GB Macs, Qwen3-30B-A3B-4bit
(17.6 GB) at 200 MB/s downloads and 2 GB/s loads, as the staging section. Each case waits
until the standby copy is complete, crashes the serving node (its connection drops, as on a
kill -9) and times from the crash until the model serves again on another node, with when the
replacement was created and when the lost instance was deleted. Printed, never asserted.

The same kill through the bridge: the master is then the stand-in for a stock exo (``master
--exo-compat``: no keeper, exo's rules only) and a bridge follows its API (in process, over
ASGI), deploying and failing over through exo's HTTP calls. It has no node's own URL to probe,
so it confirms the dead node by ``--dead-after-s`` of silence; "serving" counts only once the
lost instance is gone, as a stock exo still sends chats to it until then (§5.18).
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import httpx

from bench.staging_bench import (
    DEADLINE_S,
    DOWNLOAD_MB_PER_S,
    LOAD_GB_PER_S,
    MODEL,
    NODE_TIMEOUT_S,
    SWEEP_S,
    _serving_nodes,  # pyright: ignore[reportPrivateUsage]
    _until,  # pyright: ignore[reportPrivateUsage]
)
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.model.catalog import catalog_by_id
from keeper.model.events import InstanceCreated, InstanceDeleted
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.state import DownloadCompleted, State, download_model_id
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig


@dataclass
class Case:
    name: str
    created_s: float = 0.0
    deleted_s: float = 0.0
    total_s: float = 0.0
    most: int = 0


async def _case(name: str, liveness: LivenessConfig, through_bridge: bool = False) -> Case:
    case = Case(name)
    card = catalog_by_id()[MODEL]
    nodes = [
        NodeConfig(
            name=node,
            memory_gb=64,
            load_gb_per_s=LOAD_GB_PER_S,
            download_mb_per_s=DOWNLOAD_MB_PER_S,
            disk_gb=500,
            has_models=(card,) if node == "studio" else (),
        )
        for node in ("studio", "mini-a", "mini-b")
    ]
    config = MasterConfig(
        node_timeout_s=NODE_TIMEOUT_S,
        sweep_interval_s=SWEEP_S,
        liveness=OFF if through_bridge else liveness,  # the stand-in keeps exo's rules only
        keeper_enabled=not through_bridge,
    )
    master = Master(None, config=config)
    marks: dict[str, float] = {}
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        cluster = InProcessCluster(master, nodes)
        await group.start(cluster.run)

        async def follow() -> None:
            async with master.subscribe() as subscription:
                async for indexed in subscription:
                    event = indexed.event
                    if "killed" not in marks:
                        continue
                    if isinstance(event, InstanceDeleted):
                        marks.setdefault("deleted", anyio.current_time())
                    if isinstance(event, InstanceCreated):
                        marks.setdefault("created", anyio.current_time())
                    count = sum(
                        1
                        for i in master.state.instances.values()
                        if i.shard_assignments.model_id == MODEL
                    )
                    case.most = max(case.most, count)

        group.start_soon(follow)
        if through_bridge:
            transport = httpx.ASGITransport(app=create_exo_compat_app(master))
            exo = ExoClient("http://exo.bench", transport=transport)
            bridge = Bridge(exo, None, config=BridgeConfig(liveness=liveness))
            await group.start(bridge.run)
            await bridge.create_deployment(MODEL, standby=1)

            def deployments() -> State:
                return bridge.state
        else:
            await master.create_deployment(MODEL, standby=1)

            def deployments() -> State:
                return master.state

        await _until(lambda: _serving_nodes(master.state) is not None)
        deployment_id = next(iter(deployments().deployments))

        def staged() -> bool:
            d = deployments().deployments[deployment_id]
            return len(d.staged_on) == 1 and all(
                any(
                    isinstance(e, DownloadCompleted) and download_model_id(e) == MODEL
                    for e in master.state.downloads.get(node, [])
                )
                for node in d.staged_on
            )

        await _until(staged)
        serving = _serving_nodes(master.state)
        assert serving is not None
        (victim,) = serving
        marks["killed"] = anyio.current_time()
        cluster.crash(master.state.node_identities[victim].friendly_name, DEADLINE_S)

        def back() -> bool:
            now = _serving_nodes(master.state)
            return now is not None and victim not in now

        served = await _until(back)
        await _until(lambda: "deleted" in marks)
        killed = marks["killed"]
        case.created_s = marks.get("created", served) - killed
        case.deleted_s = marks["deleted"] - killed
        case.total_s = served - killed
        group.cancel_scope.cancel()
    return case


def run() -> None:
    from trio.testing import MockClock  # noqa: PLC0415 (only the virtual-time sections need trio)

    print(
        f"kill -> serving, {MODEL} at standby 1 (the copy complete before the kill); 3 x 64 GB "
        "nodes, exo's 30 s timeout and 10 s sweep (virtual time)"
    )
    header = f"{'kill->serving s':>15} {'created s':>9} {'deleted s':>9} {'most':>4}"
    print(f"{'where, fast failover':>24} | {header}")
    cases = (
        ("master, off", OFF, False),
        ("master, on (3 s / 8 s)", LivenessConfig(), False),
        ("bridge, off", OFF, True),
        ("bridge, on (3 s / 8 s)", LivenessConfig(), True),
    )
    for name, liveness, through_bridge in cases:
        case = anyio.run(
            _case,
            name,
            liveness,
            through_bridge,
            backend="trio",
            backend_options={"clock": MockClock(autojump_threshold=0)},
        )
        print(
            f"{case.name:>24} | {case.total_s:>15.1f} {case.created_s:>9.1f} "
            f"{case.deleted_s:>9.1f} {case.most:>4}"
        )
    print(
        "targets: kill -> serving <= suspect + load + 1 s on our master, <= dead + 1 s through "
        "the bridge; most <= replicas + 1"
    )


if __name__ == "__main__":
    run()
