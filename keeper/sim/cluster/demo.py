"""The embedded cluster behind ``exo-deploy-tui --demo``, the TUI's only door to the cluster side.

``EmbeddedCluster`` runs, in a background thread with its own event loop, a master with its HTTP
API on a free loopback port and three in-process simulated nodes of different sizes, and
creates a few deployments of real catalog models: a small one kept at two replicas on nodes
apart (kill one replica's node and the other serves on while the keeper restores the second),
and one that no node can hold. The TUI then
talks to it over HTTP like to any master, so the demo exercises the real client path. Its fault
methods are thread-safe (they hop onto the cluster's loop) and take node names, so the TUI can
offer "kill this node" without knowing anything about how nodes are run.

Timings are the real ones except three, chosen so a fault's whole story plays out in about a
minute on screen: nodes load at a few seconds per model, download at ``DEMO_DOWNLOAD_MB_PER_S``
(a model a node lacks arrives in seconds, the 16 GiB Qwen3-30B in about 17 s), and a silent
node is declared gone after ``DEMO_NODE_TIMEOUT_S`` instead of exo's 30 s. The keeper's
constants (the 15 s startup grace included) are untouched.

Each node starts with the models the keeper first places on it already on its disk
(``DEMO_NODES``), so the dashboard is serving soon after the grace; mini-b starts empty. Kill the
studio and its models move to mini-b, which must download them first: Qwen3-30B is seen
downloading for about 17 s before it loads (and the small ones queued behind it, one download at
a time). A killed node comes back with its files.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal

from keeper.model.catalog import catalog_by_id
from keeper.model.liveness import LivenessConfig
from keeper.model.state import Backend
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig

T = TypeVar("T")

# Every demo load takes at least this long, so even a tiny model is seen loading on screen.
DEMO_LOAD_FLOOR_S = 3.0
# How fast the demo's nodes download (MB/s; a fast local mirror, ten times Hugging Face's usual):
# slow enough that the 16 GiB Qwen3-30B is seen downloading for about 17 s on the node it moves
# to, fast enough that its whole story (download, load, serving) still fits in the minute.
DEMO_DOWNLOAD_MB_PER_S = 1000.0

QWEN_06B = "mlx-community/Qwen3-0.6B-4bit"
LLAMA_1B = "mlx-community/Llama-3.2-1B-Instruct-4bit"
QWEN_30B = "mlx-community/Qwen3-30B-A3B-4bit"
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"


def _demo_mac(
    name: str,
    memory_gb: float,
    load_gb_per_s: float,
    machine_model: str,
    chip_id: str,
    ip: str,
    has: tuple[str, ...],
) -> NodeConfig:
    """A simulated Apple-silicon Mac of the demo: MLX only, each load seen for a few seconds,
    ``has`` on its disk from the start."""
    catalog = catalog_by_id()
    return NodeConfig(
        name=name,
        memory_gb=memory_gb,
        backends=(Backend.MLX_METAL,),
        load_gb_per_s=load_gb_per_s,
        load_floor_s=DEMO_LOAD_FLOOR_S,
        machine_model=machine_model,
        chip_id=chip_id,
        ip=ip,
        download_mb_per_s=DEMO_DOWNLOAD_MB_PER_S,
        has_models=tuple(catalog[model_id] for model_id in has),
    )


DEMO_NODES = (
    # name, RAM in GB, load speed in GB/s, machine, chip, address, what the keeper first places
    # there (on its disk already: the start is quick; mini-b, empty, is where the studio's
    # models go when it dies, and downloads them)
    _demo_mac(
        "studio",
        96,
        10.0,
        "Mac Studio",
        "Apple M3 Ultra",
        "127.0.0.1",
        (QWEN_06B, LLAMA_1B, QWEN_30B),
    ),
    _demo_mac("mini-a", 24, 4.0, "Mac mini", "Apple M4 Pro", "127.0.0.2", (QWEN_06B,)),
    _demo_mac("mini-b", 24, 4.0, "Mac mini", "Apple M4 Pro", "127.0.0.3", ()),
)
# Real catalog models with their replicas: three that fit somewhere, the smallest kept twice so
# a node's loss shows serving carried on by the other replica, and one (DeepSeek V3.1, ~406 GB)
# that no demo node set can hold, so the dashboard shows a deployment that cannot be placed and
# why.
DEMO_MODELS: tuple[tuple[str, int], ...] = (
    (QWEN_06B, 2),
    (LLAMA_1B, 1),
    (QWEN_30B, 1),
    (DEEPSEEK, 1),
)
# A killed or frozen node is declared gone after this long (exo: 30 s), so recovery is seen soon.
DEMO_NODE_TIMEOUT_S = 10.0
DEMO_SWEEP_INTERVAL_S = 2.0
# A killed node comes back (empty) after this long: after its instance was lost and replaced.
DEMO_NODE_DOWN_S = 30.0
# Starting the loop, the master and uvicorn takes well under a second; this bounds a bad start.
START_TIMEOUT_S = 30.0


class EmbeddedCluster:
    """A master, its API and 3 simulated nodes on a background thread: start, url, stop."""

    def __init__(
        self,
        nodes: tuple[NodeConfig, ...] = DEMO_NODES,
        models: tuple[tuple[str, int], ...] = DEMO_MODELS,
    ) -> None:
        self._node_configs = nodes
        self._models = models
        # Fast failover on, at the services' defaults (docs/design.md §5.18): the demo shows a
        # killed node suspect, then dead, then gone.
        self._config = MasterConfig(
            node_timeout_s=DEMO_NODE_TIMEOUT_S,
            sweep_interval_s=DEMO_SWEEP_INTERVAL_S,
            liveness=LivenessConfig(),
        )
        self._data_dir: Path | None = None
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._main: Future[Any] | None = None
        self._cluster: InProcessCluster | None = None
        self._master: Master | None = None
        self._master_scope: anyio.CancelScope | None = None
        self._master_done: anyio.Event | None = None
        self._group: TaskGroup | None = None
        self._port = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        if not self._port:
            raise RuntimeError("the demo cluster is not started")
        return f"http://127.0.0.1:{self._port}"

    def node_names(self) -> list[str]:
        return [config.name for config in self._node_configs]

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> str:
        """Start everything; returns the master's URL once its API answers."""
        with self._lock:
            if self._portal is not None:
                return self.url
            self._data_dir = Path(tempfile.mkdtemp(prefix="exo-deploy-demo-"))
            self._portal_cm = start_blocking_portal(backend="asyncio")
            self._portal = self._portal_cm.__enter__()
            try:
                self._main, _ = self._portal.start_task(self._run, name="exo-deploy demo")
            except BaseException:
                self._shutdown_portal()
                raise
            return self.url

    def stop(self) -> None:
        """Stop the master, the nodes and the loop; remove the demo's data. Idempotent."""
        with self._lock:
            if self._portal is None:
                return
            if self._main is not None:
                self._main.cancel()
            self._shutdown_portal()

    def __enter__(self) -> EmbeddedCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _shutdown_portal(self) -> None:
        portal_cm, self._portal_cm, self._portal, self._main = self._portal_cm, None, None, None
        if portal_cm is not None:
            # Waits for the cancelled tasks to finish (the master writes its snapshot).
            portal_cm.__exit__(None, None, None)
        if self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None
        self._port = 0

    async def _run(self, *, task_status: TaskStatus[None]) -> None:
        async with anyio.create_task_group() as group:
            self._group = group
            await self._start_master(group)
            assert self._master is not None
            self._cluster = InProcessCluster(self._master, self._node_configs)
            await group.start(self._cluster.run)
            for model, replicas in self._models:
                await self._master.create_deployment(model, replicas=replicas)
            task_status.started()

    async def _start_master(self, group: TaskGroup) -> None:
        master = Master(self._data_dir, config=self._config)
        scope = anyio.CancelScope()
        done = anyio.Event()

        async def run_master(*, task_status: TaskStatus[int]) -> None:
            try:
                with scope:
                    await serve(master, "127.0.0.1", self._port, None, task_status=task_status)
            finally:
                done.set()

        with anyio.fail_after(START_TIMEOUT_S):
            self._port = await group.start(run_master)
        self._master, self._master_scope, self._master_done = master, scope, done

    # --- faults (thread-safe) -------------------------------------------------------------

    def kill_node(self, name: str, down_s: float = DEMO_NODE_DOWN_S) -> None:
        """The node dies now and comes back empty (same id, no runners) after ``down_s``."""
        self._call(lambda: self._nodes().crash(name, down_s))

    def freeze_node(self, name: str, seconds: float) -> None:
        """The node stops reading and writing for ``seconds`` (as if SIGSTOPped), then resumes."""
        self._call(lambda: self._nodes().freeze(name, seconds))

    def partition_node(self, name: str, seconds: float) -> None:
        """The node's link to the master is cut for ``seconds``."""
        self._call(lambda: self._nodes().partition(name, seconds))

    def kill_runner(self, name: str, instance_id: str | None = None) -> int:
        """A runner on the node dies (all of its runners when ``instance_id`` is None); it is
        retried with exo's backoff. Returns how many runners were killed."""
        return self._call(lambda: self._nodes().kill_runner(name, instance_id))

    def restart_master(self) -> None:
        """Stop the master and start a new one on the same port from the same log; the nodes
        reconnect and report what they run inside its startup grace."""
        portal = self._require_portal()
        portal.call(self._restart_master)

    async def _restart_master(self) -> None:
        if self._master_scope is None or self._master_done is None:
            raise RuntimeError("the demo cluster is not running")
        self._master_scope.cancel()
        await self._master_done.wait()
        group = self._require_group()
        await self._start_master(group)
        self._nodes().set_master(self._master)

    def _nodes(self) -> InProcessCluster:
        if self._cluster is None:
            raise RuntimeError("the demo cluster is not running")
        return self._cluster

    def _require_group(self) -> TaskGroup:
        if self._group is None:
            raise RuntimeError("the demo cluster is not running")
        return self._group

    def _require_portal(self) -> BlockingPortal:
        portal = self._portal
        if portal is None:
            raise RuntimeError("the demo cluster is not started")
        return portal

    def _call(self, action: Callable[[], T]) -> T:
        return self._require_portal().call(_sync_call, action)


async def _sync_call(action: Callable[[], T]) -> T:
    return action()
