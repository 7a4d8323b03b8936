"""Placement (docs/design.md §4): each rule and each error by hand, then agreement with the
brute force.

Hand-written clusters are built through the events a master applies (``ClusterBuilder``); the
property test builds random States directly (including edges to nodes that have left, which
events cannot produce) and checks ``place_instance`` against ``placement_reference``, which lists
every simple cycle as exo does.
"""

from __future__ import annotations

import itertools
import uuid
from fractions import Fraction
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from placement_reference import ReferencePlacement, reference_place
from recorded_exo import recorded_state

from keeper.core.placement import choose_cycle, place_instance
from keeper.core.placement.build import (
    EPHEMERAL_PORT_FIRST,
    EPHEMERAL_PORT_LAST,
    build_instance,
    split_layers,
)
from keeper.core.placement.graph import cluster_graph
from keeper.core.placement.search import (
    SEARCH_STEP_LIMIT,
    CycleSearch,
    SearchBudget,
    count_groups,
)
from keeper.model.apply import apply
from keeper.model.events import NodeDownloadProgress, NodeGatheredInfo, TopologyEdgeCreated
from keeper.model.state import (
    AnyDownload,
    AnyInstance,
    Backend,
    BackendName,
    Connection,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Edge,
    InstanceMeta,
    Memory,
    MemoryUsage,
    MlxJacclInstance,
    MlxRingInstance,
    ModelCard,
    Multiaddr,
    NetworkInterface,
    NodeNetwork,
    PipelineShardMetadata,
    RDMAConnection,
    Sharding,
    SocketConnection,
    State,
    TensorShardMetadata,
    Topology,
    download_fraction,
)

GB = 1024**3
WHEN = "2026-11-29T20:15:02.114000Z"
ALL_BACKENDS = (Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU)


def card(
    size_gb: float = 10,
    n_layers: int = 32,
    hidden_size: int = 4096,
    supports_tensor: bool = True,
    kv_heads: int | None = None,
    backends: tuple[Backend, ...] = ALL_BACKENDS,
    model_id: str = "test/model",
) -> ModelCard:
    return ModelCard(
        model_id=model_id,
        storage_size=Memory(in_bytes=int(size_gb * GB)),
        n_layers=n_layers,
        hidden_size=hidden_size,
        supports_tensor=supports_tensor,
        backends=backends,
        num_key_value_heads=kv_heads,
    )


DownloadKind = Literal["completed", "ongoing", "pending", "failed"]


def download(
    node: str,
    kind: DownloadKind,
    downloaded: int = 0,
    total: int = 0,
    model_id: str = "test/model",
) -> AnyDownload:
    """A download entry of ``model_id`` on ``node``, as exo reports it; ``downloaded`` and
    ``total`` (bytes) are the progress of an ongoing or pending one."""
    shard = PipelineShardMetadata(
        model_card=card(model_id=model_id),
        device_rank=0,
        world_size=1,
        start_layer=0,
        end_layer=32,
        n_layers=32,
    )
    done, size = Memory(in_bytes=downloaded), Memory(in_bytes=total)
    match kind:
        case "completed":
            return DownloadCompleted(node_id=node, shard_metadata=shard, total=size)
        case "ongoing":
            progress = DownloadProgressData(downloaded=done, total=size)
            return DownloadOngoing(node_id=node, shard_metadata=shard, download_progress=progress)
        case "pending":
            return DownloadPending(node_id=node, shard_metadata=shard, downloaded=done, total=size)
        case "failed":
            return DownloadFailed(node_id=node, shard_metadata=shard, error_message="disk full")


# exo's words when no cycle has RDMA on every hop, passed on to the user as they are.
NO_RDMA_CYCLES = "Requested RDMA (MlxJaccl) but no RDMA-connected cycles available"


class ClusterBuilder:
    """A cluster assembled from NodeGatheredInfo and TopologyEdgeCreated events."""

    def __init__(self) -> None:
        self.state = State()

    def node(
        self,
        node_id: str,
        ram_gb: float | None = 64,
        backends: tuple[Backend, ...] | None = (Backend.MLX_METAL,),
        ip: str | None = None,
    ) -> ClusterBuilder:
        self.state = apply(
            self.state,
            NodeGatheredInfo(
                node_id=node_id,
                when=WHEN,
                memory=None
                if ram_gb is None
                else MemoryUsage(
                    ram_total=Memory.from_gb(128), ram_available=Memory.from_gb(ram_gb)
                ),
                backends=None if backends is None else list(backends),
                network=None
                if ip is None
                else NodeNetwork(interfaces=[NetworkInterface(name="en0", ip_address=ip)]),
            ),
        )
        return self

    def edge(self, source: str, sink: str, edge: Edge) -> ClusterBuilder:
        self.state = apply(
            self.state, TopologyEdgeCreated(conn=Connection(source=source, sink=sink, edge=edge))
        )
        return self

    def download(
        self,
        node: str,
        kind: DownloadKind,
        downloaded: int = 0,
        total: int = 0,
        model_id: str = "test/model",
    ) -> ClusterBuilder:
        entry = download(node, kind, downloaded, total, model_id)
        self.state = apply(self.state, NodeDownloadProgress(download_progress=entry))
        return self

    def socket(self, source: str, sink: str, ip: str = "192.0.2.1") -> ClusterBuilder:
        return self.edge(source, sink, socket_edge(ip))

    def rdma(self, source: str, sink: str) -> ClusterBuilder:
        return self.edge(source, sink, rdma_edge(source, sink))

    def link(self, a: str, b: str, rdma: bool = False) -> ClusterBuilder:
        """Socket edges both ways (and RDMA edges both ways when asked)."""
        self.socket(a, b, ip_of(b)).socket(b, a, ip_of(a))
        return self.rdma(a, b).rdma(b, a) if rdma else self

    def mesh(self, *nodes: str, rdma: bool = False) -> ClusterBuilder:
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                self.link(a, b, rdma=rdma)
        return self

    def build(self) -> State:
        return self.state


