"""One soak, whatever it runs against: deploy, load, inject faults, let it settle, report.

Both soaks (separate processes on the real clock, in-process nodes in virtual time) run this
same sequence against a ``SoakTarget``, the small surface that differs between them: how to
deploy, send a chat, follow the event stream, read the deployments' status, inject a fault and
know when it is over. So the invariants and the report cannot drift apart between the two.

The sequence:
1. deploy the models (the soak never places an instance itself: the keeper does);
2. start the load and the watch, and wait until every model has answered a chat and every
   deployment has all its replicas ready;
3. for ``minutes``: every 20-60 s a fault from the seeded plan (``keeper.sim.soak.faults``); with
   ``one_fault_at_a_time`` (the process soak) a fault also waits until the one before it has
   settled (``keeper.sim.soak.faults.may_start_next``);
4. stop injecting, wait until every fault is over (processes back, links healed);
5. wait up to ``settle_timeout_s`` for every deployment to be serving with all its replicas
   ready and for every model to answer a chat;
6. stop the load (requests in flight run to their outcome or deadline), check the master's
   whole event log for duplicates, and build the report.

A fault has recovered once every deployed model has answered a chat that was sent after the
fault struck: recovery is measured as clients see it, not as the State claims it. Some faults
strike late: a partitioned node that holds only a later pipeline stage does not stop chats (the
first stage answers them) until the master times the node out and deletes its instance, half a
minute on. So the deletion of an instance a fault hit, while the fault lasts (or, for a node
taken away, within a sweep period after it is back), restarts its recovery from that moment.

A fault is *recognised* once the keeper judged an instance it hit broken while the fault lasted
(docs/design.md §5.19): a ``DeploymentRepairPlaced`` for it on the event stream, or the
deployment's ``health`` naming it while the run polls. Meant for the broken-instance kinds
(``BROKEN_KINDS``), timed for every kind. It is *repaired* once such an instance is gone
from the State (deleted after its replacement was ready, or at once when hollow).

A fault has *settled* once it is over and recovered, every node is connected to the master and
every deployment has all its replicas ready (polled every second while a fault is unsettled).
From its injection to then is the fault's span in the report: the requests in flight during it
are the ones it may have cost, which is how the report tells a master restart's errors apart.

About 630 lines because the run's phases (start, faults, the watch on their settling, settle,
drain, judge) share one clock and one set of counters; loading, faults, watching and the report
are already modules of their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from keeper.model.api_models import DeploymentsResponse
from keeper.model.events import IndexedEvent
from keeper.model.liveness import LivenessConfig
from keeper.model.state import State
from keeper.sim.master.service import MasterConfig
from keeper.sim.soak.faults import (
    BROKEN_KINDS,
    FAULT_END_TIMEOUT_S,
    MASTER,
    TAKES_A_NODE_AWAY,
    FaultKind,
    FaultPlan,
    FaultProgress,
    FaultSpec,
    give_up_at,
    is_settled,
    may_start_next,
)
from keeper.sim.soak.load import Load, LoadSettings, ModelCounts
from keeper.sim.soak.report import (
    Deployed,
    FaultRecord,
    ModelOutcomes,
    RunKind,
    SoakReport,
    latency_stats,
    model_outcomes,
    summarize,
    summarize_broken,
)
from keeper.sim.soak.watch import ClusterWatch, check_log

# Three models: one that fits on one node, one placed as a pipeline over two nodes (min_nodes 2:
# its 17.6 GB would fit some single nodes, the deployment asks for two), and a small one kept at
# two replicas on nodes apart, so a fault on one node leaves the other replica serving.
SINGLE_NODE_MODEL = Deployed(model_id="mlx-community/Qwen3-0.6B-4bit", min_nodes=1)
PIPELINE_MODEL = Deployed(model_id="mlx-community/Qwen3-30B-A3B-4bit", min_nodes=2)
REPLICATED_MODEL = Deployed(
    model_id="mlx-community/Llama-3.2-1B-Instruct-4bit", min_nodes=1, replicas=2
)
SOAK_MODELS = (SINGLE_NODE_MODEL, PIPELINE_MODEL, REPLICATED_MODEL)

# After the faults, every deployment must serve again, all its replicas ready, within three
# minutes.
SETTLE_TIMEOUT_S = 180.0
# Before the faults: the master's 15 s grace, a placement, and loading 17.6 GB over two nodes
# take well under a minute; three mean something is broken.
WARM_UP_TIMEOUT_S = 180.0
# A deletion this soon after a fault ended is still the fault's doing: the master's sweep, which
# deletes instances on departed nodes, runs this often.
REATTRIBUTE_S = MasterConfig().sweep_interval_s
# While a fault has not recovered, each model still to answer gets a probe request this often
# (one in flight at a time): recovery is timed to about this, however sparse the load.
PROBE_S = 1.0
# How often the run checks the deployments' status and the connected nodes while settling, and
# while a fault has not settled: settling is timed to about this.
STATUS_POLL_S = 1.0


def _since(moment: float | None, at: float) -> float | None:
    return None if moment is None else round(moment - at, 3)


class SoakError(Exception):
    """The soak could not run (the cluster never served); the message says what and where."""


@dataclass(frozen=True)
class DeploymentHealth:
    """A deployed model as ``GET /deployments`` shows it: its status and its replicas."""

    status: str
    replicas: int
    ready_replicas: int
    # The instance its ``health`` names broken (docs/design.md §5.19), or None.
    broken_instance: str | None = None

    @property
    def serving(self) -> bool:
        return self.status == "serving"

    @property
    def whole(self) -> bool:
        """Serving with every replica it asks for ready."""
        return self.serving and self.ready_replicas >= self.replicas


def model_statuses(listing: DeploymentsResponse) -> dict[str, DeploymentHealth]:
    """Each deployed model's health in a ``GET /deployments`` listing (what ``statuses`` says)."""
    return {
        view.deployment.model_card.model_id: DeploymentHealth(
            view.status,
            view.replicas,
            view.ready_replicas,
            None if view.health is None else view.health.instance,
        )
        for view in listing.deployments
    }


