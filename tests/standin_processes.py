"""The stock-exo stand-in, its nodes and a bridge as real processes, with the faults a serving
node and exo's master meet, for the front door's fault tests (docs/design.md §7.5, §8.3, §8.6).

Started one by one rather than as ``exo-deploy cluster``: that supervisor restarts a dead
master on its own data dir, so the master comes back with its State, whereas a stock exo's new
master starts from an *empty* State. Here each process is the test's own:

- ``exo-deploy master --exo-compat``, the stand-in (exo's 30 s node timeout and 10 s sweep;
  chats routed and ended as a stock exo's), on a data dir of its own;
- three ``exo-deploy node`` processes that all hold Qwen3-0.6B (no download), each with a key
  file made here first, so the test knows each node's id;
- ``exo-deploy bridge --exo <the stand-in>`` with fast failover at its defaults (suspect after
  3 s, dead after 8 s) and the front door at its defaults (a 30 s hold, 2 continuations).

The faults act on those processes with real signals: ``kill -9`` of a node's process group,
SIGSTOP and SIGCONT, ``RUNNER_KILL_SIGNAL`` (its runners die, the process stays up and retries
them with exo's backoff), and ``elect_new_master``: the stand-in killed -9 and a new one started
at once on the same port from a new, empty data dir. Its State starts empty, numbered from 0
again, every instance gone; the nodes reconnect by themselves, and finding no instance of
theirs in it, stop their runners: what a stock exo shows when an election ends with a new
master (``keeper.model.master_change``). Every process is stopped on the way out, a frozen one
thawed first.

Reads are async (the tests' clients chat on the same event loop) through one client kept here,
with keep-alive off as ``tests/shared_http.py`` keeps it: a restarted master on the same port is
met as a fresh request meets it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import anyio
import httpx
import pytest
from model_ids import QWEN
from process_helpers import (
    GET_TIMEOUT_S,
    KILL_TIMEOUT_S,
    START_DEADLINE_S,
    free_port,
    start_cli,
    stop,
)

from keeper.sim.link.identity import load_or_create_key
from keeper.sim.node.node_process import RUNNER_KILL_SIGNAL

# Three nodes, so that the model has somewhere to go whichever node is lost, each big enough
# for the model many times over.
NODES = ("node-1", "node-2", "node-3")
NODE_MEMORY_GB = 32
# A placed Qwen3-0.6B serves within a second or two (it is on every node's disk); the bridge
# places nothing for its first 15 s (the keeper's startup grace), counted from its own start.
SERVING_DEADLINE_S = 60.0
# How often a wait reads again: the bridge's view changes once a second (its poll).
POLL_S = 0.2


@dataclass
class StandinWithBridge:
    """The processes of one test, and the reads its waits make."""

    tmp_path: Path
    exo_port: int
    bridge_port: int
    http: httpx.AsyncClient
    outputs: list[IO[bytes]] = field(default_factory=list[IO[bytes]])
    master: subprocess.Popen[bytes] | None = None
    masters: int = 0  # how many stand-in masters were started (each on a data dir of its own)
    nodes: dict[str, subprocess.Popen[bytes]] = field(
        default_factory=dict[str, subprocess.Popen[bytes]]
    )
    node_ids: dict[str, str] = field(default_factory=dict[str, str])
    bridge: subprocess.Popen[bytes] | None = None
    deployment_id: str = ""  # Qwen's deployment in the bridge, once deployed

    @property
    def exo_url(self) -> str:
        return f"http://127.0.0.1:{self.exo_port}"

    @property
    def bridge_url(self) -> str:
        return f"http://127.0.0.1:{self.bridge_port}"

    # --- starting ------------------------------------------------------------------------------

    def _output(self, name: str) -> IO[bytes]:
        output = (self.tmp_path / f"{name}.out").open("ab")
        self.outputs.append(output)
        return output

    def start_master(self) -> None:
        """A stand-in master on the port, on a data dir no master used before: an empty State."""
        self.masters += 1
        argv = ["master", "--exo-compat", "--port", str(self.exo_port)]
        argv += ["--data-dir", str(self.tmp_path / f"exo-{self.masters}")]
        argv += ["--parent-pid", str(os.getpid())]
        self.master = start_cli(argv, self._output("exo"))

    def start_node(self, name: str) -> None:
        key_file = self.tmp_path / "keys" / f"{name}.key"
        self.node_ids[name] = load_or_create_key(key_file).node_id
        argv = ["node", "--master", self.exo_url, "--name", name]
        argv += ["--memory-gb", str(NODE_MEMORY_GB), "--key-file", str(key_file), "--has", QWEN]
        argv += ["--parent-pid", str(os.getpid())]
        self.nodes[name] = start_cli(argv, self._output(name))

    def start_bridge(self) -> None:
        argv = ["bridge", "--exo", self.exo_url, "--port", str(self.bridge_port)]
        argv += ["--data-dir", str(self.tmp_path / "bridge")]
        self.bridge = start_cli(argv, self._output("bridge"))

    # --- reads ---------------------------------------------------------------------------------

    async def get_json(self, url: str) -> Any | None:
        """The JSON of a 200 answer; None when unreachable or any other status."""
        try:
            answer = await self.http.get(url, timeout=GET_TIMEOUT_S)
        except httpx.HTTPError:
            return None
        return answer.json() if answer.status_code == 200 else None

    async def instances(self) -> dict[str, str] | None:
        """Instance id -> the name of the node holding it, for Qwen's instances in exo's State;
        None while exo does not answer."""
        state = await self.get_json(f"{self.exo_url}/state")
        if state is None:
            return None
        names = {node_id: name for name, node_id in self.node_ids.items()}
        found: dict[str, str] = {}
        for instance_id, tagged in state.get("instances", {}).items():
            (instance,) = tagged.values()
            if instance["shardAssignments"]["modelId"] == QWEN:
                node_id: str
                (node_id,) = instance["shardAssignments"]["nodeToRunner"]
                found[instance_id] = names.get(node_id, node_id)
        return found

    async def exo_nodes(self) -> int:
        """How many nodes exo's topology holds (0 while exo does not answer)."""
        state = await self.get_json(f"{self.exo_url}/state")
        return len(state["topology"]["nodes"]) if state is not None else 0

    async def serving(self) -> bool:
        """Whether the bridge's one deployment serves, in the bridge's view."""
        listed = await self.get_json(f"{self.bridge_url}/deployments")
        views = listed["deployments"] if listed is not None else []
        return len(views) == 1 and views[0]["status"] == "serving"

    async def incident_causes(self) -> list[str]:
        """The cause of each incident of the deployment in the bridge's history, oldest first
        (docs/design.md §3.5)."""
        url = f"{self.bridge_url}/deployments/{self.deployment_id}/history"
        history = await self.get_json(url)
        assert history is not None, f"no history answered at {url}"
        return [incident["cause"] for incident in history["incidents"]]

    async def following(self) -> bool:
        """The bridge reaching exo, and exo showing every node."""
        health = await self.get_json(f"{self.bridge_url}/healthz")
        reachable = health is not None and health["exo"]["reachable"]
        return reachable and await self.exo_nodes() == len(NODES)

    async def deploy_qwen(self) -> str:
        """Deploy Qwen through the bridge and wait until it serves; the node serving it."""
        created = await self.http.post(f"{self.bridge_url}/deployments", json={"model_id": QWEN})
        assert created.status_code == 200, created.text
        self.deployment_id = created.json()["deployment_id"]
        holder: list[str] = []

        async def served() -> bool:
            found = await self.instances() or {}
            holder[:] = list(found.values())
            return len(found) == 1 and await self.serving()

        await poll(served, SERVING_DEADLINE_S, "Qwen serving through the bridge")
        return holder[0]

    # --- faults --------------------------------------------------------------------------------

    def signal_node(self, name: str, sig: signal.Signals) -> None:
        """``sig`` to node ``name``'s process group (its own session: nothing else)."""
        os.killpg(self.nodes[name].pid, sig)

    def kill_node(self, name: str) -> None:
        self.signal_node(name, signal.SIGKILL)

    def freeze_node(self, name: str) -> None:
        self.signal_node(name, signal.SIGSTOP)

    def thaw_node(self, name: str) -> None:
        self.signal_node(name, signal.SIGCONT)

    def crash_runners(self, name: str) -> None:
        """Every runner of node ``name`` dies; the node retries them with exo's backoff."""
        self.signal_node(name, RUNNER_KILL_SIGNAL)

    def elect_new_master(self) -> None:
        """exo's master changes: the stand-in killed -9, and a new one started at once on the
        same port from an empty State (module doc)."""
        assert self.master is not None
        os.killpg(self.master.pid, signal.SIGKILL)
        self.master.wait(timeout=KILL_TIMEOUT_S)
        self.start_master()

    # --- stopping ------------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Every process stopped: all told at once (a frozen one thawed so it can act on it),
        then each waited for (``process_helpers.stop``: SIGKILL for one that does not stop)."""
        processes = [p for p in (self.bridge, *self.nodes.values(), self.master) if p is not None]
        for process in processes:
            if process.poll() is None:
                for sig in (signal.SIGTERM, signal.SIGCONT):
                    with contextlib.suppress(OSError):
                        os.killpg(process.pid, sig)
        for process in processes:
            stop(process)
        for output in self.outputs:
            output.close()


async def poll(probe: Callable[[], Awaitable[bool]], deadline_s: float, what: str) -> float:
    """Wait until ``probe`` answers True; the seconds it took. Fails naming ``what`` past
    ``deadline_s`` (each probe's reads are bounded by their own timeout)."""
    started = anyio.current_time()
    while not await probe():
        if anyio.current_time() - started > deadline_s:
            pytest.fail(f"not within {deadline_s:g} s: {what}")
        await anyio.sleep(POLL_S)
    return anyio.current_time() - started


@asynccontextmanager
async def standin_with_bridge(tmp_path: Path) -> AsyncIterator[StandinWithBridge]:
    """The stand-in, its three nodes and the bridge, started at once and followed (module
    doc); all stopped on the way out."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(trust_env=False, limits=limits) as http:
        run = StandinWithBridge(tmp_path, free_port(), free_port(), http)
        try:
            run.start_master()
            for name in NODES:
                run.start_node(name)
            run.start_bridge()
            await poll(run.following, START_DEADLINE_S, "the bridge following exo's 3 nodes")
            yield run
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(run.stop_all)
