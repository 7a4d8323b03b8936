"""What-if (docs/design.md §5.14): what losing some nodes now would do to each deployment.

Each cluster is built through the events a cluster applies, and its instances are placed by the real
keeper with the real placement (``keeper_harness.Cluster``), then marked ready; what-if is asked
about it afterwards, as an operator would ask a running cluster. One test per outcome (stays, moves,
loses a replica, cannot be placed) and per rule the answer follows (anti-affinity among the
replacements, the staged copy preferred, cordoned nodes left out, a freed node reused, the keeper's
wording of a refusal), then the naming of nodes. ``test_whatif_agrees.py`` checks the answers
against what the keeper then really does.
"""

from __future__ import annotations

import pytest
from keeper_harness import (
    AFTER_GRACE,
    Cluster,
    build_instance,
    card,
    link_events,
    node_info,
    simple_place,
)

from keeper.core.placement import NO_MEMORY, place_instance
from keeper.core.view import instances_off_topology
from keeper.core.whatif import (
    download_rate,
    node_list,
    placement_order,
    preview_placement,
    resolve_nodes,
    service_thresholds,
    what_if,
    what_if_named,
    without_lost_nodes,
)
from keeper.model.api_models import WhatIfDeployment, WhatIfResponse, WhatIfThresholds
from keeper.model.apply import apply
from keeper.model.events import (
    InstanceCreated,
    NodeCordoned,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
    NodeUncordoned,
)
from keeper.model.liveness import OFF, LivenessConfig
from keeper.model.refusals import NotFoundError, UnprocessableError
from keeper.model.state import (
    AnyInstance,
    Deployment,
    DownloadCompleted,
    DownloadOngoing,
    DownloadProgressData,
    InstanceMeta,
    Memory,
    ModelCard,
    NodeIdentity,
    Sharding,
    State,
)

T = AFTER_GRACE


def cluster_of(*nodes: tuple[str, str, float], linked: bool = True) -> Cluster:
    """Nodes (id, friendly name, GB free), each pair linked both ways unless ``linked`` is off."""
    cluster = Cluster(place=place_instance)
    for node_id, name, gb in nodes:
        cluster.apply(node_info(node_id, gb))
        cluster.apply(
            NodeGatheredInfo(node_id=node_id, when="2026-01-01T00:00:00Z", identity=named(name))
        )
    if linked:
        for i, (a, _, _) in enumerate(nodes):
            for b, _, _ in nodes[i + 1 :]:
                cluster.apply(*link_events(a, b))
    return cluster


def named(name: str) -> NodeIdentity:
    return NodeIdentity(friendly_name=name)


def settle(cluster: Cluster) -> None:
    """The keeper places until it has nothing more to place; every instance then ready."""
    for k in range(40):
        cluster.step(T + k)
    for instance_id in list(cluster.state.instances):
        cluster.make_ready(instance_id)


def nodes_of(instance: AnyInstance) -> frozenset[str]:
    return frozenset(instance.shard_assignments.node_to_runner)


def only(answer: WhatIfResponse) -> WhatIfDeployment:
    (deployment,) = answer.deployments
    return deployment


def placed_names(deployment: WhatIfDeployment) -> list[list[str]]:
    return [[node.name for node in placement.nodes] for placement in deployment.placed]


def test_a_deployment_none_of_whose_instances_uses_the_nodes_stays() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 16))
    deployment_id = cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    assert nodes_of(instance) == {"node-a"}
    answer = only(what_if(cluster.state, ["node-b"]))
    assert answer.deployment_id == deployment_id
    assert (answer.outcome, answer.before, answer.after, answer.replicas) == ("stays", 1, 1, 1)
    assert (answer.lost, answer.placed, answer.reason) == ([], [], None)


def test_an_instance_on_a_lost_node_moves_to_where_placement_puts_it() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    assert nodes_of(instance) == {"node-a"}
    response = what_if(cluster.state, ["node-a"])
    assert [(n.node_id, n.name) for n in response.nodes] == [("node-a", "alpha")]
    answer = only(response)
    assert (answer.outcome, answer.before, answer.after) == ("moves", 1, 1)
    assert [i.instance_id for i in answer.lost] == [instance.instance_id]
    assert [n.name for n in answer.lost[0].nodes] == ["alpha"]
    assert placed_names(answer) == [["beta"]]  # the most memory free, as placement ranks it
    assert answer.placed[0].model_on_disk is False
    assert answer.reason is None


