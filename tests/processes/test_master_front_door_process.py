"""Chats through our master's front door while one of two replicas' node is killed -9
(docs/design.md §8.6, §6.8), as processes.

``exo-deploy master`` (with the door's flags) and two ``exo-deploy node`` processes on sockets,
Qwen3-0.6B at replicas 2, one instance on each node. Four clients stream chats one after another
through the master's ``POST /v1/chat/completions`` the whole time, and one replica's node is
killed with SIGKILL while they do: its connection closes, the master sends no new chat there,
and the door continues each answer the kill cut on the other replica. Every chat is counted by
how it ended for its client (``chat_outcomes``: ok, failed, cut) or hung (no end within
``HUNG_S``). Target: none failed, cut or hung, and ``/metrics`` counting every chat, some of them
continued (``migrated``). Before the door, the master's routing alone lost 2 of 117 chats (503)
to the same kill.

The two instances are placed with exo's ``POST /place_instance`` before the deployment exists:
the keeper places nothing within its 15 s startup grace (docs/design.md §5.6), and this test
stays well under 20 s. The second is placed once the first's node reports the memory its runner
holds, so that exo's placement (the most free memory, §4.1 rule 8) puts it on the other node;
the deployment then counts both as its replicas (any instance of its model is one, §5.11).
Every wait has a deadline, the clients stop on a flag, and every process is stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import shared_http as http
from chat_outcomes import Outcome, chat_body, outcome_of
from metrics_scrape import parse
from model_ids import QWEN
from process_helpers import (
    START_DEADLINE_S,
    free_port,
    get_json,
    model_instances,
    start_cli,
    stop,
    wait_for,
)

from keeper.model.request_rule import OUTCOMES as COUNTED
from keeper.sim.node.sim_node import DEFAULT_TOKENS_PER_S

pytestmark = pytest.mark.e2e

CLIENTS = 4
# Tokens per chat: a second of a simulated node's answer (20 a second), its first after 50 ms:
# 95 % of a chat's time is mid-answer, so the kill cuts answers rather than catching chats
# before their first token (which the master's routing sends elsewhere unseen by the door).
TOKENS = 20
# The door's hold (--hold-s): the other replica serves throughout, so no chat should wait; a
# short hold bounds a run where one would.
HOLD_S = 10
# A chat with no end after this long is hung: the hold and an answer fit with room.
HUNG_S = 20.0
# Chats answered before the kill (every client under way), and after it (the other replica
# serving every client).
BEFORE = CLIENTS
AFTER = CLIENTS
NODES = ("a", "b")


@dataclass
class Chats:
    """Clients streaming chats one after another until ``stop``, each counted by outcome."""

    url: str
    stop: threading.Event = field(default_factory=threading.Event)
    counts: Counter[Outcome] = field(default_factory=Counter[Outcome])
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, offset_s: float) -> None:
        """Chats from ``offset_s`` on: the clients start spread over one answer, so that the kill
        finds each at another point of its answer, not all of them just starting."""
        self.stop.wait(offset_s)
        with httpx.Client(trust_env=False, timeout=HUNG_S) as client:
            while not self.stop.is_set():
                outcome = self._chat(client)
                with self.lock:
                    self.counts[outcome] += 1

    def _chat(self, client: httpx.Client) -> Outcome:
        started = time.monotonic()
        status, body = 0, bytearray()
        try:
            with client.stream(
                "POST", f"{self.url}/v1/chat/completions", json=chat_body(TOKENS)
            ) as answer:
                status = answer.status_code
                for piece in answer.iter_bytes():
                    body += piece
                    if time.monotonic() - started > HUNG_S:
                        return "hung"  # still coming (keep-alives), but no end in time
        except httpx.TimeoutException:
            return "hung"
        except httpx.TransportError:
            pass  # no answer, or one broken off: read as what came
        return outcome_of(status, bytes(body), TOKENS)

    def total(self, outcome: Outcome) -> int:
        with self.lock:
            return self.counts[outcome]


@dataclass
class Running:
    url: str
    nodes: dict[str, subprocess.Popen[bytes]]

    def state(self) -> dict[str, Any]:
        return get_json(f"{self.url}/state") or {}

    def node_named(self, name: str) -> str | None:
        identities = self.state().get("nodeIdentities", {})
        return next((n for n, i in identities.items() if i.get("friendlyName") == name), None)

    def instances(self) -> dict[str, str]:
        """Qwen's instances, in the State's order: instance id -> the node id holding it."""
        return dict(model_instances(self.state(), QWEN))


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "out.log").open("wb") as output:
        door = ["--hold-s", str(HOLD_S), "--migrations", "2", "--max-inflight", "64"]
        master = ["master", "--port", str(port), "--data-dir", str(tmp_path / "master"), *door]
        processes = [start_cli(master, output)]
        nodes: dict[str, subprocess.Popen[bytes]] = {}
        for name in NODES:
            key = str(tmp_path / f"{name}.key")
            argv = ["node", "--master", url, "--name", name, "--memory-gb", "16", "--has", QWEN]
            nodes[name] = start_cli([*argv, "--key-file", key], output)
            processes.append(nodes[name])
        try:
            yield Running(url, nodes)
        finally:
            for process in reversed(processes):
                stop(process)


def _held_memory(running: Running, node_id: str) -> bool | None:
    """Whether the node reports memory held (a runner's), as exo's placement reads it."""
    memory = running.state().get("nodeMemory", {}).get(node_id)
    if memory is None:
        return None
    held = memory["ramAvailable"]["inBytes"] < memory["ramTotal"]["inBytes"]
    return True if held else None


def _place(running: Running) -> str:
    """Place one more Qwen instance with exo's ``POST /place_instance``; the node it is on."""
    before = running.instances()
    placed = http.post(f"{running.url}/place_instance", json={"model_id": QWEN})
    assert placed.status_code == 200, placed.text
    new = wait_for("the instance in the State", 10, lambda: set(running.instances()) - set(before))
    (instance,) = new
    return running.instances()[instance]


def _requests_counted(url: str, deployment: str) -> dict[str, float]:
    """``exo_deploy_requests_total`` of the deployment, by outcome (0 for one not counted)."""
    _, samples = parse(http.get(f"{url}/metrics", timeout=5.0).text)
    return {
        outcome: samples.get(
            (
                "exo_deploy_requests_total",
                frozenset({("deployment", deployment), ("outcome", outcome)}),
            ),
            0.0,
        )
        for outcome in COUNTED
    }


@pytest.mark.e2e(seconds=20)
def test_no_chat_through_the_master_s_front_door_fails_is_cut_or_hangs_in_a_kill(
    running: Running,
) -> None:
    nodes = [
        wait_for(
            f"node {name} joined", START_DEADLINE_S, lambda name=name: running.node_named(name)
        )
        for name in NODES
    ]
    for node in nodes:
        wait_for(
            "its memory reported",
            10,
            lambda node=node: node in running.state()["nodeMemory"] or None,
        )
    first = _place(running)
    wait_for("the first node's runner memory reported", 10, lambda: _held_memory(running, first))
    second = _place(running)
    assert second != first, "the second instance went on the first's node"
    created = http.post(f"{running.url}/deployments", json={"model_id": QWEN, "replicas": 2})
    assert created.status_code == 200, created.text
    deployment: str = created.json()["deployment_id"]

    def serving_two() -> bool | None:
        listed = get_json(f"{running.url}/deployments") or {"deployments": []}
        views = listed["deployments"]
        return True if views and views[0]["readyReplicas"] == 2 else None

    wait_for("two ready replicas", 30, serving_two)
    (victim_node, *_) = running.instances().values()  # ties go to the first: it has chats
    victim = next(name for name in NODES if running.node_named(name) == victim_node)

    chats = Chats(running.url)
    answer_s = TOKENS / DEFAULT_TOKENS_PER_S
    clients = [
        threading.Thread(target=chats.client, args=(index * answer_s / CLIENTS,))
        for index in range(CLIENTS)
    ]
    for thread in clients:
        thread.start()
    try:
        wait_for("chats answered", 30, lambda: chats.total("ok") >= BEFORE or None)
        os.killpg(running.nodes[victim].pid, signal.SIGKILL)
        answered = chats.total("ok")
        wait_for(
            "chats answered after the kill",
            30,
            lambda: chats.total("ok") >= answered + AFTER or None,
        )
    finally:
        chats.stop.set()
        for thread in clients:
            thread.join(timeout=HUNG_S + 5)
    assert not any(thread.is_alive() for thread in clients), "a client did not stop"
    seen = dict(chats.counts)
    print(f"\nkill -9 of one of two replicas' node, the clients' chats: {seen}")
    assert (seen.get("failed", 0), seen.get("cut", 0), seen.get("hung", 0)) == (0, 0, 0), seen

    def all_counted() -> dict[str, float] | None:
        counted = _requests_counted(running.url, deployment)
        return counted if sum(counted.values()) == sum(seen.values()) else None

    # Each chat is counted as it ends, which its client sees at once: wait for the last.
    counted = wait_for("every chat counted in /metrics", 5, all_counted)
    print(f"the door's counts in /metrics: {counted}")
    assert counted["failed"] == 0
    assert counted["migrated"] > 0  # answers the kill cut, continued on the other replica
