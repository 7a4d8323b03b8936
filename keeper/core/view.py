"""What the keeper reads from the cluster State: the models with an instance, the usable-cluster
signature, and the view of the cluster a new replica may use (instance readiness is
``keeper.model.readiness``, shared with every reader).

These are plain functions of a State, kept apart from the keeper's memory so that the rules in
``keeper.core.keeper`` read as decisions and the state-walking they rely on can be tested on its
own. The signature is deliberately coarse: it names the nodes, whether each reports memory, the
backends each reports and how they are linked, and leaves out memory figures, which move all the
time and would otherwise turn every report from a node into a placement attempt.

``without_nodes`` is how anti-affinity keeps placement's pinned signature: a new replica is
placed on a State that simply does not hold the nodes already serving the model, so placement
itself never needs to know about replicas.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from keeper.model.state import (
    BackendName,
    Edge,
    InstanceId,
    ModelId,
    NodeId,
    RDMAConnection,
    State,
    Topology,
    node_name,
)

V = TypeVar("V")

# A link as plain strings: the edge models hash slowly, and signatures are compared per deployment.
LinkKey = tuple[NodeId, NodeId, str, str, str]


@dataclass(frozen=True)
class ClusterSignature:
    """The parts of a State that can turn an unplaceable deployment into a placeable one.

    Per topology node: whether it reports memory and which backends it reports; every link;
    and the cordoned names. So each piece of a node rejoining changes it (showing up,
    reporting memory, reporting backends, each link), and so does an uncordon, while the memory
    figures themselves do not.

    ``digest`` comes first so that comparing two different signatures usually stops there: a
    step compares the current one with every unplaceable deployment's, and a State read afresh
    from JSON gives equal signatures that are not the same objects.
    """

    digest: int
    nodes: frozenset[tuple[NodeId, bool, frozenset[BackendName]]]
    links: frozenset[LinkKey]
    # The cordoned names: an uncordon can make a placement fit at once.
    cordoned: tuple[str, ...] = ()


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
    digest = hash((nodes, links, state.cordoned))  # pragma: no mutate
    return ClusterSignature(digest, nodes, links, state.cordoned)  # pragma: no mutate


# Stands in for the signature in a step where no deployment is short of instances: that step
# places nothing and records no failure, so nothing compares or keeps it.
AT_REST = ClusterSignature(0, frozenset(), frozenset())


def _link_key(source: NodeId, sink: NodeId, edge: Edge) -> LinkKey:
    # (No mutation of the kind markers: any two distinct strings would do.)
    if isinstance(edge, RDMAConnection):
        ifaces = (edge.source_rdma_iface, edge.sink_rdma_iface)
        return (source, sink, "rdma", *ifaces)  # pragma: no mutate
    return source, sink, "socket", edge.sink_multiaddr.address, ""  # pragma: no mutate


def _node_signature(state: State, node: NodeId) -> tuple[NodeId, bool, frozenset[BackendName]]:
    # (No mutation: the flag inverted would change exactly when it does now.)
    reports_memory = node in state.node_memory  # pragma: no mutate
    return node, reports_memory, frozenset(state.node_backends.get(node, ()))


def models_instance_counts(state: State) -> dict[ModelId, int]:
    """How many instances of each model the state holds, however they were placed."""
    counts: dict[ModelId, int] = {}
    for instance in state.instances.values():
        model_id = instance.shard_assignments.model_id
        counts[model_id] = counts.get(model_id, 0) + 1
    return counts


def nodes_serving(state: State, model_id: ModelId) -> frozenset[NodeId]:
    """Every node holding a runner of an instance of the model."""
    return frozenset(
        node
        for instance in state.instances.values()
        if instance.shard_assignments.model_id == model_id
        for node in instance.shard_assignments.node_to_runner
    )


def node_names(state: State, nodes: frozenset[NodeId]) -> str:
    """The nodes as an operator knows them: friendly name when reported, else id; sorted."""
    return ", ".join(sorted(node_name(state, node) for node in nodes))


def without_nodes(state: State, nodes: frozenset[NodeId]) -> State:
    """The state as if ``nodes`` had left: out of the topology, their links in either direction
    and their per-node entries gone (instances and runners stay; placement does not read them)."""
    topology = state.topology
    connections = {
        source: {sink: edges for sink, edges in sinks.items() if sink not in nodes}
        for source, sinks in topology.connections.items()
        if source not in nodes
    }
    return state.model_copy(
        update={
            "topology": Topology(
                nodes=[n for n in topology.nodes if n not in nodes],
                connections={source: sinks for source, sinks in connections.items() if sinks},
            ),
            "node_memory": _without_keys(state.node_memory, nodes),
            "node_backends": _without_keys(state.node_backends, nodes),
            "node_identities": _without_keys(state.node_identities, nodes),
            "node_network": _without_keys(state.node_network, nodes),
            "node_rdma_ctl": _without_keys(state.node_rdma_ctl, nodes),
            "last_seen": _without_keys(state.last_seen, nodes),
            "downloads": _without_keys(state.downloads, nodes),
        }
    )


def _without_keys(mapping: dict[NodeId, V], nodes: frozenset[NodeId]) -> dict[NodeId, V]:
    return {node: value for node, value in mapping.items() if node not in nodes}


def instances_off_topology(state: State) -> dict[InstanceId, list[NodeId]]:
    """Each instance with a runner on a node missing from the topology, in id order, with those
    nodes (sorted): what exo's sweep deletes (the master's, docs/design.md §6.3; and what-if's
    simulated node loss, ``keeper.core.whatif``)."""
    present = set(state.topology.nodes)
    found: dict[InstanceId, list[NodeId]] = {}
    for instance_id, instance in sorted(state.instances.items()):
        missing = sorted(n for n in instance.shard_assignments.node_to_runner if n not in present)
        if missing:
            found[instance_id] = missing
    return found
