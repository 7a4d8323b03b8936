"""The soak in virtual time: the same run against a master and in-process nodes under MockClock.

``VirtualTarget`` gives ``keeper.sim.soak.run`` what it needs from an in-process cluster
(``keeper.sim.cluster.in_process``): node faults are its crash/freeze/partition/kill-runner methods,
the broken-instance kinds the node's own ``set_fault`` (healed when the fault is over; a crash
meanwhile heals it too, as the restarted node starts from its config); a
master crash stops the running ``Master`` (its tasks are cancelled, as a kill would end them)
and starts a new one on the same data dir after ``MASTER_DOWN_S``, which rebuilds its State
from the event log while the nodes reconnect to it.

The fault plan, the invariants and the report are the process soak's, but for one rule: faults
may overlap here (``SoakSettings.one_fault_at_a_time`` off). The virtual day is where the
invariants (nothing lost, never more instances than replicas) meet two nodes out at once, a
master restart during a node fault and the like, hour after hour; availability under single
faults is measured by the process soak, and the virtual run's shares are no availability
anyway (see VIRTUAL_LOAD). What differs besides is what
costs wall time here and nothing there: chats go to ``Master.chat`` directly (the HTTP layer
adds cost and nothing to what is soaked; the outcome labels are the ones HTTP would give), the
clients are sparser (the run's probes still time every recovery to the second), and the nodes
heartbeat every 5 s rather than every second (still six times inside the node timeout).

Under trio's ``MockClock(autojump_threshold=0)`` the clock jumps whenever every task waits, so
a simulated day takes a minute or two. A run is replayable: its only sources of chance are
seeded, the ids (instance, runner and deployment ids, whose order decides ties), which every
master of the run mints with one ``seeded_ids(seed)`` factory passed in, and trio's scheduler
(which otherwise orders each batch of ready tasks by chance and by memory address), which
``deterministic(seed)`` seeds around the event loop. The same seed then gives the same report,
field for field.

The master's log goes to a temporary directory, in memory (``/dev/shm``) where there is one:
the master fsyncs every batch, and a disk's fsync would cost more wall time than the rest.
"""

from __future__ import annotations

import contextlib
import importlib
import random
import tempfile
import uuid
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import TaskGroup, TaskStatus

from keeper.model.events import IndexedEvent
from keeper.model.ids import IdFactory, new_id
from keeper.model.liveness import LivenessConfig
from keeper.model.refusals import RefusalError
from keeper.model.state import State
from keeper.runtime.clock import AnyioClock
from keeper.runtime.event_log import LOG_FILE
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.cluster.local import DEFAULT_LOAD_GB_PER_S, NODE_SIZES_GB
from keeper.sim.link.protocol import ChatMessage
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.master.subscriptions import Subscription
from keeper.sim.node.sim_node import NodeConfig
from keeper.sim.soak.faults import BROKEN_KINDS, MASTER_DOWN_S, FaultKind, FaultSpec
from keeper.sim.soak.load import LoadSettings, error_label
from keeper.sim.soak.report import Deployed, RunKind, SoakReport
from keeper.sim.soak.run import DeploymentHealth, Soak, SoakError, SoakSettings, model_statuses

PROMPT = "Say something while the cluster is being knocked about."
# Requests are spaced out in virtual time, where every one costs wall time (mostly the two runner
# status events a reply causes): each client waits about a minute after a reply and a few
# seconds after an error. The run's own probes time recoveries to the second meanwhile.
VIRTUAL_LOAD = LoadSettings(pause_after_result_s=60.0, pause_after_error_s=5.0)
# A reply of two chunks: still streamed, at a quarter of the cost of eight.
VIRTUAL_MAX_TOKENS = 2
# The nodes' chatter is most of a virtual run's cost. Heartbeats every 5 s (not 1 s) and an
# unasked info refresh every 30 s (not 5 s; a change of memory is still sent at once) keep every
# node well inside the master's 30 s silence timeout at a quarter of the cost.
VIRTUAL_HEARTBEAT_S = 5.0
VIRTUAL_INFO_REFRESH_S = 30.0
# Where a temporary data dir is cheapest to fsync.
_SHM = Path("/dev/shm")


