"""The shared readiness and status rules (``keeper.model.readiness``), read in bulk and one by one.

``deployment_status`` (the keeper's API) and ``deployment_statuses`` (the TUI's, one pass over
the instances) must always agree, and ``ready_instances_of`` (the master's chat routing) must
pick exactly the instances the status rule calls ready.
"""

from __future__ import annotations

from keeper_harness import AFTER_GRACE, Cluster, build_instance, card, unplaceable

from keeper.model.events import (
    InstanceCreated,
    NodeConfirmedDead,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.readiness import (
    chat_homes,
    chat_targets,
    deployment_at_risk,
    deployment_status,
    deployment_statuses,
    instance_is_ready,
    instances_at_risk,
    instances_of,
    on_watched_node,
    ready_instances_of,
    ready_on_present_nodes,
    ready_replicas,
)
from keeper.model.state import AnyInstance, RunnerLoading


def _every_status() -> tuple[Cluster, dict[str, str]]:
    """A cluster with one deployment in each status, and an instance no deployment keeps."""
    cluster = Cluster(place=unplaceable("nothing fits"))
    cluster.add_nodes("node-a", "node-b")
    serving, starting, cant_place = (cluster.deploy(m) for m in ("m", "n", "p"))
    cluster.step(AFTER_GRACE)
    placing = cluster.deploy("q")
    cluster.apply(
        InstanceCreated(instance=build_instance(card("m"), ["node-a"], "m-loading")),
        InstanceCreated(instance=build_instance(card("m"), ["node-b"], "m-ready")),
        InstanceCreated(instance=build_instance(card("n"), ["node-a", "node-b"], "n-half")),
        InstanceCreated(instance=build_instance(card("r"), ["node-b"], "r-ready")),
    )
    cluster.make_ready("m-ready")
    cluster.make_ready("n-half")
    cluster.make_ready("r-ready")
    cluster.apply(
        RunnerStatusUpdated(runner_id="n-half-runner-1", runner_status=RunnerLoading()),
    )
    expected = {
        serving: "serving",
        starting: "starting",
        cant_place: "cant_place",
        placing: "placing",
    }
    return cluster, expected


def test_statuses_in_bulk_agree_with_each_one_alone() -> None:
    cluster, expected = _every_status()
    state = cluster.state
    assert deployment_statuses(state) == expected
    assert {
        d_id: deployment_status(deployment, state) for d_id, deployment in state.deployments.items()
    } == expected


def test_the_ready_instances_of_a_model_are_those_with_every_runner_serving() -> None:
    cluster, _ = _every_status()
    state = cluster.state
    assert [i.instance_id for i in instances_of(state, "m")] == ["m-loading", "m-ready"]
    assert [i.instance_id for i in ready_instances_of(state, "m")] == ["m-ready"]
    assert ready_instances_of(state, "n") == []
    assert [i.instance_id for i in ready_instances_of(state, "r")] == ["r-ready"]
    assert instances_of(state, "q") == []
    assert [instance_is_ready(i, state) for i in state.instances.values()] == [
        False,
        True,
        False,
        True,
    ]


def test_an_empty_state_has_no_statuses() -> None:
    assert deployment_statuses(Cluster().state) == {}


def test_chat_targets_are_the_ready_instances_with_every_node_connected_in_state_order() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a", "node-b", "node-c")
    cluster.apply(
        InstanceCreated(instance=build_instance(card("m"), ["node-c"], "m-on-c")),
        InstanceCreated(instance=build_instance(card("m"), ["node-b", "node-a"], "m-on-ba")),
        InstanceCreated(instance=build_instance(card("m"), ["node-a"], "m-loading")),
        InstanceCreated(instance=build_instance(card("n"), ["node-a"], "n-on-a")),
    )
    for instance_id in ("m-on-c", "m-on-ba", "n-on-a"):
        cluster.make_ready(instance_id)
    everyone = {"node-a", "node-b", "node-c"}
    # State order, the rank-0 node of each (node-b for the two-node ring), never one loading.
    assert chat_targets(cluster.state, "m", everyone) == [
        ("m-on-c", "node-c"),
        ("m-on-ba", "node-b"),
    ]
    # One node of a ring gone, even one that is not rank 0: the whole instance is out.
    assert chat_targets(cluster.state, "m", {"node-b", "node-c"}) == [("m-on-c", "node-c")]
    assert chat_targets(cluster.state, "m", {"node-a", "node-b"}) == [("m-on-ba", "node-b")]
    assert chat_targets(cluster.state, "m", set()) == []
    assert chat_targets(cluster.state, "n", everyone) == [("n-on-a", "node-a")]


def _ring_listed_backwards() -> AnyInstance:
    """A two-node ring whose rank-0 node (node-b) is listed last in ``nodeToRunner``."""
    ring = build_instance(card("m"), ["node-b", "node-a"], "m-ring")
    assignments = ring.shard_assignments
    backwards = dict(reversed(list(assignments.node_to_runner.items())))
    return ring.model_copy(
        update={"shard_assignments": assignments.model_copy(update={"node_to_runner": backwards})}
    )


def test_a_chat_goes_to_the_rank_0_node_whatever_order_the_nodes_are_listed_in() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a", "node-b")
    ring = _ring_listed_backwards()
    assert next(iter(ring.shard_assignments.node_to_runner)) == "node-a"
    cluster.apply(InstanceCreated(instance=ring))
    cluster.make_ready("m-ring")
    assert chat_targets(cluster.state, "m", {"node-a", "node-b"}) == [("m-ring", "node-b")]


def test_an_instance_without_a_rank_0_shard_is_no_chat_target() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a", "node-b")
    ring = _ring_listed_backwards()
    assignments = ring.shard_assignments
    no_rank_0 = {
        runner: shard.model_copy(update={"device_rank": shard.device_rank + 1})
        for runner, shard in assignments.runner_to_shard.items()
    }
    broken = ring.model_copy(
        update={"shard_assignments": assignments.model_copy(update={"runner_to_shard": no_rank_0})}
    )
    cluster.apply(InstanceCreated(instance=broken))
    cluster.make_ready("m-ring")
    assert ready_instances_of(cluster.state, "m") != []
    assert chat_targets(cluster.state, "m", {"node-a", "node-b"}) == []


def test_an_instance_on_a_node_gone_from_the_topology_serves_nothing() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a", "node-b", "node-c")
    cluster.apply(
        InstanceCreated(instance=build_instance(card("m"), ["node-a", "node-b"], "m-ab")),
        InstanceCreated(instance=build_instance(card("m"), ["node-c"], "m-c")),
        InstanceCreated(instance=build_instance(card("m"), ["node-c"], "m-loading")),
    )
    cluster.make_ready("m-ab")
    cluster.make_ready("m-c")
    on_present = {
        i.instance_id: ready_on_present_nodes(i, cluster.state)
        for i in cluster.state.instances.values()
    }
    assert on_present == {"m-ab": True, "m-c": True, "m-loading": False}
    cluster.apply(NodeTimedOut(node_id="node-b"))  # one node of the ring: the whole ring is out
    ab = cluster.state.instances["m-ab"]
    assert instance_is_ready(ab, cluster.state)  # its runners still read Ready
    assert not ready_on_present_nodes(ab, cluster.state)
    assert ready_on_present_nodes(cluster.state.instances["m-c"], cluster.state)


# --- a node suspected or confirmed dead (docs/design.md §5.18) ------------------------------


def _watched() -> Cluster:
    """Model m on node-a alone (m-a) and on node-b with node-c (m-bc), both ready; model n on
    node-c, ready; n-loading on node-b, not ready."""
    cluster = Cluster()
    cluster.add_nodes("node-a", "node-b", "node-c")
    cluster.apply(
        InstanceCreated(instance=build_instance(card("m"), ["node-a"], "m-a")),
        InstanceCreated(instance=build_instance(card("m"), ["node-b", "node-c"], "m-bc")),
        InstanceCreated(instance=build_instance(card("n"), ["node-c"], "n-c")),
        InstanceCreated(instance=build_instance(card("n"), ["node-b"], "n-loading")),
    )
    for instance_id in ("m-a", "m-bc", "n-c"):
        cluster.make_ready(instance_id)
    return cluster


def _ready_ids(cluster: Cluster) -> set[str]:
    state = cluster.state
    return {i.instance_id for i in state.instances.values() if instance_is_ready(i, state)}


def test_an_instance_with_a_node_confirmed_dead_is_not_ready_until_it_is_heard_again() -> None:
    cluster = _watched()
    m = cluster.deploy("m")
    assert _ready_ids(cluster) == {"m-a", "m-bc", "n-c"}
    cluster.apply(NodeConfirmedDead(node_id="node-c", last_heard=1.0, at=9.0, why="closed"))
    # One dead node of a ring takes the whole instance out, of every model on it.
    assert _ready_ids(cluster) == {"m-a"}
    assert [i.instance_id for i in ready_instances_of(cluster.state, "m")] == ["m-a"]
    assert ready_replicas(cluster.deployment(m), cluster.state) == 1
    assert chat_targets(cluster.state, "m", {"node-a", "node-b", "node-c"}) == [("m-a", "node-a")]
    cluster.apply(NodeConfirmedDead(node_id="node-a", last_heard=2.0, at=9.0, why="closed"))
    assert _ready_ids(cluster) == set()
    # Its runners still read Ready, yet the model serves nothing: starting, 0 ready.
    assert deployment_status(cluster.deployment(m), cluster.state) == "starting"
    assert deployment_statuses(cluster.state)[m] == "starting"
    assert ready_replicas(cluster.deployment(m), cluster.state) == 0
    cluster.apply(NodeHeardAgain(node_id="node-c", at=10.0))
    assert _ready_ids(cluster) == {"m-bc", "n-c"}
    assert deployment_status(cluster.deployment(m), cluster.state) == "serving"


def test_a_suspect_node_leaves_its_instances_ready_and_at_risk() -> None:
    cluster = _watched()
    m, n = cluster.deploy("m"), cluster.deploy("n")
    assert instances_at_risk(cluster.state) == frozenset()
    cluster.apply(NodeSuspected(node_id="node-b", last_heard=1.0, at=4.0))
    assert _ready_ids(cluster) == {"m-a", "m-bc", "n-c"}
    assert deployment_status(cluster.deployment(m), cluster.state) == "serving"
    # A ready instance with a suspect node is at risk; n-loading, not ready, risks nothing.
    assert instances_at_risk(cluster.state) == frozenset({"m-bc"})
    assert deployment_at_risk(cluster.deployment(m), cluster.state)
    assert not deployment_at_risk(cluster.deployment(n), cluster.state)
    # Dead is not at risk any more: it is out.
    cluster.apply(NodeConfirmedDead(node_id="node-b", last_heard=1.0, at=9.0, why="x"))
    assert instances_at_risk(cluster.state) == frozenset()
    assert not deployment_at_risk(cluster.deployment(m), cluster.state)
    assert _ready_ids(cluster) == {"m-a", "n-c"}


def test_the_watched_phase_is_read_per_node_and_per_phase() -> None:
    cluster = _watched()
    cluster.apply(NodeSuspected(node_id="node-c", last_heard=1.0, at=4.0))
    state = cluster.state
    bc, a = state.instances["m-bc"], state.instances["m-a"]
    assert on_watched_node(bc, state, "suspect")
    assert not on_watched_node(bc, state, "dead")
    assert not on_watched_node(a, state, "suspect")
    assert instances_at_risk(state) == frozenset({"m-bc", "n-c"})
    n = cluster.deploy("n")
    assert deployment_at_risk(cluster.deployment(n), cluster.state)


def test_a_chat_s_homes_are_the_model_s_instances_on_no_node_gone_or_dead() -> None:
    # Ready or not (exo routes to a loading instance too); a suspect node still may answer.
    cluster = _watched()
    assert chat_homes(cluster.state, "m") == frozenset({"m-a", "m-bc"})
    assert chat_homes(cluster.state, "n") == frozenset({"n-c", "n-loading"})
    assert chat_homes(cluster.state, "q") == frozenset()
    cluster.apply(NodeSuspected(node_id="node-b", last_heard=1.0, at=4.0))
    assert chat_homes(cluster.state, "m") == frozenset({"m-a", "m-bc"})
    cluster.apply(NodeConfirmedDead(node_id="node-b", last_heard=1.0, at=9.0, why="x"))
    assert chat_homes(cluster.state, "m") == frozenset({"m-a"})  # one dead node of the ring
    assert chat_homes(cluster.state, "n") == frozenset({"n-c"})
    cluster.apply(NodeTimedOut(node_id="node-a"))  # gone from the topology
    assert chat_homes(cluster.state, "m") == frozenset()
    cluster.apply(NodeHeardAgain(node_id="node-b", at=10.0))
    assert chat_homes(cluster.state, "m") == frozenset({"m-bc"})
