"""Broken instances for real (docs/design.md §5.19): ``exo-deploy master`` and two ``exo-deploy
node`` processes, the freer one told to misbehave (``--fault``), Qwen3-0.6B deployed. The keeper
recognises the broken instance from the State (lose-runner) or from the chats it routes
(fail-chats), says it in ``GET /deployments``, places a replacement on the other node and the
model answers chats again, on its own; the figures (fault -> recognised -> serving) are printed.

A stalled warm-up (``--fault stall-warmup``) is not run here: it is recognised only once its
runner has sat in RunnerWarmingUp past the warm-up bound (``WARM_UP_BOUND_S``, two minutes), so
it held one e2e lane for two and a half minutes of real time to check what the other two faults
check with real processes (the ``--fault`` flag reaching a node process, the repair, the model
answering again) plus the bound. The stall, the bound and the replacement are checked in virtual
time on the same master, keeper and simulated node (``tests/virtual/test_repair_virtual.py``,
``test_a_stalled_warm_up_is_replaced_and_the_model_serves_again``), and through the bridge
(``tests/virtual/test_bridge_repair.py``).
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from model_ids import QWEN
from process_helpers import chat_reply, free_port, get_json, run_cli, start_cli, stop, wait_for

pytestmark = pytest.mark.e2e


class Running:
    def __init__(self, base_url: str, processes: list[subprocess.Popen[bytes]]) -> None:
        self.base_url = base_url
        self.processes = processes

    def get(self, path: str) -> Any | None:
        return get_json(f"{self.base_url}{path}")

    def node_names(self) -> dict[str, str]:
        state = self.get("/state") or {}
        identities = state.get("nodeIdentities", {})
        return {node: facts.get("friendlyName", "") for node, facts in identities.items()}


@pytest.fixture
def faulty(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Running]:
    fault: str = request.param
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    output = (tmp_path / "out.log").open("wb")
    master = ["master", "--port", str(port), "--data-dir", str(tmp_path / "master")]
    processes = [start_cli(master, output)]
    for name, memory, flags in (("bad", "64", ["--fault", fault]), ("good", "32", [])):
        key = str(tmp_path / f"{name}.key")
        argv = ["node", "--master", base_url, "--name", name, "--memory-gb", memory]
        processes.append(start_cli([*argv, "--key-file", key, *flags], output))
    running = Running(base_url, processes)
    try:
        yield running
    finally:
        for process in reversed(processes):
            stop(process)
        output.close()


def _instance_on(running: Running, name: str) -> str | None:
    state = running.get("/state") or {}
    names = running.node_names()
    for instance_id, tagged in state.get("instances", {}).items():
        (instance,) = tagged.values()
        nodes = instance["shardAssignments"]["nodeToRunner"]
        if instance["shardAssignments"]["modelId"] == QWEN and any(
            names.get(n) == name for n in nodes
        ):
            return instance_id
    return None


@pytest.mark.parametrize(
    ("faulty", "problem"),
    [
        ("lose-runner", "hollow"),
        ("fail-chats", "failing"),
    ],
    indirect=["faulty"],
)
def test_a_broken_instance_is_replaced_and_the_model_answers_again(
    faulty: Running, problem: str
) -> None:
    wait_for("the master and 2 nodes", 30, lambda: len(faulty.node_names()) == 2 or None)
    deployed = run_cli("deploy", QWEN, "--standby", "0", "--url", faulty.base_url)
    assert deployed.returncode == 0, deployed.stderr
    broken = wait_for("placed on bad", 60, lambda: _instance_on(faulty, "bad"))
    fault_at = time.monotonic()
    said: list[dict[str, Any]] = []

    def recognised() -> bool | None:
        chat_reply(faulty.base_url, QWEN)  # the chats the failing-chats rule reads
        listed = faulty.get("/deployments") or {"deployments": []}
        health = listed["deployments"][0]["health"] if listed["deployments"] else None
        if health is not None:
            said.append(health)
        return bool(said) or _instance_on(faulty, "bad") != broken or None

    wait_for("recognised", 60, recognised)
    said_at = time.monotonic()
    wait_for(
        "answering on good",
        60,
        lambda: _instance_on(faulty, "good") and chat_reply(faulty.base_url, QWEN),
    )
    served_at = time.monotonic()
    wait_for("the broken one deleted", 30, lambda: _instance_on(faulty, "bad") is None or None)
    if said:
        assert said[0]["problem"] == problem and said[0]["instance"] == broken
    print(
        f"{problem}: recognised {said_at - fault_at:.1f} s after placement on the faulty node, "
        f"answering again {served_at - said_at:.1f} s later"
    )
