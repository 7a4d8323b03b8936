"""The real thing: ``exo-deploy cluster`` as processes on sockets, hurt with ``kill -9``.

One test walks the issue's story: start a 3-node cluster, deploy from the shell, wait until the
model answers a chat, ``kill -9`` the node serving it and wait until it answers again (the
master times the node out, the sweep deletes the instance, the keeper places it on another
node), then ``kill -9`` the master: the cluster restarts it, it rebuilds its State from the log,
the deployment is still there and the model serves again. Finally SIGTERM stops the cluster and
every process it started is checked to be gone.

Membership timings are shortened (``--node-timeout``/``--sweep-interval``) so this fits in well
under a minute; the keeper's own timings, the 15 s startup grace included, are the real ones.
Every wait is on a condition with a deadline; every process is cleaned up even on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
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
class Cluster:
    process: subprocess.Popen[bytes]
    data_dir: Path
    url: str
    pids_seen: set[int] = field(default_factory=set[int])

    def layout(self) -> dict[str, Any] | None:
        try:
            layout: dict[str, Any] = json.loads((self.data_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        pids = [layout["master"]["pid"], *(node["pid"] for node in layout["nodes"])]
        self.pids_seen.update(pid for pid in pids if pid is not None)
        return layout

    def pid_of(self, name: str) -> int:
        layout = self.layout()
        assert layout is not None
        (pid,) = [node["pid"] for node in layout["nodes"] if node["name"] == name]
        return pid

    def master_pid(self) -> int | None:
        layout = self.layout()
        return layout["master"]["pid"] if layout is not None else None

    def get(self, path: str) -> Any | None:
        return get_json(self.url + path)

    def chat(self) -> str | None:
        """The reply text if the model answers right now, else None."""
        return chat_reply(self.url, MODEL)

    def serving_node(self) -> tuple[str, str] | None:
        """(instance id, friendly name of its node) of the model's instance, if any."""
        state = self.get("/state")
        if state is None:
            return None
        for instance_id, node_id in model_instances(state, MODEL):
            layout = self.layout()
            assert layout is not None
            (name,) = [n["name"] for n in layout["nodes"] if n["node_id"] == node_id]
            return instance_id, name
        return None

    def cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*argv, "--url", self.url)


@contextlib.contextmanager
def running_cluster(data_dir: Path) -> Iterator[Cluster]:
    """A 3-node cluster with shortened membership timings, its output in ``data_dir``; on the
    way out it is stopped and any process of it still alive is killed."""
    port = free_port()
    output = (data_dir / "cluster.out").open("wb")
    process = start_cli(cluster_argv(port, data_dir), output)
    running = Cluster(process, data_dir, f"http://127.0.0.1:{port}")
    try:
        yield running
    finally:
        running.layout()
        stop(process)
        for pid in running.pids_seen:
            if alive(pid):  # only if the cluster failed to clean up: never leave one behind
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        output.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


def test_cluster_survives_a_killed_node_and_a_killed_master(cluster: Cluster) -> None:
    started = time.monotonic()
    wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))

    deployed = cluster.cli("deploy", MODEL, "--json")
    assert deployed.returncode == 0, deployed.stderr
    deployment_id = json.loads(deployed.stdout)["deployment_id"]

    # Serving after the master's 15 s startup grace and a load.
    assert wait_for("the model to answer", 45, cluster.chat)
    first_instance, holder = wait_for("its instance", 5, cluster.serving_node)
    serving_at = time.monotonic()

    # kill -9 the node serving it: the keeper places it elsewhere and it answers again.
    os.kill(cluster.pid_of(holder), signal.SIGKILL)
    killed_at = time.monotonic()

    def replaced() -> tuple[str, str] | None:
        found = cluster.serving_node()
        return found if found is not None and found[0] != first_instance else None

    second_instance, new_holder = wait_for("a new instance on another node", 30, replaced)
    assert new_holder != holder
    assert wait_for("the model to answer again", 30, cluster.chat)
    node_recovery_s = time.monotonic() - killed_at

    # kill -9 the master: the cluster restarts it from its log; the deployment is still there.
    old_master = cluster.master_pid()
    assert old_master is not None
    os.kill(old_master, signal.SIGKILL)
    master_killed_at = time.monotonic()
    wait_for(
        "a new master",
        30,
        lambda: True if cluster.master_pid() not in (None, old_master) else None,
    )

    def listed_ok() -> subprocess.CompletedProcess[str] | None:
        done = cluster.cli("list", "--json")
        return done if done.returncode == 0 else None

    listed = wait_for("the restarted master to list deployments", 30, listed_ok)
    (view,) = json.loads(listed.stdout)["deployments"]
    assert view["deployment"]["deploymentId"] == deployment_id
    assert view["deployment"]["instanceId"] == second_instance
    assert wait_for("the model to answer after the master restart", 30, cluster.chat)
    master_recovery_s = time.monotonic() - master_killed_at
    # The nodes reported their instance back: nothing was placed twice.
    assert cluster.serving_node() == (second_instance, new_holder)

    print(
        f"\nserving {serving_at - started:.1f} s after start; node kill -> serving again "
        f"{node_recovery_s:.1f} s; master kill -> serving again {master_recovery_s:.1f} s"
    )

    # Ctrl-C (SIGTERM) stops everything it started.
    pids = set(cluster.pids_seen)
    os.killpg(cluster.process.pid, signal.SIGTERM)
    assert cluster.process.wait(timeout=20) == 0
    assert [pid for pid in pids if alive(pid)] == []


def _all_up(cluster: Cluster) -> bool | None:
    layout = cluster.layout()
    if layout is None or any(node["pid"] is None for node in layout["nodes"]):
        return None
    health = cluster.get("/healthz")
    return True if health is not None and health["nodes_connected"] == 3 else None