def test_a_replacement_goes_to_the_node_holding_a_staged_copy() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    shard = next(iter(instance.shard_assignments.runner_to_shard.values()))
    total = shard.model_card.storage_size
    staged = DownloadCompleted(node_id="node-c", shard_metadata=shard, total=total)
    cluster.apply(NodeDownloadProgress(download_progress=staged))
    answer = only(what_if_named(cluster.state, ["alpha"]))
    # Placement prefers the nodes holding the model over the ones with the most memory.
    assert placed_names(answer) == [["gamma"]]
    assert answer.placed[0].model_on_disk is True


def test_replicas_that_cannot_be_placed_apart_are_lost_and_said_why_in_numbers() -> None:
    cluster = cluster_of(("node-a", "alpha", 16), ("node-b", "beta", 16), ("node-c", "gamma", 4))
    cluster.deploy(card("m", size_gb=8), replicas=2)
    settle(cluster)
    assert {nodes_of(i) for i in cluster.instances_of_model("m")} == {
        frozenset({"node-a"}),
        frozenset({"node-b"}),
    }
    answer = only(what_if(cluster.state, ["node-a"]))
    assert (answer.outcome, answer.before, answer.after, answer.replicas) == (
        "loses_replica",
        2,
        1,
        2,
    )
    assert answer.placed == []
    # The keeper's words for its placementError: the serving nodes by name, placement's reason.
    assert answer.reason == f"no placement apart from the nodes serving m (beta): {NO_MEMORY}"


def test_a_deployment_with_nowhere_left_cannot_be_placed_with_placement_s_reason() -> None:
    cluster = cluster_of(("node-a", "alpha", 16), ("node-b", "beta", 4))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    answer = only(what_if_named(cluster.state, ["alpha"]))
    assert (answer.outcome, answer.before, answer.after) == ("cannot_place", 1, 0)
    assert answer.reason == NO_MEMORY
    assert [i.nodes[0].name for i in answer.lost] == ["alpha"]


def test_replacements_are_placed_one_after_another_each_apart_from_the_last() -> None:
    nodes = [(f"node-{x}", x * 3, 16.0) for x in "abcde"]
    cluster = cluster_of(*nodes)
    cluster.deploy(card("m", size_gb=8), replicas=3)
    settle(cluster)
    used = {nodes_of(i) for i in cluster.instances_of_model("m")}
    assert used == {frozenset({"node-a"}), frozenset({"node-b"}), frozenset({"node-c"})}
    answer = only(what_if(cluster.state, ["node-a", "node-b"]))
    assert (answer.outcome, answer.after) == ("moves", 3)
    # Two replacements, each on a node of its own, neither beside the surviving replica.
    assert sorted(placed_names(answer)) == [["ddd"], ["eee"]]


def test_no_replacement_goes_to_a_cordoned_node_and_the_refusal_names_it() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 4))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    cluster.apply(NodeCordoned(name="beta"))
    answer = only(what_if_named(cluster.state, ["alpha"]))
    assert (answer.outcome, answer.after) == ("cannot_place", 0)
    assert answer.reason == f"{NO_MEMORY} (cordoned, left out: beta)"
    cluster.apply(NodeUncordoned(name="beta"))
    assert placed_names(only(what_if_named(cluster.state, ["alpha"]))) == [["beta"]]


def test_a_node_an_instance_frees_may_take_its_replacement() -> None:
    # Two of the three nodes hold one instance between them (no node holds it alone).
    cluster = cluster_of(("node-a", "alpha", 8), ("node-b", "beta", 8), ("node-c", "gamma", 8))
    cluster.deploy(card("m", size_gb=12), min_nodes=2)
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    pair = nodes_of(instance)
    assert len(pair) == 2
    lost_node = min(pair)
    answer = only(what_if(cluster.state, [lost_node]))
    # The surviving half of the lost instance is free again: the replacement may use it.
    assert answer.outcome == "moves"
    (placement,) = answer.placed
    assert {n.node_id for n in placement.nodes} == {"node-a", "node-b", "node-c"} - {lost_node}


def test_only_the_deployment_using_the_nodes_changes() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    first = cluster.deploy(card("m", size_gb=8), deployment_id="dep-b")
    second = cluster.deploy(card("n", size_gb=8), deployment_id="dep-a", replicas=2)
    settle(cluster)
    # m on alpha (the most memory free), n's replicas on alpha and beta.
    response = what_if(cluster.state, ["node-b"])
    assert [d.deployment_id for d in response.deployments] == [second, first]  # placement order
    by_id = {d.deployment_id: d for d in response.deployments}
    assert by_id[first].outcome == "stays"
    assert by_id[second].outcome == "moves"
    assert placed_names(by_id[second]) == [["gamma"]]


def test_what_if_leaves_the_state_it_is_given_as_it_was() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    before = cluster.state.model_dump_json()
    what_if(cluster.state, ["node-a"])
    assert cluster.state.model_dump_json() == before


