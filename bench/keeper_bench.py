"""Keeper benchmarks: what one ``Keeper.step`` costs, since the master holds its lock while
stepping (docs/design.md §5.9: a step stays cheap however many deployments wait).

Figures are printed, never asserted. Three tables:

1. The step on 8/16/32 fully connected nodes with 16/64/256 deployments, *steady* (every
   deployment serving: the step only looks) and *placing* (none has an instance: each step
   places one and the next step sees it, until all are placed). Target: steady <= 60 us at
   8 x 64 and <= 120 us at 16 x 64 (printed beside exo's reference keeper, 283 us).
2. The step in which N deployments that nothing can hold all come due for their retry at once,
   at 8 nodes, N = 64 (exo's reference keeper spent 14 s here; target <= 50 ms), 256 and 1024
   to show what the cost grows with. Ways to come due together: the UNPLACEABLE_RETRY timer, a
   cluster change (a node joining) that makes every one worth another try, and the timer on a
   State read back from JSON (see ``storm``).
3. Keeper memory after deployment churn, in entries, to show it does not grow.

States are built with the same events the cluster applies; ``python -m bench.keeper_bench``
runs this module alone.
"""

from __future__ import annotations

import copy
import statistics
import time
from collections.abc import Iterable

from keeper import UNPLACEABLE_RETRY, Keeper
from keeper.core.keeper import MAX_PLACEMENT_ATTEMPTS_PER_STEP
from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    InstanceCreated,
    NodeGatheredInfo,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
)
from keeper.model.state import (
    Backend,
    Connection,
    Deployment,
    InstanceMeta,
    Memory,
    MemoryUsage,
    MlxRingInstance,
    ModelCard,
    Multiaddr,
    PipelineShardMetadata,
    RunnerReady,
    ShardAssignments,
    SocketConnection,
    State,
)

WHEN = "2026-01-01T00:00:00Z"
# Big enough that 256 one-gigabyte models fit on the smallest cluster benchmarked.
NODE_GB = 64.0
MODEL_GB = 1.0
NODE_COUNTS = (8, 16, 32)
DEPLOYMENT_COUNTS = (16, 64, 256)
# Steady steps timed per case: enough for a stable p99 without making `make bench` slow.
STEADY_STEPS = 300
# Placing steps timed per case (each places one deployment; fewer than that when all placed).
PLACING_STEPS = 64
STORM_COUNTS = (64, 256, 1024)
STORM_NODES = 8
# Repeats of the due-at-once step, each from a copy of the same primed keeper.
STORM_REPEATS = 15
# The steady step is the master's hot path (it steps on every event that may call for a
# placement): at rest it must cost microseconds, well under exo's own reference keeper's.
STEADY_TARGETS_US = {(8, 64): 60.0, (16, 64): 120.0}
EXO_REFERENCE_STEADY_US = 283.0  # exo's reference keeper's steady step, as measured for us
STORM_TARGET_MS = 50.0
# The keeper steps on a monotonic clock; start far past the startup grace.
T0 = 1_000.0


# --- building states ----------------------------------------------------------------------


def _node_id(i: int) -> str:
    return f"node-{i:02d}"


def _node_info(node_id: str, gb: float = NODE_GB) -> NodeGatheredInfo:
    memory = Memory.from_gb(gb)
    return NodeGatheredInfo(
        node_id=node_id,
        when=WHEN,
        memory=MemoryUsage(ram_total=memory, ram_available=memory),
        backends=[Backend.MLX_METAL],
    )


def _link(source: int, sink: int) -> TopologyEdgeCreated:
    address = Multiaddr(address=f"/ip4/10.0.{sink // 250}.{sink % 250 + 1}/tcp/52415")
    conn = Connection(
        source=_node_id(source), sink=_node_id(sink), edge=SocketConnection(sink_multiaddr=address)
    )
    return TopologyEdgeCreated(conn=conn)


def _applied(state: State, events: Iterable[AnyEvent]) -> State:
    for event in events:
        state = apply(state, event)
    return state


def fully_connected(nodes: int) -> State:
    events: list[AnyEvent] = [_node_info(_node_id(i)) for i in range(nodes)]
    events += [_link(i, j) for i in range(nodes) for j in range(nodes) if i != j]
    return _applied(State(), events)


def _card(i: int, gb: float = MODEL_GB, backends: tuple[Backend, ...] | None = None) -> ModelCard:
    card = ModelCard(
        model_id=f"bench/model-{i:04d}",
        storage_size=Memory.from_gb(gb),
        n_layers=32,
        hidden_size=4096,
        supports_tensor=True,
    )
    return card if backends is None else card.model_copy(update={"backends": backends})


