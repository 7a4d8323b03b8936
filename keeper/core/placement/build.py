"""Turn a chosen cycle of nodes into an exo instance: runners, shards and the wiring between them.

Kept apart from the choice of nodes so each can be read (and tested) alone: this module decides
nothing about *which* nodes, only how an instance over given nodes, in rank order, looks in exo's
JSON. It is pure apart from the fresh ids, which come from the caller's ``IdFactory`` (random
uuid4s unless a replayable run seeds them); the port derives from the instance id.
"""

from __future__ import annotations

import uuid

from keeper.model.ids import IdFactory, new_id
from keeper.model.state import (
    AnyInstance,
    AnyShard,
    Host,
    InstanceMeta,
    MlxJacclInstance,
    MlxRingInstance,
    ModelCard,
    NodeId,
    PipelineShardMetadata,
    RDMAConnection,
    RunnerId,
    ShardAssignments,
    Sharding,
    SocketConnection,
    State,
    TensorShardMetadata,
)

# The instance's port is picked from the dynamic (ephemeral) range IANA reserves, as exo does,
# so it cannot collide with well-known services such as the master's own API port.
EPHEMERAL_PORT_FIRST = 49153
EPHEMERAL_PORT_LAST = 65535
# A node's address for itself (listen on every interface), and the fallback when nothing in the
# state tells how one node reaches another; exo writes the same.
ANY_ADDRESS = "0.0.0.0"


def split_layers(n_layers: int, ram: list[int]) -> list[tuple[int, int]]:
    """Contiguous [start, end) layer ranges, one per node in rank order, in proportion to free
    memory: largest-remainder rounding (ties to the lower rank), then every node left with no
    layer takes one from the node holding the most (ties to the higher rank). Memory all zero
    splits evenly. The caller guarantees ``n_layers >= len(ram) >= 1``."""
    nodes = len(ram)
    total = sum(ram)
    weights = ram if total > 0 else [1] * nodes
    weight_total = total if total > 0 else nodes
    counts = [n_layers * weight // weight_total for weight in weights]
    remainders = [n_layers * weight % weight_total for weight in weights]
    by_remainder = sorted(range(nodes), key=lambda rank: (-remainders[rank], rank))
    for rank in by_remainder[: n_layers - sum(counts)]:
        counts[rank] += 1
    for rank in range(nodes):
        if counts[rank] == 0:
            donor = max(range(nodes), key=lambda other: (counts[other], other))
            counts[donor] -= 1
            counts[rank] = 1
    ranges: list[tuple[int, int]] = []
    start = 0
    for count in counts:
        ranges.append((start, start + count))
        start += count
    return ranges


def ephemeral_port(instance_id: str) -> int:
    span = EPHEMERAL_PORT_LAST - EPHEMERAL_PORT_FIRST + 1
    return EPHEMERAL_PORT_FIRST + uuid.UUID(instance_id).int % span


def reach_ip(state: State, source: NodeId, sink: NodeId) -> str:
    """The IP ``source`` reaches ``sink`` at: the address of its first socket edge to it, else
    ``sink``'s first network interface, else ``0.0.0.0``."""
    for edge in state.topology.connections.get(source, {}).get(sink, []):
        if isinstance(edge, SocketConnection) and edge.sink_multiaddr.ip_address:
            return edge.sink_multiaddr.ip_address
    network = state.node_network.get(sink)
    if network is not None and network.interfaces:
        return network.interfaces[0].ip_address
    return ANY_ADDRESS


def _rdma_iface(state: State, source: NodeId, sink: NodeId) -> str | None:
    for edge in state.topology.connections.get(source, {}).get(sink, []):
        if isinstance(edge, RDMAConnection):
            return edge.source_rdma_iface
    return None


def build_instance(
    state: State,
    model_card: ModelCard,
    ranked_nodes: tuple[NodeId, ...],
    sharding: Sharding,
    instance_meta: InstanceMeta,
    *,
    new_id: IdFactory = new_id,
) -> AnyInstance:
    """An instance over ``ranked_nodes`` (device rank = position). One node is always
    MlxRing + Pipeline, whatever was asked. Raises ValueError if a pipeline would leave a node
    without a layer."""
    world_size = len(ranked_nodes)
    if world_size == 1:
        sharding, instance_meta = Sharding.PIPELINE, InstanceMeta.MLX_RING
    n_layers = model_card.n_layers
    if sharding == Sharding.PIPELINE and n_layers < world_size:
        raise ValueError(
            f"Cannot split the {n_layers} layers of {model_card.model_id} across "
            f"{world_size} nodes: every node needs at least one layer"
        )
    if sharding == Sharding.PIPELINE:
        ram = [state.node_memory[node].ram_available.in_bytes for node in ranked_nodes]
        ranges = split_layers(n_layers, ram)
    else:
        ranges = [(0, n_layers)] * world_size
    shard_type = PipelineShardMetadata if sharding == Sharding.PIPELINE else TensorShardMetadata
    runner_to_shard: dict[RunnerId, AnyShard] = {}
    node_to_runner: dict[NodeId, RunnerId] = {}
    for rank, (node, (start, end)) in enumerate(zip(ranked_nodes, ranges, strict=True)):
        runner_id = new_id()
        node_to_runner[node] = runner_id
        runner_to_shard[runner_id] = shard_type(
            model_card=model_card,
            device_rank=rank,
            world_size=world_size,
            start_layer=start,
            end_layer=end,
            n_layers=n_layers,
        )
    assignments = ShardAssignments(
        model_id=model_card.model_id,
        runner_to_shard=runner_to_shard,
        node_to_runner=node_to_runner,
    )
    instance_id = new_id()
    port = ephemeral_port(instance_id)
    if instance_meta == InstanceMeta.MLX_RING:
        return MlxRingInstance(
            instance_id=instance_id,
            shard_assignments=assignments,
            hosts_by_node={
                node: [
                    Host(ip=ANY_ADDRESS if peer == node else reach_ip(state, node, peer), port=port)
                    for peer in ranked_nodes
                ]
                for node in ranked_nodes
            },
            ephemeral_port=port,
        )
    coordinator = ranked_nodes[0]
    return MlxJacclInstance(
        instance_id=instance_id,
        shard_assignments=assignments,
        jaccl_devices=[
            [None if peer == node else _rdma_iface(state, node, peer) for peer in ranked_nodes]
            for node in ranked_nodes
        ],
        jaccl_coordinators={
            node: f"{ANY_ADDRESS if node == coordinator else reach_ip(state, node, coordinator)}"
            f":{port}"
            for node in ranked_nodes
        },
    )