def three_nodes_of_8gb() -> ClusterBuilder:
    """Nodes a, b and c with 8 GB free each, not yet linked."""
    return ClusterBuilder().node("a", 8).node("b", 8).node("c", 8)


def ip_of(node: str) -> str:
    return f"10.0.0.{sum(map(ord, node)) % 250 + 1}"


def socket_edge(ip: str) -> SocketConnection:
    return SocketConnection(sink_multiaddr=Multiaddr(address=f"/ip4/{ip}/tcp/52415"))


def rdma_edge(source: str, sink: str) -> RDMAConnection:
    return RDMAConnection(source_rdma_iface=f"rdma_{source}_{sink}", sink_rdma_iface=f"rdma_{sink}")


def ranked(instance: AnyInstance) -> list[str]:
    """The instance's nodes in device-rank order."""
    assignments = instance.shard_assignments
    rank_of = {
        node: assignments.runner_to_shard[runner].device_rank
        for node, runner in assignments.node_to_runner.items()
    }
    return sorted(rank_of, key=rank_of.__getitem__)


def layer_ranges(instance: AnyInstance) -> list[tuple[int, int]]:
    shards = sorted(
        instance.shard_assignments.runner_to_shard.values(), key=lambda s: s.device_rank
    )
    return [(shard.start_layer, shard.end_layer) for shard in shards]


def shard_kinds(instance: AnyInstance) -> set[type]:
    return {type(shard) for shard in instance.shard_assignments.runner_to_shard.values()}


def as_reference(instance: AnyInstance) -> ReferencePlacement:
    kinds = shard_kinds(instance)
    assert len(kinds) == 1
    return ReferencePlacement(
        kind=type(instance).__name__,
        sharding="Pipeline" if kinds == {PipelineShardMetadata} else "Tensor",
        ranked_nodes=tuple(ranked(instance)),
        layer_ranges=tuple(layer_ranges(instance)),
    )


# How the search may run: the default, walking sets only, and listing cycles first. All are
# exact, so all must agree with the reference.
SEARCH_MODES = {
    "default": {},
    "walk sets only": {"patience": None},
    "list cycles first": {"patience": 0, "listing_limit": 10**9},
}


def place_with_mode(
    mode: str, state: State, model: ModelCard, sharding: str, meta: str, min_nodes: int
) -> ReferencePlacement | str:
    try:
        if mode == "default":
            return as_reference(place_instance(state, model, sharding, meta, min_nodes))
        graph = cluster_graph(state)
        search = CycleSearch(graph, **SEARCH_MODES[mode])
        cycle = choose_cycle(
            graph, model, Sharding(sharding), InstanceMeta(meta), min_nodes, search
        )
        return as_reference(
            build_instance(
                state, model, graph.ids_of(cycle), Sharding(sharding), InstanceMeta(meta)
            )
        )
    except ValueError as error:
        return str(error)


def place(
    state: State,
    model: ModelCard,
    sharding: str = "Pipeline",
    meta: str = "MlxRing",
    min_nodes: int = 1,
) -> AnyInstance:
    """``place_instance``, after checking that every search mode gives the same answer."""
    answers = {
        mode: place_with_mode(mode, state, model, sharding, meta, min_nodes)
        for mode in SEARCH_MODES
    }
    assert len(set(answers.values())) == 1, answers
    return place_instance(state, model, sharding, meta, min_nodes)


def failure(state: State, model: ModelCard, *args: Any) -> str:
    with pytest.raises(ValueError) as raised:
        place(state, model, *args)
    return str(raised.value)


# --- rule 1: memory, min_nodes, live nodes -------------------------------------------------


def test_no_cycle_with_enough_memory() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b").build()
    assert failure(state, card(size_gb=17)) == "No cycles found with sufficient memory"


def test_memory_of_a_cycle_is_summed() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b").build()
    assert ranked(place(state, card(size_gb=16))) == ["a", "b"]


def test_nodes_without_an_edge_both_ways_form_no_cycle() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).socket("a", "b").build()
    assert failure(state, card(size_gb=16)) == "No cycles found with sufficient memory"


def test_min_nodes_forces_a_larger_cycle() -> None:
    state = ClusterBuilder().node("a", 64).node("b", 64).node("c", 64).mesh("a", "b", "c").build()
    assert len(ranked(place(state, card(size_gb=1), min_nodes=1))) == 1
    assert ranked(place(state, card(size_gb=1), min_nodes=3)) == ["a", "b", "c"]
    assert failure(state, card(size_gb=1), "Pipeline", "MlxRing", 4) == (
        "No cycles found with sufficient memory"
    )


def test_a_node_without_memory_is_never_chosen() -> None:
    state = ClusterBuilder().node("a", 8).node("b", None).node("c", 8).mesh("a", "b", "c").build()
    assert sorted(ranked(place(state, card(size_gb=16)))) == ["a", "c"]
    assert failure(state, card(size_gb=17)) == "No cycles found with sufficient memory"


def test_a_node_that_left_the_topology_is_never_chosen() -> None:
    live = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b").build()
    # "big" still has memory, backends and edges on record, but is not in topology.nodes.
    connections = {
        **live.topology.connections,
        "big": {"a": [socket_edge("10.0.0.1")]},
        "a": {**live.topology.connections["a"], "big": [socket_edge("10.0.0.9")]},
    }
    state = live.model_copy(
        update={
            "topology": Topology(nodes=live.topology.nodes, connections=connections),
            "node_memory": {
                **live.node_memory,
                "big": MemoryUsage(ram_available=Memory.from_gb(512)),
            },
            "node_backends": {**live.node_backends, "big": [Backend.MLX_METAL]},
        }
    )
    assert sorted(ranked(place(state, card(size_gb=10)))) == ["a", "b"]
    assert failure(state, card(size_gb=17)) == "No cycles found with sufficient memory"


