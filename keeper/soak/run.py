"""One soak, whatever it runs against: deploy, load, inject faults, let it settle, report.

Both soaks (separate processes on the real clock, in-process nodes in virtual time) run this
same sequence against a ``SoakTarget``, the small surface that differs between them: how to
deploy, send a chat, follow the event stream, read the deployments' status, inject a fault and
know when it is over. So the invariants and the report cannot drift apart between the two.

The sequence:
1. deploy the models (the soak never places an instance itself: the keeper does);
2. start the load and the watch, and wait until every model has answered a chat;
3. for ``minutes``: every 20-60 s a fault from the seeded plan (``keeper.soak.faults``);
4. stop injecting, wait until every fault is over (processes back, links healed);
5. wait up to ``settle_timeout_s`` for every deployment to be serving and to answer a chat;
6. stop the load (requests in flight run to their outcome or deadline), check the master's
   whole event log for duplicates, and build the report.

A fault has recovered once every deployed model has answered a chat that was sent after the
fault struck: recovery is measured as clients see it, not as the State claims it. Some faults
strike late: a partitioned node that holds only a later pipeline stage does not stop chats (the
first stage answers them) until the master times the node out and deletes its instance, half a
minute on. So the deletion of an instance a fault hit, while the fault lasts (or, for a node
taken away, within a sweep period after it is back), restarts its recovery from that moment.

About 430 lines because the run's phases (start, settle, faults, drain, judge) share one clock
and one set of counters; loading, faults, watching and the report are already modules of their
own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import anyio

from keeper.api_models import DeploymentsResponse
from keeper.events import IndexedEvent
from keeper.master.service import MasterConfig
from keeper.soak.faults import MASTER, TAKES_A_NODE_AWAY, FaultKind, FaultPlan, FaultSpec
from keeper.soak.load import Load, LoadSettings, ModelCounts
from keeper.soak.report import (
    Deployed,
    FaultRecord,
    ModelOutcomes,
    RunKind,
    SoakReport,
    latency_stats,
    model_outcomes,
    summarize,
)
from keeper.soak.watch import ClusterWatch, check_log
from keeper.state import State

# Three models: one that fits on one node, one placed as a pipeline over two nodes (min_nodes 2:
# its 17.6 GB would fit some single nodes, the deployment asks for two), and a small one kept at
# two replicas on nodes apart, so a fault on one node leaves the other replica serving.
SINGLE_NODE_MODEL = Deployed(model_id="mlx-community/Qwen3-0.6B-4bit", min_nodes=1)
PIPELINE_MODEL = Deployed(model_id="mlx-community/Qwen3-30B-A3B-4bit", min_nodes=2)
REPLICATED_MODEL = Deployed(
    model_id="mlx-community/Llama-3.2-1B-Instruct-4bit", min_nodes=1, replicas=2
)
SOAK_MODELS = (SINGLE_NODE_MODEL, PIPELINE_MODEL, REPLICATED_MODEL)

# The issue: after the faults, every deployment must serve again within three minutes.
SETTLE_TIMEOUT_S = 180.0
# Before the faults: the master's 15 s grace, a placement, and loading 17.6 GB over two nodes
# take well under a minute; three mean something is broken.
WARM_UP_TIMEOUT_S = 180.0
# A fault not over this long after its planned end (a process that does not come back) is left
# with ended_at null rather than holding up the run.
FAULT_END_TIMEOUT_S = 120.0
# A deletion this soon after a fault ended is still the fault's doing: the master's sweep, which
# deletes instances on departed nodes, runs this often.
REATTRIBUTE_S = MasterConfig().sweep_interval_s
# While a fault has not recovered, each model still to answer gets a probe request this often
# (one in flight at a time): recovery is timed to about this, however sparse the load.
PROBE_S = 1.0
# How often the run checks the deployments' status while settling.
STATUS_POLL_S = 1.0


class SoakError(Exception):
    """The soak could not run (the cluster never served); the message says what and where."""


def model_statuses(listing: DeploymentsResponse) -> dict[str, str]:
    """Each deployed model's status in a ``GET /deployments`` listing (what ``statuses`` says)."""
    return {view.deployment.model_card.model_id: view.status for view in listing.deployments}


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

    async def statuses(self) -> dict[str, str]:
        """Each deployed model's status; empty while the master cannot be reached."""
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


