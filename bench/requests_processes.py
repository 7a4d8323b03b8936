"""The processes ``python -m bench requests`` runs and what it reads off them: the stand-in with
a bridge, the minimal upstream with a bridge, each brought to a deployment that serves
(docs/design.md §8.6).

Apart from the section (``bench.requests_bench``) so that it reads as the measurement: here
is the starting, the waiting and the stopping. Every process is a real one on a real socket,
started as the process tests start them (``tests/process_helpers.py``: its own session, a port
below the kernel's ephemeral range, stopped for sure), and every wait has a deadline.

The minimal upstream's bridge reuses the stand-in's bridge's data dir, and the upstream serves
the stand-in's State as it was recorded: the deployment's record names the instance the first
bridge placed, the State shows it ready, so the second bridge adopts it and serves at once,
with no placement and no download to wait for.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from functools import partial
from multiprocessing.queues import Queue
from pathlib import Path
from typing import Any

import httpx

from bench.exo_shaped_upstream import COUNTS_PATH, serve

# Two nodes: one to serve the model and one for its standby copy; every other process the
# machine runs takes a share of its two cores.
NODES = 2
# Processes coming up: a few seconds idle, far more on two shared cores; this only bounds a
# hang. The deployment serves after the bridge's 15 s start-up grace.
START_DEADLINE_S = 120.0
SERVING_DEADLINE_S = 90.0
# How often a wait looks again: quick beside the waits, rare beside the processes' own work.
POLL_S = 0.2
# One GET of a local process on loopback; longer means it is not answering.
GET_TIMEOUT_S = 2.0
# The reference loop's rounds (``machine``): a fifth of a second on a quiet core.
REFERENCE_LOOPS = 20_000


@dataclass(frozen=True)
class Recorded:
    """The stand-in as the bridge saw it serving: its State, model list and node id."""

    state: dict[str, Any]
    models: bytes
    node_id: bytes


@dataclass(frozen=True)
class Running:
    """An upstream and a bridge in front of it, the deployment serving."""

    exo_port: int
    bridge_port: int
    bridge_pid: int

    @property
    def exo_url(self) -> str:
        return f"http://127.0.0.1:{self.exo_port}"

    @property
    def bridge_url(self) -> str:
        return f"http://127.0.0.1:{self.bridge_port}"


def tests_on_path() -> None:
    """The tests' helpers importable (``process_helpers``, ``ports``), as the other process
    benches do."""
    tests = str(Path(__file__).resolve().parent.parent / "tests")
    if tests not in sys.path:
        sys.path.insert(0, tests)


@contextmanager
def _process(argv: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    from process_helpers import start_cli, stop  # noqa: PLC0415 (tests_on_path first)

    with log.open("wb") as output:
        process = start_cli(argv, output)
        try:
            yield process
        finally:
            stop(process)


def _wait(what: str, deadline_s: float, probe: Callable[[], bool]) -> None:
    end = time.monotonic() + deadline_s
    while not probe():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {deadline_s:g} s waiting for {what}")
        time.sleep(POLL_S)


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=GET_TIMEOUT_S, trust_env=False)
    except httpx.HTTPError:
        return None


def following(bridge_url: str) -> bool:
    """Whether the bridge reads exo's State now (its ``/healthz``)."""
    answer = _get(f"{bridge_url}/healthz")
    return answer is not None and bool(answer.json()["exo"]["state_readable"])


def _serving(bridge_url: str) -> bool:
    """Whether the bridge's one deployment serves, its standby copy staged (nothing left to do
    that would load the bridge or change the State while chats are timed)."""
    answer = _get(f"{bridge_url}/deployments")
    if answer is None or answer.status_code != 200:
        return False
    views = answer.json()["deployments"]
    staged = all(s["state"] == "completed" for v in views for s in v.get("staged") or [])
    return bool(views) and views[0]["status"] == "serving" and staged


def _bridge(
    exo_url: str, port: int, data_dir: Path, log: Path
) -> AbstractContextManager[subprocess.Popen[bytes]]:
    argv = ["bridge", "--exo", exo_url, "--port", str(port), "--data-dir", str(data_dir)]
    return _process(argv, log)


