"""The keeper's rules (docs/design.md §5), one test per rule, each named after it.

Every state is built through the events a cluster applies and the keeper is stepped at chosen
times (``keeper_harness.Cluster``); what it returns is applied, as the master does. Rules that do
not depend on where an instance lands use a stand-in placement that the test controls; the rules
about which nodes are chosen use the real ``place_instance``.
"""

from __future__ import annotations

import json

import pytest
from keeper_harness import (
    AFTER_GRACE,
    Cluster,
    RecordingPlace,
    build_instance,
    card,
    link_events,
    node_info,
    simple_place,
    socket_edge,
    unplaceable,
    unplaceable_for,
)

from keeper.core.keeper import (
    MAX_PLACEMENT_ATTEMPTS_PER_STEP,
    Keeper,
    deployment_status,
    ready_replicas,
)
from keeper.core.placement import place_instance
from keeper.core.view import without_nodes
from keeper.model.constants import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    PLACEMENT_TIMEOUT,
    STARTUP_GRACE,
    UNPLACEABLE_RETRY,
)
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentScaled,
    InstanceCreated,
    InstanceDeleted,
    InstanceFoundBroken,
    NodeGatheredInfo,
    TopologyEdgeCreated,
)
from keeper.model.state import (
    MAX_REPLICAS,
    AnyInstance,
    Backend,
    Connection,
    Deployment,
    InstanceMeta,
    ModelCard,
    NodeIdentity,
    RDMAConnection,
    Sharding,
    State,
)

T = AFTER_GRACE  # the first moment the keeper may place
NO_MEMORY = "No cycles found with sufficient memory"


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def placed_ids(events: list[AnyEvent]) -> list[str]:
    return [e.deployment_id for e in events if isinstance(e, DeploymentPlaced)]


def failures_of(events: list[AnyEvent]) -> list[tuple[str, str]]:
    return [(e.deployment_id, e.error) for e in events if isinstance(e, DeploymentPlacementFailed)]


def one_node_cluster(place: RecordingPlace | None = None) -> tuple[Cluster, RecordingPlace]:
    recorder = place or RecordingPlace()
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-a")
    return cluster, recorder


def placement_in_flight() -> tuple[Cluster, str, list[AnyEvent], InstanceCreated]:
    """A one-node cluster whose keeper placed ``m`` at ``T``, none of that step's events applied
    yet: (the cluster, the deployment id, the step's events, its InstanceCreated)."""
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    in_flight = cluster.step_keep(T)
    created = in_flight[0]
    assert isinstance(created, InstanceCreated)
    return cluster, deployment_id, in_flight, created


def refused_at_t(*node_ids: str) -> tuple[Cluster, RecordingPlace]:
    """A cluster of ``node_ids`` whose deployment of ``m`` placement refused at ``T``."""
    recorder = RecordingPlace(inner=unplaceable())
    cluster = Cluster(place=recorder)
    cluster.add_nodes(*node_ids)
    cluster.deploy("m")
    cluster.step(T)
    return cluster, recorder


def placed_by_the_keeper() -> tuple[Cluster, str, str]:
    """A one-node cluster whose deployment of ``m`` the keeper placed at ``T``:
    (the cluster, the deployment id, the instance id)."""
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    return cluster, deployment_id, cluster.instance_of(deployment_id).instance_id


def place_by_hand(cluster: Cluster, model: ModelCard) -> None:
    """An instance of ``model`` on node-a, ``manual``, that the keeper did not place."""
    cluster.apply(InstanceCreated(instance=build_instance(model, ["node-a"], instance_id="manual")))


def deploy_beside_one_by_hand(cluster: Cluster, replicas: int = 1) -> str:
    """Place ``m`` by hand on node-a, then deploy it at ``replicas``: the deployment id."""
    model = card("m")
    place_by_hand(cluster, model)
    return cluster.deploy(model, replicas=replicas)


def too_big_for_node_a() -> tuple[Cluster, RecordingPlace, str]:
    """The real placement, node-a with 1 GB free and a deployment of a 4 GB model that cannot
    fit: (the cluster, the recording placement, the deployment id)."""
    recorder = RecordingPlace(inner=place_instance)
    cluster = Cluster(place=recorder)
    cluster.add_node("node-a", available_gb=1.0)
    return cluster, recorder, cluster.deploy(card("m", size_gb=4.0))


# --- startup -------------------------------------------------------------------------------


def test_nothing_is_placed_during_the_startup_grace() -> None:
    cluster, place = one_node_cluster()
    deployment_id = cluster.deploy("m")
    for now in (0.0, 5.0, STARTUP_GRACE - 0.001):
        assert cluster.step(now) == []
    assert place.calls == []
    assert placed_ids(cluster.step(STARTUP_GRACE)) == [deployment_id]


@pytest.mark.parametrize(
    ("options", "grace"),
    [({}, STARTUP_GRACE), ({"startup_grace": 2.0}, 2.0), ({"startup_grace": 0.0}, 0.0)],
    ids=["the default", "a configured one", "zero: from the start"],
)
def test_grace_counts_from_the_keepers_own_start(options: dict[str, float], grace: float) -> None:
    cluster = Cluster(place=simple_place, started_at=100.0, **options)
    cluster.add_nodes("node-a")
    cluster.deploy("m")
    assert cluster.step(100.0 + grace - 0.001) == []
    assert kinds(cluster.step(100.0 + grace)) == ["InstanceCreated", "DeploymentPlaced"]


def test_the_pinned_constructor_keeps_the_default_grace() -> None:
    positional = Keeper(100.0, simple_place)
    assert (positional.started_at, positional.startup_grace) == (100.0, STARTUP_GRACE)
    named = Keeper(100.0, place=simple_place, startup_grace=2.5)
    assert (named.started_at, named.startup_grace) == (100.0, 2.5)


def test_nothing_happens_without_deployments() -> None:
    cluster, place = one_node_cluster()
    for now in (T, T + 1, T + 100):
        assert cluster.step(now) == []
    assert place.calls == []


# --- placing -------------------------------------------------------------------------------


def test_a_placement_emits_instance_created_then_deployment_placed() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    events = cluster.step(T)
    assert kinds(events) == ["InstanceCreated", "DeploymentPlaced"]
    created, assigned = events
    assert isinstance(created, InstanceCreated) and isinstance(assigned, DeploymentPlaced)
    assert assigned.instance_id == created.instance.instance_id
    assert created.instance.shard_assignments.model_id == "m"
    assert cluster.deployment(deployment_id).instance_id == created.instance.instance_id


def test_placement_options_are_passed_through() -> None:
    recorder = RecordingPlace(inner=place_instance)
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-a", "node-b", available_gb=8.0)
    deployment_id = cluster.deploy(
        card("m", size_gb=4.0, n_layers=16, hidden_size=2048),
        sharding=Sharding.TENSOR,
        instance_meta=InstanceMeta.MLX_RING,
        min_nodes=2,
    )
    cluster.step(T)
    assert recorder.calls == [("m", "Tensor", "MlxRing", 2)]
    instance = cluster.instance_of(deployment_id)
    assert set(instance.shard_assignments.node_to_runner) == {"node-a", "node-b"}


def test_one_placement_per_step_in_id_order() -> None:
    cluster, _ = one_node_cluster()
    for model in ("m3", "m1", "m2"):
        cluster.deploy(model, deployment_id=f"dep-{model}")
    assert placed_ids(cluster.step(T)) == ["dep-m1"]
    assert placed_ids(cluster.step(T + 1)) == ["dep-m2"]
    assert placed_ids(cluster.step(T + 2)) == ["dep-m3"]
    assert cluster.step(T + 3) == []


def test_each_placement_sees_the_previous_one_in_the_state() -> None:
    cluster, place = one_node_cluster()
    cluster.deploy("m1")
    cluster.deploy("m2")
    cluster.step(T)
    cluster.step(T + 1)
    assert place.instances_seen == [0, 1]


def test_an_existing_instance_of_the_model_is_never_touched_and_nothing_is_added() -> None:
    cluster, place = one_node_cluster()
    model = card("m")
    # Someone placed it by hand; its runner keeps failing. That is not the keeper's business.
    manual = build_instance(model, ["node-a"], instance_id="manual")
    cluster.apply(InstanceCreated(instance=manual))
    cluster.fail_runner("manual")
    cluster.deploy(model)
    said: list[AnyEvent] = []
    for now in range(int(T), int(T) + 200, 7):
        said += cluster.step(float(now))
    # Only said: one record of it broken, for the repair backoff (docs/design.md §5.19).
    assert [type(e) for e in said] == [InstanceFoundBroken]
    assert place.calls == []
    assert "manual" in cluster.state.instances