@dataclass
class _Fault:
    spec: FaultSpec
    at: float  # absolute, on the run's clock
    hit: list[str]  # instances with a runner where it struck (all of them for a master crash)
    waiting_for: set[str]  # models that have not yet answered a chat sent after ``since``
    since: float  # ``at``, or the deletion of an instance it hit (see the module docstring)
    ended_at: float | None = None
    recovered_at: float | None = None


class Soak:
    def __init__(
        self, target: SoakTarget, settings: SoakSettings, say: Callable[[str], None]
    ) -> None:
        self._target = target
        self._settings = settings
        self._say = say
        self._models = [model.model_id for model in settings.models]
        self._plan = FaultPlan(settings.seed)
        self.watch = ClusterWatch(on_deleted=self._on_deleted)
        self.load = Load(
            target.chat, self._models, settings.load, self._on_result, seed=settings.seed
        )
        self._faults: list[_Fault] = []
        self._recovering: list[_Fault] = []
        self._last_served: dict[str, float] = {}  # model -> latest send time of a reply
        self._origin = 0.0
        self._fault_struck = anyio.Event()  # wakes the prober

    # --- the sequence -------------------------------------------------------------------------

    async def run(self) -> SoakReport:
        settings = self._settings
        serving = False
        settle_s: float | None = None
        async with anyio.create_task_group() as group:
            self.watch.master_started(anyio.current_time())
            group.start_soon(self._follow)
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
            serving = await self._settle(back_at)
            if serving:
                settle_s = round(anyio.current_time() - back_at, 3)
            self.load.stop()
            self._fault_struck.set()  # the prober leaves too
            await load_done.wait()
            group.cancel_scope.cancel()
        self.watch.finish()
        return self._report(serving, settle_s)

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
        with anyio.move_on_after(self._settings.warm_up_timeout_s):
            while any(model not in self._last_served for model in self._models):
                await anyio.sleep(STATUS_POLL_S)
            return
        silent = [model for model in self._models if model not in self._last_served]
        raise SoakError(
            f"{', '.join(silent)} never answered a chat within "
            f"{self._settings.warm_up_timeout_s:g} s of being deployed, before any fault"
        )

    async def _inject_faults(self, group: anyio.abc.TaskGroup) -> None:
        end = self._origin + self._settings.minutes * 60
        while True:
            gap = self._plan.next_gap()
            if anyio.current_time() + gap >= end:
                break
            await anyio.sleep(gap)
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
            )
            self._faults.append(fault)
            self._recovering.append(fault)
            self._fault_struck.set()
            if self._settings.say_faults:
                self._say(self._describe(fault))
            await self._target.inject(spec)
            group.start_soon(self._await_over, fault)
        await anyio.sleep(max(0.0, end - anyio.current_time()))

    def _fault_options(self) -> tuple[list[str], set[str], bool]:
        ongoing = [fault for fault in self._faults if fault.ended_at is None]
        away = {f.spec.node for f in ongoing if f.spec.kind in TAKES_A_NODE_AWAY}
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

    async def _settle(self, back_at: float) -> bool:
        with anyio.move_on_after(self._settings.settle_timeout_s):
            while True:
                statuses = await self._target.statuses()
                if all(statuses.get(model) == "serving" for model in self._models) and all(
                    self._last_served.get(model, -1.0) >= back_at for model in self._models
                ):
                    return True
                await anyio.sleep(STATUS_POLL_S)
        return False

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

    def _on_deleted(self, instance_id: str, now: float) -> None:
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
        )

    def _outcomes(self, model: str) -> ModelOutcomes:
        counts = self.load.stats.per_model.get(model, ModelCounts())
        since = self.load.stats.per_model_since.get(model, ModelCounts())
        return model_outcomes(
            counts.requests,
            counts.results,
            counts.errors,
            counts.lost,
            under_faults=(since.requests, since.results),
            errors_under_faults=dict(since.error_kinds),
        )

    def _report(self, serving: bool, settle_s: float | None) -> SoakReport:
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
            per_model={model: self._outcomes(model) for model in self._models},
            duplicates=max(live.episodes, checked.duplicates if checked else 0),
            duplicates_seen_live=live.episodes,
            events_checked=checked.events if checked else 0,
            faults=records,
            recovery=summarize(records),
            serving_at_end=serving,
            settle_s=settle_s,
            keeper_added_latency=latency_stats(
                self.watch.latencies,
                self.watch.latencies_alone,
                {reason.value: n for reason, n in self.watch.excluded.items()},
            ),
            error_kinds=dict(sorted(stats.error_kinds.items())),
            lost_examples=stats.lost_examples,
            duplicate_examples=(checked.examples if checked else []) or live.examples,
        )
