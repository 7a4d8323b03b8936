"""What-if (docs/design.md §5.14): how long ``GET /whatif`` computes, at the sizes a master keeps.

16 nodes of 64 GB, fully linked; 60, then 1,000 deployments (the default maximum), replicas 1
to 3, their instances placed as the keeper places them (each apart from the model's others, on
a State holding the previous ones). Nodes report no memory taken, as before anything loads, so
every deployment has an instance on the first node: losing it re-places every one, the worst
case for one lost node; losing three leaves some short. Wall time of ``what_if`` (the route
runs it in a worker thread, one at a time). Printed, never asserted.
"""

from __future__ import annotations

import time
from functools import partial
from itertools import count

from keeper.core.placement import place_instance
from keeper.core.view import nodes_serving, without_nodes
from keeper.core.whatif import service_thresholds, what_if
from keeper.model.apply import apply
from keeper.model.events import (
    DeploymentCreated,
    InstanceCreated,
    NodeGatheredInfo,
    TopologyEdgeCreated,
)
from keeper.model.liveness import LivenessConfig
from keeper.model.state import (
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

NODES = 16
SIZES_GB = (2, 8, 30, 100, 300)
WHEN = "2026-01-01T00:00:00Z"


def _cluster(deployments: int) -> State:
    state = State()
    ids = count(1)
    place = partial(place_instance, new_id=lambda: f"00000000-0000-0000-0001-{next(ids):012x}")
    names = [f"n{i:02d}" for i in range(NODES)]
    memory = Memory.from_gb(64)
    for name in names:
        usage = MemoryUsage(ram_total=memory, ram_available=memory)
        info = NodeGatheredInfo(node_id=name, when=WHEN, memory=usage, backends=[Backend.MLX_METAL])
        state = apply(state, info)
    for a in names:
        for b in names:
            if a != b:
                edge = SocketConnection(
                    sink_multiaddr=Multiaddr(address=f"/ip4/10.0.0.{b[1:]}/tcp/1")
                )
                state = apply(
                    state, TopologyEdgeCreated(conn=Connection(source=a, sink=b, edge=edge))
                )
    for d in range(deployments):
        card = ModelCard(
            model_id=f"model-{d:04d}",
            storage_size=Memory.from_gb(SIZES_GB[d % len(SIZES_GB)]),
            n_layers=64,
            hidden_size=4096,
            supports_tensor=False,
        )
        deployment = Deployment(deployment_id=f"dep-{d:04d}", model_card=card, replicas=1 + d % 3)
        state = apply(state, DeploymentCreated(deployment=deployment))
        for _ in range(deployment.replicas):
            apart = without_nodes(state, nodes_serving(state, card.model_id))
            try:
                instance = place(apart, card, deployment.sharding, deployment.instance_meta, 1)
            except ValueError:
                break
            state = apply(state, InstanceCreated(instance=instance))
    return state


# As the route asks it: with the estimates, at the default fast failover flags.
THRESHOLDS = service_thresholds(LivenessConfig())


def run() -> None:
    print(f"what_if on {NODES} fully linked 64 GB nodes (wall time)")
    print(f"{'deployments':>11} {'instances':>9} | {'lose n00':>12} {'lose n00-n02':>14}")
    for deployments in (60, 1000):
        state = _cluster(deployments)
        times: list[float] = []
        for lost in (["n00"], ["n00", "n01", "n02"]):
            started = time.perf_counter()
            what_if(state, lost, thresholds=THRESHOLDS)
            times.append(time.perf_counter() - started)
        print(
            f"{deployments:>11} {len(state.instances):>9} | {times[0] * 1000:>9.0f} ms "
            f"{times[1] * 1000:>11.0f} ms"
        )


if __name__ == "__main__":
    run()
