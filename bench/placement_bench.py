"""Placement benchmark: ``place_instance`` beside the list-every-simple-cycle baseline.

Run with ``make bench`` (``python -m bench``) or ``python -m bench.placement_bench``. Figures are
printed, never asserted; the targets are printed beside them:
- at most 10 ms per placement at 16 fully connected nodes, whatever the request;
- at least 100x faster than the baseline (``tests/placement_reference.py``, which lists every
  simple cycle as exo does) at 10 fully connected nodes.

The baseline runs in a child process that is stopped after ``BASELINE_CUTOFF_S``; once one size
hits the cutoff, larger sizes are not run (a larger complete graph holds every cycle of the
smaller one, so it can only be slower). A second table times the inputs the search bound is for,
and clusters where nodes hold some of the model (the download score ranks first).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe

from keeper.core.placement import choose_cycle, place_instance
from keeper.core.placement.graph import ClusterGraph, cluster_graph
from keeper.core.placement.search import SEARCH_STEP_LIMIT, CycleSearch
from keeper.model.state import (
    Backend,
    DownloadCompleted,
    DownloadOngoing,
    DownloadProgressData,
    Edge,
    InstanceMeta,
    Memory,
    MemoryUsage,
    ModelCard,
    Multiaddr,
    PipelineShardMetadata,
    RDMAConnection,
    Sharding,
    SocketConnection,
    State,
    Topology,
)
from tests.placement_reference import reference_place

SIZES = range(4, 17)
# Long enough for the baseline at 10 nodes (about 1.1 million cycles) on a loaded 2-core machine.
BASELINE_CUTOFF_S = 30.0
# Repetitions per timing of ours; the median is reported.
REPEATS = 15
TARGET_MS_AT_16 = 10.0
TARGET_RATIO_AT_10 = 100.0
GB = 1024**3


def fully_connected(nodes: int, ram_gb: float | None = None) -> State:
    """``nodes`` Macs, every ordered pair linked by a socket and an RDMA edge; free memory
    varies (16 to 32 GB) so memory, not only the ids, decides, unless ``ram_gb`` sets it."""
    names = [f"node-{i:02d}" for i in range(nodes)]

    def edges(source: int, sink: int) -> list[Edge]:
        return [
            SocketConnection(sink_multiaddr=Multiaddr(address=f"/ip4/10.0.0.{sink + 1}/tcp/52415")),
            RDMAConnection(source_rdma_iface=f"rdma_en{sink}", sink_rdma_iface=f"rdma_en{source}"),
        ]

    return State(
        topology=Topology(
            nodes=names,
            connections={
                names[a]: {names[b]: edges(a, b) for b in range(nodes) if b != a}
                for a in range(nodes)
            },
        ),
        node_memory={
            name: MemoryUsage(
                ram_available=Memory.from_gb(16 + 4 * (i % 5) if ram_gb is None else ram_gb)
            )
            for i, name in enumerate(names)
        },
        node_backends={name: [Backend.MLX_METAL] for name in names},
    )


def one_way_ring(nodes: int, rdma: bool, socket_mesh: bool = False) -> State:
    """The only cycle of more than one node (of RDMA edges, with ``rdma``) runs through all of
    them; ``socket_mesh`` adds socket edges between every pair, as ethernet would."""
    names = [f"node-{i:02d}" for i in range(nodes)]
    ring: Edge = (
        RDMAConnection(source_rdma_iface="rdma_en0", sink_rdma_iface="rdma_en1")
        if rdma
        else SocketConnection(sink_multiaddr=Multiaddr(address="/ip4/10.0.0.1/tcp/52415"))
    )
    socket = SocketConnection(sink_multiaddr=Multiaddr(address="/ip4/10.0.0.2/tcp/52415"))
    connections: dict[str, dict[str, list[Edge]]] = {name: {} for name in names}
    for i, name in enumerate(names):
        if socket_mesh:
            connections[name] = {other: [socket] for other in names if other != name}
        following = names[(i + 1) % nodes]
        connections[name][following] = [*connections[name].get(following, []), ring]
    return State(
        topology=Topology(nodes=names, connections=connections),
        node_memory={name: MemoryUsage(ram_available=Memory.from_gb(16)) for name in names},
        node_backends={name: [Backend.MLX_METAL] for name in names},
    )


def two_cliques(size: int) -> State:
    """Adversarial: two complete graphs joined by one two-way link. Too many cycles to list,
    and no cycle through a set spanning both, which a model bigger than one clique needs."""
    state = fully_connected(size * 2)
    names = state.topology.nodes
    left = set(names[:size])
    connections = {
        source: {
            sink: edges
            for sink, edges in sinks.items()
            if (source in left) == (sink in left) or {source, sink} == {names[0], names[size]}
        }
        for source, sinks in state.topology.connections.items()
    }
    return state.model_copy(update={"topology": Topology(nodes=names, connections=connections)})


def holding(state: State, done: range, along: dict[int, tuple[int, int]]) -> State:
    """``state`` with the bench model downloaded on the nodes ``done`` and ``(downloaded,
    total)`` bytes of it on each node of ``along``, by position in ``topology.nodes``."""
    names = state.topology.nodes
    shard = PipelineShardMetadata(
        model_card=model(1), device_rank=0, world_size=1, start_layer=0, end_layer=80, n_layers=80
    )
    downloads: dict[str, list[DownloadCompleted | DownloadOngoing]] = {
        names[i]: [DownloadCompleted(node_id=names[i], shard_metadata=shard, total=Memory())]
        for i in done
    }
    for i, (downloaded, total) in along.items():
        progress = DownloadProgressData(
            downloaded=Memory(in_bytes=downloaded), total=Memory(in_bytes=total)
        )
        downloads[names[i]] = [
            DownloadOngoing(node_id=names[i], shard_metadata=shard, download_progress=progress)
        ]
    return state.model_copy(update={"downloads": downloads})


def free_gb(state: State) -> float:
    return sum(usage.ram_available.in_bytes for usage in state.node_memory.values()) / GB


def model(size_gb: float, hidden_size: int = 8192, n_layers: int = 80) -> ModelCard:
    return ModelCard(
        model_id="bench/model",
        storage_size=Memory(in_bytes=int(size_gb * GB)),
        n_layers=n_layers,
        hidden_size=hidden_size,
        supports_tensor=True,
        num_key_value_heads=8,
    )


@dataclass(frozen=True)
class Request:
    name: str
    card: Callable[[State], ModelCard]
    sharding: str = "Pipeline"
    meta: str = "MlxRing"
    min_nodes: Callable[[State], int] = lambda _: 1


# The request the baseline is timed on: a model that needs about half the cluster.
HALF_RING = Request("half, Pipeline/MlxRing", lambda s: model(free_gb(s) / 2))
REQUESTS = (
    Request("one node", lambda _: model(8)),
    HALF_RING,
    Request("half, Tensor/MlxJaccl", lambda s: model(free_gb(s) / 2), "Tensor", "MlxJaccl"),
    Request("every node", lambda _: model(8), min_nodes=lambda s: len(s.topology.nodes)),
    Request("too big", lambda s: model(free_gb(s) * 2)),
    Request("Tensor, no divisor", lambda s: model(free_gb(s) / 2, hidden_size=4099), "Tensor"),
)


def place(state: State, request: Request) -> None:
    with contextlib.suppress(ValueError):  # an answer too: the reason nothing fits
        place_instance(
            state, request.card(state), request.sharding, request.meta, request.min_nodes(state)
        )


def median_ms(action: Callable[[], object], repeats: int = REPEATS) -> float:
    samples: list[float] = []
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def _baseline_child(nodes: int, pipe: Pipe) -> None:
    state = fully_connected(nodes)
    card = HALF_RING.card(state)
    start = time.perf_counter()
    with contextlib.suppress(ValueError):
        reference_place(state, card, HALF_RING.sharding, HALF_RING.meta, 1)
    pipe.send((time.perf_counter() - start) * 1000)


def baseline_ms(nodes: int) -> float | None:
    """The baseline's time in ms, or None if it ran past the cutoff."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.Process(target=_baseline_child, args=(nodes, send), daemon=True)
    child.start()
    if receive.poll(BASELINE_CUTOFF_S):
        elapsed: float = receive.recv()
        child.join()
        return elapsed
    child.terminate()
    child.join()
    return None


