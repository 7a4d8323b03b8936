"""Keeper benchmark: the cost of one ``Keeper.step`` when many deployments come due together.

Run with ``python -m bench.keeper_bench`` (or ``make bench``). Figures are printed, never
asserted. The case is the one that made exo's reference keeper spend 14 s in a step: 64
deployments that nothing can hold, all due at once because the cluster just changed. The master
holds its lock while stepping, so the target is a step in the milliseconds: attempts per step
are capped (``MAX_PLACEMENT_ATTEMPTS_PER_STEP``), the rest wait for the following steps.
"""

from __future__ import annotations

import statistics
import time

from keeper.apply import apply
from keeper.core import MAX_PLACEMENT_ATTEMPTS_PER_STEP, Keeper
from keeper.events import AnyEvent, DeploymentCreated, NodeGatheredInfo, TopologyEdgeCreated
from keeper.state import (
    Backend,
    Connection,
    Deployment,
    Memory,
    MemoryUsage,
    ModelCard,
    Multiaddr,
    SocketConnection,
    State,
)

TARGET_MS = 100.0  # a step under the master's lock should stay well under its 1 s period
STEPS = 7  # steps timed per case; each follows a cluster change, so every deployment is due
WHEN = "2026-01-01T00:00:00Z"


def _node(node_id: str) -> NodeGatheredInfo:
    gb = Memory.from_gb(16.0)
    return NodeGatheredInfo(
        node_id=node_id,
        when=WHEN,
        memory=MemoryUsage(ram_total=gb, ram_available=gb),
        backends=[Backend.MLX_METAL],
    )


def _cluster(n_nodes: int, n_deployments: int) -> State:
    events: list[AnyEvent] = [_node(f"node-{i:02d}") for i in range(n_nodes)]
    for i in range(n_nodes):
        for j in range(n_nodes):
            if i != j:
                address = Multiaddr(address=f"/ip4/10.0.{j // 250}.{j % 250 + 1}/tcp/52415")
                edge = SocketConnection(sink_multiaddr=address)
                conn = Connection(source=f"node-{i:02d}", sink=f"node-{j:02d}", edge=edge)
                events.append(TopologyEdgeCreated(conn=conn))
    for i in range(n_deployments):
        card = ModelCard(
            model_id=f"too-big-{i:04d}",
            storage_size=Memory.from_gb(10_000.0),
            n_layers=80,
            hidden_size=8192,
            supports_tensor=True,
        )
        events.append(
            DeploymentCreated(deployment=Deployment(deployment_id=f"dep-{i:04d}", model_card=card))
        )
    state = State()
    for event in events:
        state = apply(state, event)
    return state


def time_steps(n_nodes: int, n_deployments: int) -> list[float]:
    state = _cluster(n_nodes, n_deployments)
    keeper = Keeper(started_at=-1000.0)
    times: list[float] = []
    for k in range(STEPS):
        state = apply(state, _node(f"joining-{k}"))  # a change: every deployment is due again
        start = time.perf_counter()
        events = keeper.step(state, float(k))
        times.append(time.perf_counter() - start)
        for event in events:
            state = apply(state, event)
    return times


def main() -> None:
    print(
        f"keeper step, every deployment unplaceable and due "
        f"(cap {MAX_PLACEMENT_ATTEMPTS_PER_STEP} attempts/step; target < {TARGET_MS:.0f} ms)"
    )
    print(f"{'nodes':>6} {'deployments':>12} {'median ms':>10} {'max ms':>8}")
    for n_nodes, n_deployments in ((3, 64), (8, 64), (16, 64), (16, 1000), (32, 64)):
        times = time_steps(n_nodes, n_deployments)
        median_ms = statistics.median(times) * 1e3
        max_ms = max(times) * 1e3
        verdict = "ok" if max_ms < TARGET_MS else "OVER TARGET"
        print(f"{n_nodes:>6} {n_deployments:>12} {median_ms:>10.2f} {max_ms:>8.2f}  {verdict}")


if __name__ == "__main__":
    main()