# --- waiting for its own placement ---------------------------------------------------------


def test_an_in_flight_placement_is_not_repeated_before_the_timeout() -> None:
    cluster, place = one_node_cluster()
    deployment_id = cluster.deploy("m")
    first = cluster.step_keep(T)  # emitted, but the state has not caught up
    assert placed_ids(first) == [deployment_id]
    for now in (T + 1, T + 10, T + PLACEMENT_TIMEOUT - 0.001):
        assert cluster.step_keep(now) == []
    assert len(place.calls) == 1


def test_an_in_flight_placement_that_never_arrives_is_forgotten_without_a_failure() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step_keep(T)
    again = cluster.step(T + PLACEMENT_TIMEOUT)
    assert placed_ids(again) == [deployment_id]
    assert cluster.keeper.timers(cluster.state, T + PLACEMENT_TIMEOUT)[deployment_id].failures == 0


def test_an_in_flight_placement_arriving_late_is_watched() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    late = cluster.step_keep(T)
    cluster.step_keep(T + 5)
    cluster.apply(*late)  # arrives before the timeout
    assert cluster.step(T + 6) == []
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    cluster.step(T + 7)  # lost before ready: a failure, so a backoff
    timer = cluster.keeper.timers(cluster.state, T + 7)[deployment_id]
    assert (timer.failures, timer.waiting) == (1, "backoff")


def test_a_placement_that_arrives_and_is_gone_before_the_next_step_counts_as_lost() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    assert cluster.step(T + 1) == []
    timer = cluster.keeper.timers(cluster.state, T + 1)[deployment_id]
    assert (timer.failures, timer.waiting, timer.next_attempt_at) == (
        1,
        "backoff",
        T + 1 + FIRST_BACKOFF,
    )


def test_an_instance_lost_between_two_steps_is_placed_again() -> None:
    cluster, deployment_id, first = placed_by_the_keeper()
    cluster.make_ready(first)
    assert cluster.step(T + 1) == []  # serving
    cluster.delete_instance(first)
    again = cluster.step(T + 2)
    assert placed_ids(again) == [deployment_id]
    assert cluster.instance_of(deployment_id).instance_id != first


def test_after_a_node_dies_the_model_is_placed_again_away_from_it() -> None:
    cluster = Cluster(place=place_instance)
    cluster.add_node("node-a", available_gb=32.0)
    cluster.add_node("node-b", available_gb=16.0)
    cluster.add_node("node-c", available_gb=16.0)
    for a, b in (("node-a", "node-b"), ("node-b", "node-c"), ("node-a", "node-c")):
        cluster.link(a, b)
    deployment_id = cluster.deploy(card("m", size_gb=4.0))
    cluster.step(T)
    instance = cluster.instance_of(deployment_id)
    (dead,) = instance.shard_assignments.node_to_runner
    assert dead == "node-a"  # the freest node
    cluster.make_ready(instance.instance_id)
    cluster.step(T + 1)
    cluster.kill_node(dead)
    assert placed_ids(cluster.step(T + 2)) == [deployment_id]
    replacement = cluster.instance_of(deployment_id)
    assert replacement.instance_id != instance.instance_id
    assert dead not in replacement.shard_assignments.node_to_runner


# --- backoff -------------------------------------------------------------------------------


def _lose_before_ready(cluster: Cluster, deployment_id: str, now: float) -> None:
    """The deployment's instance dies before its runners are ready; the keeper sees it at now."""
    instance_id = cluster.instance_of(deployment_id).instance_id
    cluster.make_loading(instance_id)
    assert cluster.step(now) == []  # arrived, loading
    cluster.delete_instance(instance_id)
    assert cluster.step(now + 0.5) == []  # lost: the backoff starts now + 0.5


def test_backoff_after_losses_before_ready_is_10_20_40_60_60() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    now = T
    waits: list[float] = []
    for _ in range(6):
        _lose_before_ready(cluster, deployment_id, now + 1)
        lost_at = now + 1.5
        timer = cluster.keeper.timers(cluster.state, lost_at)[deployment_id]
        assert timer.waiting == "backoff"
        assert timer.next_attempt_at is not None
        wait = timer.next_attempt_at - lost_at
        assert cluster.step(lost_at + wait - 0.001) == []
        assert placed_ids(cluster.step(lost_at + wait)) == [deployment_id]
        waits.append(wait)
        now = lost_at + wait
    assert waits == [10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert waits[0] == FIRST_BACKOFF and max(waits) == MAX_BACKOFF


def test_backoff_resets_after_an_instance_that_became_ready_is_lost() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    _lose_before_ready(cluster, deployment_id, T + 1)  # failure 1: 10 s
    cluster.step(T + 11.5)
    _lose_before_ready(cluster, deployment_id, T + 12)  # failure 2: 20 s
    cluster.step(T + 32.5)
    ready = cluster.instance_of(deployment_id).instance_id
    cluster.make_ready(ready)
    assert cluster.step(T + 33) == []
    assert cluster.keeper.timers(cluster.state, T + 33)[deployment_id].failures == 0
    cluster.delete_instance(ready)
    assert placed_ids(cluster.step(T + 34)) == [deployment_id]  # at once
    _lose_before_ready(cluster, deployment_id, T + 35)
    timer = cluster.keeper.timers(cluster.state, T + 35.5)[deployment_id]
    assert (timer.failures, timer.next_attempt_at) == (1, T + 35.5 + FIRST_BACKOFF)


def test_an_instance_that_was_ready_once_counts_as_ready_when_lost_after_its_runners_failed() -> (
    None
):
    cluster, deployment_id, instance_id = placed_by_the_keeper()
    cluster.make_ready(instance_id)
    cluster.step(T + 1)
    cluster.fail_runner(instance_id)  # it served, then broke: the node gives up on it
    cluster.step(T + 2)
    cluster.step(T + 3)
    cluster.delete_instance(instance_id)
    assert placed_ids(cluster.step(T + 4)) == [deployment_id]


def test_an_instance_placed_some_other_way_that_vanishes_means_place_now() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = deploy_beside_one_by_hand(cluster)
    assert cluster.step(T) == []
    cluster.delete_instance("manual")  # never ready, but not the keeper's
    assert placed_ids(cluster.step(T + 1)) == [deployment_id]
    assert cluster.keeper.timers(cluster.state, T + 1)[deployment_id].failures == 0


def test_a_failed_runner_is_not_ready() -> None:
    cluster, deployment_id, instance_id = placed_by_the_keeper()
    cluster.fail_runner(instance_id)
    cluster.step(T + 1)
    cluster.delete_instance(instance_id)
    assert cluster.step(T + 2) == []
    assert cluster.keeper.timers(cluster.state, T + 2)[deployment_id].waiting == "backoff"


# --- a new master --------------------------------------------------------------------------


def _restarted(cluster: Cluster, started_at: float) -> Cluster:
    """The same state under a fresh keeper, as after a master restart."""
    fresh = Cluster(place=cluster.keeper._place, started_at=started_at)  # pyright: ignore[reportPrivateUsage]
    fresh.state = cluster.state
    return fresh


def test_a_new_master_adopts_the_instance_the_deployment_names() -> None:
    cluster, deployment_id, named = placed_by_the_keeper()
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE) == []  # it exists: nothing to place
    restarted.delete_instance(named)  # lost before ready: the keeper's own, so a failure
    assert restarted.step(1000.0 + STARTUP_GRACE + 1) == []
    assert restarted.keeper.timers(restarted.state, 1016.0)[deployment_id].failures == 1


def test_a_new_master_places_at_once_after_an_adopted_ready_instance_is_lost() -> None:
    cluster, deployment_id, named = placed_by_the_keeper()
    cluster.make_ready(named)
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE) == []
    restarted.delete_instance(named)
    assert placed_ids(restarted.step(1016.0)) == [deployment_id]


def test_a_new_master_places_at_once_when_the_named_instance_is_already_gone() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE - 0.001) == []
    assert placed_ids(restarted.step(1000.0 + STARTUP_GRACE)) == [deployment_id]


# --- nothing fits --------------------------------------------------------------------------


def test_an_unplaceable_reason_is_reported_once() -> None:
    recorder = RecordingPlace(inner=unplaceable(NO_MEMORY))
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m")
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]
    assert cluster.deployment(deployment_id).placement_error == NO_MEMORY
    for k in range(1, 5):
        assert cluster.step(T + k * UNPLACEABLE_RETRY) == []
    assert len(recorder.calls) == 5