class SoakTarget(Protocol):
    """What a soak needs of the cluster it runs against (see the module docstring)."""

    run_kind: RunKind

    def node_names(self) -> list[str]: ...

    def node_id(self, name: str) -> str: ...

    async def deploy(self, model: Deployed) -> None: ...

    async def chat(self, model_id: str) -> str | None:
        """Send one chat: None for a reply, else a short label of the error."""
        ...

    async def follow(
        self, on_state: Callable[[State], None], on_event: Callable[[IndexedEvent], None]
    ) -> None:
        """Until cancelled: the master's State, then each event; a State again whenever the
        stream starts over (a new master, a reconnection)."""
        ...

    async def statuses(self) -> dict[str, DeploymentHealth]:
        """Each deployed model's health; empty while the master cannot be reached."""
        ...

    async def connected_nodes(self) -> int | None:
        """How many nodes are connected to the master; None while it cannot be reached."""
        ...

    async def inject(self, fault: FaultSpec) -> None: ...

    async def wait_over(self, fault: FaultSpec) -> None:
        """Return once the fault is over: the process is back, the node thawed, the link healed."""
        ...

    def master_log(self) -> Path | None:
        """The master's event log, for the final duplicate check (None: not available)."""
        ...


@dataclass(frozen=True)
class SoakSettings:
    minutes: float
    seed: int
    nodes: int
    models: tuple[Deployed, ...] = SOAK_MODELS
    load: LoadSettings = field(default_factory=LoadSettings)
    settle_timeout_s: float = SETTLE_TIMEOUT_S
    warm_up_timeout_s: float = WARM_UP_TIMEOUT_S
    # Print a progress line this often (run time), and one per fault when ``say_faults``.
    progress_every_s: float = 60.0
    say_faults: bool = True
    # A fault starts only once the one before it has settled (keeper.sim.soak.faults): the process
    # soak measures recovery from single faults. The virtual day lets them overlap, see
    # keeper.sim.soak.virtual.
    one_fault_at_a_time: bool = True
    # The master's fast failover (``--suspect-after-s`` / ``--dead-after-s``, docs/design.md
    # §5.18): on at the master's defaults, as ``exo-deploy master`` runs; OFF keeps exo's rule.
    liveness: LivenessConfig = field(default_factory=LivenessConfig)