def node_configs(nodes: int) -> list[NodeConfig]:
    """The nodes ``exo-deploy cluster`` would start: the same names, sizes and load speed (only
    quieter, see VIRTUAL_HEARTBEAT_S)."""
    return [
        NodeConfig(
            name=f"node-{i + 1}",
            memory_gb=NODE_SIZES_GB[i % len(NODE_SIZES_GB)],
            load_gb_per_s=DEFAULT_LOAD_GB_PER_S,
            heartbeat_s=VIRTUAL_HEARTBEAT_S,
            info_refresh_s=VIRTUAL_INFO_REFRESH_S,
        )
        for i in range(nodes)
    ]


def seeded_ids(seed: int) -> IdFactory:
    """uuid4-shaped ids (placement derives ports from them) drawn from a generator seeded by
    ``seed``: the same sequence on every run."""
    rng = random.Random(f"ids-{seed}")

    def seeded_id() -> str:
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))

    return seeded_id


@contextlib.contextmanager
def deterministic(seed: int) -> Generator[None]:
    """trio's own switch for replayable runs (the one its Hypothesis plugin throws): each batch
    of ready tasks is put in creation order, then shuffled by trio's seeded ``_r``. Without it
    the order also depends on memory addresses (tasks in sets), which differ between runs.

    Both names are private: trio has no public way to ask for this yet
    (https://github.com/python-trio/trio/issues/2675). Hence the upper bound on trio in
    pyproject.toml and the canary tests/virtual/test_trio_canary.py, which fails when either
    moves."""
    try:
        run_module: Any = importlib.import_module("trio._core._run")
    except ImportError:  # not running on trio: nothing to seed
        yield
        return
    scheduler: Any = getattr(run_module, "_r", None)
    switch = "_ALLOW_DETERMINISTIC_SCHEDULING"
    if not isinstance(scheduler, random.Random) or not hasattr(run_module, switch):
        yield
        return
    saved_state, saved_switch = scheduler.getstate(), getattr(run_module, switch)
    scheduler.seed(f"scheduler-{seed}")
    setattr(run_module, switch, True)
    try:
        yield
    finally:
        setattr(run_module, switch, saved_switch)
        scheduler.setstate(saved_state)


