"""Starting, polling and stopping ``exo-deploy`` processes for the end-to-end tests.

The end-to-end tests run the real command as processes on sockets, so they share the same
chores: a port of its own (``ports``: safe with tests in parallel), waiting on a condition with a
deadline (never sleep-and-hope), a JSON GET and a chat that read "not yet" as None, running the
shell client, and stopping a process group for sure even when the test failed. They live here
once so every end-to-end test waits and cleans up the same way.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import httpx
import ports
import pytest
import shared_http as http

T = TypeVar("T")

# How often a wait polls: quick enough not to add to a measured recovery, rare enough not to load
# the processes it watches.
POLL_INTERVAL_S = 0.2
# One GET of a local process on loopback; longer means it is not answering.
GET_TIMEOUT_S = 2.0
# A chat asks for a few tokens of a simulated model; longer means it is not being served.
CHAT_TIMEOUT_S = 10.0
# A client command is one small request; this only bounds a hung one.
CLI_TIMEOUT_S = 60
# A SIGTERMed process stops its children and writes its snapshot well within this...
STOP_TIMEOUT_S = 20
# ...and a SIGKILLed one is reaped at once; this only bounds a wedged wait.
KILL_TIMEOUT_S = 10
# Processes coming up (a master and its nodes, exo's stand-in, a bridge, etcd): a few seconds on
# an idle machine, but CI's six lanes on two slow cores have taken over 30 s. It bounds a hang and
# nothing else: a wait returns as soon as its condition holds, so a passing test pays nothing for
# a long bound, and a start-up deadline is never what a test measures.
START_DEADLINE_S = 120.0
# Membership timings of a test cluster, shortened so a killed node is timed out and its instance
# swept within seconds.
NODE_TIMEOUT_S = 4
SWEEP_INTERVAL_S = 1


def free_port() -> int:
    """A loopback port for a server a test starts: its own, even with tests in parallel
    (``ports``; docs/design.md §10, "Ports and data dirs")."""
    return ports.free_port()


def wait_for(what: str, deadline_s: float, probe: Callable[[], T | None]) -> T:
    """Poll ``probe`` until it returns something other than None; fail after the deadline."""
    end = time.monotonic() + deadline_s
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > end:
            pytest.fail(f"timed out after {deadline_s:g} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def get_json(url: str) -> Any | None:
    """The JSON body of a 200 answer; None when unreachable or any other status."""
    try:
        response = http.get(url, timeout=GET_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def chat_reply(base_url: str, model: str) -> str | None:
    """The reply text if ``model`` answers a short chat on ``base_url`` right now, else None."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    try:
        response = http.post(f"{base_url}/v1/chat/completions", json=body, timeout=CHAT_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code != 200 or not response.content.strip():
        return None  # (an empty 200: exo closed the chat, its instance deleted under it)
    text: str = response.json()["choices"][0]["message"]["content"]
    return text or None


def run_cli(*argv: str) -> subprocess.CompletedProcess[str]:
    """``exo-deploy ARGV`` to completion, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "keeper.cli", *argv],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        check=False,
    )


def start_cli(argv: list[str], output: IO[bytes]) -> subprocess.Popen[bytes]:
    """``exo-deploy ARGV`` in the background, in a session of its own (so its group can be
    signalled), stdout and stderr both to ``output``."""
    return subprocess.Popen(
        [sys.executable, "-m", "keeper.cli", *argv],
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def cluster_argv(port: int, data_dir: Path, *flags: str) -> list[str]:
    """``exo-deploy cluster`` of 3 nodes on ``port`` with shortened membership timings and no
    node restarts (a killed node stays dead), with ``flags`` such as ``--exo-compat``."""
    return [
        "cluster",
        *flags,
        "--nodes",
        "3",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--node-timeout",
        str(NODE_TIMEOUT_S),
        "--sweep-interval",
        str(SWEEP_INTERVAL_S),
        "--no-node-restart",
    ]


@dataclass
class ExoAndBridge:
    """exo's stand-in and ``exo-deploy bridge`` in front of it, as processes."""

    exo_url: str
    bridge_url: str
    exo: subprocess.Popen[bytes]
    bridge: subprocess.Popen[bytes]


@contextlib.contextmanager
def exo_and_bridge(
    out_dir: Path, exo_argv: Callable[[int], list[str]], *bridge_flags: str
) -> Iterator[ExoAndBridge]:
    """``exo-deploy`` with ``exo_argv(port)`` (the stand-in for a stock exo, alone or as a
    cluster) and ``exo-deploy bridge --exo`` it with ``bridge_flags``, each on a port of its own,
    writing to ``exo.out`` and ``bridge.out`` in ``out_dir``; given once the bridge reaches exo,
    both stopped on the way out."""
    exo_port, bridge_port = free_port(), free_port()
    exo_url, bridge_url = f"http://127.0.0.1:{exo_port}", f"http://127.0.0.1:{bridge_port}"
    bridge_argv = ["bridge", "--exo", exo_url, "--port", str(bridge_port), *bridge_flags]
    with (
        (out_dir / "exo.out").open("wb") as exo_out,
        (out_dir / "bridge.out").open("wb") as bridge_out,
    ):
        exo = start_cli(exo_argv(exo_port), exo_out)
        bridge = start_cli(bridge_argv, bridge_out)
        try:

            def following() -> bool | None:
                health = get_json(f"{bridge_url}/healthz")
                return True if health is not None and health["exo"]["reachable"] else None

            wait_for("the bridge following exo", START_DEADLINE_S, following)
            yield ExoAndBridge(exo_url, bridge_url, exo, bridge)
        finally:
            stop(bridge)
            stop(exo)


def model_instances(state: dict[str, Any], model: str) -> Iterator[tuple[str, str]]:
    """(instance id, the node id holding it) of each of ``model``'s instances in exo's State, in
    State order; each instance is on one node."""
    for instance_id, tagged in state.get("instances", {}).items():
        (instance,) = tagged.values()
        if instance["shardAssignments"]["modelId"] == model:
            (node_id,) = instance["shardAssignments"]["nodeToRunner"]
            yield instance_id, node_id


def stop(process: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM the process's group (SIGKILL if it does not stop in time); its exit code."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            return process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=KILL_TIMEOUT_S)
    return process.returncode


def alive(pid: int) -> bool:
    """Whether ``pid`` is still one of our processes (not a reused pid, not a zombie)."""
    try:
        if b"keeper.cli" not in Path(f"/proc/{pid}/cmdline").read_bytes():
            return False
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def freeze(pid: int) -> float:
    """SIGSTOP ``pid``'s process group; when it froze."""
    os.killpg(pid, signal.SIGSTOP)
    return time.monotonic()


def thaw_at(pid: int, frozen_at: float, seconds: float) -> None:
    """Thaw ``pid`` ``seconds`` after it froze (the fault's length is the scenario)."""
    time.sleep(max(0.0, frozen_at + seconds - time.monotonic()))
    os.killpg(pid, signal.SIGCONT)


# A node heard this recently is reporting again: a couple of its one-second heartbeats.
HEARD_WITHIN_S = 1.5


def nodes_heard(listed: Any | None, nodes: int) -> bool | None:
    """True when a service's ``GET /nodes`` answer lists ``nodes`` nodes, each alive and heard
    within ``HEARD_WITHIN_S``; None otherwise (a probe for ``wait_for``)."""
    if listed is None or len(listed["nodes"]) != nodes:
        return None
    fresh = all(
        n["liveness"] == "alive" and n["silent_s"] is not None and n["silent_s"] < HEARD_WITHIN_S
        for n in listed["nodes"]
    )
    return True if fresh else None