# --- rule 2: tensor ---------------------------------------------------------------------------


def test_tensor_needs_a_model_that_supports_it() -> None:
    state = ClusterBuilder().node("a").node("b").link("a", "b").build()
    model = card(supports_tensor=False, model_id="org/no-tensor")
    assert failure(state, model, "Tensor") == (
        "Requested Tensor sharding but this model does not support tensor parallelism: "
        "org/no-tensor"
    )


def test_memory_is_checked_before_tensor_support() -> None:
    state = ClusterBuilder().node("a", 8).build()
    model = card(size_gb=9, supports_tensor=False)
    assert failure(state, model, "Tensor") == "No cycles found with sufficient memory"


def test_tensor_needs_a_cycle_size_dividing_hidden_size() -> None:
    state = three_nodes_of_8gb().mesh("a", "b", "c").build()
    model = card(size_gb=20, hidden_size=4096)  # needs 3 nodes; 3 does not divide 4096
    assert failure(state, model, "Tensor") == (
        "No tensor sharding found for model with hidden_size 4096 candidate cycles"
    )
    assert len(ranked(place(state, model, "Pipeline"))) == 3


def test_tensor_skips_sizes_that_do_not_divide_the_kv_heads() -> None:
    nodes = ("a", "b", "c", "d")
    state = three_nodes_of_8gb().node("d", 8).mesh(*nodes).build()
    # 2 divides hidden_size 12 but not 3 kv heads; 3 divides both.
    model = card(size_gb=10, hidden_size=12, kv_heads=3)
    instance = place(state, model, "Tensor")
    assert len(ranked(instance)) == 3
    assert shard_kinds(instance) == {TensorShardMetadata}
    assert layer_ranges(instance) == [(0, 32)] * 3


# --- rule 3: smallest cycles --------------------------------------------------------------


def test_the_smallest_cycle_wins_over_more_memory() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).node("c", 100).mesh("a", "b", "c").build()
    model = card(size_gb=16, hidden_size=6)
    # Pipeline: one node (c) holds it.
    assert ranked(place(state, model)) == ["c"]
    # With min_nodes=2 the pairs qualify; the three-node cycle has more memory but is larger.
    assert len(ranked(place(state, model, "Pipeline", "MlxRing", 2))) == 2


# --- rule 4: backends ---------------------------------------------------------------------


def test_every_node_needs_an_accepted_backend() -> None:
    state = ClusterBuilder().node("a", backends=()).node("b", backends=None).link("a", "b").build()
    assert failure(state, card(model_id="org/m")) == (
        "No cycle where every node supports a backend in ['MlxCpu', 'MlxCuda', 'MlxMetal'] "
        "for org/m"
    )


def test_the_allowed_backends_are_the_engines_narrowed_by_the_card() -> None:
    state = ClusterBuilder().node("a", backends=(Backend.MLX_CUDA,)).build()
    metal_cpu = card(backends=(Backend.MLX_METAL, Backend.MLX_CPU), model_id="org/m")
    assert failure(state, metal_cpu) == (
        "No cycle where every node supports a backend in ['MlxCpu', 'MlxMetal'] for org/m"
    )
    assert failure(state, metal_cpu, "Pipeline", "MlxJaccl") == (
        "No cycle where every node supports a backend in ['MlxMetal'] for org/m"
    )
    cpu_only = card(backends=(Backend.MLX_CPU,), model_id="org/m")
    assert failure(state, cpu_only, "Pipeline", "MlxJaccl") == (
        "No cycle where every node supports a backend in [] for org/m"
    )


def test_backends_filter_only_the_smallest_cycles() -> None:
    # b (CUDA) could hold the model alone but Jaccl needs Metal; a cannot hold it alone, so the
    # smallest size is 1 and no single node qualifies: rule 4 fails although the pair would fit.
    state = (
        ClusterBuilder()
        .node("a", 8, backends=(Backend.MLX_METAL,))
        .node("b", 64, backends=(Backend.MLX_CUDA,))
        .link("a", "b", rdma=True)
        .build()
    )
    assert failure(state, card(size_gb=10), "Pipeline", "MlxJaccl").startswith(
        "No cycle where every node supports a backend in ['MlxMetal']"
    )
    assert ranked(place(state, card(size_gb=10))) == ["b"]


# --- rule 5: RDMA -------------------------------------------------------------------------


def test_jaccl_needs_rdma_edges() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b").build()
    assert failure(state, card(size_gb=16), "Pipeline", "MlxJaccl") == NO_RDMA_CYCLES


def test_rdma_must_cover_every_hop_in_cycle_order() -> None:
    state = (
        three_nodes_of_8gb()
        .mesh("a", "b", "c")
        .rdma("a", "c")
        .rdma("c", "b")
        .rdma("b", "a")
        .build()
    )
    instance = place(state, card(size_gb=20), "Pipeline", "MlxJaccl")
    assert isinstance(instance, MlxJacclInstance)
    assert ranked(instance) == ["a", "c", "b"]  # the only all-RDMA direction
    # An RDMA edge missing on one hop leaves no RDMA cycle.
    broken = three_nodes_of_8gb().mesh("a", "b", "c").rdma("a", "c").rdma("c", "b").build()
    assert failure(broken, card(size_gb=20), "Pipeline", "MlxJaccl") == NO_RDMA_CYCLES


def test_a_ring_follows_the_direction_of_the_edges() -> None:
    state = three_nodes_of_8gb().socket("a", "c").socket("c", "b").socket("b", "a").build()
    assert ranked(place(state, card(size_gb=20))) == ["a", "c", "b"]