def run() -> None:
    print("Placement on fully connected clusters (median ms)")
    print(f"{'nodes':>5}  {'ours':>8}  {'ours, worst request':>31}  {'baseline':>10}  {'ratio':>8}")
    cutoff_hit = False
    for nodes in SIZES:
        state = fully_connected(nodes)
        ours = {
            request.name: median_ms(lambda r=request, s=state: place(s, r)) for request in REQUESTS
        }
        worst = max(ours, key=ours.__getitem__)
        base = None if cutoff_hit else baseline_ms(nodes)
        cutoff_hit = cutoff_hit or base is None
        same = ours[HALF_RING.name]
        base_text = (
            f"{base:10.1f}"
            if base is not None
            else f"{'> ' + str(int(BASELINE_CUTOFF_S)) + ' s':>10}"
        )
        ratio_text = f"{base / same:7.0f}x" if base is not None else f"{'-':>8}"
        print(
            f"{nodes:>5}  {same:8.2f}  {ours[worst]:8.2f} ({worst:>20})  {base_text}  {ratio_text}"
        )
    print(
        f"targets: <= {TARGET_MS_AT_16:g} ms at 16 nodes for every request; "
        f">= {TARGET_RATIO_AT_10:g}x the baseline at 10 nodes"
    )
    print(
        f"ours = request '{HALF_RING.name}' (the one the baseline runs); requests timed: "
        + ", ".join(request.name for request in REQUESTS)
    )
    print()
    print(f"Inputs the search bound is for (SEARCH_STEP_LIMIT = {SEARCH_STEP_LIMIT} steps)")
    print(f"{'input':>50}  {'ms':>8}  {'steps':>7}  outcome")
    cases: tuple[tuple[str, State, InstanceMeta, float], ...] = (
        (
            "64 nodes, one-way ring, needs 20",
            one_way_ring(64, rdma=False),
            InstanceMeta.MLX_RING,
            20,
        ),
        (
            "16 nodes, RDMA ring + socket mesh, Jaccl, needs 8",
            one_way_ring(16, rdma=True, socket_mesh=True),
            InstanceMeta.MLX_JACCL,
            8,
        ),
        ("16 nodes, two cliques of 8, needs 9", two_cliques(8), InstanceMeta.MLX_RING, 9),
        (
            "16 fully connected, 4 hold it, 4 half, needs 8",
            holding(fully_connected(16, ram_gb=16), range(4), {i: (1, 2) for i in range(4, 8)}),
            InstanceMeta.MLX_RING,
            8,
        ),
        (
            "16 fully connected, 16 partly, Jaccl, needs 8",
            holding(fully_connected(16, ram_gb=16), range(0), {i: (i, 16) for i in range(16)}),
            InstanceMeta.MLX_JACCL,
            8,
        ),
    )
    for name, state, meta, nodes_needed in cases:
        graph = cluster_graph(state)
        card = model(free_gb(state) / len(graph.ids) * (nodes_needed - 0.5), n_layers=80)
        outcome = ""
        steps = 0

        def attempt(
            graph: ClusterGraph = graph, card: ModelCard = card, meta: InstanceMeta = meta
        ) -> None:
            nonlocal outcome, steps
            search = CycleSearch(graph)
            try:
                cycle = choose_cycle(graph, card, Sharding.PIPELINE, meta, 1, search)
                outcome = f"placed on {len(cycle)} nodes"
            except ValueError as error:
                outcome = str(error)[:48] + "..."
            steps = search.budget.spent

        elapsed = median_ms(attempt, repeats=5)
        print(f"{name:>50}  {elapsed:8.1f}  {steps:>7}  {outcome}")


if __name__ == "__main__":
    run()