@contextmanager
def standin(tmp: Path, model: str) -> Iterator[Running]:
    """``exo-deploy cluster --exo-compat`` and a bridge on it, ``model`` deployed through the
    bridge and serving; the bridge's data dir is ``tmp / "bridge"``."""
    from process_helpers import free_port, run_cli  # noqa: PLC0415

    running = Running(free_port(), free_port(), 0)
    cluster = ["cluster", "--exo-compat", "--nodes", str(NODES), "--port", str(running.exo_port)]
    with (
        _process([*cluster, "--data-dir", str(tmp / "cluster")], tmp / "cluster.out"),
        _bridge(running.exo_url, running.bridge_port, tmp / "bridge", tmp / "bridge.out") as bridge,
    ):
        url = running.bridge_url
        _wait("the bridge following the stand-in", START_DEADLINE_S, partial(following, url))
        deployed = run_cli("deploy", model, "--url", url, "--json")
        if deployed.returncode != 0:
            raise RuntimeError(f"deploy {model}: {deployed.stderr or deployed.stdout}")
        _wait(f"{model} serving", SERVING_DEADLINE_S, partial(_serving, url))
        yield Running(running.exo_port, running.bridge_port, bridge.pid)


def record(exo_url: str) -> Recorded:
    """The stand-in's State, model list and node id as they are now."""
    with httpx.Client(base_url=exo_url, timeout=GET_TIMEOUT_S, trust_env=False) as client:
        return Recorded(
            client.get("/state").json(),
            client.get("/models").content,
            client.get("/node_id").content,
        )


@contextmanager
def _upstream(recorded: Recorded) -> Iterator[int]:
    """The minimal upstream in a process of its own (so its work is not the bench's); its port."""
    context = multiprocessing.get_context("spawn")
    port_queue: Queue[int] = context.Queue()
    args = (port_queue, recorded.state, recorded.models, recorded.node_id)
    child = context.Process(target=serve, args=args, daemon=True)
    child.start()
    try:
        yield port_queue.get(timeout=START_DEADLINE_S)
    finally:
        child.terminate()
        child.join(10)


@contextmanager
def minimal(tmp: Path, recorded: Recorded, model: str) -> Iterator[Running]:
    """The minimal upstream serving ``recorded``, and a bridge on a copy of the stand-in's
    bridge's data dir: ``model``'s deployment adopts the recorded instance (module doc)."""
    from process_helpers import free_port  # noqa: PLC0415

    data_dir = tmp / "bridge-minimal"
    shutil.copytree(tmp / "bridge", data_dir)
    with _upstream(recorded) as exo_port:
        running = Running(exo_port, free_port(), 0)
        url = running.bridge_url
        with _bridge(running.exo_url, running.bridge_port, data_dir, tmp / "bridge2.out") as bridge:
            _wait("the bridge following the upstream", START_DEADLINE_S, partial(following, url))
            _wait(f"{model} serving again", SERVING_DEADLINE_S, partial(_serving, url))
            yield Running(exo_port, running.bridge_port, bridge.pid)


def counts(exo_url: str) -> dict[str, Any]:
    """The minimal upstream's counts: connections accepted, chats answered, commands."""
    return httpx.get(f"{exo_url}{COUNTS_PATH}", timeout=GET_TIMEOUT_S, trust_env=False).json()


def rss_mib(pid: int) -> float:
    """A process's resident memory (Linux /proc), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def machine() -> str:
    """The machine as the figures were taken: how busy, and a reference loop's CPU and wall
    time (their ratio: how much of the time other processes held the cores)."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(REFERENCE_LOOPS):
        sum(range(1000))
    cpu_us = (time.process_time() - cpu) / REFERENCE_LOOPS * 1e6
    wall_us = (time.perf_counter() - wall) / REFERENCE_LOOPS * 1e6
    return (
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; sum(range(1000)) "
        f"{cpu_us:.0f} us of CPU, {wall_us:.0f} us of wall time"
    )