def test_jaccl_devices_and_coordinators() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b", rdma=True).build()
    instance = place(state, card(size_gb=16), "Tensor", "MlxJaccl")
    assert isinstance(instance, MlxJacclInstance)
    assert ranked(instance) == ["a", "b"]
    assert instance.jaccl_devices == [[None, "rdma_a_b"], ["rdma_b_a", None]]
    port = int(instance.jaccl_coordinators["a"].rsplit(":", 1)[1])
    assert EPHEMERAL_PORT_FIRST <= port <= EPHEMERAL_PORT_LAST
    assert instance.jaccl_coordinators == {"a": f"0.0.0.0:{port}", "b": f"{ip_of('a')}:{port}"}
    assert shard_kinds(instance) == {TensorShardMetadata}


# --- rule 6: leaves -----------------------------------------------------------------------


def leafy_cluster() -> State:
    # hub, a, b form a triangle; leaf hangs off hub only.
    return (
        ClusterBuilder()
        .node("hub", 100)
        .node("a", 50)
        .node("b", 50)
        .node("leaf", 10)
        .mesh("hub", "a", "b")
        .link("hub", "leaf")
        .build()
    )


def test_a_cycle_holding_a_leaf_is_preferred() -> None:
    state = leafy_cluster()
    assert ranked(place(state, card(size_gb=5))) == ["leaf"]
    assert ranked(place(state, card(size_gb=55), "Pipeline", "MlxRing", 2)) == ["hub", "leaf"]


def test_without_a_leaf_the_most_memory_wins() -> None:
    state = leafy_cluster()
    # No single node or pair with the leaf holds 111 GB; pairs without it do.
    assert ranked(place(state, card(size_gb=111))) == ["a", "hub"]
    # A leaf is never on a cycle of three; this one starts at its smallest id.
    assert ranked(place(state, card(size_gb=151))) == ["a", "b", "hub"]


# --- how much of the model a node holds ---------------------------------------------------


def test_a_node_s_download_fraction_is_exo_s() -> None:
    def fraction(*entries: AnyDownload) -> Fraction:
        return download_fraction(entries, "test/model")

    assert fraction(download("a", "completed", total=GB)) == 1
    assert fraction(download("a", "ongoing", 1, 4)) == Fraction(1, 4)
    assert fraction(download("a", "pending", 3, 4)) == Fraction(3, 4)
    assert fraction(download("a", "ongoing", 5, 0)) == 0  # no total: nothing counted
    assert fraction(download("a", "pending", 5, 0)) == 0
    assert fraction(download("a", "failed")) == 0
    assert fraction() == 0
    # Another model's entry is passed over; the first entry for the model decides.
    other = download("a", "completed", model_id="org/other")
    assert fraction(other, download("a", "ongoing", 1, 2)) == Fraction(1, 2)
    assert fraction(download("a", "failed"), download("a", "completed")) == 0
    assert type(fraction(download("a", "ongoing", 1, 3))) is Fraction  # exact, never a float


def test_a_recorded_download_counts_its_bytes() -> None:
    state = recorded_state("state-downloading")
    model_id = "mlx-community/Qwen3-0.6B-4bit"
    fractions = {
        node: download_fraction(entries, model_id) for node, entries in state.downloads.items()
    }
    assert fractions == {
        "5763eeb9-da3e-4a1b-8b43-ed46f68c9532": 1,  # serving it: completed
        "d2f80960-d20d-4473-b970-8318b488d614": Fraction(210_031_775, 342_884_352),
    }


# --- rule 7: the most of the model already on the nodes -----------------------------------


def test_a_completed_copy_beats_more_free_memory() -> None:
    builder = ClusterBuilder().node("a", 64).node("b", 16).link("a", "b")
    assert ranked(place(builder.build(), card(size_gb=10))) == ["a"]
    state = builder.download("b", "completed", total=10 * GB).build()
    assert ranked(place(state, card(size_gb=10))) == ["b"]


@pytest.mark.parametrize("kind", ["ongoing", "pending"])
def test_half_a_download_beats_none(kind: DownloadKind) -> None:
    state = ClusterBuilder().node("a", 64).node("b", 32).link("a", "b").download("b", kind, 1, 2)
    assert ranked(place(state.build(), card(size_gb=10))) == ["b"]


def test_more_of_the_model_beats_less() -> None:
    state = (
        ClusterBuilder()
        .node("a", 8)
        .node("b", 64)
        .link("a", "b")
        .download("a", "completed", total=4)
        .download("b", "ongoing", 3, 4)
        .build()
    )
    assert ranked(place(state, card(size_gb=5))) == ["a"]


def test_a_download_of_another_model_counts_nothing() -> None:
    state = (
        ClusterBuilder()
        .node("a", 64)
        .node("b", 16)
        .link("a", "b")
        .download("b", "completed", total=GB, model_id="org/other")
        .build()
    )
    assert ranked(place(state, card(size_gb=10))) == ["a"]


def test_a_failed_download_counts_nothing() -> None:
    state = ClusterBuilder().node("a", 64).node("b", 16).link("a", "b").download("b", "failed")
    assert ranked(place(state.build(), card(size_gb=10))) == ["a"]


def test_equal_scores_fall_back_to_memory_then_to_the_smallest_ids() -> None:
    builder = ClusterBuilder().node("c", 64).node("b", 32).node("a", 16).mesh("a", "b", "c")
    builder.download("a", "completed", total=4).download("b", "completed", total=4)
    assert ranked(place(builder.build(), card(size_gb=10))) == ["b"]
    level = ClusterBuilder().node("b", 32).node("a", 32).node("c", 64).mesh("a", "b", "c")
    level.download("a", "ongoing", 1, 2).download("b", "pending", 2, 4)
    assert ranked(place(level.build(), card(size_gb=10))) == ["a"]


