"""Placement: pick the nodes for an instance with exo's /place_instance rules (docs/design.md §4).

``place_instance`` applies the rules in exo's order, and the order is part of the contract: it
decides which reason a failed placement reports. Over the candidate cycles of the topology:

1. cycles of at least ``min_nodes`` nodes, all reporting memory, whose summed ramAvailable
   holds the model (a single node is a cycle of one; two nodes form one with edges both ways);
2. Tensor only: the card supports tensor parallelism and the cycle size divides hidden_size
   (and num_key_value_heads when known);
3. only the smallest remaining size;
4. every node has a backend the engine accepts (MlxRing: MlxMetal, MlxCuda, MlxCpu; MlxJaccl:
   MlxMetal), intersected with the card's backends;
5. MlxJaccl only: every hop of the cycle is an RDMA edge (a single node qualifies);
6. cycles holding a leaf node (at most one distinct neighbour, edges in either direction)
   are preferred when there are any;
7. the most of the model already on the cycle's nodes: the highest download score, the sum over
   its nodes of each node's download fraction of the model (``download_fraction``: its first
   download entry for the model; completed 1, ongoing or pending downloaded / total bytes,
   failed or none 0), summed exactly, where exo sums floats;
8. the most total ramAvailable; ties go to the lexicographically smallest sorted node-id tuple,
   and then to the lexicographically smallest cycle order starting at its smallest id.

Rules 1-4 and 6-8 depend on a cycle's node set only, so the search works on sets by increasing
size and asks "is there a cycle (of RDMA edges) through this set?" only for the sets it ranks
(see ``keeper.core.placement.search``). It lists cycles, as exo does, only where a graph is sparse
enough for that to be cheap: listing them all explodes past about eight fully connected nodes.
Only nodes in ``topology.nodes`` take part. The chosen cycle, rotated to start at its smallest
node id, gives the device ranks; ``keeper.core.placement.build`` makes the instance. If the model
has fewer layers than the chosen cycle has nodes, a pipeline cannot give each node a layer and
placement fails with that reason (every remaining candidate has the same size).
"""

from __future__ import annotations

from collections.abc import Callable

from keeper.core.placement.build import build_instance
from keeper.core.placement.graph import ClusterGraph, cluster_graph
from keeper.core.placement.search import CycleSearch
from keeper.model.ids import IdFactory, new_id
from keeper.model.state import (
    AnyInstance,
    Backend,
    BackendName,
    InstanceMeta,
    ModelCard,
    Sharding,
    State,
)

# The backends each engine can run on (exo's engine table); a model card narrows them further.
ENGINE_BACKENDS: dict[InstanceMeta, frozenset[BackendName]] = {
    InstanceMeta.MLX_RING: frozenset({Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU}),
    InstanceMeta.MLX_JACCL: frozenset({Backend.MLX_METAL}),
}

NO_MEMORY = "No cycles found with sufficient memory"
NO_RDMA = "Requested RDMA (MlxJaccl) but no RDMA-connected cycles available"


def no_tensor_support(model_id: str) -> str:
    return (
        f"Requested Tensor sharding but this model does not support tensor parallelism: {model_id}"
    )


def no_tensor_split(hidden_size: int) -> str:
    return f"No tensor sharding found for model with hidden_size {hidden_size} candidate cycles"


def no_backend(allowed: frozenset[BackendName], model_id: str) -> str:
    """E.g. ``No cycle where every node supports a backend in ['MlxCpu', 'MlxMetal'] for m``:
    the allowed backends' values, sorted, written as a Python list."""
    names = sorted(str(backend) for backend in allowed)
    return f"No cycle where every node supports a backend in {names} for {model_id}"


# What the keeper calls to place (``place_instance``, or the bridge's through exo's answers):
# the State to place on, the model, its sharding and engine, the fewest nodes; ValueError(reason)
# when nothing fits.
PlaceFn = Callable[[State, ModelCard, Sharding, InstanceMeta, int], AnyInstance]


def place_instance(
    state: State,
    model_card: ModelCard,
    sharding: Sharding | str,
    instance_meta: InstanceMeta | str,
    min_nodes: int,
    *,
    new_id: IdFactory = new_id,
) -> AnyInstance:
    """A new instance of ``model_card`` on the nodes the rules pick; ValueError(reason) if none.
    Its instance and runner ids come from ``new_id``."""
    sharding = Sharding(sharding)
    instance_meta = InstanceMeta(instance_meta)
    graph = cluster_graph(state)
    cycle = choose_cycle(graph, model_card, sharding, instance_meta, min_nodes)
    return build_instance(
        state, model_card, graph.ids_of(cycle), sharding, instance_meta, new_id=new_id
    )


def choose_cycle(
    graph: ClusterGraph,
    model_card: ModelCard,
    sharding: Sharding,
    instance_meta: InstanceMeta,
    min_nodes: int,
    search: CycleSearch | None = None,
) -> tuple[int, ...]:
    """The chosen cycle as node indices of ``graph``, starting at the smallest id. ``search``
    (over ``graph``) sets how the search runs; its default suits every caller but tests."""
    search = search or CycleSearch(graph)
    required = model_card.storage_size.in_bytes
    with_memory = sum(1 << i for i, ram in enumerate(graph.ram_available) if ram is not None)
    tensor = sharding == Sharding.TENSOR

    def splits_tensor(size: int) -> bool:
        heads = model_card.num_key_value_heads
        return model_card.hidden_size % size == 0 and (heads is None or heads % size == 0)

    # Rules 1-3: the smallest size that has a candidate (a divisor, for Tensor).
    found_any = False
    size: int | None = None
    for candidate_size in range(max(min_nodes, 1), with_memory.bit_count() + 1):
        if found_any and not splits_tensor(candidate_size):
            continue  # only reached for Tensor: Pipeline stops at the first size found
        if search.best(with_memory, candidate_size, required, rdma_only=False) is None:
            continue
        found_any = True
        if tensor and not model_card.supports_tensor:
            raise ValueError(no_tensor_support(model_card.model_id))
        if not tensor or splits_tensor(candidate_size):
            size = candidate_size
            break
    if not found_any:
        raise ValueError(NO_MEMORY)
    if size is None:
        raise ValueError(no_tensor_split(model_card.hidden_size))

    # Rule 4: the nodes with a usable backend.
    allowed = ENGINE_BACKENDS[instance_meta] & frozenset(model_card.backends)
    usable = with_memory & sum(
        1 << i for i, backends in enumerate(graph.backends) if backends & allowed
    )
    # Rules 5-8. A leaf has at most one neighbour, so it can only sit on a cycle of one or two
    # nodes: for larger sizes no candidate holds a leaf and the preference changes nothing.
    # When no node holds any of the model, rule 7 ranks every candidate alike: it is left out.
    held = graph.held(model_card.model_id)
    rdma_only = instance_meta == InstanceMeta.MLX_JACCL
    best: tuple[int, ...] | None = None
    if size <= 2 and usable & graph.leaves:
        best = search.best(usable, size, required, rdma_only, touching=graph.leaves, held=held)
    if best is None:
        best = search.best(usable, size, required, rdma_only, held=held)
    if best is not None:
        return best
    if rdma_only and search.best(usable, size, required, rdma_only=False) is not None:
        raise ValueError(NO_RDMA)
    raise ValueError(no_backend(allowed, model_card.model_id))
