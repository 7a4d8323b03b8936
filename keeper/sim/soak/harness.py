"""The soak against real processes: a master and N simulated nodes on this machine.

``ProcessTarget`` gives ``keeper.sim.soak.run`` what it needs from a ``LocalCluster`` (the
``exo-deploy cluster`` supervisor, which starts every process, restarts the dead ones and stops
them all on the way out, Ctrl-C included) and from the master's HTTP API:

- faults are the cluster's: ``kill -9`` of a node (restarted by the cluster after
  ``NODE_DOWN_S``) or of the master (restarted after a second from its log), SIGSTOP/SIGCONT,
  a partition by the node's TCP proxy, a runner kill (a signal the node process answers by
  failing its runners), and the broken-instance kinds (the node's fault file and a signal, the
  fault healed the same way when it is over);
- chats are ``POST /v1/chat/completions`` with no client-side timeout at all: the load's
  deadline decides, so a hung request is counted lost, never quietly turned into an error;
- the watch follows ``GET /events`` (server-sent events), reconnecting after a master restart;
- the event log the duplicate check replays is the master's own, in the cluster's data dir.

Everything the run writes (master and node logs, cluster.json, the master's event log) stays in
the data dir, whose path the run prints, for looking into whatever the report shows.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx

from keeper.model.api_models import DeploymentsResponse, StreamSnapshot
from keeper.model.events import IndexedEvent
from keeper.model.state import State
from keeper.runtime.event_log import LOG_FILE
from keeper.sim.cluster.local import HOST, LocalCluster
from keeper.sim.soak.faults import BROKEN_KINDS, NODE_DOWN_S, FaultKind, FaultSpec
from keeper.sim.soak.load import MAX_TOKENS, error_label
from keeper.sim.soak.report import Deployed, RunKind, SoakReport
from keeper.sim.soak.run import DeploymentHealth, Soak, SoakError, SoakSettings, model_statuses

PROMPT = "Say something while the cluster is being knocked about."
# How often a restarted process is looked for; restarts take a second or two.
BACK_POLL_S = 0.25
# The event stream sends a keepalive every 15 s; twice that in silence means the link is dead.
STREAM_READ_TIMEOUT_S = 30.0
# Pause before reconnecting the event stream (the master restarts within a couple of seconds).
STREAM_RETRY_S = 0.5
# Deployments and status calls are small; a master that takes longer is down for the moment.
API_TIMEOUT_S = 10.0
# Chat clients plus the stream plus status calls, with room to spare.
MAX_CONNECTIONS = 64


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _error_label(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.ConnectError):
        return "connection refused"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return "connection lost"
    return type(exc).__name__


def _error_message(response: httpx.Response) -> str:
    """The message of the master's error body (exo's shape), or "" if it has none."""
    try:
        body: Any = response.json()
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return ""


class ProcessTarget:
    """A running ``LocalCluster`` seen through its master's API (see module docstring)."""

    run_kind: RunKind = "processes"

    def __init__(self, cluster: LocalCluster, client: httpx.AsyncClient) -> None:
        self._cluster = cluster
        self._client = client
        self._url = cluster.url

    def node_names(self) -> list[str]:
        return self._cluster.node_names()

    def node_id(self, name: str) -> str:
        return self._cluster.node_id(name)

    async def deploy(self, model: Deployed) -> None:
        body = {
            "model_id": model.model_id,
            "min_nodes": model.min_nodes,
            "replicas": model.replicas,
        }
        response = await self._client.post(
            f"{self._url}/deployments", json=body, timeout=API_TIMEOUT_S
        )
        if response.status_code != 200:
            raise SoakError(
                f"the master refused to deploy {model.model_id}: HTTP {response.status_code} "
                f"{response.text[:300]}"
            )

    async def chat(self, model_id: str) -> str | None:
        body = {
            "model": model_id,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": MAX_TOKENS,
        }
        try:
            response = await self._client.post(
                f"{self._url}/v1/chat/completions", json=body, timeout=None
            )
        except httpx.HTTPError as exc:
            return _error_label(exc)
        if response.status_code != 200:
            return error_label(response.status_code, _error_message(response))
        try:
            reply: Any = response.json()
            reply["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "unreadable reply"
        return None

    async def follow(
        self, on_state: Callable[[State], None], on_event: Callable[[IndexedEvent], None]
    ) -> None:
        timeout = httpx.Timeout(API_TIMEOUT_S, read=STREAM_READ_TIMEOUT_S)
        while True:
            with contextlib.suppress(httpx.HTTPError):
                async with self._client.stream(
                    "GET", f"{self._url}/events", timeout=timeout
                ) as response:
                    if response.status_code == 200:
                        await _read_sse(response, on_state, on_event)
            await anyio.sleep(STREAM_RETRY_S)

    async def statuses(self) -> dict[str, DeploymentHealth]:
        try:
            response = await self._client.get(f"{self._url}/deployments", timeout=API_TIMEOUT_S)
            listing = DeploymentsResponse.model_validate_json(response.content)
        except (httpx.HTTPError, ValueError):
            return {}
        return model_statuses(listing)

    async def connected_nodes(self) -> int | None:
        try:
            response = await self._client.get(f"{self._url}/healthz", timeout=API_TIMEOUT_S)
            health: Any = response.json()
            return int(health["nodes_connected"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    async def inject(self, fault: FaultSpec) -> None:
        cluster = self._cluster
        match fault.kind:
            case FaultKind.NODE_CRASH:
                cluster.kill_node(fault.node, signal.SIGKILL)
            case FaultKind.MASTER_CRASH:
                cluster.kill_master(signal.SIGKILL)
            case FaultKind.FREEZE:
                cluster.freeze_node(fault.node, fault.duration_s)
            case FaultKind.PARTITION:
                cluster.partition_node(fault.node, fault.duration_s)
            case FaultKind.RUNNER_KILL:
                cluster.kill_runners(fault.node)
            case FaultKind.STALL_WARMUP | FaultKind.LOSE_RUNNER | FaultKind.FAIL_CHATS:
                cluster.set_node_fault(fault.node, BROKEN_KINDS[fault.kind])

    async def wait_over(self, fault: FaultSpec) -> None:
        await anyio.sleep(fault.duration_s)
        if fault.kind is FaultKind.NODE_CRASH:
            while self._cluster.pid(fault.node) is None:
                await anyio.sleep(BACK_POLL_S)
        elif fault.kind is FaultKind.MASTER_CRASH:
            while not await self._master_answers():
                await anyio.sleep(BACK_POLL_S)
        elif fault.kind in BROKEN_KINDS:
            self._cluster.set_node_fault(fault.node, None)

    async def _master_answers(self) -> bool:
        if self._cluster.pid("master") is None:
            return False
        try:
            response = await self._client.get(f"{self._url}/healthz", timeout=API_TIMEOUT_S)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    def master_log(self) -> Path | None:
        return self._cluster.data_dir / "master" / LOG_FILE


async def _read_sse(
    response: httpx.Response,
    on_state: Callable[[State], None],
    on_event: Callable[[IndexedEvent], None],
) -> None:
    """Dispatch a dashboard stream's messages until it ends (see
    keeper.sim.master.dashboard_stream)."""
    kind = ""
    data: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("event:"):
            kind = line.removeprefix("event:").strip()
        elif line.startswith("data:"):
            data.append(line.removeprefix("data:").strip())
        elif not line:
            payload = "\n".join(data)
            if kind == "snapshot":
                on_state(StreamSnapshot.model_validate_json(payload).state)
            elif kind == "event":
                on_event(IndexedEvent.model_validate_json(payload))
            elif kind == "error":
                return
            kind, data = "", []


async def run_processes(
    settings: SoakSettings, data_dir: Path, say: Callable[[str], None], cluster_out: TextIO
) -> SoakReport:
    """Start the cluster, run the soak against it, stop every process (also on failure)."""
    cluster = LocalCluster(
        settings.nodes,
        free_port(),
        data_dir,
        node_restart_s=NODE_DOWN_S,
        out=cluster_out,
        liveness=settings.liveness,
    )
    limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=32)
    report: SoakReport | None = None
    async with (
        httpx.AsyncClient(limits=limits, trust_env=False) as client,
        anyio.create_task_group() as group,
    ):
        await group.start(cluster.run)
        say(f"cluster up: master {cluster.url}, {settings.nodes} nodes, data in {data_dir}")
        report = await Soak(ProcessTarget(cluster, client), settings, say).run()
        group.cancel_scope.cancel()
    if report is None:  # the task group re-raises whatever stopped the run first
        raise SoakError("the soak stopped before it finished")
    return report


def layout_summary(data_dir: Path) -> str:
    """What cluster.json says about restarts, for the closing lines of a run."""
    try:
        layout: Any = json.loads((data_dir / "cluster.json").read_text())
    except (OSError, ValueError):
        return ""
    restarts = [f"master {layout['master']['restarts']}"]
    restarts += [f"{node['name']} {node['restarts']}" for node in layout["nodes"]]
    return "process restarts: " + ", ".join(restarts)