@pytest.mark.parametrize(("more_on", "chosen"), [("halves", ["a", "b"]), ("ends", ["c", "d"])])
def test_a_score_sums_its_nodes_and_equal_sums_fall_back_to_memory(
    more_on: str, chosen: list[str]
) -> None:
    # A path a - b - c - d: the pairs {a, b}, {b, c} and {c, d} are cycles. Two halves on a
    # and b tie one completed copy on d (the pair with c): memory decides between the two ways
    # to score 1, however the search meets them.
    halves, ends = (14, 12) if more_on == "halves" else (12, 14)
    state = (
        ClusterBuilder()
        .node("a", halves)
        .node("b", 12)
        .node("c", ends)
        .node("d", 12)
        .link("a", "b")
        .link("b", "c")
        .link("c", "d")
        .download("a", "ongoing", 1, 2)
        .download("b", "pending", 1, 2)
        .download("d", "completed", total=2)
        .build()
    )
    assert ranked(place(state, card(size_gb=20))) == chosen


def test_scores_are_summed_exactly() -> None:
    # 1/10 + 2/10 ties 3/10 + 0, so memory decides: {c, d}. (exo sums floats, where
    # 0.1 + 0.2 is 0.30000000000000004 and would win.)
    state = (
        ClusterBuilder()
        .node("a", 8)
        .node("b", 8)
        .node("c", 10)
        .node("d", 10)
        .link("a", "b")
        .link("c", "d")
        .download("a", "ongoing", 1, 10)
        .download("b", "ongoing", 2, 10)
        .download("c", "ongoing", 3, 10)
        .build()
    )
    assert ranked(place(state, card(size_gb=15))) == ["c", "d"]


def test_leaves_and_the_smallest_size_come_before_downloads() -> None:
    leafy = leafy_cluster()
    held = leafy.model_copy(
        update={"downloads": {node: [download(node, "completed")] for node in ("hub", "a", "b")}}
    )
    assert ranked(place(held, card(size_gb=5))) == ["leaf"]
    assert ranked(place(held, card(size_gb=55), "Pipeline", "MlxRing", 2)) == ["hub", "leaf"]
    # A pair holding two copies does not beat one node that holds none.
    pair = ClusterBuilder().node("a", 8).node("b", 8).node("c", 100).mesh("a", "b", "c")
    pair.download("a", "completed").download("b", "completed")
    assert ranked(place(pair.build(), card(size_gb=10))) == ["c"]


def test_nodes_holding_the_model_but_short_of_memory_are_passed_over_cheaply() -> None:
    # A set of 8 with either small holder has 71 GB; only the 8 large nodes hold 75 GB.
    names = [f"n{i}" for i in range(8)]
    builder = ClusterBuilder().node("h0", 1).node("h1", 1)
    for name in names:
        builder.node(name, 10)
    builder.mesh("h0", "h1", *names).download("h0", "completed").download("h1", "completed")
    state = builder.build()
    model = card(size_gb=75, n_layers=80)
    # (Listing every cycle of 10 fully connected nodes, the third mode, runs out of steps.)
    for mode in ("default", "walk sets only"):
        placed = place_with_mode(mode, state, model, "Pipeline", "MlxRing", 1)
        assert isinstance(placed, ReferencePlacement), placed
        assert placed.ranked_nodes == tuple(names)
    graph = cluster_graph(state)
    search = CycleSearch(graph)
    choose_cycle(graph, card(size_gb=75), Sharding.PIPELINE, InstanceMeta.MLX_RING, 1, search)
    assert search.budget.spent < 100


def test_many_partial_downloads_on_a_large_dense_cluster_are_cheap() -> None:
    # 16 nodes, each a different share of the model along: Tensor on 8 (7 do not divide
    # hidden_size), the 8 furthest along.
    names = [f"n{i:02d}" for i in range(16)]
    builder = ClusterBuilder()
    for name in names:
        builder.node(name, 16)
    builder.mesh(*names, rdma=True)
    for i, name in enumerate(names):
        builder.download(name, "ongoing", i, 16)
    graph = cluster_graph(builder.build())
    search = CycleSearch(graph)
    cycle = choose_cycle(
        graph, card(size_gb=100), Sharding.TENSOR, InstanceMeta.MLX_JACCL, 1, search
    )
    assert graph.ids_of(cycle) == tuple(names[8:])
    assert search.budget.spent < 200


# --- rule 8: most free memory, then the smallest ids --------------------------------------


def test_the_most_free_memory_wins() -> None:
    state = ClusterBuilder().node("a", 10).node("b", 30).node("c", 20).mesh("a", "b", "c").build()
    assert ranked(place(state, card(size_gb=5))) == ["b"]
    assert ranked(place(state, card(size_gb=5), "Pipeline", "MlxRing", 2)) == ["b", "c"]


def test_ties_among_sets_without_a_cycle_go_to_the_smallest_ids() -> None:
    # Equal memory everywhere; the best-ranked pairs ({a, b}, {a, c}, ...) have no cycle, so the
    # search must still order the pairs it queues behind them by their ids.
    builder = ClusterBuilder()
    for name in ("a", "b", "c", "d", "e", "f"):
        builder.node(name, 8)
    state = builder.link("c", "f").link("d", "e").link("b", "f").build()
    assert ranked(place(state, card(size_gb=16))) == ["b", "f"]


def test_ties_go_to_the_smallest_node_ids() -> None:
    state = ClusterBuilder().node("c", 20).node("b", 20).node("a", 20).mesh("c", "b", "a").build()
    assert ranked(place(state, card(size_gb=5))) == ["a"]
    assert ranked(place(state, card(size_gb=5), "Pipeline", "MlxRing", 2)) == ["a", "b"]


# --- building the instance ----------------------------------------------------------------


def test_a_single_node_is_always_ring_and_pipeline() -> None:
    state = ClusterBuilder().node("a", 64).build()
    instance = place(state, card(size_gb=10, n_layers=24), "Tensor", "MlxJaccl")
    assert isinstance(instance, MlxRingInstance)
    assert shard_kinds(instance) == {PipelineShardMetadata}
    assert layer_ranges(instance) == [(0, 24)]
    assert instance.hosts_by_node == {
        "a": [instance.hosts_by_node["a"][0].model_copy(update={"ip": "0.0.0.0"})]
    }


