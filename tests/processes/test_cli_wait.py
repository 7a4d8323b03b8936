"""``exo-deploy deploy --wait`` and ``set --wait`` against a real master on a loopback port: 0
once the deployment serves with every replica, 1 with the keeper's reason when it cannot be
placed, 1 saying what it is still doing at ``--timeout``, 2 for ``--timeout`` alone.

The master runs in a background thread with two simulated nodes of 32 GB, ``a`` and ``b``, and
no start-up grace, so a deployment is placed at the keeper's next step; the timeout is taken
against a master of its own still in its grace (15 s), when nothing can be placed yet. Every
wait here has a ``--timeout``, so a wait that never ends fails the test instead of hanging it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import anyio
import pytest
from anyio.abc import TaskStatus
from anyio.from_thread import start_blocking_portal
from model_ids import LLAMA, QWEN
from test_cli import run_cli

from keeper.cli import EXIT_OK, EXIT_USAGE
from keeper.cli.exits import EXIT_NOT_DONE
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

# 378 GB: more than the two nodes' 64 GB together, so the keeper says it cannot be placed.
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
# Bounds each wait that should end by itself: a small model's simulated download and load take
# seconds; on a loaded machine, several.
WAIT_BOUND = "60"
# How long simulated nodes in the master's process may take to join it and report memory.
JOINED_WITHIN_S = 10.0


def _serve(config: MasterConfig, nodes: list[NodeConfig]) -> Iterator[str]:
    master = Master(None, config=config)
    cluster = InProcessCluster(master, nodes)
    with start_blocking_portal(backend="asyncio") as portal:

        async def run(*, task_status: TaskStatus[int]) -> None:
            async with anyio.create_task_group() as group:
                await group.start(cluster.run)
                await serve(master, "127.0.0.1", 0, None, task_status=task_status)

        future, port = portal.start_task(run)

        async def joined() -> None:
            # Placement before the nodes report their memory is a cant_place, which --wait
            # rightly ends with: the tests ask of a cluster that has joined.
            with anyio.fail_after(JOINED_WITHIN_S):
                while len(master.state.node_memory) < len(nodes):
                    await anyio.sleep(0.05)

        portal.call(joined)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            future.cancel()


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    """A master with nodes a and b that places at once (no grace)."""
    yield from _serve(
        MasterConfig(startup_grace_s=0.0), [NodeConfig("a", 32.0), NodeConfig("b", 32.0)]
    )


@pytest.fixture
def graceful_url() -> Iterator[str]:
    """A master of its own, in its start-up grace (15 s) while the test runs: it places
    nothing yet."""
    yield from _serve(MasterConfig(), [NodeConfig("a", 32.0)])


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_DEPLOY_TOKEN", raising=False)
    monkeypatch.delenv("EXO_DEPLOY_URL", raising=False)


def status_of(
    capsys: pytest.CaptureFixture[str], url: str, deployment_id: str
) -> dict[str, object]:
    """The deployment's status and readiness as ``list --json`` shows them now."""
    code, out, _ = run_cli(capsys, "list", "--url", url, "--json")
    assert code == EXIT_OK
    (view,) = [
        v
        for v in json.loads(out)["deployments"]
        if v["deployment"]["deploymentId"] == deployment_id
    ]
    return {"status": view["status"], "ready": view["readyReplicas"], "of": view["replicas"]}


def test_deploy_wait_returns_0_once_the_deployment_serves(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "deploy", QWEN, "--standby", "0", "--wait", "--timeout", WAIT_BOUND,
        "--url", cluster_url,
    )  # fmt: skip
    assert code == EXIT_OK, err
    created, result = out.strip().splitlines()
    deployment_id = created.rsplit(" ", 1)[1]
    assert result == f"deployment {deployment_id} is serving (1/1 ready)"
    # It returned once the master said so, not before.
    assert status_of(capsys, cluster_url, deployment_id) == {
        "status": "serving",
        "ready": 1,
        "of": 1,
    }


def test_set_wait_returns_0_once_every_replica_serves(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "deploy", LLAMA, "--standby", "0", "--wait", "--timeout", WAIT_BOUND,
        "--url", cluster_url,
    )  # fmt: skip
    assert code == EXIT_OK, err
    deployment_id = out.splitlines()[0].rsplit(" ", 1)[1]
    code, out, err = run_cli(
        capsys, "set", deployment_id, "--replicas", "2", "--wait", "--timeout", WAIT_BOUND,
        "--url", cluster_url,
    )  # fmt: skip
    assert code == EXIT_OK, err
    assert out.strip().splitlines()[-1] == f"deployment {deployment_id} is serving (2/2 ready)"
    # What it says on its way depends on how soon the second replica is ready (it may be ready
    # at the first look): the words of "serving, 1/2 ready" are pinned by the pure rule's test
    # (tests/pure/test_cli_wait_rule.py), not by this race.
    assert status_of(capsys, cluster_url, deployment_id) == {
        "status": "serving",
        "ready": 2,
        "of": 2,
    }


def test_deploy_wait_of_a_model_too_large_exits_1_with_the_keepers_reason(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(
        capsys, "deploy", DEEPSEEK, "--wait", "--timeout", WAIT_BOUND, "--url", cluster_url
    )
    assert code == EXIT_NOT_DONE
    deployment_id = out.strip().rsplit(" ", 1)[1]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"deployment {deployment_id} cannot be placed: ")
    assert "No cycles found with sufficient memory" in last
    assert status_of(capsys, cluster_url, deployment_id)["status"] == "cant_place"


def test_deploy_wait_gives_up_at_the_timeout_saying_what_it_still_does(
    graceful_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    code, out, err = run_cli(
        capsys, "deploy", QWEN, "--wait", "--timeout", "1", "--url", graceful_url
    )
    took = time.monotonic() - started
    assert code == EXIT_NOT_DONE
    deployment_id = out.strip().rsplit(" ", 1)[1]
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"deployment {deployment_id}: still placing, 0/1 ready: grace")
    assert last.endswith("after 1 s")
    assert took < 10  # the timeout, not the grace (15 s) or anything else, ended it


def test_a_timeout_without_wait_is_bad_usage_and_sends_nothing(
    graceful_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "deploy", QWEN, "--timeout", "5", "--url", graceful_url)
    assert (code, out) == (EXIT_USAGE, "")
    assert "--timeout needs --wait" in err
    code, out, _ = run_cli(capsys, "list", "--url", graceful_url)
    assert (code, out.strip()) == (EXIT_OK, "no deployments")
