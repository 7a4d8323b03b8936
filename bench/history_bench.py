"""Cost of the deployment history over 24 hours of a busy cluster (docs/design.md 3.5). Run with
``make bench`` (``python -m bench history``); figures printed, never asserted. Target: 50 ms per
``GET /deployments/{id}/history``.

The day is synthetic and busier than the soak's: 4 nodes, 8 deployments each with an instance
over two nodes, a fault every 5 minutes (a node times out, the sweep deletes its instances, the
node comes back, new instances load and become ready), and node reports (the bulk of a real
log) every 10 s per node. Three rows:
- a request: ``summarize`` over one deployment's serving records of the day (what the API does);
- writing them: the day applied with the serving records a master logs
(``keeper.model.history.replay``)   against the same day applied plainly, per event, so the cost on
the router is a figure;
- their size: the day's records in the State, which every snapshot and dashboard connect carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.history import TimedEvent, replay, summarize
from keeper.model.state import (
    Deployment,
    Memory,
    MlxRingInstance,
    ModelCard,
    NodeIdentity,
    PipelineShardMetadata,
    RunnerLoading,
    RunnerReady,
    Shard,
    ShardAssignments,
    State,
)

DAY_S = 24 * 3600.0
NODES = ("studio", "mini-a", "mini-b", "mini-c")
DEPLOYMENTS = 8
# One fault every 5 minutes: far more than a healthy cluster sees, so the figure is an upper bound.
FAULT_EVERY_S = 300.0
# Node reports every 10 s per node, as the simulated nodes send them.
REPORT_EVERY_S = 10.0


def _card(n: int) -> ModelCard:
    return ModelCard(
        model_id=f"bench/model-{n}",
        storage_size=Memory.from_gb(4.0),
        n_layers=16,
        hidden_size=2048,
        supports_tensor=True,
    )


def _instance(card: ModelCard, instance_id: str, nodes: list[str]) -> MlxRingInstance:
    runner_to_shard: dict[str, Shard] = {}
    node_to_runner: dict[str, str] = {}
    per = card.n_layers // len(nodes)
    for rank, node in enumerate(nodes):
        runner = f"{instance_id}-r{rank}"
        node_to_runner[node] = runner
        runner_to_shard[runner] = PipelineShardMetadata(
            model_card=card,
            device_rank=rank,
            world_size=len(nodes),
            start_layer=rank * per,
            end_layer=(rank + 1) * per,
            n_layers=card.n_layers,
        )
    return MlxRingInstance(
        instance_id=instance_id,
        shard_assignments=ShardAssignments(
            model_id=card.model_id, runner_to_shard=runner_to_shard, node_to_runner=node_to_runner
        ),
        hosts_by_node={},
        ephemeral_port=50000,
    )


def _day(with_reports: bool) -> list[TimedEvent]:
    timed: list[TimedEvent] = []

    def log(at: float, *events: AnyEvent) -> None:
        for event in events:
            timed.append(TimedEvent(idx=len(timed), at=at, event=event))

    def info(node: str) -> NodeGatheredInfo:
        return NodeGatheredInfo(
            node_id=node, when="2026-01-01T00:00:00Z", identity=NodeIdentity(friendly_name=node)
        )

    cards = [_card(n) for n in range(DEPLOYMENTS)]
    log(0.0, *(info(node) for node in NODES))
    log(
        0.0,
        *(
            DeploymentCreated(deployment=Deployment(deployment_id=f"d{n}", model_card=card))
            for n, card in enumerate(cards)
        ),
    )
    placed: dict[int, tuple[str, list[str]]] = {}
    serial = 0

    def place(at: float, n: int, nodes: list[str]) -> None:
        nonlocal serial
        serial += 1
        instance_id = f"i{serial}"
        instance = _instance(cards[n], instance_id, nodes)
        placed[n] = (instance_id, nodes)
        log(at, InstanceCreated(instance=instance))
        runners = [f"{instance_id}-r{r}" for r in range(len(nodes))]
        log(
            at + 1,
            *(RunnerStatusUpdated(runner_id=r, runner_status=RunnerLoading()) for r in runners),
        )
        log(
            at + 20,
            *(RunnerStatusUpdated(runner_id=r, runner_status=RunnerReady()) for r in runners),
        )

    for n in range(DEPLOYMENTS):
        place(1.0, n, [NODES[n % 4], NODES[(n + 1) % 4]])
    now, fault = 60.0, 0
    next_fault = FAULT_EVERY_S
    while now < DAY_S:
        if with_reports:
            log(now, *(info(node) for node in NODES))
        if now >= next_fault:
            lost = NODES[fault % 4]
            fault += 1
            next_fault += FAULT_EVERY_S
            log(now, NodeTimedOut(node_id=lost))
            hit = [n for n, (_, nodes) in placed.items() if lost in nodes]
            log(now + 5, *(InstanceDeleted(instance_id=placed[n][0]) for n in hit))
            log(now + 8, info(lost))
            for n in hit:
                place(now + 9, n, [node for node in NODES if node != lost][:2])
        now += REPORT_EVERY_S
    return timed


def _per_call(call: Callable[[], object], repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


def _plain(events: list[TimedEvent]) -> State:
    state = State()
    for timed in events:
        state = apply(state, timed.event)
    return state


def run() -> None:
    events = _day(with_reports=True)
    state = replay(events)
    records = state.serving_history["d0"]
    history = summarize("d0", records, window_start=0.0, window_end=DAY_S)
    request_s = _per_call(
        lambda: summarize("d0", records, window_start=0.0, window_end=DAY_S), repeat=50
    )
    availability = history.availability or 0.0
    print(
        f"history request, one deployment over 24 h: {len(records)} serving records, "
        f"{len(history.incidents)} incidents, availability {availability:.4f}: "
        f"{request_s * 1e3:.3f} ms per call (target 50 ms)",
        flush=True,
    )
    plain_s = _per_call(lambda: _plain(events), repeat=3)
    tracked_s = _per_call(lambda: replay(events), repeat=3)
    added_us = (tracked_s - plain_s) / len(events) * 1e6
    print(
        f"writing serving records over the day's {len(events):,} events (node reports included): "
        f"{tracked_s:.2f} s against {plain_s:.2f} s applying them alone, "
        f"{added_us:.1f} µs per event added (each event judged alone; the master judges a batch)",
        flush=True,
    )
    total = sum(len(r) for r in state.serving_history.values())
    size = len(state.model_dump_json(include={"serving_history"}))
    print(
        f"serving records of {DEPLOYMENTS} deployments after the day: {total:,} records, "
        f"{size / 1e3:.0f} kB of State (snapshots and the dashboard's first message carry them)",
        flush=True,
    )