def _deployment(i: int, card: ModelCard, meta: InstanceMeta = InstanceMeta.MLX_RING) -> Deployment:
    return Deployment(deployment_id=f"dep-{i:04d}", model_card=card, instance_meta=meta)


def with_deployments(state: State, count: int) -> State:
    return _applied(
        state, (DeploymentCreated(deployment=_deployment(i, _card(i))) for i in range(count))
    )


def all_serving(nodes: int, deployments: int) -> State:
    """Every deployment with a ready single-node instance, as the keeper placed it."""
    state = with_deployments(fully_connected(nodes), deployments)
    events: list[AnyEvent] = []
    for i, deployment in enumerate(
        sorted(state.deployments.values(), key=lambda d: d.deployment_id)
    ):
        card = deployment.model_card
        node, runner, instance_id = _node_id(i % nodes), f"runner-{i:04d}", f"instance-{i:04d}"
        shard = PipelineShardMetadata(
            model_card=card,
            device_rank=0,
            world_size=1,
            start_layer=0,
            end_layer=card.n_layers,
            n_layers=card.n_layers,
        )
        instance = MlxRingInstance(
            instance_id=instance_id,
            shard_assignments=ShardAssignments(
                model_id=card.model_id,
                runner_to_shard={runner: shard},
                node_to_runner={node: runner},
            ),
        )
        events += [
            InstanceCreated(instance=instance),
            DeploymentPlaced(deployment_id=deployment.deployment_id, instance_id=instance_id),
            RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()),
        ]
    return _applied(state, events)


def unplaceable_storm(nodes: int, deployments: int) -> State:
    """Deployments nothing can hold, for three of placement's reasons in turn: too big for the
    whole cluster; a backend no node has; RDMA (MlxJaccl) on a cluster of socket links."""
    state = fully_connected(nodes)
    events: list[AnyEvent] = []
    for i in range(deployments):
        match i % 3:
            case 0:
                deployment = _deployment(i, _card(i, gb=NODE_GB * nodes * 2))
            case 1:
                deployment = _deployment(i, _card(i, backends=(Backend.MLX_CUDA,)))
            case _:
                deployment = _deployment(i, _card(i, gb=NODE_GB * 1.5), InstanceMeta.MLX_JACCL)
        events.append(DeploymentCreated(deployment=deployment))
    return _applied(state, events)


# --- timing -------------------------------------------------------------------------------


def _timed_step(keeper: Keeper, state: State, now: float) -> tuple[float, list[AnyEvent]]:
    start = time.perf_counter()
    events = keeper.step(state, now)
    return time.perf_counter() - start, events


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds < 0.01 else f"{seconds * 1e3:.1f}"


def steady_steps(nodes: int, deployments: int) -> list[float]:
    state = all_serving(nodes, deployments)
    keeper = Keeper(started_at=0.0)
    keeper.step(state, T0)  # the first step adopts every instance
    times: list[float] = []
    for k in range(1, STEADY_STEPS + 1):
        elapsed, events = _timed_step(keeper, state, T0 + k)
        assert not events  # a steady cluster must not make the keeper act
        times.append(elapsed)
    return times


def placing_steps(nodes: int, deployments: int) -> list[float]:
    """From none placed: each step places one; its events are applied before the next."""
    state = with_deployments(fully_connected(nodes), deployments)
    keeper = Keeper(started_at=0.0)
    times: list[float] = []
    for k in range(min(PLACING_STEPS, deployments)):
        elapsed, events = _timed_step(keeper, state, T0 + k)
        times.append(elapsed)
        state = _applied(state, events)
    return times


STORM_TRIGGERS = ("retry timer", "node joined", "state re-read")


def _fork(keeper: Keeper) -> Keeper:
    """A copy of the keeper whose memory can change without touching the original's, sharing
    the (immutable) values it remembers, as the keeper itself does from step to step."""
    trial = copy.copy(keeper)
    for name, value in vars(keeper).items():
        if isinstance(value, dict | set | list):
            setattr(trial, name, copy.copy(value))  # pyright: ignore[reportUnknownArgumentType]
    return trial