def test_an_unplaceable_reason_sent_but_not_yet_applied_is_not_sent_again() -> None:
    recorder = RecordingPlace(inner=unplaceable(NO_MEMORY))
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m")
    first = cluster.step_keep(T)
    cluster.add_node("node-b")  # a change: retried at once, while the first report is on its way
    assert cluster.step_keep(T + 1) == []
    assert len(recorder.calls) == 2
    cluster.apply(*first)
    assert cluster.deployment(deployment_id).placement_error == NO_MEMORY


def test_changing_unplaceable_reasons_are_each_reported() -> None:
    cluster = Cluster(place=unplaceable_for("reason X", "reason Y", "reason Y", "reason X"))
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    reported = [failures_of(cluster.step(T + k * UNPLACEABLE_RETRY)) for k in range(4)]
    assert reported == [
        [(deployment_id, "reason X")],
        [(deployment_id, "reason Y")],
        [],
        [(deployment_id, "reason X")],
    ]
    assert cluster.deployment(deployment_id).placement_error == "reason X"


def test_a_reason_the_state_still_holds_from_before_a_newer_report_is_reported_again() -> None:
    cluster = Cluster(place=unplaceable_for("reason X", "reason Y", "reason X"))
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    cluster.step(T)  # X applied
    y = cluster.step_keep(T + UNPLACEABLE_RETRY)  # Y sent, not applied yet
    assert failures_of(y) == [(deployment_id, "reason Y")]
    x_again = cluster.step_keep(T + 2 * UNPLACEABLE_RETRY)
    # The state still says X, but once Y lands it would say Y: X must be sent again.
    assert failures_of(x_again) == [(deployment_id, "reason X")]
    cluster.apply(*y, *x_again)
    assert cluster.deployment(deployment_id).placement_error == "reason X"


def test_a_new_master_does_not_repeat_the_reason_on_the_deployment() -> None:
    cluster = Cluster(place=unplaceable(NO_MEMORY))
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE) == []


def test_a_reason_cleared_by_a_placement_is_reported_again_when_it_recurs() -> None:
    recorder = RecordingPlace()
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m")
    recorder.failing["m"] = ValueError(NO_MEMORY)
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]
    del recorder.failing["m"]
    placed = cluster.step(T + UNPLACEABLE_RETRY)
    assert placed_ids(placed) == [deployment_id]
    assert cluster.deployment(deployment_id).placement_error is None
    instance_id = cluster.instance_of(deployment_id).instance_id
    cluster.make_ready(instance_id)
    cluster.step(T + 31)
    recorder.failing["m"] = ValueError(NO_MEMORY)
    cluster.delete_instance(instance_id)
    assert failures_of(cluster.step(T + 32)) == [(deployment_id, NO_MEMORY)]


def test_memory_freeing_up_is_seen_on_the_retry_but_not_before() -> None:
    cluster, recorder, deployment_id = too_big_for_node_a()
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]
    cluster.add_node("node-a", available_gb=12.0)  # a memory figure: not a change of cluster
    for now in (T + 1, T + 10, T + UNPLACEABLE_RETRY - 0.001):
        assert cluster.step(now) == []
    assert len(recorder.calls) == 1
    assert placed_ids(cluster.step(T + UNPLACEABLE_RETRY)) == [deployment_id]
    assert cluster.deployment(deployment_id).placement_error is None


def test_a_node_joining_at_once_is_a_reason_to_try_again() -> None:
    cluster, _, deployment_id = too_big_for_node_a()
    cluster.step(T)
    assert cluster.step(T + 1) == []
    cluster.add_node("node-b", available_gb=12.0)
    cluster.link("node-a", "node-b")
    events = cluster.step(T + 2)
    assert placed_ids(events) == [deployment_id]
    assert list(cluster.instance_of(deployment_id).shard_assignments.node_to_runner) == ["node-b"]


def test_a_node_joining_in_pieces_is_retried_at_each_piece() -> None:
    recorder = RecordingPlace(inner=place_instance)
    cluster = Cluster(place=recorder)
    cluster.add_node("node-a", available_gb=3.0)
    # Needs both nodes: 4 GB over two nodes of 3 GB each, linked both ways.
    deployment_id = cluster.deploy(card("m", size_gb=4.0), min_nodes=2)
    cluster.step(T)
    pieces: list[list[AnyEvent]] = [
        [node_info("node-b", available_gb=None, backends=None)],  # shows up
        [node_info("node-b", available_gb=3.0, backends=None)],  # reports memory
        [node_info("node-b", available_gb=3.0)],  # reports backends
        [TopologyEdgeCreated(conn=socket_edge("node-a", "node-b"))],  # one link
        [TopologyEdgeCreated(conn=socket_edge("node-b", "node-a"))],  # the link back
    ]
    now = T
    events: list[AnyEvent] = []
    for piece in pieces:
        tried = len(recorder.calls)
        now += 1
        assert cluster.step(now) == []
        assert len(recorder.calls) == tried  # no change: no attempt
        cluster.apply(*piece)
        now += 1
        events = cluster.step(now)
        assert len(recorder.calls) == tried + 1, f"no attempt after {piece}"
    assert placed_ids(events) == [deployment_id]
    assert set(cluster.instance_of(deployment_id).shard_assignments.node_to_runner) == {
        "node-a",
        "node-b",
    }


def test_a_change_of_backends_is_a_reason_to_try_again() -> None:
    recorder = RecordingPlace(inner=unplaceable())
    cluster = Cluster(place=recorder)
    cluster.add_node("node-a", backends=[Backend.MLX_CPU])
    cluster.deploy("m")
    cluster.step(T)
    cluster.add_node("node-a", backends=[Backend.MLX_METAL])
    cluster.step(T + 1)
    assert len(recorder.calls) == 2


def test_a_link_going_away_is_a_reason_to_try_again() -> None:
    cluster, recorder = refused_at_t("node-a", "node-b")
    cluster.step(T + 1)
    assert len(recorder.calls) == 1
    cluster.apply(*link_events("node-a", "node-b")[:1])  # already there: no change
    cluster.step(T + 2)
    assert len(recorder.calls) == 1
    cluster.kill_node("node-b")
    cluster.step(T + 3)
    assert len(recorder.calls) == 2


def test_an_unplaceable_deployment_does_not_hold_up_the_others() -> None:
    cluster = Cluster(place=place_instance)
    cluster.add_nodes("node-a", available_gb=8.0)
    huge = cluster.deploy(card("huge", size_gb=400.0), deployment_id="dep-1")
    small = cluster.deploy(card("small", size_gb=1.0), deployment_id="dep-2")
    events = cluster.step(T)
    assert failures_of(events) == [(huge, NO_MEMORY)]
    assert placed_ids(events) == [small]


def test_a_crashing_placement_records_type_and_message_and_the_others_proceed() -> None:
    recorder = RecordingPlace()
    recorder.failing["crashy"] = RuntimeError("boom")
    cluster, _ = one_node_cluster(recorder)
    crashy = cluster.deploy("crashy", deployment_id="dep-1")
    fine = cluster.deploy("fine", deployment_id="dep-2")
    events = cluster.step(T)
    assert failures_of(events) == [(crashy, "RuntimeError: boom")]
    assert placed_ids(events) == [fine]
    assert cluster.deployment(crashy).placement_error == "RuntimeError: boom"
    assert cluster.step(T + UNPLACEABLE_RETRY - 0.001) == []
    del recorder.failing["crashy"]
    assert placed_ids(cluster.step(T + UNPLACEABLE_RETRY)) == [crashy]


def test_a_crash_is_kept_with_its_traceback_until_an_attempt_does_not_crash() -> None:
    recorder = RecordingPlace()
    first, second = RuntimeError("boom"), KeyError("node-x")
    recorder.failing["crashy"] = first
    cluster, _ = one_node_cluster(recorder)
    crashy = cluster.deploy("crashy", deployment_id="dep-1")
    cluster.deploy("fine", deployment_id="dep-2")
    assert cluster.keeper.placement_crashes() == {}
    cluster.step(T)
    crashes = cluster.keeper.placement_crashes()
    assert crashes == {crashy: first}
    assert crashes[crashy].__traceback__ is not None  # what the host logs
    # A reason (ValueError) is not a crash: the kept one goes.
    recorder.failing["crashy"] = ValueError("No cycles found with sufficient memory")
    cluster.step(T + UNPLACEABLE_RETRY)
    assert cluster.keeper.placement_crashes() == {}
    recorder.failing["crashy"] = second
    cluster.step(T + 2 * UNPLACEABLE_RETRY)
    assert cluster.keeper.placement_crashes() == {crashy: second}
    # A placement that works clears it too.
    del recorder.failing["crashy"]
    assert placed_ids(cluster.step(T + 3 * UNPLACEABLE_RETRY)) == [crashy]
    assert cluster.keeper.placement_crashes() == {}


