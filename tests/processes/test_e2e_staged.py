"""Staged failover for real: ``exo-deploy cluster`` as processes whose nodes download slowly and
hold no model at start, Qwen3-0.6B deployed with ``standby 1``, ``kill -9`` of the node serving
it (docs/design.md §5.12).

What it shows: before the kill, the keeper has had a second node download the model (its copy
reads ``completed``); after it, the new instance lands on that node and serves without a
download in the way: from the moment the master deletes the lost instance (detection) to an
answered chat takes the load and little more (the download alone would take about 16 s at the
rate used).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_ids import QWEN
from process_helpers import (
    NODE_TIMEOUT_S,
    START_DEADLINE_S,
    chat_reply,
    cluster_argv,
    free_port,
    model_instances,
    start_cli,
    stop,
    wait_for,
)
from test_e2e_cluster import Cluster, _all_up

pytestmark = pytest.mark.e2e

# 20 MB/s: Qwen3-0.6B's 343 MB take about 16 s to download, far more than its load.
DOWNLOAD_MB_S = 20
# The load of 343 MB at the simulation's 2 GB/s, and the polls that see it (50 ms each way).
LOAD_AND_POLLS_S = 1.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    port = free_port()
    output = (tmp_path / "cluster.out").open("wb")
    argv = cluster_argv(port, tmp_path, "--download-mb-s", str(DOWNLOAD_MB_S))
    process = start_cli(argv, output)
    running = Cluster(process, tmp_path, f"http://127.0.0.1:{port}")
    try:
        yield running
    finally:
        running.layout()
        stop(process)
        output.close()


def _view(cluster: Cluster) -> dict[str, Any] | None:
    listed = cluster.get("/deployments")
    return listed["deployments"][0] if listed and listed["deployments"] else None


def _staged_node(cluster: Cluster) -> str | None:
    """The node holding the standby copy, once it is completely downloaded."""
    view = _view(cluster)
    if view is None or view["readyReplicas"] != 1:
        return None
    done = [copy["node_id"] for copy in view["staged"] if copy["state"] == "completed"]
    return done[0] if done else None


def _instance(cluster: Cluster) -> tuple[str, str] | None:
    state = cluster.get("/state") or {}
    found = list(model_instances(state, QWEN))
    return found[0] if len(found) == 1 else None


@pytest.mark.e2e(seconds=40)
def test_a_kill_lands_on_the_staged_node_and_serves_without_a_download(cluster: Cluster) -> None:
    wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))
    created = cluster.cli("deploy", QWEN, "--standby", "1")
    assert created.returncode == 0, created.stderr
    # Startup grace, a download on the first node, its load; then the standby copy's download.
    staged_on = wait_for("the standby copy downloaded", 120, lambda: _staged_node(cluster))
    old_instance, serving_node = wait_for("its instance", 5, lambda: _instance(cluster))
    assert staged_on != serving_node
    layout = cluster.layout()
    assert layout is not None
    (name,) = [n["name"] for n in layout["nodes"] if n["node_id"] == serving_node]

    os.kill(cluster.pid_of(name), signal.SIGKILL)
    killed_at = time.monotonic()

    def lost() -> bool | None:
        state = cluster.get("/state") or {}
        return True if old_instance not in state.get("instances", {}) else None

    wait_for("the lost instance deleted", NODE_TIMEOUT_S + 10, lost)
    detected_at = time.monotonic()
    assert wait_for("the model to answer again", 30, lambda: chat_reply(cluster.url, QWEN))
    serving_at = time.monotonic()
    new_instance, new_node = wait_for("the new instance", 5, lambda: _instance(cluster))
    assert new_instance != old_instance
    assert new_node == staged_on  # where the copy was staged
    state = cluster.get("/state") or {}
    entries = state.get("downloads", {}).get(new_node, [])
    kinds = {kind for entry in entries for kind in entry}
    assert "DownloadOngoing" not in kinds  # nothing downloaded on the way
    detection_s = detected_at - killed_at
    after_detection_s = serving_at - detected_at
    assert after_detection_s <= LOAD_AND_POLLS_S + 1.0, after_detection_s
    print(
        f"\nkill -> serving {serving_at - killed_at:.1f} s on the staged node: detected "
        f"{detection_s:.1f} s, then serving {after_detection_s:.2f} s later (no download; "
        f"{342_884_352 / DOWNLOAD_MB_S / 1e6:.0f} s at {DOWNLOAD_MB_S} MB/s without the copy)"
    )