def storm(deployments: int, trigger: str) -> tuple[list[float], int]:
    """Times of the step in which every unplaceable deployment is due at once, and how many
    steps it takes until each has been tried again.

    "retry timer": UNPLACEABLE_RETRY has passed for all. "node joined": the usable cluster
    changed, so all are worth another try. "state re-read": the retry timer, on a State read
    back from its JSON (as after a snapshot load), so nothing in it is the very object the
    keeper remembered and every comparison goes field by field.
    """
    state = unplaceable_storm(STORM_NODES, deployments)
    keeper = Keeper(started_at=0.0)
    now = T0
    # Prime: step until every deployment has been tried once and its error is in the state.
    while any(d.placement_error is None for d in state.deployments.values()):
        state = _applied(state, keeper.step(state, now))
        now += 1.0
    if trigger == "node joined":
        state = apply(state, _node_info("node-joining", gb=8.0))
    else:
        now += UNPLACEABLE_RETRY
        if trigger == "state re-read":
            state = State.model_validate_json(state.model_dump_json())
    times: list[float] = []
    for _ in range(STORM_REPEATS):
        trial = _fork(keeper)
        elapsed, _events = _timed_step(trial, state, now)
        times.append(elapsed)
    steps_to_retry_all = -(-deployments // MAX_PLACEMENT_ATTEMPTS_PER_STEP)
    return times, steps_to_retry_all


def churned_memory_entries(cycles: int) -> tuple[int, int]:
    """Keeper memory (dict and set entries) after `cycles` deployments came and went, against
    one that never saw any."""
    state = fully_connected(8)
    keeper = Keeper(started_at=0.0)
    fresh = _memory_entries(Keeper(started_at=0.0))
    now = T0
    for i in range(cycles):
        created = DeploymentCreated(deployment=_deployment(i, _card(i)))
        state = _applied(state, [created])
        state = _applied(state, keeper.step(state, now))
        state = _applied(state, keeper.delete(created.deployment.deployment_id, state))
        state = _applied(state, [DeploymentDeleted(deployment_id=created.deployment.deployment_id)])
        now += 1.0
    keeper.step(state, now)
    return fresh, _memory_entries(keeper)


def _memory_entries(keeper: Keeper) -> int:
    """The entries of the keeper's collections and of its parts' (the moves', staging's)."""
    parts: list[object] = [keeper]
    parts += [v for v in vars(keeper).values() if type(v).__module__.startswith("keeper.core.")]
    return sum(
        len(v)  # pyright: ignore[reportUnknownArgumentType]
        for part in parts
        for v in vars(part).values()
        if isinstance(v, dict | set | list)
    )


# --- the report ---------------------------------------------------------------------------


def run() -> None:
    targets = ", ".join(f"<= {us:.0f} us at {n} x {d}" for (n, d), us in STEADY_TARGETS_US.items())
    print(
        f"keeper step, fully connected nodes (steady target {targets}; "
        f"exo's reference keeper: {EXO_REFERENCE_STEADY_US:.0f} us)"
    )
    print(
        f"{'nodes':>5} {'deploys':>7} | {'steady med ms':>13} {'p99 ms':>8} | "
        f"{'placing med ms':>14} {'p99 ms':>8}"
    )
    for nodes in NODE_COUNTS:
        for deployments in DEPLOYMENT_COUNTS:
            steady = steady_steps(nodes, deployments)
            placing = placing_steps(nodes, deployments)
            median = statistics.median(steady)
            target = STEADY_TARGETS_US.get((nodes, deployments))
            verdict = ""
            if target is not None:
                met = "met" if median * 1e6 <= target else "MISSED"
                ratio = EXO_REFERENCE_STEADY_US / (median * 1e6)
                verdict = f"  {median * 1e6:.0f} us: target {met}, {ratio:.1f}x faster than exo's"
            print(
                f"{nodes:>5} {deployments:>7} | {_ms(median):>13} "
                f"{_ms(_p99(steady)):>8} | {_ms(statistics.median(placing)):>14} "
                f"{_ms(_p99(placing)):>8}{verdict}"
            )
    print()
    print(
        f"unplaceable deployments due at once, {STORM_NODES} nodes "
        f"(target <= {STORM_TARGET_MS:.0f} ms at 64; exo's reference keeper: 14 s; "
        f"cap {MAX_PLACEMENT_ATTEMPTS_PER_STEP} attempts/step)"
    )
    print(
        f"{'deploys':>7} {'due because':>13} | {'step med ms':>11} {'max ms':>8} | "
        f"{'steps to retry all':>18}"
    )
    for deployments in STORM_COUNTS:
        for trigger in STORM_TRIGGERS:
            times, steps = storm(deployments, trigger)
            print(
                f"{deployments:>7} {trigger:>13} | {_ms(statistics.median(times)):>11} "
                f"{_ms(max(times)):>8} | {steps:>18}"
            )
    print()
    cycles = 2_000
    fresh, after = churned_memory_entries(cycles)
    print(f"keeper memory: {fresh} entries new, {after} after {cycles} deployments came and went")


if __name__ == "__main__":
    run()