def test_a_deleted_deployments_crash_is_forgotten() -> None:
    recorder = RecordingPlace()
    recorder.failing["crashy"] = RuntimeError("boom")
    cluster, _ = one_node_cluster(recorder)
    crashy = cluster.deploy("crashy", deployment_id="dep-1")
    cluster.deploy("fine", deployment_id="dep-2")
    cluster.step(T)
    assert list(cluster.keeper.placement_crashes()) == [crashy]
    cluster.delete(crashy)
    cluster.step(T + 1)
    assert cluster.keeper.placement_crashes() == {}


# --- deletion ------------------------------------------------------------------------------


def test_delete_removes_the_deployment_and_the_keepers_instance() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.deploy("other")
    cluster.step(T)
    cluster.step(T + 1)
    own = cluster.instance_of(deployment_id).instance_id
    events = cluster.delete(deployment_id)
    assert events == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=own),
    ]
    assert deployment_id not in cluster.state.deployments
    assert [i.shard_assignments.model_id for i in cluster.state.instances.values()] == ["other"]


def test_delete_leaves_an_instance_placed_some_other_way_running() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = deploy_beside_one_by_hand(cluster)
    cluster.step(T)
    assert cluster.delete(deployment_id) == [DeploymentDeleted(deployment_id=deployment_id)]
    assert "manual" in cluster.state.instances


def test_delete_after_the_keepers_instance_is_gone_deletes_no_instance() -> None:
    cluster, deployment_id, instance_id = placed_by_the_keeper()
    cluster.make_ready(instance_id)
    cluster.step(T + 1)
    cluster.delete_instance(instance_id)
    # Someone places the model by hand before the keeper's next step: it is not the keeper's.
    place_by_hand(cluster, card("m"))
    assert cluster.delete(deployment_id) == [DeploymentDeleted(deployment_id=deployment_id)]
    assert "manual" in cluster.state.instances


def test_delete_of_a_placement_arrived_and_gone_before_the_next_step_deletes_no_instance() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    assert cluster.delete(deployment_id) == [DeploymentDeleted(deployment_id=deployment_id)]


def test_delete_while_the_placement_is_in_flight_deletes_it_after_it_lands() -> None:
    cluster, deployment_id, in_flight, created = placement_in_flight()
    deletion = cluster.keeper.delete(deployment_id, cluster.state)
    assert deletion == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=created.instance.instance_id),
    ]
    cluster.apply(*in_flight, *deletion)  # the cluster applies them in the order emitted
    assert cluster.state.instances == {} and cluster.state.deployments == {}


def test_delete_after_the_placement_landed_but_before_the_keeper_saw_it() -> None:
    cluster, deployment_id, _, created = placement_in_flight()
    cluster.apply(created)  # InstanceCreated applied, DeploymentPlaced not yet
    assert cluster.keeper.delete(deployment_id, cluster.state) == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=created.instance.instance_id),
    ]


def test_delete_twice_is_harmless() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    first = cluster.keeper.delete(deployment_id, cluster.state)
    assert len(first) == 2
    assert cluster.keeper.delete(deployment_id, cluster.state) == []  # not applied yet
    cluster.apply(*first)
    assert cluster.keeper.delete(deployment_id, cluster.state) == []  # applied


def test_delete_of_an_unknown_deployment_does_nothing() -> None:
    cluster, _ = one_node_cluster()
    cluster.deploy("m")
    cluster.step(T)
    assert cluster.delete("no-such-deployment") == []


def test_delete_during_the_grace_deletes_the_instance_the_deployment_names() -> None:
    cluster, deployment_id, named = placed_by_the_keeper()
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.delete(deployment_id) == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=named),
    ]


def test_nothing_is_placed_for_a_deployment_being_deleted() -> None:
    recorder = RecordingPlace()
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m")
    deletion = cluster.keeper.delete(deployment_id, cluster.state)
    assert deletion == [DeploymentDeleted(deployment_id=deployment_id)]
    # The deletion is on its way: the state still holds the deployment.
    for now in (T, T + 1, T + 100):
        assert cluster.step(now) == []
    assert recorder.calls == []
    assert cluster.keeper.timers(cluster.state, T + 100)[deployment_id].waiting is None


def test_the_deleting_mark_is_forgotten_once_the_state_drops_the_deployment() -> None:
    cluster, _ = one_node_cluster()
    model = card("m")
    deployment = Deployment(deployment_id="dep-x", model_card=model)
    cluster.apply(DeploymentCreated(deployment=deployment))
    cluster.delete("dep-x")
    cluster.step(T)
    cluster.apply(DeploymentCreated(deployment=deployment))  # the same id again
    assert placed_ids(cluster.step(T + 1)) == ["dep-x"]


# --- memory and cost -----------------------------------------------------------------------


def _remembered(keeper: Keeper) -> int:
    return len(keeper._memos) + len(keeper._deleting)  # pyright: ignore[reportPrivateUsage]


def test_memory_does_not_grow_with_deployments_that_come_and_go() -> None:
    cluster, _ = one_node_cluster()
    now = T
    for cycle in range(2000):
        deployment_id = cluster.deploy(f"m{cycle % 3}", deployment_id=f"dep-{cycle:05d}")
        cluster.step(now)
        cluster.delete(deployment_id)
        now += 1
        cluster.step(now)
        assert _remembered(cluster.keeper) <= 1
    assert cluster.state.deployments == {} and cluster.state.instances == {}
    assert _remembered(cluster.keeper) == 0


def test_memory_left_by_commands_during_the_grace_is_forgotten_at_the_next_step() -> None:
    cluster, _ = one_node_cluster()
    deployment_id = cluster.deploy("m")
    cluster.scale(deployment_id, 2)
    cluster.delete(deployment_id)
    assert _remembered(cluster.keeper) == 2
    assert cluster.step(T - 1) == []  # still in the grace
    assert _remembered(cluster.keeper) == 0


def test_memory_does_not_grow_with_time() -> None:
    cluster, _ = one_node_cluster(RecordingPlace(inner=unplaceable()))
    cluster.deploy("m")
    for second in range(3000):
        cluster.step(T + second)
    assert _remembered(cluster.keeper) == 1


def test_attempts_per_step_are_capped_and_every_deployment_gets_its_turn() -> None:
    recorder = RecordingPlace(inner=unplaceable())
    cluster, _ = one_node_cluster(recorder)
    count = 2 * MAX_PLACEMENT_ATTEMPTS_PER_STEP + 4
    ids = [cluster.deploy(f"m{i:02d}", deployment_id=f"dep-{i:02d}") for i in range(count)]
    per_step: list[int] = []
    for k in range(4):
        before = len(recorder.calls)
        cluster.step(T + k)
        per_step.append(len(recorder.calls) - before)
    assert per_step == [MAX_PLACEMENT_ATTEMPTS_PER_STEP, MAX_PLACEMENT_ATTEMPTS_PER_STEP, 4, 0]
    assert sorted(recorder.models_tried()) == [f"m{i:02d}" for i in range(count)]
    assert set(cluster.state.deployments) == set(ids)
    assert all(d.placement_error is not None for d in cluster.state.deployments.values())


def test_no_deployment_starves_while_the_cluster_keeps_changing() -> None:
    recorder = RecordingPlace(inner=unplaceable())
    cluster, _ = one_node_cluster(recorder)
    count = 3 * MAX_PLACEMENT_ATTEMPTS_PER_STEP
    for i in range(count):
        cluster.deploy(f"m{i:02d}", deployment_id=f"dep-{i:02d}")
    for k in range(3):
        cluster.add_node(f"flapping-{k}")  # every step sees a new cluster: all are due
        cluster.step(T + k)
    assert len(recorder.calls) == count
    assert sorted(recorder.models_tried()) == [f"m{i:02d}" for i in range(count)]


def test_a_placement_after_the_cap_waits_for_its_turn_not_for_the_retry() -> None:
    recorder = RecordingPlace()
    cluster, _ = one_node_cluster(recorder)
    for i in range(MAX_PLACEMENT_ATTEMPTS_PER_STEP):
        recorder.failing[f"bad{i}"] = ValueError(NO_MEMORY)
        cluster.deploy(f"bad{i}", deployment_id=f"dep-a{i}")
    good = cluster.deploy("good", deployment_id="dep-z")
    assert placed_ids(cluster.step(T)) == []
    assert placed_ids(cluster.step(T + 1)) == [good]


