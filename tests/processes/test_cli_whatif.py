"""``exo-deploy whatif NODE[,NODE...]`` against a real master on a loopback port: its table, its
``--json``, and the exit codes scripts rely on (0 answered, 1 refused with the master's message,
2 bad usage, 3 unreachable). The master runs in a background thread with two simulated nodes,
``a`` and ``b``. The table's layout on its own (every outcome, 80 columns) is
tests/pure/test_whatif_table.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import anyio
import pytest
from anyio.abc import TaskStatus
from anyio.from_thread import start_blocking_portal
from model_ids import QWEN
from process_helpers import free_port
from test_cli import run_cli

from keeper.cli import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from keeper.model.api_models import WhatIfResponse
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

# How long the master may take to place the deployment the test makes: one keeper step.
PLACED_WITHIN_S = 10.0


@pytest.fixture(scope="module")
def serving_url() -> Iterator[str]:
    """A master with nodes a and b, serving Qwen on one of them (placed at once: no grace)."""
    master = Master(None, config=MasterConfig(startup_grace_s=0.0))
    cluster = InProcessCluster(master, [NodeConfig("a", 32.0), NodeConfig("b", 32.0)])
    with start_blocking_portal(backend="asyncio") as portal:

        async def run(*, task_status: TaskStatus[int]) -> None:
            async with anyio.create_task_group() as group:
                await group.start(cluster.run)
                await serve(master, "127.0.0.1", 0, None, task_status=task_status)

        future, port = portal.start_task(run)

        async def placed() -> None:
            await master.create_deployment(QWEN, standby=0)  # no copy staged: a download
            with anyio.fail_after(PLACED_WITHIN_S):
                while not master.state.instances:
                    await anyio.sleep(0.05)

        portal.call(placed)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            future.cancel()


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_DEPLOY_TOKEN", raising=False)
    monkeypatch.delenv("EXO_DEPLOY_URL", raising=False)


def test_whatif_prints_where_the_lost_node_s_instance_goes(
    serving_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "whatif", "a,b", "--url", serving_url, "--json")
    assert code == EXIT_OK
    answer = WhatIfResponse.model_validate(json.loads(out))
    (deployment,) = answer.deployments
    (lost,) = deployment.lost
    (serving,) = [node.name for node in lost.nodes]
    other = {"a": "b", "b": "a"}[serving]
    assert answer.thresholds is not None and answer.thresholds.exo_timeout_s == 30.0

    code, out, err = run_cli(capsys, "whatif", serving, "--url", serving_url)
    assert (code, err) == (EXIT_OK, "")
    assert out.splitlines() == [
        f"If {serving} went now:",
        "MODEL                          OUTCOME                 LEFT",
        f"{QWEN}  moves                   1 of 1",
        f"  was on: {serving}",
        # Fast failover off (the master's default): exo's timeout and sweep; the model is
        # downloaded at a rate no node reports, so the time is a floor.
        f"  goes to: {other} (downloads first): serving again in over ~40 s (exo's timeout 30-40",
        "    s, download time unknown, load ~1 s at an assumed 2 GB/s)",
    ]


def test_whatif_refusals_and_usage_have_their_exit_codes(
    serving_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "whatif", "a,zeta", "--url", serving_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "exo-deploy whatif: No node 'zeta' in the cluster" in err
    code, _, err = run_cli(capsys, "whatif", " , ")
    assert code == EXIT_USAGE
    assert "name at least one node" in err
    url = f"http://127.0.0.1:{free_port()}"
    code, _, err = run_cli(capsys, "whatif", "a", "--url", url)
    assert code == EXIT_UNREACHABLE
    assert f"cannot reach the master at {url}" in err