class VirtualTarget:
    """An in-process master and nodes, restarted and faulted in place (see module docstring)."""

    run_kind: RunKind = "virtual"

    def __init__(
        self,
        data_dir: Path,
        nodes: int,
        config: MasterConfig | None = None,
        *,
        new_id: IdFactory = new_id,
    ) -> None:
        self._data_dir = data_dir
        # One factory for every master of the run, so a restarted master goes on with the
        # sequence rather than starting it again.
        self._new_id = new_id
        self._config = config if config is not None else MasterConfig()
        # One wall clock for every master of the run, made in the event loop on first start: a
        # host's wall clock runs on across a master's restart, and an AnyioClock made anew would
        # anchor to real time, which under the MockClock lags the virtual time that passed, so
        # a restarted master would read the State's Unix times (serving records, the repairs'
        # incidents) as hours ahead.
        self._clock: AnyioClock | None = None
        self._configs = node_configs(nodes)
        self._cluster = InProcessCluster(None, self._configs)
        self._master: Master | None = None
        self._master_scope: anyio.CancelScope | None = None
        self._master_stopped = anyio.Event()
        self._master_back = anyio.Event()
        self._group: TaskGroup | None = None
        send, receive = anyio.create_memory_object_stream[Subscription](16)
        self._new_subscriptions = send
        self._subscriptions = receive

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the master and the nodes until cancelled."""
        async with anyio.create_task_group() as group:
            self._group = group
            await group.start(self._cluster.run)
            await self._start_master()
            task_status.started()

    async def _start_master(self) -> None:
        assert self._group is not None
        if self._clock is None:
            self._clock = AnyioClock()
        master = Master(self._data_dir, config=self._config, new_id=self._new_id, clock=self._clock)
        scope = anyio.CancelScope()
        stopped = anyio.Event()

        async def run_master(*, task_status: TaskStatus[None]) -> None:
            try:
                with scope:
                    await master.run(task_status=task_status)
            finally:
                stopped.set()

        await self._group.start(run_master)
        # Subscribed before any node connects: the watch sees every event of this master.
        subscription = master.subscribe()
        await self._new_subscriptions.send(subscription)
        self._master, self._master_scope, self._master_stopped = master, scope, stopped
        self._cluster.set_master(master)
        self._master_back.set()

    async def _crash_master(self) -> None:
        if self._master_scope is None:
            return
        self._master = None
        self._cluster.set_master(None)
        self._master_scope.cancel()
        await self._master_stopped.wait()
        await anyio.sleep(MASTER_DOWN_S)
        await self._start_master()

    # --- SoakTarget -------------------------------------------------------------------------

    def node_names(self) -> list[str]:
        return [config.name for config in self._configs]

    def node_id(self, name: str) -> str:
        return next(c.resolved_id for c in self._configs if c.name == name)

    async def deploy(self, model: Deployed) -> None:
        assert self._master is not None
        await self._master.create_deployment(
            model.model_id, min_nodes=model.min_nodes, replicas=model.replicas
        )

    async def chat(self, model_id: str) -> str | None:
        master = self._master
        if master is None or not master.running:
            return "connection refused"
        try:
            stream = await master.chat(
                model_id, [ChatMessage(role="user", content=PROMPT)], VIRTUAL_MAX_TOKENS
            )
            async for _ in stream:
                pass
        except RefusalError as exc:
            return error_label(exc.status_code, exc.message)
        return None

    async def follow(
        self, on_state: Callable[[State], None], on_event: Callable[[IndexedEvent], None]
    ) -> None:
        async for subscription in self._subscriptions:
            on_state(subscription.state)
            async with subscription:
                async for indexed in subscription:
                    on_event(indexed)

    async def statuses(self) -> dict[str, DeploymentHealth]:
        master = self._master
        if master is None or not master.running:
            return {}
        return model_statuses(master.deployments_view())

    async def connected_nodes(self) -> int | None:
        master = self._master
        if master is None or not master.running:
            return None
        return len(master.connected_nodes())

    async def inject(self, fault: FaultSpec) -> None:
        cluster = self._cluster
        match fault.kind:
            case FaultKind.NODE_CRASH:
                cluster.crash(fault.node, fault.duration_s)
            case FaultKind.FREEZE:
                cluster.freeze(fault.node, fault.duration_s)
            case FaultKind.PARTITION:
                cluster.partition(fault.node, fault.duration_s)
            case FaultKind.RUNNER_KILL:
                cluster.kill_runner(fault.node)
            case FaultKind.MASTER_CRASH:
                assert self._group is not None
                self._master_back = anyio.Event()
                self._group.start_soon(self._crash_master)
            case FaultKind.STALL_WARMUP | FaultKind.LOSE_RUNNER | FaultKind.FAIL_CHATS:
                cluster.node(fault.node).set_fault(BROKEN_KINDS[fault.kind])

    async def wait_over(self, fault: FaultSpec) -> None:
        if fault.kind is FaultKind.MASTER_CRASH:
            await self._master_back.wait()
            return
        await anyio.sleep(fault.duration_s)
        if fault.kind in BROKEN_KINDS:
            self._cluster.node(fault.node).set_fault(None)

    def master_log(self) -> Path | None:
        return self._data_dir / LOG_FILE


def virtual_settings(
    hours: float, seed: int, nodes: int, liveness: LivenessConfig | None = None
) -> SoakSettings:
    """``liveness``: the master's fast failover; None: on, at its defaults."""
    return SoakSettings(
        minutes=hours * 60,
        seed=seed,
        nodes=nodes,
        load=VIRTUAL_LOAD,
        progress_every_s=3600.0,
        say_faults=False,
        one_fault_at_a_time=False,
        liveness=liveness if liveness is not None else LivenessConfig(),
    )


async def run_virtual(
    settings: SoakSettings, data_dir: Path, say: Callable[[str], None]
) -> SoakReport:
    """One virtual soak inside the running (MockClock) event loop, its ids seeded by the
    settings' seed; seed trio's scheduler with ``deterministic`` around the event loop for a
    replayable run."""
    config = MasterConfig(liveness=settings.liveness)
    target = VirtualTarget(data_dir, settings.nodes, config, new_id=seeded_ids(settings.seed))
    report: SoakReport | None = None
    async with anyio.create_task_group() as group:
        await group.start(target.run)
        report = await Soak(target, settings, say).run()
        group.cancel_scope.cancel()
    if report is None:  # the task group re-raises whatever stopped the run first
        raise SoakError("the soak stopped before it finished")
    return report


def temporary_data_dir() -> tempfile.TemporaryDirectory[str]:
    where = _SHM if _SHM.is_dir() else None
    return tempfile.TemporaryDirectory(prefix="exo-deploy-soak-", dir=where)