def test_a_deployment_being_deleted_does_not_hold_up_the_ones_after_it() -> None:
    cluster, _ = one_node_cluster()
    first = cluster.deploy("m1", deployment_id="dep-1")
    second = cluster.deploy("m2", deployment_id="dep-2")
    cluster.keeper.delete(first, cluster.state)  # on its way
    assert placed_ids(cluster.step(T)) == [second]


def test_a_failure_already_reported_does_not_end_the_step() -> None:
    recorder = RecordingPlace()
    recorder.failing["bad"] = ValueError(NO_MEMORY)
    cluster, _ = one_node_cluster(recorder)
    bad = cluster.deploy("bad", deployment_id="dep-1")
    cluster.step(T)
    assert cluster.deployment(bad).placement_error == NO_MEMORY
    good = cluster.deploy("good", deployment_id="dep-2")
    cluster.add_node("node-b")  # a change: "bad" is due again and fails the same way, silently
    events = cluster.step(T + 1)
    assert recorder.models_tried() == ["bad", "bad", "good"]
    assert placed_ids(events) == [good] and failures_of(events) == []


def test_attempts_rotate_evenly_while_the_cluster_keeps_changing() -> None:
    recorder = RecordingPlace(inner=unplaceable())
    cluster, _ = one_node_cluster(recorder)
    count = MAX_PLACEMENT_ATTEMPTS_PER_STEP + 1
    for i in range(count):
        cluster.deploy(f"m{i:02d}", deployment_id=f"dep-{i:02d}")
    for k in range(5):
        cluster.add_node(f"flapping-{k}")
        cluster.step(T + k)
    tries = [recorder.models_tried().count(f"m{i:02d}") for i in range(count)]
    assert max(tries) - min(tries) <= 1, tries


def test_an_old_unplaceable_verdict_does_not_delay_placing_after_a_loss() -> None:
    cluster, _, deployment_id = too_big_for_node_a()
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]
    cluster.add_node("node-b", available_gb=12.0)
    cluster.link("node-a", "node-b")
    assert placed_ids(cluster.step(T + 1)) == [deployment_id]
    cluster.add_node("node-a", available_gb=12.0)  # node-a frees memory meanwhile
    cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    cluster.step(T + 2)
    cluster.kill_node("node-b")  # the cluster is node-a alone again, as when it failed
    assert placed_ids(cluster.step(T + 3)) == [deployment_id]
    assert list(cluster.instance_of(deployment_id).shard_assignments.node_to_runner) == ["node-a"]


def test_an_error_cleared_by_a_placement_on_its_way_is_reported_again_when_it_recurs() -> None:
    recorder = RecordingPlace()
    recorder.failing["m"] = ValueError(NO_MEMORY)
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m")
    cluster.step(T)  # the error is in the state
    del recorder.failing["m"]
    cluster.add_node("node-b")
    slow = cluster.step_keep(T + 1)  # placed, but its events are slow to arrive
    assert placed_ids(slow) == [deployment_id]
    recorder.failing["m"] = ValueError(NO_MEMORY)
    again = cluster.step_keep(T + 1 + PLACEMENT_TIMEOUT)
    assert failures_of(again) == [(deployment_id, NO_MEMORY)]
    cluster.apply(*slow, *again)
    assert cluster.deployment(deployment_id).placement_error == NO_MEMORY


def test_delete_after_the_keeper_saw_its_placement_land_before_the_deployment_named_it() -> None:
    cluster, deployment_id, _, created = placement_in_flight()
    cluster.apply(created)  # InstanceCreated applied, DeploymentPlaced not yet
    assert cluster.step(T + 1) == []  # the keeper sees it arrive
    assert cluster.keeper.delete(deployment_id, cluster.state) == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=created.instance.instance_id),
    ]


def test_delete_with_a_state_that_no_longer_shows_the_deployment_still_deletes_its_placement() -> (
    None
):
    cluster, deployment_id, _, created = placement_in_flight()
    assert cluster.keeper.delete(deployment_id, State()) == [
        DeploymentDeleted(deployment_id=deployment_id),
        InstanceDeleted(instance_id=created.instance.instance_id),
    ]


def test_an_rdma_link_beside_a_socket_link_is_a_reason_to_try_again() -> None:
    cluster, recorder = refused_at_t("node-a", "node-b")
    rdma = RDMAConnection(source_rdma_iface="rdma_en2", sink_rdma_iface="rdma_en3")
    for now, sink_iface in ((T + 1, "rdma_en3"), (T + 2, "rdma_en4")):
        edge = Connection(
            source="node-a",
            sink="node-b",
            edge=rdma.model_copy(update={"sink_rdma_iface": sink_iface}),
        )
        cluster.apply(TopologyEdgeCreated(conn=edge))
        cluster.step(now)
    assert len(recorder.calls) == 3


def test_links_are_told_apart_by_their_ends() -> None:
    cluster, recorder = refused_at_t("node-a", "node-b", "node-c")
    rdma = RDMAConnection(source_rdma_iface="rdma_en2", sink_rdma_iface="rdma_en3")
    # Same edge, new ends each time: from another source, then to another sink.
    for now, (source, sink) in ((T + 1, ("node-a", "node-b")), (T + 2, ("node-c", "node-b"))):
        cluster.apply(TopologyEdgeCreated(conn=Connection(source=source, sink=sink, edge=rdma)))
        cluster.step(now)
    cluster.apply(TopologyEdgeCreated(conn=Connection(source="node-a", sink="node-c", edge=rdma)))
    cluster.step(T + 3)
    assert len(recorder.calls) == 4


# --- replicas (docs/design.md §5.11) --------------------------------------------------------


def created_ids(events: list[AnyEvent]) -> list[str]:
    return [e.instance.instance_id for e in events if isinstance(e, InstanceCreated)]


def deleted_ids(events: list[AnyEvent]) -> list[str]:
    return [e.instance_id for e in events if isinstance(e, InstanceDeleted)]


def replicated(
    replicas: int, nodes: int = 3, place: RecordingPlace | None = None
) -> tuple[Cluster, RecordingPlace, str, list[str]]:
    """``nodes`` linked nodes and a deployment of ``m`` whose ``replicas`` instances the keeper
    placed one step apart from T: (cluster, placement, deployment id, instance ids oldest
    first)."""
    recorder = place or RecordingPlace()
    cluster = Cluster(place=recorder)
    cluster.add_nodes(*(f"node-{chr(ord('a') + k)}" for k in range(nodes)))
    deployment_id = cluster.deploy("m", replicas=replicas)
    placed: list[str] = []
    for k in range(replicas):
        placed.extend(created_ids(cluster.step(T + k)))
    assert len(placed) == replicas
    return cluster, recorder, deployment_id, placed


def test_replicas_are_added_one_at_a_time_up_to_the_count() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b", "node-c", "node-d")
    deployment_id = cluster.deploy("m", replicas=3)
    first = cluster.step_keep(T)
    assert placed_ids(first) == [deployment_id]
    # The first is on its way: nothing more for this deployment until the state shows it.
    for now in (T + 1, T + 10, T + PLACEMENT_TIMEOUT - 0.001):
        assert cluster.step_keep(now) == []
    timer = cluster.keeper.timers(cluster.state, T + 1)[deployment_id]
    assert timer.waiting == "placement_in_flight"
    cluster.apply(*first)
    assert placed_ids(cluster.step(T + 20)) == [deployment_id]
    assert placed_ids(cluster.step(T + 21)) == [deployment_id]
    assert len(cluster.instances_of_model("m")) == 3
    for now in (T + 22, T + 100):
        assert cluster.step(now) == []
    assert cluster.keeper.timers(cluster.state, T + 100)[deployment_id].waiting is None
    assert cluster.deployment(deployment_id).placed_instance_ids == tuple(
        i.instance_id for i in cluster.instances_of_model("m")
    )


def test_any_instance_of_the_model_counts_towards_the_replicas() -> None:
    cluster, place = one_node_cluster()
    cluster.add_nodes("node-b")
    cluster.link("node-a", "node-b")
    deployment_id = deploy_beside_one_by_hand(cluster, replicas=2)
    assert placed_ids(cluster.step(T)) == [deployment_id]
    for now in (T + 1, T + 50):
        assert cluster.step(now) == []
    assert len(place.calls) == 1
    assert len(cluster.instances_of_model("m")) == 2