def test_layers_follow_free_memory() -> None:
    state = ClusterBuilder().node("a", 30).node("b", 10).link("a", "b").build()
    instance = place(state, card(size_gb=35, n_layers=8))
    assert layer_ranges(instance) == [(0, 6), (6, 8)]


def test_every_node_gets_at_least_one_layer() -> None:
    state = ClusterBuilder().node("a", 100).node("b", 0.01).link("a", "b").build()
    instance = place(state, card(size_gb=100, n_layers=10), "Pipeline", "MlxRing", 2)
    assert layer_ranges(instance) == [(0, 9), (9, 10)]


def test_fewer_layers_than_nodes_cannot_be_pipelined() -> None:
    state = three_nodes_of_8gb().mesh("a", "b", "c").build()
    model = card(size_gb=20, n_layers=2, hidden_size=3, model_id="org/tiny")
    assert failure(state, model) == (
        "Cannot split the 2 layers of org/tiny across 3 nodes: every node needs at least one layer"
    )
    assert layer_ranges(place(state, model, "Tensor")) == [(0, 2)] * 3


@pytest.mark.parametrize(
    ("n_layers", "ram", "expected"),
    [
        (48, [20_615_843_020, 82_463_372_083], [(0, 10), (10, 48)]),  # exo's own example
        (10, [1, 1, 1], [(0, 4), (4, 7), (7, 10)]),  # equal remainders: lower ranks first
        (3, [0, 0, 0], [(0, 1), (1, 2), (2, 3)]),  # no memory figures: an even split
        (4, [1, 0, 0, 100], [(0, 1), (1, 2), (2, 3), (3, 4)]),
        (7, [5, 0, 5], [(0, 3), (3, 4), (4, 7)]),  # the empty node takes from the higher rank
    ],
)
def test_split_layers(n_layers: int, ram: list[int], expected: list[tuple[int, int]]) -> None:
    assert split_layers(n_layers, ram) == expected


def test_matches_exos_own_two_node_ring() -> None:
    studio, mini = "12D3KooWstudioxxxx", "12D3KooWminibxxxxx"
    state = (
        ClusterBuilder()
        .node(studio, 82_463_372_083 / GB)
        .node(mini, 20_615_843_020 / GB)
        .socket(studio, mini, "192.0.2.12")
        .socket(mini, studio, "192.0.2.10")
        .build()
    )
    model = card(size_gb=17_612_931_072 / GB, n_layers=48, hidden_size=2048, kv_heads=4)
    instance = place(state, model, "Pipeline", "MlxRing", 2)
    assert isinstance(instance, MlxRingInstance)
    assert ranked(instance) == [mini, studio]
    assert layer_ranges(instance) == [(0, 10), (10, 48)]
    port = instance.ephemeral_port
    hosts = {node: [(h.ip, h.port) for h in row] for node, row in instance.hosts_by_node.items()}
    assert hosts == {
        mini: [("0.0.0.0", port), ("192.0.2.10", port)],
        studio: [("192.0.2.12", port), ("0.0.0.0", port)],
    }


def test_ring_hosts_fall_back_to_the_network_interface_then_any_address() -> None:
    state = (
        ClusterBuilder()
        .node("a", 8, ip="198.51.100.1")
        .node("b", 8, ip="198.51.100.2")
        .node("c", 8)
        .rdma("a", "b")
        .rdma("b", "c")
        .rdma("c", "a")
        .build()
    )
    instance = place(state, card(size_gb=20))
    assert isinstance(instance, MlxRingInstance)
    assert ranked(instance) == ["a", "b", "c"]
    ips = {node: [h.ip for h in row] for node, row in instance.hosts_by_node.items()}
    assert ips == {
        "a": ["0.0.0.0", "198.51.100.2", "0.0.0.0"],
        "b": ["198.51.100.1", "0.0.0.0", "0.0.0.0"],
        "c": ["198.51.100.1", "198.51.100.2", "0.0.0.0"],
    }
    ports = {h.port for row in instance.hosts_by_node.values() for h in row}
    assert ports == {instance.ephemeral_port}
    assert EPHEMERAL_PORT_FIRST <= instance.ephemeral_port <= EPHEMERAL_PORT_LAST


def test_runners_ids_and_shards_are_consistent() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b").build()
    first = place(state, card(size_gb=16))
    second = place(state, card(size_gb=16))
    assignments = first.shard_assignments
    assert assignments.model_id == "test/model"
    assert set(assignments.node_to_runner.values()) == set(assignments.runner_to_shard)
    assert {s.world_size for s in assignments.runner_to_shard.values()} == {2}
    assert first.instance_id != second.instance_id
    uuid.UUID(first.instance_id)  # a real uuid


# --- arguments ----------------------------------------------------------------------------


def test_string_and_enum_arguments_agree() -> None:
    state = ClusterBuilder().node("a", 8).node("b", 8).link("a", "b", rdma=True).build()
    model = card(size_gb=16)
    by_string = place_instance(state, model, "Tensor", "MlxJaccl", 2)
    by_enum = place_instance(state, model, Sharding.TENSOR, InstanceMeta.MLX_JACCL, 2)
    assert type(by_string) is type(by_enum) is MlxJacclInstance
    assert ranked(by_string) == ranked(by_enum)
    assert layer_ranges(by_string) == layer_ranges(by_enum)


def test_an_unknown_sharding_is_a_clear_error() -> None:
    state = ClusterBuilder().node("a").build()
    with pytest.raises(ValueError, match="'Diagonal' is not a valid Sharding"):
        place_instance(state, card(), "Diagonal", "MlxRing", 1)


