"""The bridge for real: ``exo-deploy cluster --exo-compat`` + ``exo-deploy bridge`` as processes.

The cluster's master is the stand-in for a stock exo master (no keeper, exo's API); the bridge
follows it over HTTP. The story: deploy through the bridge from the shell, wait until the model
answers a chat on exo's API, ``kill -9`` the node serving it, and wait until it answers again
(exo times the node out and deletes the instance; the bridge sees the model has none and POSTs
a new one). Then the bridge's own deployments API still lists it as serving, and SIGTERM stops
everything. Membership timings are shortened so it fits well under a minute; the keeper's 15 s
startup grace is the real one. Every wait has a deadline; every process is cleaned up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from model_ids import QWEN as MODEL
from process_helpers import (
    START_DEADLINE_S,
    alive,
    chat_reply,
    cluster_argv,
    free_port,
    get_json,
    model_instances,
    run_cli,
    start_cli,
    stop,
    wait_for,
)

pytestmark = pytest.mark.e2e


@dataclass
class Processes:
    data_dir: Path
    exo_url: str
    bridge_url: str
    cluster: subprocess.Popen[bytes]
    bridge: subprocess.Popen[bytes]

    def layout(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.data_dir / "cluster" / "cluster.json").read_text())
        except (OSError, ValueError):
            return None

    def node_pids(self) -> dict[str, int | None]:
        layout = self.layout()
        return {} if layout is None else {n["name"]: n["pid"] for n in layout["nodes"]}

    def chat(self) -> str | None:
        return chat_reply(self.exo_url, MODEL)

    def serving_node(self) -> tuple[str, str] | None:
        """(instance id, name of the node holding it) of the model's instance in exo."""
        state = get_json(f"{self.exo_url}/state")
        layout = self.layout()
        if state is None or layout is None:
            return None
        for instance_id, node_id in model_instances(state, MODEL):
            names = [n["name"] for n in layout["nodes"] if n["node_id"] == node_id]
            return (instance_id, names[0]) if names else None
        return None


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    exo_port, bridge_port = free_port(), free_port()
    exo_url = f"http://127.0.0.1:{exo_port}"
    cluster_out = (tmp_path / "cluster.out").open("wb")
    bridge_out = (tmp_path / "bridge.out").open("wb")
    cluster = start_cli(cluster_argv(exo_port, tmp_path / "cluster", "--exo-compat"), cluster_out)
    bridge = start_cli(
        [
            "bridge",
            "--exo",
            exo_url,
            "--port",
            str(bridge_port),
            "--data-dir",
            str(tmp_path / "bridge"),
        ],
        bridge_out,
    )
    running = Processes(tmp_path, exo_url, f"http://127.0.0.1:{bridge_port}", cluster, bridge)
    try:
        yield running
    finally:
        stop(bridge)
        stop(cluster)
        cluster_out.close()
        bridge_out.close()


def bridge_follows_exo(processes: Processes) -> None:
    """Until exo has its 3 nodes and the bridge reaches it."""

    def ready() -> bool | None:
        health = get_json(f"{processes.bridge_url}/healthz")
        nodes = processes.node_pids()
        exo_state = get_json(f"{processes.exo_url}/state")
        ready = (
            health is not None
            and health["exo"]["reachable"]
            and len(nodes) == 3
            and exo_state is not None
            and len(exo_state["topology"]["nodes"]) == 3
        )
        return True if ready else None

    wait_for("exo's 3 nodes and the bridge following it", START_DEADLINE_S, ready)


@pytest.mark.e2e(seconds=37)
def test_a_killed_node_s_model_serves_again_through_the_bridge(processes: Processes) -> None:
    started = time.monotonic()
    bridge_follows_exo(processes)
    deployed = run_cli("deploy", MODEL, "--url", processes.bridge_url, "--json")
    assert deployed.returncode == 0, deployed.stderr
    deployment_id = json.loads(deployed.stdout)["deployment_id"]

    assert wait_for("the model to answer on exo's API", 40, processes.chat)
    first_instance, holder = wait_for("its instance in exo", 5, processes.serving_node)
    pid = processes.node_pids()[holder]
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()

    def replaced() -> tuple[str, str] | None:
        found = processes.serving_node()
        return found if found is not None and found[0] != first_instance else None

    second_instance, new_holder = wait_for("a new instance on another node", 30, replaced)
    assert new_holder != holder
    assert wait_for("the model to answer again", 30, processes.chat)
    recovery_s = time.monotonic() - killed_at

    listed = run_cli("list", "--url", processes.bridge_url, "--json")
    assert listed.returncode == 0, listed.stderr
    (view,) = json.loads(listed.stdout)["deployments"]
    assert view["deployment"]["deploymentId"] == deployment_id
    assert view["status"] == "serving"
    wait_for(
        "the bridge to record the new instance",
        5,
        lambda: (
            True
            if (get_json(f"{processes.bridge_url}/state") or {})
            .get("deployments", {})
            .get(deployment_id, {})
            .get("instanceId")
            == second_instance
            else None
        ),
    )
    print(
        f"\nbridge: serving {killed_at - started:.1f} s after start (15 s grace); "
        f"node kill -> serving again {recovery_s:.1f} s"
    )

    nodes = [pid for pid in processes.node_pids().values() if pid is not None]
    assert stop(processes.bridge) == 0
    assert stop(processes.cluster) == 0
    assert [pid for pid in nodes if alive(pid)] == []


@pytest.mark.e2e(seconds=25)
def test_deploy_wait_through_the_bridge_returns_once_exo_serves_it(processes: Processes) -> None:
    """``deploy --wait`` against the bridge: it returns 0 once the bridge's deployments API says
    serving (placed through exo's API, after the keeper's grace), and by then the model answers
    on exo's API."""
    bridge_follows_exo(processes)
    deployed = run_cli("deploy", MODEL, "--wait", "--timeout", "45", "--url", processes.bridge_url)
    assert deployed.returncode == 0, deployed.stderr
    created, result = deployed.stdout.strip().splitlines()
    deployment_id = created.rsplit(" ", 1)[1]
    assert result == f"deployment {deployment_id} is serving (1/1 ready)"
    assert f"deployment {deployment_id}: placing, 0/1 ready" in deployed.stderr  # it waited
    assert processes.chat() is not None