def test_a_replica_is_never_placed_on_a_node_serving_the_model() -> None:
    # The real placement prefers the freest node, node-a, every time; only anti-affinity moves
    # the replicas elsewhere.
    cluster = Cluster(place=place_instance)
    cluster.add_node("node-a", available_gb=64.0)
    cluster.add_node("node-b", available_gb=16.0)
    cluster.add_node("node-c", available_gb=8.0)
    deployment_id = cluster.deploy(card("m", size_gb=2.0), replicas=3)
    for k in range(3):
        assert placed_ids(cluster.step(T + k)) == [deployment_id]
    nodes = [cluster.nodes_of(i.instance_id) for i in cluster.instances_of_model("m")]
    assert nodes == [["node-a"], ["node-b"], ["node-c"]]


def test_anti_affinity_hands_placement_a_state_without_the_serving_nodes() -> None:
    seen: list[State] = []

    def place(
        state: State, model: ModelCard, sharding: Sharding, meta: InstanceMeta, min_nodes: int
    ) -> AnyInstance:
        seen.append(state)
        return simple_place(state, model, sharding, meta, min_nodes)

    cluster = Cluster(place=place)
    cluster.add_nodes("node-a", "node-b", "node-c")
    cluster.deploy("m", replicas=2)
    cluster.step(T)
    cluster.step(T + 1)
    first, second = seen
    assert first == cluster.state.model_copy(
        update={"instances": {}, "deployments": first.deployments}
    )
    assert len(first.topology.nodes) == 3
    (used,) = cluster.nodes_of(cluster.instances_of_model("m")[0].instance_id)
    others = sorted({"node-a", "node-b", "node-c"} - {used})
    assert sorted(second.topology.nodes) == others
    for per_node in (
        second.node_memory,
        second.node_backends,
        second.last_seen,
    ):
        assert sorted(per_node) == others
    assert used not in second.topology.connections
    assert all(used not in sinks for sinks in second.topology.connections.values())
    assert sorted(second.topology.connections) == others
    # Nothing else is taken away: the instances stay, and the real state keeps its nodes.
    first_instance = cluster.instances_of_model("m")[0]
    assert second.instances == {first_instance.instance_id: first_instance}
    assert len(cluster.state.topology.nodes) == 3


def test_a_replica_with_no_room_apart_is_refused_by_name_while_the_model_serves() -> None:
    cluster, _ = one_node_cluster()
    cluster.apply(
        NodeGatheredInfo(
            node_id="node-a",
            when="2026-01-01T00:00:00Z",
            identity=NodeIdentity(friendly_name="studio"),
        )
    )
    cluster.add_node("node-b", available_gb=0.5)  # too small for m on its own
    cluster.link("node-a", "node-b")
    deployment_id = cluster.deploy("m", replicas=2)
    assert placed_ids(cluster.step(T)) == [deployment_id]
    cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    reason = f"no placement apart from the nodes serving m (studio): {NO_MEMORY}"
    assert failures_of(cluster.step(T + 1)) == [(deployment_id, reason)]
    deployment = cluster.deployment(deployment_id)
    assert deployment.placement_error == reason
    assert deployment_status(deployment, cluster.state) == "serving"
    assert ready_replicas(deployment, cluster.state) == 1
    # Reported once, retried like any unplaceable deployment.
    assert cluster.step(T + 2) == []
    timer = cluster.keeper.timers(cluster.state, T + 2)[deployment_id]
    assert (timer.waiting, timer.next_attempt_at) == (
        "unplaceable_retry",
        T + 1 + UNPLACEABLE_RETRY,
    )


def test_the_refusal_names_nodes_without_a_friendly_name_by_id() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_node("node-b")
    cluster.add_node("node-a", available_gb=0.5)
    deployment_id = cluster.deploy("m", replicas=2)
    cluster.step(T)
    reason = f"no placement apart from the nodes serving m (node-b): {NO_MEMORY}"
    assert failures_of(cluster.step(T + 1)) == [(deployment_id, reason)]


def test_the_refusal_names_every_serving_node_sorted() -> None:
    cluster = Cluster(place=simple_place)
    for node_id, name in (("node-c", "zeta"), ("node-a", "alpha"), ("node-b", "mid")):
        cluster.add_node(node_id)
        cluster.apply(
            NodeGatheredInfo(
                node_id=node_id,
                when="2026-01-01T00:00:00Z",
                identity=NodeIdentity(friendly_name=name),
            )
        )
    cluster.add_node("node-d", available_gb=0.5)
    deployment_id = cluster.deploy("m", replicas=4)
    for k in range(3):
        assert placed_ids(cluster.step(T + k)) == [deployment_id]
    reason = f"no placement apart from the nodes serving m (alpha, mid, zeta): {NO_MEMORY}"
    assert failures_of(cluster.step(T + 3)) == [(deployment_id, reason)]


def test_the_view_without_nodes_drops_every_entry_of_theirs() -> None:
    state = State.model_validate(
        {
            "topology": {
                "nodes": ["a", "b", "c"],
                "connections": {
                    "a": {"b": [socket_edge("a", "b").edge.model_dump()]},
                    "b": {
                        "a": [socket_edge("b", "a").edge.model_dump()],
                        "c": [socket_edge("b", "c").edge.model_dump()],
                    },
                    "c": {"b": [socket_edge("c", "b").edge.model_dump()]},
                },
            },
            **{
                key: {n: value for n in ("a", "b", "c")}
                for key, value in (
                    ("nodeMemory", {}),
                    ("nodeBackends", ["MlxMetal"]),
                    ("nodeIdentities", {"friendlyName": "x"}),
                    ("nodeNetwork", {}),
                    ("nodeRdmaCtl", {}),
                    ("lastSeen", "2026-01-01T00:00:00Z"),
                    ("downloads", []),
                )
            },
            "instances": {"i": build_instance(card("m"), ["b"], "i").model_dump(by_alias=True)},
        }
    )
    view = without_nodes(state, frozenset({"b"}))
    assert view.topology.nodes == ["a", "c"]
    assert view.topology.connections == {}  # every link touched b
    for per_node in (
        view.node_memory,
        view.node_backends,
        view.node_identities,
        view.node_network,
        view.node_rdma_ctl,
        view.last_seen,
        view.downloads,
    ):
        assert sorted(per_node) == ["a", "c"]
    assert view.instances == state.instances
    assert without_nodes(state, frozenset()) == state
    assert len(state.topology.nodes) == 3  # the state itself is untouched
    kept = without_nodes(state, frozenset({"c"})).topology.connections
    assert {s: sorted(sinks) for s, sinks in kept.items()} == {"a": ["b"], "b": ["a"]}


def test_a_first_replica_keeps_placements_own_reason() -> None:
    cluster, _, deployment_id = too_big_for_node_a()
    assert failures_of(cluster.step(T)) == [(deployment_id, NO_MEMORY)]


def test_scaling_up_records_the_count_and_the_steps_add_the_replicas() -> None:
    cluster, _, deployment_id, _ = replicated(1)
    assert cluster.step(T + 1) == []
    assert cluster.scale(deployment_id, 3) == [
        DeploymentScaled(deployment_id=deployment_id, replicas=3)
    ]
    assert cluster.deployment(deployment_id).replicas == 3
    assert placed_ids(cluster.step(T + 2)) == [deployment_id]
    assert placed_ids(cluster.step(T + 3)) == [deployment_id]
    assert cluster.step(T + 4) == []
    assert len(cluster.instances_of_model("m")) == 3


def test_scaling_down_removes_the_newest_keeper_instances_first() -> None:
    cluster, _, deployment_id, placed = replicated(3)
    # Another model's instance is no replica of this one.
    cluster.apply(InstanceCreated(instance=build_instance(card("other"), ["node-a"], "x")))
    events = cluster.scale(deployment_id, 1)
    assert events == [
        DeploymentScaled(deployment_id=deployment_id, replicas=1),
        InstanceDeleted(instance_id=placed[2]),
        InstanceDeleted(instance_id=placed[1]),
    ]
    assert list(cluster.state.instances) == [placed[0], "x"]
    assert cluster.deployment(deployment_id).placed_instance_ids == (placed[0],)
    for now in (T + 10, T + 100):
        assert cluster.step(now) == []
    assert cluster.keeper.timers(cluster.state, T + 100)[deployment_id].failures == 0


def test_scaling_down_never_removes_an_instance_placed_some_other_way() -> None:
    cluster, _ = one_node_cluster()
    cluster.add_nodes("node-b", "node-c")
    for a, b in (("node-a", "node-b"), ("node-a", "node-c"), ("node-b", "node-c")):
        cluster.link(a, b)
    deployment_id = deploy_beside_one_by_hand(cluster, replicas=3)
    own = created_ids(cluster.step(T)) + created_ids(cluster.step(T + 1))
    assert len(own) == 2
    assert deleted_ids(cluster.scale(deployment_id, 2)) == [own[1]]
    # Down to one: the hand-placed instance alone makes one, so the keeper's last one goes.
    assert deleted_ids(cluster.scale(deployment_id, 1)) == [own[0]]
    assert list(cluster.state.instances) == ["manual"]
    assert cluster.step(T + 2) == []