def test_the_loss_is_the_one_a_real_timeout_and_sweep_leave() -> None:
    cluster = cluster_of(("node-a", "alpha", 8), ("node-b", "beta", 8), ("node-c", "gamma", 8))
    cluster.deploy(card("m", size_gb=12), min_nodes=2)
    settle(cluster)
    lost = without_lost_nodes(cluster.state, ["node-a"])
    timed_out = apply(cluster.state, NodeTimedOut(node_id="node-a"))
    assert set(instances_off_topology(timed_out)) == {
        i.instance_id for i in cluster.instances_of_model("m") if "node-a" in nodes_of(i)
    }
    cluster.kill_node("node-a")  # the harness's timeout and sweep, as the master does them
    assert lost == cluster.state


def test_a_placement_that_crashes_is_said_as_the_keeper_says_it() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)

    def crashing(
        state: State, model_card: ModelCard, sharding: Sharding, meta: InstanceMeta, min_nodes: int
    ) -> AnyInstance:
        raise KeyError("boom")

    answer = only(what_if(cluster.state, ["node-a"], crashing))
    assert (answer.outcome, answer.reason) == ("cannot_place", "KeyError: 'boom'")


def test_the_preview_mints_ids_of_its_own() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 16))
    cluster.deploy(card("m", size_gb=8))
    place = preview_placement()
    again = preview_placement()
    first = place(cluster.state, card("m"), Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
    second = place(cluster.state, card("m"), Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
    # Its runner's id, then its own: numbered by the preview, the same in every preview.
    assert first.instance_id == "00000000-0000-0000-0000-000000000002"
    assert second.instance_id == "00000000-0000-0000-0000-000000000004"
    assert again(cluster.state, card("m"), Sharding.PIPELINE, InstanceMeta.MLX_RING, 1) == first


def test_deployments_are_considered_in_id_order() -> None:
    deployments = [
        Deployment(deployment_id=deployment_id, model_card=card(model))
        for deployment_id, model in (("dep-2", "x"), ("dep-1", "y"), ("dep-3", "z"))
    ]
    assert [d.deployment_id for d in placement_order(deployments)] == ["dep-1", "dep-2", "dep-3"]


# --- naming the nodes -----------------------------------------------------------------------


def test_a_node_is_named_by_id_or_friendly_name_each_once_in_the_order_given() -> None:
    state = cluster_of(("node-a", "alpha", 8), ("node-b", "beta", 8)).state
    assert resolve_nodes(state, ["beta", "node-a", "node-b"]) == ["node-b", "node-a"]


def test_an_unknown_node_is_a_404_naming_it() -> None:
    state = cluster_of(("node-a", "alpha", 8)).state
    with pytest.raises(NotFoundError) as refused:
        resolve_nodes(state, ["alpha", "omega"])
    assert refused.value.message == (
        "No node 'omega' in the cluster (known: alpha); name a node by its friendly name or its id"
    )
    assert refused.value.param == "nodes"
    with pytest.raises(NotFoundError) as long_name:
        resolve_nodes(state, ["x" * 10_000])
    assert len(long_name.value.message) < 300


def test_no_node_named_is_a_422() -> None:
    state = cluster_of(("node-a", "alpha", 8)).state
    with pytest.raises(UnprocessableError) as refused:
        resolve_nodes(state, node_list(" , ,"))
    assert refused.value.status_code == 422
    assert "name at least one node" in refused.value.message


def test_a_friendly_name_is_every_node_that_goes_by_it() -> None:
    # One Mac, restarted: exo gave it a new id, and the old one lingers until it times out.
    state = cluster_of(("node-a", "mac", 8), ("node-b", "mac", 8), ("node-c", "pc", 8)).state
    assert resolve_nodes(state, ["mac"]) == ["node-a", "node-b"]
    assert resolve_nodes(state, ["node-b", "pc"]) == ["node-b", "node-c"]


def test_the_node_list_is_split_at_commas_and_stripped() -> None:
    assert node_list("a, b,,c ,") == ["a", "b", "c"]
    assert node_list("") == []


def test_the_sweeps_rule_names_each_instance_off_the_topology_with_its_missing_nodes() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("n1", "n2", "n3")
    for instance in (
        build_instance(card("m"), ["n1", "n2"], "i-a"),
        build_instance(card("n"), ["n3"], "i-b"),
        build_instance(card("o"), ["n2"], "i-c"),
    ):
        cluster.apply(InstanceCreated(instance=instance))
    cluster.apply(NodeTimedOut(node_id="n2"), NodeTimedOut(node_id="n1"))
    assert instances_off_topology(cluster.state) == {"i-a": ["n1", "n2"], "i-c": ["n2"]}


# --- in seconds (docs/design.md §5.14) -------------------------------------------------------

GB = 1024**3
FAST = WhatIfThresholds(suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=30.0, exo_sweep_s=10.0)


def downloading(
    cluster: Cluster, node_id: str, instance: AnyInstance, speed: float, model: str = "m"
) -> None:
    """``node_id`` reports a download of ``model`` (the instance's by default) under way at
    ``speed``."""
    shard = next(iter(instance.shard_assignments.runner_to_shard.values()))
    shard = shard.model_copy(update={"model_card": card(model, size_gb=8)})
    progress = DownloadProgressData(speed=speed)
    entry = DownloadOngoing(node_id=node_id, shard_metadata=shard, download_progress=progress)
    cluster.apply(NodeDownloadProgress(download_progress=entry))


def test_with_the_thresholds_each_placement_says_when_it_serves() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    assert only(what_if(cluster.state, ["node-a"])).placed[0].estimate is None  # none asked
    response = what_if(cluster.state, ["node-a"], thresholds=FAST)
    assert response.thresholds == FAST
    (placement,) = only(response).placed
    assert [node.name for node in placement.nodes] == ["beta"]
    assert placement.estimate is not None
    # beta reports no download: its rate, and so the total, are unknown; the load assumed.
    assert (placement.estimate.download_s, placement.estimate.total_s) == (None, None)
    assert (placement.estimate.load_s, placement.estimate.load_rate_assumed) == (4.0, True)

    downloading(cluster, "node-b", instance, 0.25 * GB)
    downloading(cluster, "node-c", instance, 0.5 * GB)
    (placement,) = only(what_if(cluster.state, ["node-a"], thresholds=FAST)).placed
    assert placement.estimate is not None
    assert (placement.estimate.download_s, placement.estimate.total_s) == (32.0, 39.0)


def test_a_staged_copy_serves_after_detection_and_its_load() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    shard = next(iter(instance.shard_assignments.runner_to_shard.values()))
    staged = DownloadCompleted(node_id="node-c", shard_metadata=shard, total=Memory.from_gb(8))
    cluster.apply(NodeDownloadProgress(download_progress=staged))
    off = service_thresholds(OFF)
    (placement,) = only(what_if(cluster.state, ["node-a"], thresholds=off)).placed
    assert placement.model_on_disk and placement.estimate is not None
    # Fast failover off: exo's timeout and its sweep, then 8 GB at the assumed 2 GB/s.
    assert (placement.estimate.detection_s, placement.estimate.total_s) == (40.0, 44.0)


def test_the_service_thresholds_are_its_flags_and_zero_while_fast_failover_is_off() -> None:
    assert service_thresholds(LivenessConfig(3.0, 8.0)) == FAST
    assert service_thresholds(LivenessConfig(5.0, 12.0), 6.0, 2.0) == WhatIfThresholds(
        suspect_after_s=5.0, dead_after_s=12.0, exo_timeout_s=6.0, exo_sweep_s=2.0
    )
    assert service_thresholds(LivenessConfig(0.0, 8.0)) == WhatIfThresholds(
        suspect_after_s=0.0, dead_after_s=0.0, exo_timeout_s=30.0, exo_sweep_s=10.0
    )


def test_a_download_is_reckoned_at_the_slowest_node_s_fastest_download() -> None:
    cluster = cluster_of(("node-a", "alpha", 32), ("node-b", "beta", 24), ("node-c", "gamma", 16))
    cluster.deploy(card("m", size_gb=8))
    settle(cluster)
    (instance,) = cluster.instances_of_model("m")
    assert download_rate(cluster.state, ["node-b"], "m") is None  # no download: no rate
    downloading(cluster, "node-b", instance, 0.0)  # a rate of 0 is no rate
    assert download_rate(cluster.state, ["node-b"], "m") is None
    downloading(cluster, "node-b", instance, 3.0)
    downloading(cluster, "node-b", instance, 1.0, model="other")  # the fastest counts
    downloading(cluster, "node-c", instance, 2.0)
    assert download_rate(cluster.state, ["node-b"], "m") == 3.0
    assert download_rate(cluster.state, ["node-b", "node-c"], "m") == 2.0
    assert download_rate(cluster.state, ["node-c", "node-b"], "m") == 2.0
    shard = next(iter(instance.shard_assignments.runner_to_shard.values()))
    staged = DownloadCompleted(node_id="node-c", shard_metadata=shard, total=Memory.from_gb(8))
    cluster.apply(NodeDownloadProgress(download_progress=staged))
    # node-c holds m now: only node-b downloads; nothing to fetch at all is no rate.
    assert download_rate(cluster.state, ["node-c", "node-b"], "m") == 3.0
    assert download_rate(cluster.state, ["node-c"], "m") is None
