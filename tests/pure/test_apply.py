"""``apply(state, event)``: every event's effect, the deployment rules (docs/design.md §3.3),
and purity.

Each test starts from a state built by applying events and checks exactly what the event
changed and what it left alone, so a rule that drifts (a kept runner, a leftover edge, a
deployment overwritten) fails here before it confuses the keeper.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import WHEN, build_instance, card, memory, node_info, socket_edge

from keeper.model.apply import apply, apply_indexed
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentPriorityChanged,
    DeploymentScaled,
    DeploymentServingChanged,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.state import (
    MAX_SERVING_RECORDS,
    SERVING_HISTORY_KEEP_S,
    Backend,
    Connection,
    Deployment,
    NetworkInterface,
    NodeIdentity,
    NodeNetwork,
    RDMAConnection,
    RdmaCtl,
    RunnerLoading,
    RunnerReady,
    RunnerShutdown,
    ServingRecord,
    State,
)


def applied(*events: AnyEvent, state: State | None = None) -> State:
    result = state or State()
    for event in events:
        result = apply(result, event)
    return result


def deployment(deployment_id: str, model_id: str, **fields: object) -> Deployment:
    return Deployment.model_validate(
        {"deployment_id": deployment_id, "model_card": card(model_id), **fields}
    )


def created(deployment_id: str, model_id: str, **fields: object) -> DeploymentCreated:
    return DeploymentCreated(deployment=deployment(deployment_id, model_id, **fields))


def rdma_edge(source: str, sink: str) -> Connection:
    return Connection(
        source=source,
        sink=sink,
        edge=RDMAConnection(source_rdma_iface="rdma_en2", sink_rdma_iface="rdma_en3"),
    )


def three_linked_nodes() -> State:
    events: list[AnyEvent] = [node_info(n) for n in ("a", "b", "c")]
    for source, sink in (("a", "b"), ("b", "a"), ("b", "c"), ("c", "b"), ("a", "c")):
        events.append(TopologyEdgeCreated(conn=socket_edge(source, sink)))
    return applied(*events)


# --- deployments ---------------------------------------------------------------------------


def test_deployment_created_adds_the_deployment() -> None:
    state = applied(created("d1", "m"))
    assert state.deployments == {"d1": deployment("d1", "m")}


def test_deployment_created_first_wins_for_a_model() -> None:
    state = applied(created("d1", "m"), created("d2", "m", min_nodes=2), created("d3", "n"))
    assert set(state.deployments) == {"d1", "d3"}
    assert state.deployments["d1"].min_nodes == 1


def test_deployment_created_twice_with_one_id_keeps_the_first() -> None:
    state = applied(created("d1", "m"), created("d1", "other-model"))
    assert state.deployments == {"d1": deployment("d1", "m")}


def test_deployment_deleted_removes_only_it() -> None:
    state = applied(created("d1", "m"), created("d2", "n"), DeploymentDeleted(deployment_id="d1"))
    assert list(state.deployments) == ["d2"]


def test_a_model_can_be_deployed_again_after_its_deployment_is_deleted() -> None:
    state = applied(created("d1", "m"), DeploymentDeleted(deployment_id="d1"), created("d2", "m"))
    assert list(state.deployments) == ["d2"]


def serving(deployment_id: str, at: float, is_serving: bool = True) -> DeploymentServingChanged:
    return DeploymentServingChanged(
        deployment_id=deployment_id, record=ServingRecord(at=at, serving=is_serving)
    )


def test_serving_records_are_kept_per_deployment_in_order() -> None:
    state = applied(
        created("d1", "m"), created("d2", "n"), serving("d1", 1.0), serving("d1", 2.0, False)
    )
    assert [(r.at, r.serving) for r in state.serving_history["d1"]] == [(1.0, True), (2.0, False)]
    assert "d2" not in state.serving_history
    # The deployment's deletion takes its records with it; another's stay.
    state = applied(serving("d2", 3.0), DeploymentDeleted(deployment_id="d1"), state=state)
    assert list(state.serving_history) == ["d2"]


def test_serving_records_older_than_the_kept_span_go_but_the_last_of_them_stays() -> None:
    day = 24 * 3600.0
    events = [serving("d1", at) for at in (0.0, day, 2 * day, 2 * day + 1)]
    newest = 2 * day + 1 + SERVING_HISTORY_KEEP_S - day  # day 1 and before are out of the span
    state = applied(created("d1", "m"), *events, serving("d1", newest))
    # The record of day 1 says what held when the span begins; day 0's is gone.
    assert [r.at for r in state.serving_history["d1"]] == [day, 2 * day, 2 * day + 1, newest]
    # A record exactly at the span's start is inside it: the one before it goes.
    at_edge = applied(serving("d1", 2 * day + SERVING_HISTORY_KEEP_S), state=state)
    assert at_edge.serving_history["d1"][0].at == 2 * day


def test_serving_records_are_capped_oldest_first() -> None:
    events = [serving("d1", float(at)) for at in range(MAX_SERVING_RECORDS + 3)]
    records = applied(created("d1", "m"), *events).serving_history["d1"]
    assert len(records) == MAX_SERVING_RECORDS
    assert (records[0].at, records[-1].at) == (3.0, float(MAX_SERVING_RECORDS + 2))


@pytest.mark.parametrize(
    "event",
    [
        DeploymentDeleted(deployment_id="nope"),
        DeploymentPlaced(deployment_id="nope", instance_id="i1"),
        DeploymentPlacementFailed(deployment_id="nope", error="reason"),
        DeploymentScaled(deployment_id="nope", replicas=2),
        DeploymentPriorityChanged(deployment_id="nope", priority=900, preempt=True),
        DeploymentServingChanged(deployment_id="nope", record=ServingRecord(at=1.0, serving=True)),
    ],
    ids=lambda event: type(event).__name__,
)
def test_a_deployment_event_with_an_unknown_id_changes_nothing(event: AnyEvent) -> None:
    before = applied(created("d1", "m"))
    after = apply(before, event)
    assert after == before and "nope" not in after.deployments


def test_deployment_placed_sets_the_instance_and_clears_the_error() -> None:
    state = applied(
        created("d1", "m"),
        DeploymentPlacementFailed(deployment_id="d1", error="No cycles found"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
    )
    assert state.deployments["d1"].instance_id == "i1"
    assert state.deployments["d1"].placement_error is None


def test_deployment_placement_failed_sets_the_error_and_keeps_the_instance() -> None:
    state = applied(
        created("d1", "m"),
        created("d2", "n"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        DeploymentPlacementFailed(deployment_id="d1", error="reason"),
    )
    assert state.deployments["d1"].instance_id == "i1"
    assert state.deployments["d1"].placement_error == "reason"
    assert state.deployments["d2"] == deployment("d2", "n")


def test_deployment_placed_appends_to_the_keepers_record_once() -> None:
    state = applied(
        created("d1", "m"),
        created("d2", "n"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        DeploymentPlaced(deployment_id="d1", instance_id="i2"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),  # replayed: recorded once
    )
    assert state.deployments["d1"].placed_instance_ids == ("i1", "i2")
    assert state.deployments["d1"].instance_id == "i1"
    assert state.deployments["d2"].placed_instance_ids == ()


def test_deployment_scaled_sets_replicas_and_clears_the_error() -> None:
    state = applied(
        created("d1", "m"),
        created("d2", "n"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        DeploymentPlacementFailed(deployment_id="d1", error="reason"),
        DeploymentScaled(deployment_id="d1", replicas=3),
    )
    scaled = state.deployments["d1"]
    assert (scaled.replicas, scaled.placement_error) == (3, None)
    assert (scaled.instance_id, scaled.placed_instance_ids) == ("i1", ("i1",))
    assert state.deployments["d2"] == deployment("d2", "n")
    assert (
        applied(DeploymentScaled(deployment_id="d1", replicas=1), state=state)
        .deployments["d1"]
        .replicas
        == 1
    )


def test_deployment_priority_changed_sets_both_and_keeps_the_rest() -> None:
    state = applied(
        created("d1", "m"),
        created("d2", "n"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        DeploymentPlacementFailed(deployment_id="d1", error="reason"),
        DeploymentPriorityChanged(deployment_id="d1", priority=900, preempt=True),
    )
    changed = state.deployments["d1"]
    assert (changed.priority, changed.preempt) == (900, True)
    # The error still holds: a new priority places nothing by itself.
    assert (changed.placement_error, changed.placed_instance_ids) == ("reason", ("i1",))
    assert state.deployments["d2"] == deployment("d2", "n")
    lowered = applied(
        DeploymentPriorityChanged(deployment_id="d1", priority=0, preempt=False), state=state
    ).deployments["d1"]
    assert (lowered.priority, lowered.preempt) == (0, False)


# --- instances and runners -----------------------------------------------------------------


def test_instance_created_adds_it() -> None:
    instance = build_instance(card("m"), ["a"], "i1")
    state = applied(InstanceCreated(instance=instance))
    assert state.instances == {"i1": instance}


def test_instance_deleted_removes_it_and_its_runners_only() -> None:
    mine = build_instance(card("m"), ["a", "b"], "i1")
    other = build_instance(card("n"), ["c"], "i2")
    events: list[AnyEvent] = [InstanceCreated(instance=mine), InstanceCreated(instance=other)]
    for runner_id in (*mine.shard_assignments.runner_to_shard, "i2-runner-0"):
        events.append(RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerReady()))
    state = applied(*events, InstanceDeleted(instance_id="i1"))
    assert list(state.instances) == ["i2"]
    assert list(state.runners) == ["i2-runner-0"]


def test_instance_deleted_leaves_every_keeper_record_and_keeps_the_last_placement() -> None:
    instance = build_instance(card("m"), ["a"], "i1")
    state = applied(
        created("d1", "m"),
        created("d2", "n"),
        InstanceCreated(instance=instance),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        DeploymentPlaced(deployment_id="d1", instance_id="i2"),
        DeploymentPlaced(deployment_id="d2", instance_id="i1"),  # a record holding it twice over
        DeploymentPlaced(deployment_id="d2", instance_id="i3"),
        InstanceDeleted(instance_id="i1"),
    )
    assert state.instances == {}
    assert state.deployments["d1"].placed_instance_ids == ("i2",)
    assert state.deployments["d2"].placed_instance_ids == ("i3",)
    assert state.deployments["d1"].instance_id == "i2"
    assert state.deployments["d2"].instance_id == "i3"


def test_instance_deleted_of_an_instance_gone_already_still_leaves_the_record() -> None:
    before = applied(created("d1", "m"), DeploymentPlaced(deployment_id="d1", instance_id="i1"))
    after = apply(before, InstanceDeleted(instance_id="i1"))
    assert after.deployments["d1"].placed_instance_ids == ()
    assert after.deployments["d1"].instance_id == "i1"  # the last placement, as before
    assert after.instances == before.instances == {}


def test_instance_deleted_of_an_unrecorded_instance_keeps_the_deployments() -> None:
    before = applied(
        created("d1", "m"),
        DeploymentPlaced(deployment_id="d1", instance_id="i1"),
        InstanceCreated(instance=build_instance(card("m"), ["a"], "manual")),
    )
    after = apply(before, InstanceDeleted(instance_id="manual"))
    assert after.deployments is before.deployments
    assert after.instances == {}


def test_instance_deleted_with_an_unknown_id_changes_nothing() -> None:
    before = applied(InstanceCreated(instance=build_instance(card("m"), ["a"], "i1")))
    assert apply(before, InstanceDeleted(instance_id="nope")) == before


def test_runner_status_updated_sets_and_replaces_the_status() -> None:
    loading = RunnerLoading(layers_loaded=3, total_layers=16)
    state = applied(RunnerStatusUpdated(runner_id="r1", runner_status=loading))
    assert state.runners == {"r1": loading}
    state = applied(RunnerStatusUpdated(runner_id="r1", runner_status=RunnerReady()), state=state)
    assert state.runners == {"r1": RunnerReady()}


def test_runner_shutdown_removes_the_runner() -> None:
    state = applied(
        RunnerStatusUpdated(runner_id="r1", runner_status=RunnerReady()),
        RunnerStatusUpdated(runner_id="r2", runner_status=RunnerReady()),
        RunnerStatusUpdated(runner_id="r1", runner_status=RunnerShutdown()),
    )
    assert state.runners == {"r2": RunnerReady()}


def test_runner_shutdown_of_an_unknown_runner_changes_nothing() -> None:
    before = applied(RunnerStatusUpdated(runner_id="r1", runner_status=RunnerReady()))
    after = apply(before, RunnerStatusUpdated(runner_id="r9", runner_status=RunnerShutdown()))
    assert after == before and "r9" not in after.runners


# --- nodes and topology --------------------------------------------------------------------


def test_node_gathered_info_adds_the_node_once_with_what_it_reports() -> None:
    identity = NodeIdentity(friendly_name="studio-1", chip_id="Apple M2 Ultra")
    network = NodeNetwork(interfaces=[NetworkInterface(name="en0", ip_address="192.0.2.1")])
    full = NodeGatheredInfo(
        node_id="a",
        when=WHEN,
        memory=memory(16.0),
        backends=[Backend.MLX_METAL],
        identity=identity,
        network=network,
        rdma_ctl=RdmaCtl(enabled=True),
    )
    state = applied(full, NodeGatheredInfo(node_id="a", when="2026-01-01T00:00:05Z"))
    assert state.topology.nodes == ["a"]
    assert state.last_seen == {"a": "2026-01-01T00:00:05Z"}
    assert state.node_memory == {"a": memory(16.0)}
    assert state.node_backends == {"a": [Backend.MLX_METAL]}
    assert state.node_identities == {"a": identity}
    assert state.node_network == {"a": network}
    assert state.node_rdma_ctl == {"a": RdmaCtl(enabled=True)}


def test_node_gathered_info_updates_only_the_fields_it_carries() -> None:
    state = applied(node_info("a", available_gb=16.0), node_info("b"))
    state = applied(node_info("a", available_gb=4.0, backends=None), state=state)
    assert state.node_memory["a"] == memory(4.0)
    assert state.node_backends["a"] == [Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU]
    assert state.topology.nodes == ["a", "b"]


def test_node_gathered_info_without_memory_or_backends_records_none() -> None:
    state = applied(node_info("a", available_gb=None, backends=None))
    assert state.topology.nodes == ["a"]
    assert state.node_memory == {} and state.node_backends == {}
    assert state.node_identities == {} and state.node_network == {} and state.node_rdma_ctl == {}


def test_topology_edge_created_adds_a_directed_edge() -> None:
    state = applied(node_info("a"), node_info("b"), TopologyEdgeCreated(conn=socket_edge("a", "b")))
    assert state.topology.connections == {"a": {"b": [socket_edge("a", "b").edge]}}


def test_topology_edge_created_keeps_several_edges_between_two_nodes_once_each() -> None:
    socket, rdma = socket_edge("a", "b"), rdma_edge("a", "b")
    state = applied(
        node_info("a"),
        node_info("b"),
        TopologyEdgeCreated(conn=socket),
        TopologyEdgeCreated(conn=rdma),
        TopologyEdgeCreated(conn=socket),
    )
    assert state.topology.connections == {"a": {"b": [socket.edge, rdma.edge]}}


def test_topology_edge_created_to_or_from_an_unknown_node_changes_nothing() -> None:
    before = applied(node_info("a"))
    assert apply(before, TopologyEdgeCreated(conn=socket_edge("a", "ghost"))) == before
    assert apply(before, TopologyEdgeCreated(conn=socket_edge("ghost", "a"))) == before


def test_topology_edge_deleted_removes_only_that_edge() -> None:
    socket, rdma = socket_edge("a", "b"), rdma_edge("a", "b")
    state = applied(
        node_info("a"),
        node_info("b"),
        TopologyEdgeCreated(conn=socket),
        TopologyEdgeCreated(conn=rdma),
        TopologyEdgeDeleted(conn=socket),
    )
    assert state.topology.connections == {"a": {"b": [rdma.edge]}}


def test_topology_edge_deleted_drops_emptied_entries() -> None:
    state = three_linked_nodes()
    for source, sink in (("a", "b"), ("a", "c"), ("c", "b")):
        state = apply(state, TopologyEdgeDeleted(conn=socket_edge(source, sink)))
    edge = socket_edge("b", "a").edge
    assert state.topology.connections == {"b": {"a": [edge], "c": [socket_edge("b", "c").edge]}}


def test_topology_edge_deleted_that_does_not_exist_changes_nothing() -> None:
    before = three_linked_nodes()
    assert apply(before, TopologyEdgeDeleted(conn=rdma_edge("a", "b"))) == before
    assert apply(before, TopologyEdgeDeleted(conn=socket_edge("c", "a"))) == before


def test_node_timed_out_removes_the_node_its_edges_and_its_entries() -> None:
    state = three_linked_nodes()
    instance = build_instance(card("m"), ["a", "b"], "i1")
    state = applied(
        InstanceCreated(instance=instance),
        RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerReady()),
        NodeGatheredInfo(
            node_id="b",
            when=WHEN,
            identity=NodeIdentity(friendly_name="b"),
            network=NodeNetwork(),
            rdma_ctl=RdmaCtl(enabled=True),
        ),
        state=state,
    )
    state = state.model_copy(update={"downloads": {"a": [], "b": [{"x": 1}]}})
    state = apply(state, NodeTimedOut(node_id="b"))
    assert state.topology.nodes == ["a", "c"]
    assert state.topology.connections == {"a": {"c": [socket_edge("a", "c").edge]}}
    assert set(state.node_memory) == set(state.node_backends) == set(state.last_seen) == {"a", "c"}
    assert state.downloads == {"a": []}
    assert state.node_identities == {} and state.node_network == {} and state.node_rdma_ctl == {}
    # Instances stay: deciding they are broken is the membership sweep's job, not apply's.
    assert state.instances == {"i1": instance}
    assert list(state.runners) == ["i1-runner-0"]


def test_node_timed_out_for_an_unknown_node_changes_nothing_that_matters() -> None:
    before = three_linked_nodes()
    assert apply(before, NodeTimedOut(node_id="ghost")) == before


def test_an_edge_report_after_the_node_timed_out_does_not_bring_half_of_it_back() -> None:
    state = applied(NodeTimedOut(node_id="b"), state=three_linked_nodes())
    state = apply(state, TopologyEdgeCreated(conn=socket_edge("a", "b")))
    assert "b" not in state.topology.nodes
    assert all("b" not in sinks for sinks in state.topology.connections.values())


def test_apply_indexed_records_the_index() -> None:
    state = apply_indexed(State(), IndexedEvent(idx=7, event=created("d1", "m")))
    assert state.last_event_applied_idx == 7 and list(state.deployments) == ["d1"]


# --- purity --------------------------------------------------------------------------------

NODES = ("a", "b", "c")
EVENTS: st.SearchStrategy[AnyEvent] = st.one_of(
    st.builds(node_info, st.sampled_from(NODES), st.sampled_from([1.0, 8.0])),
    st.builds(
        lambda s, t: TopologyEdgeCreated(conn=socket_edge(s, t)),
        st.sampled_from(NODES),
        st.sampled_from(NODES),
    ),
    st.builds(
        lambda s, t: TopologyEdgeDeleted(conn=socket_edge(s, t)),
        st.sampled_from(NODES),
        st.sampled_from(NODES),
    ),
    st.builds(lambda n: NodeTimedOut(node_id=n), st.sampled_from(NODES)),
    st.builds(created, st.sampled_from(["d1", "d2"]), st.sampled_from(["m", "n"])),
    st.builds(lambda d: DeploymentDeleted(deployment_id=d), st.sampled_from(["d1", "d2"])),
    st.builds(serving, st.sampled_from(["d1", "d2"]), st.floats(0, 1e6), st.booleans()),
    st.builds(
        lambda d, i: DeploymentPlaced(deployment_id=d, instance_id=i),
        st.sampled_from(["d1", "d2"]),
        st.sampled_from(["i1", "i2"]),
    ),
    st.builds(
        lambda d: DeploymentPlacementFailed(deployment_id=d, error="x"),
        st.sampled_from(["d1", "d2"]),
    ),
    st.builds(
        lambda d, n: DeploymentScaled(deployment_id=d, replicas=n),
        st.sampled_from(["d1", "d2"]),
        st.integers(1, 3),
    ),
    st.builds(
        lambda d, p, flag: DeploymentPriorityChanged(deployment_id=d, priority=p, preempt=flag),
        st.sampled_from(["d1", "d2"]),
        st.integers(0, 1000),
        st.booleans(),
    ),
    st.builds(
        lambda i, n: InstanceCreated(instance=build_instance(card("m"), [n], i)),
        st.sampled_from(["i1", "i2"]),
        st.sampled_from(NODES),
    ),
    st.builds(lambda i: InstanceDeleted(instance_id=i), st.sampled_from(["i1", "i2"])),
    st.builds(
        lambda i, shutdown: RunnerStatusUpdated(
            runner_id=f"{i}-runner-0",
            runner_status=RunnerShutdown() if shutdown else RunnerReady(),
        ),
        st.sampled_from(["i1", "i2"]),
        st.booleans(),
    ),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(EVENTS, max_size=30))
def test_apply_never_mutates_its_input(events: list[AnyEvent]) -> None:
    state = State()
    for event in events:
        before = state.model_dump_json()
        after = apply(state, event)
        assert state.model_dump_json() == before
        state = after
    # One deployment per model, however the events interleave.
    models = [d.model_card.model_id for d in state.deployments.values()]
    assert len(models) == len(set(models))
    # A keeper record holds each instance once.
    for d in state.deployments.values():
        assert len(d.placed_instance_ids) == len(set(d.placed_instance_ids))
    # Edges only ever join nodes the topology holds.
    for source, sinks in state.topology.connections.items():
        assert source in state.topology.nodes and sinks
        assert all(sink in state.topology.nodes and edges for sink, edges in sinks.items())