def test_scaling_down_removes_a_replica_still_in_flight_after_it_lands() -> None:
    cluster, _, deployment_id, placed = replicated(1)
    cluster.scale(deployment_id, 2)
    in_flight = cluster.step_keep(T + 1)
    (arriving,) = created_ids(in_flight)
    scaled = cluster.keeper.scale(deployment_id, 1, cluster.state)
    assert scaled == [
        DeploymentScaled(deployment_id=deployment_id, replicas=1),
        InstanceDeleted(instance_id=arriving),
    ]
    cluster.apply(*in_flight, *scaled)  # in the order emitted
    assert list(cluster.state.instances) == placed
    for now in (T + 2, T + 3, T + 100):
        assert cluster.step(now) == []
    assert cluster.keeper.timers(cluster.state, T + 100)[deployment_id].failures == 0


def test_a_removed_replica_the_state_still_shows_is_neither_counted_as_lost_nor_replaced() -> None:
    cluster, _, deployment_id, placed = replicated(2)
    scaled = cluster.keeper.scale(deployment_id, 1, cluster.state)
    assert deleted_ids(scaled) == [placed[1]]
    for now in (T + 5, T + 5.5):
        assert cluster.step(now) == []  # the removal is on its way
    cluster.apply(*scaled)
    assert cluster.step(T + 6) == []
    timer = cluster.keeper.timers(cluster.state, T + 6)[deployment_id]
    assert (timer.failures, timer.waiting) == (0, None)
    # Once the state no longer shows it, the keeper forgets it.
    memo = cluster.keeper._memos[deployment_id]  # pyright: ignore[reportPrivateUsage]
    assert memo.retiring == frozenset()
    # Scaled up again before the removal lands: the removed one does not count as a replica
    # kept, and the keeper waits for the state to show it gone rather than place beside it.
    again = cluster.keeper.scale(deployment_id, 2, cluster.state)
    assert deleted_ids(again) == []
    cluster.apply(*again)
    assert placed_ids(cluster.step(T + 7)) == [deployment_id]
    assert len(cluster.instances_of_model("m")) == 2


def test_scaling_down_then_up_before_the_state_caught_up_places_nothing_extra() -> None:
    cluster, _, deployment_id, placed = replicated(1, nodes=3)
    cluster.scale(deployment_id, 2)
    in_flight = cluster.step_keep(T + 1)
    down = cluster.keeper.scale(deployment_id, 1, cluster.state)
    up = cluster.keeper.scale(deployment_id, 2, cluster.state)
    assert deleted_ids(down) == created_ids(in_flight) and deleted_ids(up) == []
    # None of it is applied yet: the one removed is still on its way, so nothing is placed.
    assert cluster.step_keep(T + 2) == []
    cluster.apply(*in_flight)
    assert cluster.step_keep(T + 3) == []
    cluster.apply(*down, *up)
    assert placed_ids(cluster.step(T + 4)) == [deployment_id]
    assert cluster.step(T + 5) == []
    assert len(cluster.instances_of_model("m")) == 2
    assert placed[0] in cluster.state.instances


def test_scaling_to_the_current_count_emits_nothing() -> None:
    cluster, _, deployment_id, _ = replicated(2)
    assert cluster.scale(deployment_id, 2) == []
    sent = cluster.keeper.scale(deployment_id, 3, cluster.state)
    assert len(sent) == 1
    # The count it sent is the current one, even before the state shows it.
    assert cluster.keeper.scale(deployment_id, 3, cluster.state) == []
    assert cluster.deployment(deployment_id).replicas == 2


def test_scaling_an_unknown_deployment_or_one_being_deleted_emits_nothing() -> None:
    cluster, _, deployment_id, _ = replicated(1)
    assert cluster.scale("no-such-deployment", 2) == []
    cluster.keeper.delete(deployment_id, cluster.state)
    assert cluster.keeper.scale(deployment_id, 2, cluster.state) == []


def test_scaling_outside_the_bounds_is_refused_and_changes_nothing() -> None:
    cluster, _, deployment_id, _ = replicated(2)
    for bad in (0, MAX_REPLICAS + 1):
        with pytest.raises(ValueError):
            cluster.keeper.scale(deployment_id, bad, cluster.state)
    assert cluster.scale(deployment_id, 2) == []
    assert len(cluster.scale(deployment_id, MAX_REPLICAS)) == 1


def test_scaling_is_a_reason_to_try_again_at_once() -> None:
    recorder = RecordingPlace()
    cluster, _ = one_node_cluster(recorder)
    cluster.add_nodes("node-b")
    cluster.link("node-a", "node-b")
    deployment_id = cluster.deploy("m", replicas=2)
    cluster.step(T)
    recorder.failing["m"] = ValueError(NO_MEMORY)
    cluster.step(T + 1)
    assert cluster.deployment(deployment_id).placement_error is not None
    assert cluster.step(T + 2) == []  # unplaceable: waits for the retry
    cluster.scale(deployment_id, 3)
    assert cluster.deployment(deployment_id).placement_error is None  # a new count, a new try
    tries = len(recorder.calls)
    events = cluster.step(T + 3)
    assert len(recorder.calls) == tries + 1
    assert len(failures_of(events)) == 1  # the error, cleared by the scaling, is sent again


def test_scaling_clears_the_error_so_a_recurring_one_is_sent_again_before_it_lands() -> None:
    recorder = RecordingPlace()
    cluster, _ = one_node_cluster(recorder)
    deployment_id = cluster.deploy("m", replicas=2)
    cluster.step(T)
    reason = f"no placement apart from the nodes serving m (node-a): {NO_MEMORY}"
    assert failures_of(cluster.step(T + 1)) == [(deployment_id, reason)]
    scaled = cluster.keeper.scale(deployment_id, 3, cluster.state)  # on its way
    again = cluster.step_keep(T + 2)
    assert failures_of(again) == [(deployment_id, reason)]
    cluster.apply(*scaled, *again)
    assert cluster.deployment(deployment_id).placement_error == reason


def test_a_deployment_written_before_the_record_owns_the_instance_it_names() -> None:
    cluster, _, deployment_id, placed = replicated(1, nodes=2)
    place_by_hand(cluster, card("m"))
    old = cluster.deployment(deployment_id).model_copy(
        update={"placed_instance_ids": (), "replicas": 2}
    )
    cluster.state = cluster.state.model_copy(update={"deployments": {deployment_id: old}})
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.scale(deployment_id, 1) == [
        DeploymentScaled(deployment_id=deployment_id, replicas=1),
        InstanceDeleted(instance_id=placed[0]),
    ]
    assert list(restarted.state.instances) == ["manual"]


def test_a_new_master_adopts_the_instance_an_old_deployment_names() -> None:
    cluster, _, deployment_id, placed = replicated(1)
    old = cluster.deployment(deployment_id).model_copy(update={"placed_instance_ids": ()})
    cluster.state = cluster.state.model_copy(update={"deployments": {deployment_id: old}})
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE) == []
    restarted.delete_instance(placed[0])  # lost before ready: the keeper's own, so a failure
    assert restarted.step(1000.0 + STARTUP_GRACE + 1) == []
    assert restarted.keeper.timers(restarted.state, 1016.0)[deployment_id].failures == 1


def test_deleting_a_deployment_removes_all_its_keeper_instances() -> None:
    cluster, _ = one_node_cluster()
    cluster.add_nodes("node-b", "node-c", "node-d")
    for a, b in (("node-a", "node-b"), ("node-a", "node-c"), ("node-a", "node-d")):
        cluster.link(a, b)
    deployment_id = deploy_beside_one_by_hand(cluster, replicas=4)
    own = created_ids(cluster.step(T)) + created_ids(cluster.step(T + 1))
    in_flight = cluster.step_keep(T + 2)
    own += created_ids(in_flight)
    assert len(own) == 3
    deletion = cluster.keeper.delete(deployment_id, cluster.state)
    assert deletion[0] == DeploymentDeleted(deployment_id=deployment_id)
    assert deleted_ids(deletion) == own
    cluster.apply(*in_flight, *deletion)
    assert list(cluster.state.instances) == ["manual"]