# --- the search: sparse, dense and adversarial topologies -----------------------------------


def one_way_ring(nodes: int, rdma: bool = False) -> ClusterBuilder:
    """The only cycle of more than one node runs through all of them."""
    builder = ClusterBuilder()
    names = [f"n{i:02d}" for i in range(nodes)]
    for name in names:
        builder.node(name, 1)
    for i, name in enumerate(names):
        following = names[(i + 1) % nodes]
        builder.rdma(name, following) if rdma else builder.socket(name, following)
    return builder


def test_a_large_sparse_cluster_is_answered_exactly() -> None:
    # 64 nodes, the model needs 20 of them: no set smaller than all 64 has a cycle.
    state = one_way_ring(64).build()
    instance = place_instance(state, card(size_gb=20, n_layers=80), "Pipeline", "MlxRing", 1)
    assert ranked(instance) == [f"n{i:02d}" for i in range(64)]


def test_a_sparse_rdma_ring_beside_a_full_socket_mesh() -> None:
    # Thunderbolt cables in a one-way ring of 16, ethernet between all: a Jaccl model that
    # needs 8 nodes has no RDMA cycle through any 8 of them, and that is found cheaply.
    names = [f"n{i:02d}" for i in range(16)]
    state = one_way_ring(16, rdma=True).mesh(*names).build()
    with pytest.raises(ValueError) as raised:
        place_instance(state, card(size_gb=8), "Tensor", "MlxJaccl", 1)
    assert str(raised.value) == NO_RDMA_CYCLES
    graph = cluster_graph(state)
    budget = SearchBudget()
    with pytest.raises(ValueError):
        choose_cycle(
            graph,
            card(size_gb=8),
            Sharding.TENSOR,
            InstanceMeta.MLX_JACCL,
            1,
            CycleSearch(graph, budget),
        )
    assert budget.spent < 2_000


def test_a_large_dense_cluster_takes_few_steps() -> None:
    names = [f"n{i:02d}" for i in range(16)]
    builder = ClusterBuilder()
    for name in names:
        builder.node(name, 16)
    graph = cluster_graph(builder.mesh(*names, rdma=True).build())
    budget = SearchBudget()
    search = CycleSearch(graph, budget)
    cycle = choose_cycle(
        graph, card(size_gb=100), Sharding.TENSOR, InstanceMeta.MLX_JACCL, 1, search
    )
    assert len(cycle) == 8
    assert budget.spent < 100


def two_cliques(size: int) -> State:
    """Two complete graphs joined by one two-way link: too many cycles to list, and no cycle
    through a set that spans both, which is what a model bigger than one clique needs."""
    left = [f"l{i:02d}" for i in range(size)]
    right = [f"r{i:02d}" for i in range(size)]
    builder = ClusterBuilder()
    for name in left + right:
        builder.node(name, 1)
    return builder.mesh(*left).mesh(*right).link(left[0], right[0]).build()


def test_an_adversarial_topology_stops_at_the_step_limit() -> None:
    state = two_cliques(8)
    graph = cluster_graph(state)
    budget = SearchBudget()
    with pytest.raises(ValueError, match="Placement search gave up after 50000 steps"):
        choose_cycle(
            graph,
            card(size_gb=9),
            Sharding.PIPELINE,
            InstanceMeta.MLX_RING,
            1,
            CycleSearch(graph, budget),
        )
    assert budget.spent == SEARCH_STEP_LIMIT + 1


@settings(max_examples=300, deadline=None)
@given(
    classes=st.lists(st.lists(st.integers(0, 6), min_size=1, max_size=3), min_size=2, max_size=4),
    weights=st.lists(st.integers(0, 6), min_size=4, max_size=4, unique=True),
    size=st.integers(1, 6),
    required=st.integers(0, 20),
)
def test_the_ways_to_take_members_from_classes_come_grouped_by_score(
    classes: list[list[int]], weights: list[int], size: int, required: int
) -> None:
    rams = [sorted(members, reverse=True) for members in classes]
    weights = sorted(weights[: len(rams)], reverse=True)
    expected: dict[int, list[tuple[int, ...]]] = {}
    for taken in itertools.product(*(range(len(members) + 1) for members in rams)):
        memory = sum(sum(members[:number]) for members, number in zip(rams, taken, strict=True))
        if sum(taken) == size and memory >= required:
            score = sum(number * weight for number, weight in zip(taken, weights, strict=True))
            expected.setdefault(score, []).append(taken)
    found = list(count_groups(rams, weights, size, required, SearchBudget()))
    assert [(score, sorted(group)) for score, group in found] == [
        (score, sorted(expected[score])) for score in sorted(expected, reverse=True)
    ]


# --- agreement with the brute force -------------------------------------------------------

NODE_NAMES = ("n0", "n1", "n2", "n3", "n4", "n5", "x", "y")


