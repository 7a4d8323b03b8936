"""What the keeper reads from the cluster State: the models with an instance and the
usable-cluster signature (instance readiness is ``keeper.readiness``, shared with every reader).

These are plain functions of a State, kept apart from the keeper's memory so that the rules in
``keeper.core`` read as decisions and the state-walking they rely on can be tested on its own.
The signature is deliberately coarse: it names the nodes, whether each reports memory, the
backends each reports and how they are linked, and leaves out memory figures, which move all the
time and would otherwise turn every report from a node into a placement attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper.state import (
    Backend,
    Edge,
    NodeId,
    RDMAConnection,
    State,
)

# A link as plain strings: the edge models hash slowly, and signatures are compared per deployment.
LinkKey = tuple[NodeId, NodeId, str, str, str]


@dataclass(frozen=True)
class ClusterSignature:
    """The parts of a State that can turn an unplaceable deployment into a placeable one.

    Per topology node: whether it reports memory and which backends it reports; and every
    link. So each piece of a node rejoining changes it (showing up, reporting memory, reporting
    backends, each link), while the memory figures themselves do not.

    ``digest`` comes first so that comparing two different signatures usually stops there: a
    step compares the current one with every unplaceable deployment's, and a State read afresh
    from JSON gives equal signatures that are not the same objects.
    """

    digest: int
    nodes: frozenset[tuple[NodeId, bool, frozenset[Backend]]]
    links: frozenset[LinkKey]


def cluster_signature(state: State) -> ClusterSignature:
    nodes = frozenset(_node_signature(state, node) for node in state.topology.nodes)
    links = frozenset(
        _link_key(source, sink, edge)
        for source, sinks in state.topology.connections.items()
        for sink, edges in sinks.items()
        for edge in edges
    )
    # (No mutation: the digest alone tells apart all but colliding signatures, which the fields
    # settle, and without a digest the fields alone would; either way the answers are the same.)
    digest = hash((nodes, links))  # pragma: no mutate
    return ClusterSignature(digest, nodes, links)  # pragma: no mutate


def _link_key(source: NodeId, sink: NodeId, edge: Edge) -> LinkKey:
    # (No mutation of the kind markers: any two distinct strings would do.)
    if isinstance(edge, RDMAConnection):
        ifaces = (edge.source_rdma_iface, edge.sink_rdma_iface)
        return (source, sink, "rdma", *ifaces)  # pragma: no mutate
    return source, sink, "socket", edge.sink_multiaddr.address, ""  # pragma: no mutate


def _node_signature(state: State, node: NodeId) -> tuple[NodeId, bool, frozenset[Backend]]:
    # (No mutation: the flag inverted would change exactly when it does now.)
    reports_memory = node in state.node_memory  # pragma: no mutate
    return node, reports_memory, frozenset(state.node_backends.get(node, ()))


def models_with_instances(state: State) -> frozenset[str]:
    return frozenset(instance.shard_assignments.model_id for instance in state.instances.values())
