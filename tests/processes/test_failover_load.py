"""Chats under load through our master while one of two replicas' node is killed -9 (docs/design.md
§5.18): ``exo-deploy cluster`` as processes with exo's own membership timings and the failover
flags at their defaults, Qwen3-0.6B at replicas 2 on 3 nodes that all hold it.

Four clients send one-token chats back to back through the master the whole time. The kill
closes the node's connection: the master sends no new chat there from then on (the other
replica is ready), a replacement is placed on the third node, and the lost instance is deleted.
Only chats already on the killed node can fail. Target: at least 99.9 % answered. A thread reads
the State every 50 ms: never more than replicas + 1 instances.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest
import shared_http as http
from model_ids import QWEN
from process_helpers import START_DEADLINE_S, wait_for
from test_e2e_cluster import _all_up
from test_e2e_drain import Watch
from test_e2e_failover import instances, name_of, running
from test_e2e_replicas import CHAT_TIMEOUT_S, Chats

pytestmark = pytest.mark.e2e

CLIENTS = 4
# Chats answered before the kill, and after the model is back at 2 ready replicas: enough that
# one failed chat in a thousand shows.
CHATS_BEFORE = 200
CHATS_AFTER = 1000


def ready_replicas(url: str) -> int | None:
    try:
        listed = http.get(f"{url}/deployments", timeout=5.0).json()
    except (httpx.HTTPError, ValueError):
        return None
    (deployment,) = listed["deployments"]
    return deployment["readyReplicas"]


@pytest.mark.e2e(seconds=60)
def test_chats_under_load_through_a_kill_of_one_of_two_replicas(tmp_path: Path) -> None:
    with running(tmp_path) as cluster:
        wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))
        created = http.post(
            f"{cluster.url}/deployments",
            json={"model_id": QWEN, "replicas": 2},
        )
        assert created.status_code == 200, created.text
        wait_for("2 replicas ready", 60, lambda: ready_replicas(cluster.url) == 2 or None)
        first = instances(cluster)
        chats = [Chats(cluster.url, QWEN) for _ in range(CLIENTS)]
        watch = Watch(cluster, (QWEN,))
        threads = [threading.Thread(target=c.client) for c in chats]
        threads.append(threading.Thread(target=watch.run))
        for thread in threads:
            thread.start()

        def answered() -> int:
            return sum(c.answered for c in chats)

        try:
            wait_for("chats answered", 30, lambda: answered() >= CHATS_BEFORE or None)
            victim_instance, victim_node = next(iter(first.items()))
            node_pid = cluster.pid_of(name_of(cluster, victim_node))
            os.killpg(node_pid, signal.SIGKILL)
            killed_at = time.monotonic()
            wait_for(
                "the lost instance deleted and 2 replicas ready again",
                60,
                lambda: (
                    (victim_instance not in instances(cluster) and ready_replicas(cluster.url) == 2)
                    or None
                ),
            )
            recovered_s = time.monotonic() - killed_at
            after = answered()
            wait_for("chats answered after", 60, lambda: answered() >= after + CHATS_AFTER or None)
        finally:
            for c in chats:
                c.stop.set()
            watch.stop.set()
            for thread in threads:
                thread.join(timeout=CHAT_TIMEOUT_S + 5)
        failures = [f for c in chats for f in c.failures]
        total = answered() + len(failures)
        share = answered() / total
        print(
            f"\nkill -9 of one of 2 replicas under load: {answered()} of {total} chats "
            f"answered ({100 * share:.3f} %), {len(failures)} failed {failures[:3]}; back at 2 "
            f"ready replicas {recovered_s:.1f} s after the kill; most instances "
            f"{watch.most[QWEN]}"
        )
        assert watch.most[QWEN] <= 3  # replicas + 1
        assert share >= 0.999