def test_backoff_is_kept_per_deployment_with_replicas() -> None:
    cluster, _, deployment_id, placed = replicated(2)
    other = cluster.deploy("other", deployment_id="dep-zz", replicas=1)
    cluster.make_ready(placed[0])
    assert placed_ids(cluster.step(T + 2)) == [other]
    cluster.make_loading(placed[1])
    cluster.step(T + 3)
    cluster.delete_instance(placed[1])  # lost before ready: the deployment backs off
    assert cluster.step(T + 4) == []
    timer = cluster.keeper.timers(cluster.state, T + 4)[deployment_id]
    assert (timer.failures, timer.waiting, timer.next_attempt_at) == (
        1,
        "backoff",
        T + 4 + FIRST_BACKOFF,
    )
    other_timer = cluster.keeper.timers(cluster.state, T + 4)[other]
    assert (other_timer.failures, other_timer.waiting) == (0, None)
    assert deployment_status(cluster.deployment(deployment_id), cluster.state) == "serving"
    assert cluster.step(T + 4 + FIRST_BACKOFF - 0.001) == []
    assert placed_ids(cluster.step(T + 4 + FIRST_BACKOFF)) == [deployment_id]


def test_each_replica_lost_before_ready_counts_as_a_failure() -> None:
    cluster, _, deployment_id, placed = replicated(2)
    for instance_id in placed:
        cluster.delete_instance(instance_id)
    assert cluster.step(T + 5) == []
    timer = cluster.keeper.timers(cluster.state, T + 5)[deployment_id]
    assert (timer.failures, timer.next_attempt_at) == (2, T + 5 + 2 * FIRST_BACKOFF)


def test_a_replica_becoming_ready_ends_the_failures_in_a_row() -> None:
    cluster, _, deployment_id, placed = replicated(2)
    cluster.delete_instance(placed[1])
    cluster.step(T + 2)
    assert cluster.keeper.timers(cluster.state, T + 2)[deployment_id].failures == 1
    cluster.make_ready(placed[0])
    cluster.step(T + 3)
    assert cluster.keeper.timers(cluster.state, T + 3)[deployment_id].failures == 0


def test_a_replica_lost_after_ready_is_replaced_at_once() -> None:
    cluster, _, deployment_id, placed = replicated(3, nodes=4)
    for instance_id in placed:
        cluster.make_ready(instance_id)
    assert cluster.step(T + 3) == []
    assert ready_replicas(cluster.deployment(deployment_id), cluster.state) == 3
    cluster.delete_instance(placed[1])
    assert ready_replicas(cluster.deployment(deployment_id), cluster.state) == 2
    assert placed_ids(cluster.step(T + 4)) == [deployment_id]
    assert cluster.keeper.timers(cluster.state, T + 4)[deployment_id].failures == 0


def test_a_new_master_scales_down_by_the_durable_record() -> None:
    cluster, _, deployment_id, placed = replicated(3)
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.scale(deployment_id, 1) == [
        DeploymentScaled(deployment_id=deployment_id, replicas=1),
        InstanceDeleted(instance_id=placed[2]),
        InstanceDeleted(instance_id=placed[1]),
    ]
    assert list(restarted.state.instances) == [placed[0]]


def test_a_new_master_deletes_every_instance_the_deployment_records() -> None:
    cluster, _, deployment_id, placed = replicated(3)
    place_by_hand(cluster, card("m"))  # not recorded: it stays
    restarted = _restarted(cluster, started_at=1000.0)
    assert deleted_ids(restarted.delete(deployment_id)) == placed
    assert list(restarted.state.instances) == ["manual"]


def test_a_new_master_adopts_every_recorded_replica() -> None:
    cluster, _, deployment_id, placed = replicated(2)
    restarted = _restarted(cluster, started_at=1000.0)
    assert restarted.step(1000.0 + STARTUP_GRACE) == []
    for instance_id in placed:
        restarted.delete_instance(instance_id)  # lost before ready, both the keeper's
    assert restarted.step(1000.0 + STARTUP_GRACE + 1) == []
    assert restarted.keeper.timers(restarted.state, 1016.0)[deployment_id].failures == 2


def test_a_deployment_written_before_replicas_keeps_one_instance() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    raw = {"deploymentId": "old", "modelCard": card("m").model_dump(by_alias=True)}
    cluster.apply(DeploymentCreated(deployment=Deployment.model_validate_json(json.dumps(raw))))
    assert placed_ids(cluster.step(T)) == ["old"]
    for now in (T + 1, T + 100):
        assert cluster.step(now) == []
    assert len(cluster.instances_of_model("m")) == 1


def test_ready_replicas_counts_every_ready_instance_of_the_model() -> None:
    cluster, _, deployment_id, placed = replicated(3, nodes=4)
    place_by_hand(cluster, card("m"))
    cluster.apply(InstanceCreated(instance=build_instance(card("other"), ["node-b"], "x")))
    cluster.make_ready("x")
    deployment = cluster.deployment(deployment_id)
    assert ready_replicas(deployment, cluster.state) == 0
    cluster.make_ready(placed[0])
    cluster.make_ready("manual")
    cluster.make_loading(placed[1])
    assert ready_replicas(cluster.deployment(deployment_id), cluster.state) == 2


def test_a_runner_turning_ready_at_rest_is_seen_so_its_loss_is_placed_again_at_once() -> None:
    # The step skips observing a deployment when nothing it reads changed since the last step:
    # a runner's report changes only the State's runners, and must still be seen.
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    instance_id = cluster.instance_of(deployment_id).instance_id
    assert cluster.step(T + 1) == []  # the instance arrived: watched, not ready yet
    assert cluster.step(T + 2) == []  # at rest
    cluster.make_ready(instance_id)  # only the runners change
    assert cluster.step(T + 3) == []
    cluster.delete_instance(instance_id)
    # It had been ready: placed again at once, no backoff.
    replaced = cluster.step(T + 4)
    assert [type(e).__name__ for e in replaced][:2] == ["InstanceCreated", "DeploymentPlaced"]


def test_a_departed_deployment_leaves_nothing_observed_behind() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    cluster.step(T + 1)
    cluster.delete(deployment_id)
    cluster.step(T + 2)
    assert cluster.keeper._observed == {}  # pyright: ignore[reportPrivateUsage]


# --- exo's master changed (docs/design.md §3.5) -----------------------------------------------


def loading_on_exo(index: int) -> tuple[Cluster, str]:
    """A one-node cluster whose keeper placed ``m`` at ``T``, its instance loading, in exo's
    State at event ``index``: (the cluster, the deployment id)."""
    cluster, deployment_id, instance_id = placed_by_the_keeper()
    cluster.make_loading(instance_id)
    cluster.state = cluster.state.model_copy(update={"last_event_applied_idx": index})
    assert cluster.step(T + 1) == []  # arrived, loading
    return cluster, deployment_id


def exo_state_emptied(cluster: Cluster, index: int) -> None:
    """exo's next State read: no instance or runner left, at event ``index``, node-a heard
    since."""
    cluster.state = cluster.state.model_copy(
        update={
            "instances": {},
            "runners": {},
            "last_event_applied_idx": index,
            "last_seen": {"node-a": "2026-01-01T00:00:05Z"},
        }
    )


def test_an_instance_lost_with_exos_master_is_placed_again_at_once() -> None:
    """A new master's State starts empty: the instance loading on the old one went with it, no
    failure of its placement, so no backoff delays the next one."""
    cluster, deployment_id = loading_on_exo(500)
    exo_state_emptied(cluster, 3)
    # As the bridge asks before the step: nothing to wait for.
    timer = cluster.keeper.timers(cluster.state, T + 2)[deployment_id]
    assert (timer.failures, timer.waiting) == (0, None)
    assert placed_ids(cluster.step(T + 2)) == [deployment_id]


def test_an_instance_lost_before_ready_on_the_same_exo_master_still_backs_off() -> None:
    cluster, deployment_id = loading_on_exo(500)
    exo_state_emptied(cluster, 501)  # the index moves on: the same master deleted it
    timer = cluster.keeper.timers(cluster.state, T + 2)[deployment_id]
    assert (timer.failures, timer.waiting) == (1, "backoff")
    assert cluster.step(T + 2) == []
    # A master change read once is not read again: the next loss before ready backs off.
    cluster, deployment_id = loading_on_exo(500)
    exo_state_emptied(cluster, 3)
    assert placed_ids(cluster.step(T + 2)) == [deployment_id]
    instance_id = cluster.instance_of(deployment_id).instance_id
    cluster.make_loading(instance_id)
    assert cluster.step(T + 3) == []
    cluster.delete_instance(instance_id)
    assert cluster.step(T + 4) == []
    assert cluster.keeper.timers(cluster.state, T + 4)[deployment_id].waiting == "backoff"
