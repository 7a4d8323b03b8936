"""Fast failover through the bridge for real (docs/design.md §5.18): ``exo-deploy cluster
--exo-compat`` (the stand-in for a stock exo master, with exo's own 30 s timeout and 10 s sweep
and nothing faster: ``--suspect-after-s 0``) and ``exo-deploy bridge`` following it, as
processes. Qwen3-0.6B at replicas 1 with a standby copy; every node holds the model (staged).

The stand-in is no node, so the bridge has no node's own URL to probe: it confirms a silent node
by ``--dead-after-s`` of silence while the others are heard. "Serving again" is timed as a stock
exo would serve: exo's master gives a chat to the model's instance with the fewest tasks,
whatever its node, so chats can land on the dead node's instance until it is deleted. It is the
later of a chat answered on exo's API and the lost instance gone from exo's State.

With fast failover on: a 2 s freeze (SIGSTOP) of the serving node makes no verdict and no
replacement; a kill -9 serves again within ``--dead-after-s`` + 1 s. Off (the bridge's
``--suspect-after-s 0``): the same kill waits for exo's timeout and sweep. A thread reads exo's
State every 50 ms throughout: never more than replicas + 1 instances.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from model_ids import QWEN
from process_helpers import (
    alive,
    chat_reply,
    free_port,
    get_json,
    model_instances,
    run_cli,
    start_cli,
    stop,
    wait_for,
)

from keeper.model.liveness import DEFAULT_DEAD_AFTER_S

pytestmark = pytest.mark.e2e

WATCH_EVERY_S = 0.05


@dataclass
class Running:
    data_dir: Path
    exo_url: str
    bridge_url: str
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list[subprocess.Popen[bytes]])
    pids_seen: set[int] = field(default_factory=set)

    def layout(self) -> dict[str, Any] | None:
        layout = get_json_file(self.data_dir / "cluster" / "cluster.json")
        if layout is not None:
            self.pids_seen.update(n["pid"] for n in layout["nodes"] if n["pid"] is not None)
        return layout

    def pid_of(self, name: str) -> int:
        layout = self.layout()
        assert layout is not None
        (pid,) = [n["pid"] for n in layout["nodes"] if n["name"] == name]
        return pid

    def instances(self) -> dict[str, str]:
        """Instance id -> node id of Qwen's instances in exo's State."""
        return dict(model_instances(get_json(f"{self.exo_url}/state") or {}, QWEN))

    def serving(self) -> tuple[str, str] | None:
        """(instance id, node name) of the one instance, once it answers a chat."""
        found = self.instances()
        layout = self.layout()
        if len(found) != 1 or layout is None or chat_reply(self.exo_url, QWEN) is None:
            return None
        ((instance_id, node_id),) = found.items()
        names = [n["name"] for n in layout["nodes"] if n["node_id"] == node_id]
        return (instance_id, names[0]) if names else None

    def liveness(self) -> dict[str, str] | None:
        """Each node's liveness by the bridge's GET /nodes."""
        listed = get_json(f"{self.bridge_url}/nodes")
        return None if listed is None else {n["name"]: n["liveness"] for n in listed["nodes"]}


def get_json_file(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def running(tmp_path: Path, *bridge_flags: str) -> Iterator[Running]:
    exo_port, bridge_port = free_port(), free_port()
    exo_url = f"http://127.0.0.1:{exo_port}"
    outputs = [(tmp_path / f"{n}.out").open("wb") for n in ("cluster", "bridge")]
    cluster_argv = [
        "cluster",
        "--exo-compat",
        "--suspect-after-s",
        "0",  # the stand-in keeps exo's rules only: 30 s timeout, 10 s sweep
        "--nodes",
        "3",
        "--port",
        str(exo_port),
        "--data-dir",
        str(tmp_path / "cluster"),
        "--has",
        QWEN,
        "--no-node-restart",
    ]
    bridge_argv = [
        "bridge",
        *bridge_flags,
        "--exo",
        exo_url,
        "--port",
        str(bridge_port),
        "--data-dir",
        str(tmp_path / "bridge"),
    ]
    run = Running(tmp_path, exo_url, f"http://127.0.0.1:{bridge_port}")
    run.processes = [start_cli(cluster_argv, outputs[0]), start_cli(bridge_argv, outputs[1])]
    try:
        yield run
    finally:
        run.layout()
        for pid in run.pids_seen:  # a frozen one would not stop
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGCONT)
        for process in reversed(run.processes):
            stop(process)
        for pid in run.pids_seen:
            if alive(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        for output in outputs:
            output.close()


class Watch:
    """exo's State and the bridge's nodes read every 50 ms: the most instances of Qwen seen, and
    every node the bridge ever judged other than alive."""

    def __init__(self, run: Running) -> None:
        self.run = run
        self.most = 0
        self.judged: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.most = max(self.most, len(self.run.instances()))
            liveness = self.run.liveness() or {}
            self.judged.update(name for name, phase in liveness.items() if phase != "alive")
            time.sleep(WATCH_EVERY_S)


def deploy_and_wait(run: Running) -> tuple[str, str]:
    def following() -> bool | None:
        health = get_json(f"{run.bridge_url}/healthz")
        state = get_json(f"{run.exo_url}/state")
        layout = run.layout()
        ready = (
            health is not None
            and health["exo"]["reachable"]
            and layout is not None
            and all(n["pid"] is not None for n in layout["nodes"])
            and state is not None
            and len(state["topology"]["nodes"]) == 3
        )
        return True if ready else None

    wait_for("exo's 3 nodes and the bridge following it", 60, following)
    deployed = run_cli("deploy", QWEN, "--standby", "1", "--url", run.bridge_url)
    assert deployed.returncode == 0, deployed.stderr
    return wait_for("Qwen serving", 60, run.serving)  # past the keeper's 15 s startup grace


def all_alive(run: Running) -> bool | None:
    liveness = run.liveness()
    return True if liveness and all(p == "alive" for p in liveness.values()) else None


def kill_and_time(run: Running, name: str) -> tuple[float, float, float]:
    """kill -9 of node ``name``: seconds to a chat answered, to the lost instance gone, and to
    both (serving as a stock exo serves)."""
    before = set(run.instances())
    os.killpg(run.pid_of(name), signal.SIGKILL)
    killed_at = time.monotonic()
    chat_s = deleted_s = None
    while chat_s is None or deleted_s is None:
        now = time.monotonic()
        assert now - killed_at < 90, "not serving again within 90 s of the kill"
        if deleted_s is None and not before & set(run.instances()):
            deleted_s = now - killed_at
        if chat_s is None and chat_reply(run.exo_url, QWEN) is not None:
            chat_s = time.monotonic() - killed_at
        time.sleep(WATCH_EVERY_S)
    return chat_s, deleted_s, max(chat_s, deleted_s)


def test_a_freeze_and_a_kill_through_the_bridge_with_fast_failover_on(tmp_path: Path) -> None:
    with running(tmp_path) as run:  # the bridge's defaults: 3 s suspect, 8 s dead
        first, holder = deploy_and_wait(run)
        watch = Watch(run)
        watch.thread.start()
        try:
            # 2 s: under the 3 s suspicion; no verdict, no replacement.
            pid = run.pid_of(holder)
            os.killpg(pid, signal.SIGSTOP)
            time.sleep(2.0)
            os.killpg(pid, signal.SIGCONT)
            wait_for("every node alive again", 10, lambda: all_alive(run))
            time.sleep(2.0)  # a verdict would be a poll or two behind the silence
            assert watch.most == 1 and watch.judged == set()
            assert set(run.instances()) == {first}

            chat_s, deleted_s, serving_s = kill_and_time(run, holder)
            wait_for("one instance left", 10, lambda: len(run.instances()) == 1 or None)
        finally:
            watch.stop.set()
            watch.thread.join(timeout=5)
        assert watch.most <= 2  # replicas + 1
        assert holder in watch.judged
        print(
            f"\nbridge, fast failover on: freeze 2 s -> no verdict, no replacement; kill -9 -> "
            f"chat answered {chat_s:.2f} s, lost instance deleted {deleted_s:.2f} s, serving "
            f"(both) {serving_s:.2f} s; most instances {watch.most}"
        )
        assert serving_s <= DEFAULT_DEAD_AFTER_S + 1.0


def test_a_kill_through_the_bridge_with_fast_failover_off(tmp_path: Path) -> None:
    with running(tmp_path, "--suspect-after-s", "0") as run:
        _, holder = deploy_and_wait(run)
        watch = Watch(run)
        watch.thread.start()
        try:
            chat_s, deleted_s, serving_s = kill_and_time(run, holder)
        finally:
            watch.stop.set()
            watch.thread.join(timeout=5)
        assert watch.most <= 2 and watch.judged == set()
        print(
            f"\nbridge, fast failover off: kill -9 -> chat answered {chat_s:.1f} s, lost "
            f"instance deleted {deleted_s:.1f} s, serving (both) {serving_s:.1f} s; most "
            f"instances {watch.most}"
        )
        assert deleted_s > 30  # exo's 30 s timeout, then its sweep
