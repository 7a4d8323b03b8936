"""Bridges sharing an etcd store, as processes, for the end-to-end tests and the takeover bench.

One stand-in exo cluster (``exo-deploy cluster --exo-compat``, three simulated nodes), one etcd
(``keeper.cluster.etcd_members``, one member or three) and several ``exo-deploy bridge --store``
processes on free ports. The helpers read each bridge's ``/healthz`` whatever its status (a
degraded bridge answers 503 with the same body), find the acting one, kill or stop one with a
signal and start it again, and count a model's instances in exo's State: what the tests assert
on. Every wait has a deadline (``process_helpers.wait_for``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from process_helpers import (
    cluster_argv,
    free_port,
    get_json,
    model_instances,
    start_cli,
    stop,
    wait_for,
)

from keeper.cluster.etcd_members import EtcdCluster

# The bridges' lease in these tests: short, so a takeover is quick, and still twice etcd's test
# election timeout (keeper.cluster.etcd_members).
LEASE_S = 2
# A takeover must happen within the lease (the old leader's key lapses) plus this: one
# campaign round and one tick of the new leader, with room for a loaded machine.
TAKEOVER_MARGIN_S = 2.0
PREFIX = "/exo-deploy-test/"


def health(url: str) -> dict[str, Any] | None:
    """``/healthz`` of a bridge, 200 or 503 alike; None when it does not answer."""
    try:
        answer = httpx.get(f"{url}/healthz", timeout=2.0, trust_env=False)
    except httpx.HTTPError:
        return None
    if answer.status_code not in (200, 503):
        return None
    return answer.json()


@dataclass
class BridgeProcess:
    name: str
    port: int
    output: IO[bytes]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any] | None:
        return health(self.url)


@dataclass
class Stack:
    root: Path
    etcd: EtcdCluster
    exo_url: str
    cluster: subprocess.Popen[bytes]
    bridges: dict[str, BridgeProcess] = field(default_factory=dict[str, BridgeProcess])
    store_url: str | None = None  # another address of the store (a proxy), if set

    def bridge_argv(self, bridge: BridgeProcess, *extra: str) -> list[str]:
        return [
            "bridge",
            "--exo",
            self.exo_url,
            "--port",
            str(bridge.port),
            "--store",
            self.store_url or self.etcd.endpoints,
            "--name",
            bridge.name,
            "--lease-s",
            str(LEASE_S),
            "--store-prefix",
            PREFIX,
            *extra,
        ]

    def start_bridge(self, name: str, *, store_url: str | None = None) -> BridgeProcess:
        bridge = self.bridges.get(name)
        if bridge is None:
            log_path = self.root / f"{name}.out"
            bridge = BridgeProcess(name, free_port(), log_path.open("ab"), log_path=log_path)
            self.bridges[name] = bridge
        argv = self.bridge_argv(bridge)
        if store_url is not None:
            argv[argv.index("--store") + 1] = store_url
        bridge.process = start_cli(argv, bridge.output)
        return bridge

    def wait_answering(self, bridge: BridgeProcess, deadline_s: float = 30) -> None:
        wait_for(f"bridge {bridge.name} to answer", deadline_s, bridge.health)

    def acting(self) -> BridgeProcess | None:
        """The one bridge whose /healthz says it acts, if exactly one does."""
        found = [
            bridge
            for bridge in self.bridges.values()
            if (h := bridge.health()) is not None and h["role"] == "acting"
        ]
        return found[0] if len(found) == 1 else None

    def wait_acting(self, deadline_s: float, *, not_: str | None = None) -> BridgeProcess:
        def probe() -> BridgeProcess | None:
            found = self.acting()
            return found if found is not None and found.name != not_ else None

        return wait_for("one acting bridge", deadline_s, probe)

    def signal(self, bridge: BridgeProcess, sig: int) -> None:
        assert bridge.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bridge.process.pid, sig)
        if sig == signal.SIGKILL:
            bridge.process.wait(timeout=10)

    def exo_state(self) -> dict[str, Any] | None:
        return get_json(f"{self.exo_url}/state")

    def instances_of(self, model: str) -> int | None:
        state = self.exo_state()
        return None if state is None else len(list(model_instances(state, model)))

    def stop_all(self) -> None:
        for bridge in self.bridges.values():
            if bridge.process is not None:
                if bridge.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(bridge.process.pid, signal.SIGCONT)
                stop(bridge.process)
            bridge.output.close()
        stop(self.cluster)
        self.etcd.stop()


@contextlib.contextmanager
def stack(root: Path, etcd_members: int = 1) -> Iterator[Stack]:
    """etcd, the stand-in exo cluster with three nodes, no bridge yet; all stopped at the end."""
    etcd_out = (root / "etcd.out").open("wb")
    etcd = EtcdCluster(root / "etcd", etcd_members, etcd_out).start()
    exo_port = free_port()
    cluster_out = (root / "cluster.out").open("wb")
    cluster = start_cli(cluster_argv(exo_port, root / "cluster", "--exo-compat"), cluster_out)
    running = Stack(root, etcd, f"http://127.0.0.1:{exo_port}", cluster)
    try:
        wait_for(
            "exo's three nodes",
            30,
            lambda: (
                True
                if (s := running.exo_state()) is not None and len(s["topology"]["nodes"]) == 3
                else None
            ),
        )
        yield running
    finally:
        running.stop_all()
        etcd_out.close()
        cluster_out.close()


def since(started: float) -> float:
    return time.monotonic() - started