@dataclass
class _Fault:
    spec: FaultSpec
    at: float  # absolute, on the run's clock
    hit: list[str]  # instances with a runner where it struck (all of them for a master crash)
    waiting_for: set[str]  # models that have not yet answered a chat sent after ``since``
    since: float  # ``at``, or the deletion of an instance it hit (see the module docstring)
    ended_at: float | None = None
    recovered_at: float | None = None
    settled_at: float | None = None  # see the module docstring
    given_up: bool = False  # it did not settle by ``give_up_at``
    recognised_at: float | None = None  # see the module docstring
    recognised: set[str] = field(default_factory=set[str])  # the hit instances judged broken
    repaired_at: float | None = None
    started_unsettled: bool = False  # the fault before it had not settled when it struck


@dataclass
class _Ending:
    """What held when the run stopped waiting for the cluster after the faults."""

    serving: bool = False  # every deployment serving, every model answered after the faults
    replicas: bool = False  # every deployment with all its replicas ready
    settle_s: float | None = None  # from every fault over until both held


class Soak:
    def __init__(
        self, target: SoakTarget, settings: SoakSettings, say: Callable[[str], None]
    ) -> None:
        self._target = target
        self._settings = settings
        self._say = say
        self._models = [model.model_id for model in settings.models]
        self._plan = FaultPlan(settings.seed)
        self.watch = ClusterWatch(on_deleted=self._on_deleted, on_repair=self._on_repair)
        self.load = Load(
            target.chat, self._models, settings.load, self._on_result, seed=settings.seed
        )
        self._faults: list[_Fault] = []
        self._recovering: list[_Fault] = []
        self._last_served: dict[str, float] = {}  # model -> latest send time of a reply
        self._origin = 0.0
        self._fault_struck = anyio.Event()  # wakes the prober
        self._to_settle = anyio.Event()  # wakes the settling watch

    # --- the sequence -------------------------------------------------------------------------

    async def run(self) -> SoakReport:
        settings = self._settings
        ending = _Ending()
        async with anyio.create_task_group() as group:
            self.watch.master_started(anyio.current_time())
            group.start_soon(self._follow)
            group.start_soon(self._watch_settling)
            for model in settings.models:
                await self._target.deploy(model)
            load_done = anyio.Event()
            group.start_soon(self._run_load, load_done)
            group.start_soon(self._progress)
            await self._warm_up()
            self._origin = anyio.current_time()
            self.load.count_from(self._origin)
            self._say(f"every model serves; injecting faults for {settings.minutes:g} min")
            async with anyio.create_task_group() as faults:
                await self._inject_faults(faults)
            self._say("faults over; waiting for every deployment to serve again")
            back_at = anyio.current_time()
            ending = await self._settle(back_at)
            self.load.stop()
            self._fault_struck.set()  # the prober leaves too
            await load_done.wait()
            group.cancel_scope.cancel()
        self.watch.finish()
        return self._report(ending)

    async def _run_load(self, done: anyio.Event) -> None:
        """The clients and the recovery probes, until the load stops and every request ended."""
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(self.load.run)
                group.start_soon(self._probe)
        finally:
            done.set()

    async def _follow(self) -> None:
        watch = self.watch
        await self._target.follow(
            lambda state: watch.snapshot(state, anyio.current_time()),
            lambda indexed: watch.event(indexed, anyio.current_time()),
        )

    async def _warm_up(self) -> None:
        healths: dict[str, DeploymentHealth] = {}
        with anyio.move_on_after(self._settings.warm_up_timeout_s):
            while True:
                if all(model in self._last_served for model in self._models):
                    healths = await self._target.statuses()
                    if all(self._whole(healths, model) for model in self._models):
                        return
                await anyio.sleep(STATUS_POLL_S)
        silent = [model for model in self._models if model not in self._last_served]
        if silent:
            raise SoakError(
                f"{', '.join(silent)} never answered a chat within "
                f"{self._settings.warm_up_timeout_s:g} s of being deployed, before any fault"
            )
        short = [model for model in self._models if not self._whole(healths, model)]
        raise SoakError(
            f"{', '.join(short)} did not have all its replicas ready within "
            f"{self._settings.warm_up_timeout_s:g} s of being deployed, before any fault"
        )

    @staticmethod
    def _whole(healths: dict[str, DeploymentHealth], model: str) -> bool:
        health = healths.get(model)
        return health is not None and health.whole

    async def _inject_faults(self, group: anyio.abc.TaskGroup) -> None:
        end = self._origin + self._settings.minutes * 60
        while True:
            gap = self._plan.next_gap()
            if anyio.current_time() + gap >= end:
                break
            await anyio.sleep(gap)
            if self._settings.one_fault_at_a_time and not await self._until_settled(end):
                break
            spec = self._plan.next_fault(*self._fault_options())
            if spec is None:
                continue
            node_id = None if spec.node == MASTER else self._target.node_id(spec.node)
            now = anyio.current_time()
            fault = _Fault(
                spec,
                at=now,
                hit=self.watch.instances_on(node_id),
                waiting_for=set(self._models),
                since=now,
                started_unsettled=bool(self._faults) and self._faults[-1].settled_at is None,
            )
            self._faults.append(fault)
            self._recovering.append(fault)
            self._fault_struck.set()
            self._to_settle.set()
            if self._settings.say_faults:
                self._say(self._describe(fault))
            await self._target.inject(spec)
            group.start_soon(self._await_over, fault)
        await anyio.sleep(max(0.0, end - anyio.current_time()))

    async def _until_settled(self, end: float) -> bool:
        """Wait until the latest fault has settled or waiting for it is past its deadline
        (``may_start_next``); False if the run's time for faults ran out first."""
        while True:
            now = anyio.current_time()
            latest = self._faults[-1] if self._faults else None
            progress = None if latest is None else self._progress_of(latest, False, False)
            settled = latest is not None and latest.settled_at is not None
            if may_start_next(progress, settled, now):
                return True
            if now >= end:
                return False
            await anyio.sleep(STATUS_POLL_S)

    def _progress_of(self, fault: _Fault, connected: bool, replicas: bool) -> FaultProgress:
        return FaultProgress(
            at=fault.at,
            duration_s=fault.spec.duration_s,
            ended_at=fault.ended_at,
            recovered=fault not in self._recovering,
            nodes_connected=connected,
            replicas_ready=replicas,
        )

    async def _watch_settling(self) -> None:
        """Until cancelled: while a fault has not settled, poll the cluster every STATUS_POLL_S
        and mark each fault settled (or given up on) as soon as it is."""
        target, nodes = self._target, len(self._target.node_names())
        while True:
            waiting = [f for f in self._faults if f.settled_at is None and not f.given_up]
            if not waiting:
                self._to_settle = anyio.Event()
                await self._to_settle.wait()
                continue
            connected = await target.connected_nodes() == nodes
            healths = await target.statuses()
            replicas = all(self._whole(healths, model) for model in self._models)
            now = anyio.current_time()
            for health in healths.values():
                if health.broken_instance is not None:
                    self.watch.judged_broken(health.broken_instance)
                    self._on_repair(health.broken_instance, now)
            for fault in waiting:
                progress = self._progress_of(fault, connected, replicas)
                if is_settled(progress):
                    fault.settled_at = now
                elif now >= give_up_at(progress):
                    fault.given_up = True
                    if self._settings.one_fault_at_a_time:  # else nothing waited for it
                        self._say(f"{self._describe(fault)}: not settled in time; going on")
            await anyio.sleep(STATUS_POLL_S)

    def _fault_options(self) -> tuple[list[str], set[str], bool]:
        ongoing = [fault for fault in self._faults if fault.ended_at is None]
        busy = TAKES_A_NODE_AWAY | BROKEN_KINDS.keys()
        away = {f.spec.node for f in ongoing if f.spec.kind in busy}
        healthy = [name for name in self._target.node_names() if name not in away]
        holding = self.watch.nodes_holding_runners()
        with_runners = {name for name in healthy if self._target.node_id(name) in holding}
        master_up = not any(f.spec.kind is FaultKind.MASTER_CRASH for f in ongoing)
        return healthy, with_runners, master_up

    async def _await_over(self, fault: _Fault) -> None:
        with anyio.move_on_after(fault.spec.duration_s + FAULT_END_TIMEOUT_S):
            await self._target.wait_over(fault.spec)
            fault.ended_at = anyio.current_time()
            if fault.spec.kind is FaultKind.MASTER_CRASH:
                self.watch.master_started(fault.ended_at)
        if fault.ended_at is None:
            self._say(f"{self._describe(fault)}: still not over; the report says so")

    async def _settle(self, back_at: float) -> _Ending:
        """Wait until every deployment serves with all its replicas ready and every model has
        answered a chat sent after ``back_at``, or ``settle_timeout_s``; what held at the end.
        Within the same timeout, also until every fault has settled or been given up on, so
        that each one's record is complete."""
        ending = _Ending()
        settle_s: float | None = None
        with anyio.move_on_after(self._settings.settle_timeout_s):
            while True:
                healths = await self._target.statuses()
                answered = all(
                    self._last_served.get(model, -1.0) >= back_at for model in self._models
                )
                serving = all(
                    (health := healths.get(model)) is not None and health.serving
                    for model in self._models
                )
                replicas = all(self._whole(healths, model) for model in self._models)
                if answered and serving and replicas and settle_s is None:
                    settle_s = round(anyio.current_time() - back_at, 3)
                ending = _Ending(answered and serving, replicas, settle_s)
                unsettled = any(f.settled_at is None and not f.given_up for f in self._faults)
                if settle_s is not None and not unsettled:
                    return ending
                await anyio.sleep(STATUS_POLL_S)
        return ending

    async def _probe(self) -> None:
        probing: set[str] = set()

        async def probe(model: str) -> None:
            try:
                await self.load.probe(model)
            finally:
                probing.discard(model)

        async with anyio.create_task_group() as group:
            while not self.load.stopping:
                wanted = {model for fault in self._recovering for model in fault.waiting_for}
                for model in sorted(wanted - probing):
                    probing.add(model)
                    group.start_soon(probe, model)
                if wanted:
                    await anyio.sleep(PROBE_S)
                else:  # nothing to time: sleep until a fault strikes (or the load stops)
                    self._fault_struck = anyio.Event()
                    await self._fault_struck.wait()

    async def _progress(self) -> None:
        every = self._settings.progress_every_s
        while True:
            await anyio.sleep(every)
            stats = self.load.stats
            self._say(
                f"requests {stats.requests}, results {stats.results}, errors {stats.errors}, "
                f"lost {stats.lost}, faults {len(self._faults)}, "
                f"duplicates {self.watch.duplicates.episodes}"
            )

    # --- results ------------------------------------------------------------------------------

    def _on_result(self, model: str, sent_at: float, answered_at: float) -> None:
        self._last_served[model] = max(self._last_served.get(model, sent_at), sent_at)
        still: list[_Fault] = []
        for fault in self._recovering:
            if sent_at >= fault.since:
                fault.waiting_for.discard(model)
            if fault.waiting_for:
                still.append(fault)
            else:
                fault.recovered_at = answered_at
        self._recovering = still

    def _on_repair(self, instance_id: str, now: float) -> None:
        """The keeper judged the instance broken (a repair placed, or a health verdict seen)."""
        for fault in self._faults:
            if instance_id not in fault.hit or not self._still_acting(fault, now):
                continue  # judged broken for some later reason, not this fault's
            if instance_id not in fault.recognised:
                fault.recognised.add(instance_id)
                if fault.recognised_at is None:
                    fault.recognised_at = now

    def _on_deleted(self, instance_id: str, now: float) -> None:
        for fault in self._faults:
            if instance_id in fault.recognised and fault.repaired_at is None:
                fault.repaired_at = now
        for fault in self._faults:
            if instance_id not in fault.hit or not self._still_acting(fault, now):
                continue
            fault.since = now
            fault.recovered_at = None
            fault.waiting_for = set(self._models)
            if fault not in self._recovering:
                self._recovering.append(fault)
            self._fault_struck.set()

    @staticmethod
    def _still_acting(fault: _Fault, now: float) -> bool:
        """Whether a deletion at ``now`` can be the fault's doing: while it lasts, and for a
        node taken away, until the sweep after it is back."""
        if fault.ended_at is None:
            return True
        after = REATTRIBUTE_S if fault.spec.kind in TAKES_A_NODE_AWAY else 0.0
        return now <= fault.ended_at + after

    def _describe(self, fault: _Fault) -> str:
        spec = fault.spec
        length = f" for {spec.duration_s:g} s" if spec.duration_s else ""
        where = "the master" if spec.node == MASTER else spec.node
        hit = f" (holding {len(fault.hit)} instance(s))" if fault.hit else ""
        return f"fault: {spec.kind.value} on {where}{length}{hit}"

    def _record(self, fault: _Fault, run_end: float) -> FaultRecord:
        origin = self._origin
        survived: bool | None = None
        if fault.hit:
            until = max(fault.recovered_at or run_end, fault.ended_at or run_end)
            survived = all(
                (deleted := self.watch.deleted_at.get(instance_id)) is None or deleted > until
                for instance_id in fault.hit
            )
        return FaultRecord(
            kind=fault.spec.kind,
            node=fault.spec.node,
            at=round(fault.at - origin, 3),
            ended_at=None if fault.ended_at is None else round(fault.ended_at - origin, 3),
            recovered_after_s=(
                None if fault.recovered_at is None else round(fault.recovered_at - fault.at, 3)
            ),
            instance_survived=survived,
            duration_s=fault.spec.duration_s,
            settled_after_s=(
                None if fault.settled_at is None else round(fault.settled_at - fault.at, 3)
            ),
            started_unsettled=fault.started_unsettled,
            recognised_after_s=_since(fault.recognised_at, fault.at),
            repaired_after_s=_since(fault.repaired_at, fault.at),
        )

    def _outcomes(self, model: str, records: list[FaultRecord]) -> ModelOutcomes:
        counts = self.load.stats.per_model.get(model, ModelCounts())
        since = self.load.stats.per_model_since.get(model, ModelCounts())
        return model_outcomes(
            counts.requests,
            counts.results,
            counts.errors,
            counts.lost,
            under_faults=(since.requests, since.results),
            errors_under_faults=dict(since.error_kinds),
            sent=[request for request in self.load.stats.sent if request.model == model],
            faults=records,
        )

    def _report(self, ending: _Ending) -> SoakReport:
        settings = self._settings
        run_end = anyio.current_time()
        records = [self._record(fault, run_end) for fault in self._faults]
        log_path = self._target.master_log()
        checked = check_log(log_path) if log_path is not None and log_path.exists() else None
        live = self.watch.duplicates
        stats = self.load.stats
        return SoakReport(
            run=self._target.run_kind,
            minutes=settings.minutes,
            nodes=settings.nodes,
            seed=settings.seed,
            models=list(settings.models),
            clients=settings.load.clients,
            request_deadline_s=settings.load.deadline_s,
            requests=stats.requests,
            results=stats.results,
            errors=stats.errors,
            lost=stats.lost,
            per_model={model: self._outcomes(model, records) for model in self._models},
            duplicates=max(live.episodes, checked.duplicates if checked else 0),
            duplicates_seen_live=live.episodes,
            events_checked=checked.events if checked else 0,
            faults=records,
            recovery=summarize(records),
            serving_at_end=ending.serving,
            replicas_at_end=ending.replicas,
            settle_s=ending.settle_s,
            one_fault_at_a_time=settings.one_fault_at_a_time,
            suspect_after_s=settings.liveness.suspect_after_s,
            dead_after_s=settings.liveness.dead_after_s,
            broken=summarize_broken(records),
            keeper_added_latency=latency_stats(
                self.watch.latencies,
                self.watch.latencies_alone,
                {reason.value: n for reason, n in self.watch.excluded.items()},
            ),
            error_kinds=dict(sorted(stats.error_kinds.items())),
            lost_examples=stats.lost_examples,
            duplicate_examples=(checked.examples if checked else []) or live.examples,
        )
