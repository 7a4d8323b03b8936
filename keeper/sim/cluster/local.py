"""``exo-deploy cluster``: a master and N simulated node processes on this machine, in the
foreground, each node reaching the master through its own TCP proxy (for partitions).

Real processes, so faults are real: ``kill -9`` a node or the master, SIGSTOP one, cut its link.
``LocalCluster`` is also the harness other tools drive (the soak runner, the end-to-end test);
its fault methods (``kill_node``, ``kill_runners``, ``freeze_node``, ``partition_node``,
``kill_master``) act on the processes it started and nothing else.

Supervision policy, decided here:
- A master that dies is reported and restarted after ``MASTER_RESTART_S`` on the same port and
  data dir: it rebuilds its State from the log, the nodes reconnect by themselves, and its
  startup grace lets them report their instances before the keeper acts.
- A node that dies is reported and restarted (same name, so the same node id, with no runners)
  after ``node_restart_s`` (default 60 s): longer than exo's 30 s node timeout plus the 10 s
  sweep, so what a dead node costs is first handled the way a real cluster handles a machine
  that is gone (its instance is deleted and the keeper places the model again), and the cluster
  then gets its capacity back. ``node_restart_s=None`` never restarts nodes.

Children run in their own process groups, with their output in ``DATA_DIR/logs/``. Stopping
(Ctrl-C, SIGTERM, or cancelling ``run``) sends SIGTERM to every group (and SIGCONT, so a frozen
child can act on it), then SIGKILL to whatever is left after ``STOP_GRACE_S``: nothing is left
running. Each child also watches its parent and exits if the cluster process vanishes without
cleaning up (``kill -9`` of the cluster itself; ``keeper.runtime.process_exit.exit_with_parent``).
``DATA_DIR/cluster.json`` always says where everything is (URL, pids, proxy ports, logs), for
scripts and tests.

One module (about 450 lines) because it is one supervisor: starting, restarting, the fault
methods, stopping and ``cluster.json`` all act on the same table of children.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import anyio
import httpx
from anyio.abc import TaskGroup, TaskStatus

from keeper.model.liveness import LivenessConfig
from keeper.runtime.process_exit import EXIT_STOPPED, STOP_GRACE_S, run_reporting
from keeper.sim.cluster.proxy import TcpProxy
from keeper.sim.link.identity import NodeKey, load_or_create_key
from keeper.sim.node.node_process import RUNNER_KILL_SIGNAL, SET_FAULT_SIGNAL, write_fault_file
from keeper.sim.node.sim_options import SimFault

# Node sizes cycle through these, so a cluster mixes big and small machines (placement then
# has real choices to make, and a large model fits on some nodes and not others).
NODE_SIZES_GB = (64, 32, 16, 48, 24)
DEFAULT_LOAD_GB_PER_S = 2.0
# A dead master is restarted quickly: without one the cluster can do nothing.
MASTER_RESTART_S = 1.0
# See the module docstring: longer than node timeout + sweep, so the keeper's recovery is seen.
DEFAULT_NODE_RESTART_S = 60.0
# How often child processes are checked; a death is reported within this.
SUPERVISE_S = 0.2
# A master process answers /healthz within a second or two of starting; this bounds a bad start.
MASTER_READY_S = 30.0

HOST = "127.0.0.1"


class ClusterError(Exception):
    """The cluster cannot start (the master did not come up); the message says why."""


@dataclass
class _Child:
    role: str  # "master" or the node's name
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    restart_at: float | None = None
    restarts: int = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "keeper.cli", *args]


def _describe_exit(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
        return f"killed by signal {-code}"
    return f"exit code {code}"


class LocalCluster:
    """A master and ``nodes`` node processes under supervision; ``run`` until cancelled."""

    def __init__(
        self,
        nodes: int,
        port: int,
        data_dir: Path,
        *,
        node_timeout_s: float | None = None,
        sweep_interval_s: float | None = None,
        liveness: LivenessConfig | None = None,
        node_restart_s: float | None = DEFAULT_NODE_RESTART_S,
        load_gb_per_s: float = DEFAULT_LOAD_GB_PER_S,
        out: TextIO | None = None,
        exo_compat: bool = False,
        disk_gb: float | None = None,
        download_mb_per_s: float | None = None,
        has_models: tuple[str, ...] = (),
        webhooks: tuple[str, ...] = (),
    ) -> None:
        """``webhooks`` go to the master (``--webhook``).

        ``disk_gb``, ``download_mb_per_s`` and ``has_models`` are every node's (``exo-deploy
        node --disk-gb --download-mb-s --has``; None: the node's default). A node that dies
        restarts with only ``has_models`` on its disk: its process kept the rest in memory."""
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.port = port
        self.data_dir = data_dir
        self.node_restart_s = node_restart_s
        self._out = out if out is not None else sys.stdout
        self._logs = data_dir / "logs"
        master_args = ["master", "--host", HOST, "--port", str(port)]
        master_args += ["--data-dir", str(data_dir / "master"), "--parent-pid", str(os.getpid())]
        if node_timeout_s is not None:
            master_args += ["--node-timeout", str(node_timeout_s)]
        if sweep_interval_s is not None:
            master_args += ["--sweep-interval", str(sweep_interval_s)]
        if liveness is not None:
            master_args += ["--suspect-after-s", str(liveness.suspect_after_s)]
            master_args += ["--dead-after-s", str(liveness.dead_after_s)]
        for url in webhooks:
            master_args += ["--webhook", url]
        # A stand-in for a stock exo master (no keeper): deployments then need exo-deploy bridge.
        self.exo_compat = exo_compat
        if exo_compat:
            master_args.append("--exo-compat")
        self._master = _Child("master", _cli(*master_args), self._logs / "master.log")
        self._node_sizes = {
            f"node-{i + 1}": NODE_SIZES_GB[i % len(NODE_SIZES_GB)] for i in range(nodes)
        }
        self._load_gb_per_s = load_gb_per_s
        self._disk_args: list[str] = []
        if disk_gb is not None:
            self._disk_args += ["--disk-gb", str(disk_gb)]
        if download_mb_per_s is not None:
            self._disk_args += ["--download-mb-s", str(download_mb_per_s)]
        if has_models:
            self._disk_args += ["--has", ",".join(has_models)]
        # Each node's key, kept in the data dir so a node restarted here is the same node.
        self._node_keys: dict[str, NodeKey] = {
            name: load_or_create_key(self._key_path(name)) for name in self._node_sizes
        }
        self._nodes: dict[str, _Child] = {}
        self._proxies: dict[str, TcpProxy] = {}
        self._group: TaskGroup | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def node_names(self) -> list[str]:
        return list(self._node_sizes)

    def node_id(self, name: str) -> str:
        return self._node_keys[name].node_id

    def _key_path(self, name: str) -> Path:
        return self.data_dir / "nodes" / f"{name}.key"

    def _fault_path(self, name: str) -> Path:
        return self.data_dir / "nodes" / f"{name}.fault"

    def pid(self, role: str) -> int | None:
        """The current pid of ``"master"`` or of a node, None while it is down."""
        child = self._child(role)
        return child.pid if child.alive() else None

    # --- running ------------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start everything, report when the master answers and the nodes are started, then
        supervise until cancelled; every child is stopped on the way out."""
        self._logs.mkdir(parents=True, exist_ok=True)
        try:
            self._spawn(self._master)
            await self._wait_for_master()
            async with anyio.create_task_group() as group:
                self._group = group
                for name, size in self._node_sizes.items():
                    proxy = TcpProxy(HOST, self.port)
                    proxy_port = await group.start(proxy.run)
                    self._proxies[name] = proxy
                    self._nodes[name] = _Child(
                        name, self._node_argv(name, size, proxy_port), self._logs / f"{name}.log"
                    )
                    self._spawn(self._nodes[name])
                self._write_layout()
                self._print_layout()
                task_status.started()
                await self._supervise()
        finally:
            self._group = None
            with anyio.CancelScope(shield=True):
                await self._stop_all()

    def _node_argv(self, name: str, size_gb: int, proxy_port: int) -> list[str]:
        return _cli(
            "node",
            "--master",
            f"http://{HOST}:{proxy_port}",
            "--name",
            name,
            "--memory-gb",
            str(size_gb),
            "--load-gbps",
            str(self._load_gb_per_s),
            "--key-file",
            str(self._key_path(name)),
            "--fault-file",
            str(self._fault_path(name)),
            *self._disk_args,
            "--parent-pid",
            str(os.getpid()),
        )

    def _spawn(self, child: _Child) -> None:
        with child.log_path.open("ab") as log_file:
            child.process = subprocess.Popen(
                child.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: signals reach all of it
            )
        child.restart_at = None

    async def _wait_for_master(self) -> None:
        deadline = time.monotonic() + MASTER_READY_S
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                process = self._master.process
                if process is None or process.poll() is not None:
                    code = process.poll() if process is not None else None
                    raise ClusterError(
                        f"the master exited while starting ({_describe_exit(code or 0)}); "
                        f"see {self._master.log_path}:\n{_tail(self._master.log_path)}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{self.url}/healthz")).status_code == 200:
                        return
                await anyio.sleep(0.1)
        raise ClusterError(
            f"the master did not answer on {self.url} within {MASTER_READY_S:g} s; "
            f"see {self._master.log_path}"
        )

    async def _supervise(self) -> None:
        while True:
            await anyio.sleep(SUPERVISE_S)
            now = time.monotonic()
            changed = False
            for child in [self._master, *self._nodes.values()]:
                process = child.process
                if process is not None and child.restart_at is None:
                    code = process.poll()
                    if code is not None:
                        self._report_death(child, code, now)
                        changed = True
                elif child.restart_at is not None and now >= child.restart_at:
                    self._spawn(child)
                    child.restarts += 1
                    self._say(f"{child.role} restarted (pid {child.pid})")
                    changed = True
            if changed:
                self._write_layout()

    def _report_death(self, child: _Child, code: int, now: float) -> None:
        how = _describe_exit(code)
        if child is self._master:
            child.restart_at = now + MASTER_RESTART_S
            self._say(f"master (pid {child.pid}) died: {how}; restarting in {MASTER_RESTART_S:g} s")
        elif self.node_restart_s is None:
            self._say(f"{child.role} (pid {child.pid}) died: {how}; not restarting")
            child.process = None
        else:
            child.restart_at = now + self.node_restart_s
            self._say(
                f"{child.role} (pid {child.pid}) died: {how}; "
                f"restarting in {self.node_restart_s:g} s"
            )

    async def _stop_all(self) -> None:
        children = [c for c in [*self._nodes.values(), self._master] if c.alive()]
        for child in children:
            _signal_group(child, signal.SIGTERM)
            _signal_group(child, signal.SIGCONT)  # a frozen child must wake to act on it
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.alive() for c in children) and time.monotonic() < deadline:
            await anyio.sleep(0.05)
        for child in children:
            if child.alive():
                _signal_group(child, signal.SIGKILL)
        for child in children:
            if child.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(timeout=STOP_GRACE_S)

    # --- faults ---------------------------------------------------------------------------

    def kill_node(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        _signal_group(self._child(name), sig)

    def kill_runners(self, name: str) -> None:
        """Every runner on the node dies (its process stays up) and is retried with backoff."""
        _signal_group(self._child(name), RUNNER_KILL_SIGNAL)

    def set_node_fault(self, name: str, fault: SimFault | None) -> None:
        """The node's runners misbehave as ``fault`` says from now on, or heal (None): the
        fault is written to its fault file, which SET_FAULT_SIGNAL makes it read."""
        child = self._child(name)
        write_fault_file(self._fault_path(name), fault)
        _signal_group(child, SET_FAULT_SIGNAL)

    def kill_master(self, sig: signal.Signals = signal.SIGKILL) -> None:
        _signal_group(self._master, sig)

    def freeze_node(self, name: str, seconds: float) -> None:
        """SIGSTOP the node now and SIGCONT it after ``seconds``."""
        child = self._child(name)
        _signal_group(child, signal.SIGSTOP)
        self._later(seconds, lambda: _signal_group(child, signal.SIGCONT))

    def partition_node(self, name: str, seconds: float) -> None:
        """Cut the node's link to the master for ``seconds`` (both processes keep running)."""
        self._child(name)  # a clear error for an unknown name
        proxy = self._proxies[name]
        proxy.partition()
        self._later(seconds, proxy.heal)

    def _later(self, seconds: float, action: Callable[[], None]) -> None:
        if self._group is None:
            raise RuntimeError("the cluster is not running")

        async def wait_then() -> None:
            await anyio.sleep(seconds)
            action()

        self._group.start_soon(wait_then)

    def _child(self, role: str) -> _Child:
        if role == "master":
            return self._master
        child = self._nodes.get(role)
        if child is None:
            raise KeyError(f"no node named {role!r} (nodes: {', '.join(self.node_names())})")
        return child

    # --- reporting ------------------------------------------------------------------------

    def layout(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "data_dir": str(self.data_dir),
            "master": {
                "pid": self.pid("master"),
                "port": self.port,
                "log": str(self._master.log_path),
                "restarts": self._master.restarts,
            },
            "nodes": [
                {
                    "name": name,
                    "node_id": self.node_id(name),
                    "pid": self.pid(name),
                    "memory_gb": self._node_sizes[name],
                    "proxy_port": self._proxies[name].port if name in self._proxies else None,
                    "log": str(child.log_path),
                    "restarts": child.restarts,
                }
                for name, child in self._nodes.items()
            ],
        }

    def _write_layout(self) -> None:
        path = self.data_dir / "cluster.json"
        partial = path.with_suffix(".json.tmp")
        partial.write_text(json.dumps(self.layout(), indent=2) + "\n")
        partial.replace(path)

    def _print_layout(self) -> None:
        lines = [
            f"exo-deploy cluster: master {self.url} (pid {self.pid('master')})",
            f"  data dir  {self.data_dir}  (state in master/, logs in logs/, cluster.json)",
        ]
        for name, child in self._nodes.items():
            lines.append(
                f"  {name:<8} {self._node_sizes[name]:>3} GB  pid {child.pid}  "
                f"via proxy :{self._proxies[name].port}  id {self.node_id(name)[:16]}..."
            )
        restart = "never" if self.node_restart_s is None else f"after {self.node_restart_s:g} s"
        lines.append(f"  dead nodes restart {restart}; the master after {MASTER_RESTART_S:g} s")
        if self.exo_compat:
            lines.append(
                f"  serving exo's API (no keeper); try: exo-deploy bridge --exo {self.url}"
            )
        else:
            lines.append(f"  try: exo-deploy deploy mlx-community/Qwen3-0.6B-4bit --url {self.url}")
        lines.append("  Ctrl-C stops everything.")
        for line in lines:
            print(line, file=self._out, flush=True)

    def _say(self, message: str) -> None:
        stamp = datetime.now(UTC).astimezone().strftime("%H:%M:%S")
        print(f"[{stamp}] {message}", file=self._out, flush=True)


def _signal_group(child: _Child, sig: signal.Signals) -> None:
    process = child.process
    if process is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_cluster(
    nodes: int,
    port: int,
    data_dir: Path,
    *,
    node_timeout_s: float | None = None,
    sweep_interval_s: float | None = None,
    liveness: LivenessConfig | None = None,
    node_restart_s: float | None = DEFAULT_NODE_RESTART_S,
    exo_compat: bool = False,
    disk_gb: float | None = None,
    download_mb_per_s: float | None = None,
    has_models: tuple[str, ...] = (),
    webhooks: tuple[str, ...] = (),
) -> int:
    """``exo-deploy cluster``: run in the foreground until SIGINT/SIGTERM; the exit code."""
    cluster = LocalCluster(
        nodes,
        port,
        data_dir,
        node_timeout_s=node_timeout_s,
        sweep_interval_s=sweep_interval_s,
        liveness=liveness,
        node_restart_s=node_restart_s,
        exo_compat=exo_compat,
        disk_gb=disk_gb,
        download_mb_per_s=download_mb_per_s,
        has_models=has_models,
        webhooks=webhooks,
    )

    async def main() -> None:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for received in signals:
                        print(
                            f"{signal.Signals(received).name}: stopping the cluster",
                            flush=True,
                        )
                        group.cancel_scope.cancel()
                        return

            group.start_soon(stop_on_signal)
            await cluster.run()

    code = run_reporting("cluster", main, ClusterError)
    if code == EXIT_STOPPED:
        print("exo-deploy cluster: stopped; nothing left running", flush=True)
    return code
