"""Replicas for real: ``exo-deploy cluster`` as processes, a model at replicas 2 on 3 nodes,
chats sent without pause, and ``kill -9`` of the node serving them.

What it shows (docs/design.md §6.8, §5.11): no chat fails, because the master stops choosing
the killed node as soon as its connection closes (long before it times out) and a chat caught
on it before its first token is sent once more to the other replica; and the keeper restores
the second replica on the third node once the node times out and the sweep deletes its
instance. Each chat asks for one token, so it is either answered or caught before its first
token: a reply cut after its first token is an error by design and is tested in
``test_chat_replicas.py``.

Membership timings are shortened (``--node-timeout``/``--sweep-interval``); the 15 s startup
grace is the real one. Every wait is on a condition with a deadline; the chat clients stop on a
flag or after a bounded count, and every process is cleaned up even on failure.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import shared_http as http
from process_helpers import START_DEADLINE_S, model_instances, wait_for
from test_e2e_cluster import MODEL, Cluster, _all_up, running_cluster

pytestmark = pytest.mark.e2e

CLIENTS = 2
# Each client's cap: far more than the test needs, so a stuck flag cannot loop for ever.
MAX_CHATS_PER_CLIENT = 5_000
CHAT_TIMEOUT_S = 10.0


@dataclass
class Chats:
    """Clients sending one-token chats back to back until ``stop`` is set."""

    url: str
    model: str = MODEL
    stop: threading.Event = field(default_factory=threading.Event)
    answered: int = 0
    failures: list[str] = field(default_factory=list[str])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
        }
        with httpx.Client(trust_env=False, timeout=CHAT_TIMEOUT_S) as http:
            for _ in range(MAX_CHATS_PER_CLIENT):
                if self.stop.is_set():
                    return
                try:
                    response = http.post(f"{self.url}/v1/chat/completions", json=body)
                    failure = (
                        None
                        if response.status_code == 200
                        and response.json()["choices"][0]["message"]["content"]
                        else f"{response.status_code}: {response.text[:200]}"
                    )
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if failure is None:
                        self.answered += 1
                    else:
                        self.failures.append(failure)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


def _ready_replicas(cluster: Cluster) -> int | None:
    listed = cluster.get("/deployments")
    if listed is None or not listed["deployments"]:
        return None
    return listed["deployments"][0]["readyReplicas"]


def _model_instances(cluster: Cluster) -> dict[str, str]:
    """Instance id -> the node id holding it, for the model's instances, in State order."""
    state = cluster.get("/state") or {}
    return dict(model_instances(state, MODEL))


def test_no_chat_fails_when_the_node_of_a_replica_is_killed(cluster: Cluster) -> None:
    wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))
    created = http.post(f"{cluster.url}/deployments", json={"model_id": MODEL, "replicas": 2})
    assert created.status_code == 200, created.text
    wait_for("two ready replicas", 40, lambda: True if _ready_replicas(cluster) == 2 else None)
    before = _model_instances(cluster)
    assert len(set(before.values())) == 2  # on two nodes apart

    chats = Chats(cluster.url)
    clients = [threading.Thread(target=chats.client) for _ in range(CLIENTS)]
    for client in clients:
        client.start()
    try:
        wait_for("chats answered", 10, lambda: True if chats.answered >= 20 else None)
        # kill -9 the node of the first replica in State order: every tie goes to it.
        victim_instance, victim_node = next(iter(before.items()))
        layout = cluster.layout()
        assert layout is not None
        (name,) = [n["name"] for n in layout["nodes"] if n["node_id"] == victim_node]
        os.kill(cluster.pid_of(name), signal.SIGKILL)
        killed_at = time.monotonic()
        answered_at_kill = chats.answered

        def restored() -> bool | None:
            now = _model_instances(cluster)
            return (
                True
                if victim_instance not in now
                and len(now) == 2
                and victim_node not in now.values()
                and _ready_replicas(cluster) == 2
                else None
            )

        wait_for("the second replica restored on the third node", 30, restored)
        restored_s = time.monotonic() - killed_at
        wait_for(
            "chats answered after the restore",
            10,
            lambda: True if chats.answered >= answered_at_kill + 40 else None,
        )
    finally:
        chats.stop.set()
        for client in clients:
            client.join(timeout=CHAT_TIMEOUT_S + 5)
    assert chats.failures == []
    print(
        f"\n{chats.answered} chats answered, none failed; kill -9 -> two ready replicas again "
        f"{restored_s:.1f} s"
    )