@st.composite
def clusters(draw: st.DrawFn, usable: bool = False) -> State:
    """A random State. ``usable``: every node reports memory and Metal, and most hold some of
    the model, so placements succeed more often and the download score decides more of them."""
    names = draw(st.permutations(NODE_NAMES))[: draw(st.integers(2, 7))]
    # Up to one name is a node that has left: it keeps its memory, backends and edges.
    gone = names[-1] if len(names) > 2 and draw(st.integers(0, 3)) == 0 else None
    live = [name for name in names if name != gone][:6]
    memory: dict[str, MemoryUsage] = {}
    backends: dict[str, list[BackendName]] = {}
    for name in names:
        if usable or draw(st.integers(0, 11)) > 0:
            ram = draw(st.sampled_from([0, 2, 3, 3, 4, 4, 5, 6, 8]))
            memory[name] = MemoryUsage(ram_available=Memory(in_bytes=ram))
        if usable:
            backends[name] = [Backend.MLX_METAL]
        elif draw(st.integers(0, 11)) > 0:
            backends[name] = draw(
                st.one_of(
                    st.just([Backend.MLX_METAL]),
                    st.lists(st.sampled_from(ALL_BACKENDS), unique=True),
                ).map(list[BackendName])
            )
    connections: dict[str, dict[str, list[Edge]]] = {}
    density = draw(st.sampled_from([0.15, 0.3, 0.5, 0.8, 0.9, 1.0, 1.0]))
    for source in names:
        for sink in names:
            if source == sink or draw(st.floats(0, 1)) > density:
                continue
            kind = draw(st.sampled_from(["socket", "rdma", "both", "both", "empty"]))
            edges: list[Edge] = []
            if kind in ("socket", "both"):
                edges.append(socket_edge(ip_of(sink)))
            if kind in ("rdma", "both"):
                edges.append(rdma_edge(source, sink))
            connections.setdefault(source, {})[sink] = edges
    downloads = {name: draw(download_lists(name, often=usable)) for name in names}
    return State(
        topology=Topology(nodes=live, connections=connections),
        node_memory=memory,
        node_backends=backends,
        downloads={name: entries for name, entries in downloads.items() if entries},
    )


RANDOM_MODEL = "test/random"


@st.composite
def download_lists(draw: st.DrawFn, node: str, often: bool = False) -> list[AnyDownload]:
    """A node's download entries: none, one or two (``often``: seldom none), of the placed model
    or another, completed, failed, or ongoing or pending with a fraction of small numbers (so
    that sums of fractions tie often: 1/2 + 1/2 is a completed copy), sometimes over a total of
    0. When two are for the placed model, the first decides."""
    entries: list[AnyDownload] = []
    for _ in range(draw(st.sampled_from([0, 1, 1, 2] if often else [0, 0, 0, 1, 1, 2]))):
        model_id = draw(st.sampled_from([RANDOM_MODEL, RANDOM_MODEL, "test/other"]))
        kinds: list[DownloadKind] = ["completed", "ongoing", "ongoing", "pending", "failed"]
        kind = draw(st.sampled_from(kinds))
        total = draw(st.sampled_from([0, 2, 3, 4, 6]))
        downloaded = draw(st.integers(0, total))
        entries.append(download(node, kind, downloaded, total, model_id))
    return entries


@st.composite
def clusters_and_models(draw: st.DrawFn, usable: bool = False) -> tuple[State, ModelCard]:
    """A cluster and a model sized as a share of the cluster's free memory, so that every size
    of cycle, and sometimes none, can hold it (``usable``: most often some can)."""
    state = draw(clusters(usable))
    live_ram = sum(
        usage.ram_available.in_bytes
        for node, usage in state.node_memory.items()
        if node in state.topology.nodes
    )
    shares = [0, 0.1, 0.2, 0.3, 0.45, 0.6, *([] if usable else [0.75, 0.9, 1, 1.2])]
    share = draw(st.sampled_from(shares))
    return state, draw(model_cards(int(live_ram * share)))


@st.composite
def model_cards(draw: st.DrawFn, size: int) -> ModelCard:
    return ModelCard(
        model_id=RANDOM_MODEL,
        storage_size=Memory(in_bytes=size),
        n_layers=draw(st.integers(1, 8)),
        hidden_size=draw(st.sampled_from([1, 2, 3, 4, 5, 6, 12, 60])),
        supports_tensor=draw(st.integers(0, 7)) > 0,
        backends=draw(
            st.one_of(
                st.just(ALL_BACKENDS),
                st.lists(st.sampled_from(ALL_BACKENDS), min_size=1, unique=True).map(tuple),
            )
        ),
        num_key_value_heads=draw(st.one_of(st.none(), st.integers(1, 8))),
    )


@pytest.mark.slow  # 800 examples against listing every cycle: seconds, not milliseconds
@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_and_model=clusters_and_models(),
    sharding=st.sampled_from(["Pipeline", "Tensor"]),
    meta=st.sampled_from(["MlxRing", "MlxJaccl"]),
    min_nodes=st.sampled_from([1, 1, 2, 2, 3, 4]),
)
def test_agrees_with_listing_every_cycle(
    cluster_and_model: tuple[State, ModelCard], sharding: str, meta: str, min_nodes: int
) -> None:
    agrees_with_the_reference(*cluster_and_model, sharding, meta, min_nodes)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_and_model=clusters_and_models(usable=True),
    meta=st.sampled_from(["MlxRing", "MlxJaccl"]),
    min_nodes=st.sampled_from([1, 2, 2, 3]),
)
def test_agrees_with_listing_every_cycle_where_nodes_hold_the_model(
    cluster_and_model: tuple[State, ModelCard], meta: str, min_nodes: int
) -> None:
    agrees_with_the_reference(*cluster_and_model, "Pipeline", meta, min_nodes)


def agrees_with_the_reference(
    state: State, model: ModelCard, sharding: str, meta: str, min_nodes: int
) -> None:
    """Every search mode answers as the brute force does; records whether the model's
    downloads changed which nodes the brute force chose."""
    try:
        expected: ReferencePlacement | str = reference_place(
            state, model, sharding, meta, min_nodes
        )
    except ValueError as error:
        expected = str(error)
    event(
        expected
        if isinstance(expected, str)
        else f"{expected.kind} on {len(expected.ranked_nodes)}"
    )
    if not isinstance(expected, str):
        try:
            by_memory = reference_place(
                state.model_copy(update={"downloads": {}}), model, sharding, meta, min_nodes
            )
        except ValueError as error:
            by_memory = str(error)
        event(
            "downloads: decided the nodes"
            if isinstance(by_memory, ReferencePlacement)
            and by_memory.ranked_nodes != expected.ranked_nodes
            else "downloads: nodes as by memory alone"
        )
    for mode in SEARCH_MODES:
        assert place_with_mode(mode, state, model, sharding, meta, min_nodes) == expected, mode
