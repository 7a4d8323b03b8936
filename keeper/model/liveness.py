"""Whether each node of the cluster is alive, silent or gone, and how many are in each state.

The TUI shows a node as *alive*, *silent* (still in the topology, but it has not reported for a
while: trouble coming) or *gone* (left the topology); ``GET /metrics`` counts nodes the same
way, so a dashboard built on Prometheus and the operator's terminal cannot disagree. The rule
is written here once, pure: the caller passes when each node was last heard of (the State's
``lastSeen``, parsed by the shell, which owns dates) and its own "now".

*Gone* is what the State still says of a node that left the topology: a stock exo keeps its
identity, memory and backends after it times out (``departed_nodes``), and our master keeps the
instances that ran on it until the sweep deletes them. A node the State no longer mentions at
all is not counted: nothing is known of it any more. *Cordoned* counts names, not nodes: a name
cordoned while its Mac is away (being updated) is cordoned all the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from keeper.model.state import NodeId, State

# Nodes report their info at least every 5 s (keeper.link.protocol.INFO_REFRESH_S), and each
# report moves lastSeen; 3 s of slack over that is silence, not jitter. exo's master gives up
# on a node after 30 s (the demo after 10 s), so this leaves time to see it coming.
SILENT_AFTER_S = 8.0

Liveness = Literal["alive", "silent", "gone"]
# The states ``nodes_by_state`` counts, in the order they are shown.
NodeCountState = Literal["alive", "silent", "gone", "cordoned"]
NODE_COUNT_STATES: tuple[NodeCountState, ...] = ("alive", "silent", "gone", "cordoned")


def departed_nodes(state: State) -> list[NodeId]:
    """Nodes the State still describes (identity, backends, memory) but whose place in the
    topology is gone: a stock exo keeps those entries after a node times out."""
    present = state.topology.nodes
    known = dict.fromkeys([*state.node_identities, *state.node_backends, *state.node_memory])
    return [node_id for node_id in known if node_id not in present]


def node_liveness(
    state: State, last_heard: Mapping[NodeId, float], now: float
) -> dict[NodeId, Liveness]:
    """Each node the State knows of: ``alive`` (in the topology, heard of less than
    ``SILENT_AFTER_S`` before ``now``, or never dated), ``silent`` (in the topology, quiet for
    longer) or ``gone`` (out of the topology, still described or still running instances)."""
    liveness: dict[NodeId, Liveness] = {}
    for node_id in state.topology.nodes:
        heard = last_heard.get(node_id)
        quiet = now - heard if heard is not None else 0.0
        liveness[node_id] = "silent" if quiet >= SILENT_AFTER_S else "alive"
    for node_id in departed_nodes(state):
        liveness[node_id] = "gone"
    for instance in state.instances.values():
        for node_id in instance.shard_assignments.node_to_runner:
            liveness.setdefault(node_id, "gone")
    return liveness


def nodes_by_state(
    state: State, last_heard: Mapping[NodeId, float], now: float
) -> dict[NodeCountState, int]:
    """How many nodes are alive, silent and gone (``node_liveness``), and how many names are
    cordoned; every state present, zero included, so a series never vanishes."""
    counts: dict[NodeCountState, int] = dict.fromkeys(NODE_COUNT_STATES, 0)
    for liveness in node_liveness(state, last_heard, now).values():
        counts[liveness] += 1
    counts["cordoned"] = len(state.cordoned)
    return counts
