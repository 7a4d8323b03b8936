"""Cordons and drains (docs/design.md §5.15): no new placement on a cordoned node, and a drain
moves the keeper's instances off its node make-before-break, one per deployment at a time,
never more than replicas + 1 instances of a model."""

from __future__ import annotations

from keeper_harness import (
    AFTER_GRACE,
    WHEN,
    Cluster,
    RecordingPlace,
    build_instance,
    card,
    simple_place,
    unplaceable,
)

from keeper.core.keeper import MOVE_SETTLE, Keeper
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DrainReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeUncordoned,
)
from keeper.model.readiness import chat_targets
from keeper.model.state import AnyInstance, InstanceMeta, Sharding

ALL = frozenset({"node-a", "node-b", "node-c"})  # connected nodes

T = AFTER_GRACE


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def serving_on(
    *nodes: str, replicas: int = 1, first: str = "node-a"
) -> tuple[Cluster, str, list[str]]:
    """``m`` deployed on ``nodes`` (its first instance on ``first``, the freest), every instance
    ready: (the cluster, the deployment id, its instance ids)."""
    cluster = Cluster(place=simple_place)
    cluster.add_nodes(*nodes)
    cluster.add_node(first, available_gb=32.0)
    deployment_id = cluster.deploy("m", replicas=replicas)
    for k in range(replicas):
        cluster.step(T + k)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    instances = sorted(cluster.state.instances)
    return cluster, deployment_id, instances


def model_instances(cluster: Cluster) -> list[AnyInstance]:
    return cluster.instances_of_model("m")


def test_a_cordoned_node_gets_no_new_placement_and_keeps_what_runs() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    cluster.add_node("node-a", available_gb=32.0)  # the freest: placement would take it
    assert cluster.cordon("node-a") == [NodeCordoned(name="node-a")]
    assert cluster.cordon("node-a") == []  # cordoned already: no new event
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    assert cluster.nodes_of(cluster.instance_of(deployment_id).instance_id) == ["node-b"]
    # Cordoning the node that serves it changes nothing that runs.
    cluster.cordon("node-b")
    cluster.step(T + 1)
    assert len(model_instances(cluster)) == 1


def test_the_placement_error_names_the_cordoned_nodes_left_out() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a")
    cluster.cordon("node-a")
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    error = cluster.deployment(deployment_id).placement_error
    assert error is not None and "cordoned, left out: node-a" in error


def test_a_drain_moves_an_instance_make_before_break() -> None:
    cluster, deployment_id, (old,) = serving_on("node-a", "node-b")
    assert cluster.nodes_of(old) == ["node-a"]
    assert kinds(cluster.drain("node-a")) == ["NodeDrainStarted"]
    assert cluster.state.cordoned == ("node-a",)
    placed = cluster.step(T + 10)
    assert kinds(placed) == ["DrainReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]
    created = placed[1]
    assert isinstance(created, InstanceCreated)
    new = created.instance.instance_id
    assert cluster.nodes_of(new) == ["node-b"]
    # Until the replacement is ready, the old one stays (two instances: replicas + 1).
    assert cluster.step(T + 11) == []
    assert len(model_instances(cluster)) == 2
    assert chat_targets(cluster.state, "m", ALL) == [(old, "node-a")]
    cluster.make_ready(new)
    # Ready: new chats go to the replacement; the old one finishes its own for MOVE_SETTLE.
    assert chat_targets(cluster.state, "m", ALL) == [(new, "node-b")]
    assert cluster.step(T + 12) == []
    assert cluster.step(T + 12 + MOVE_SETTLE - 0.5) == []
    assert cluster.step(T + 12 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    assert cluster.step(T + 13 + MOVE_SETTLE) == [NodeDrainEnded(name="node-a")]
    assert cluster.state.drains == {} and cluster.state.cordoned == ("node-a",)
    assert [i.instance_id for i in model_instances(cluster)] == [new]
    assert cluster.deployment(deployment_id).placed_instance_ids == (new,)
    assert cluster.step(T + 14 + MOVE_SETTLE) == []


def test_one_instance_moves_at_a_time_and_never_more_than_replicas_plus_one() -> None:
    cluster, _, instances = serving_on("node-a", "node-b", "node-c", replicas=2)
    on_a = [i for i in instances if "node-a" in cluster.nodes_of(i)]
    assert len(on_a) == 1
    cluster.drain("node-a")
    most = 0
    for k in range(30):
        events = cluster.step(T + 10 + k)
        most = max(most, len(model_instances(cluster)))
        for event in events:
            if isinstance(event, InstanceCreated):
                cluster.make_ready(event.instance.instance_id)
    assert most == 3  # replicas + 1, and only while the move ran
    assert len(model_instances(cluster)) == 2
    assert all("node-a" not in cluster.nodes_of(i.instance_id) for i in model_instances(cluster))
    assert on_a[0] not in cluster.state.instances
    assert cluster.state.drains == {}


def test_a_drain_that_cannot_place_a_replacement_says_why_and_leaves_it_running() -> None:
    cluster, _, (old,) = serving_on("node-a")
    cluster.drain("node-a")
    assert cluster.step(T + 10) == []
    note = cluster.keeper.drain_note("node-a")
    assert note is not None
    assert "cannot move m off node-a" in note and "No cycles found with sufficient memory" in note
    assert old in cluster.state.instances and "node-a" in cluster.state.drains
    # Forced, it goes anyway: the keeper then places it again as after any fault.
    cluster.drain("node-a", force=True)
    assert cluster.step(T + 11) == [InstanceDeleted(instance_id=old)]
    after = cluster.step(T + 12)
    assert NodeDrainEnded(name="node-a") in after
    assert "DeploymentPlacementFailed" in kinds(after)  # nowhere else to go: said, as ever


def test_an_instance_the_keeper_did_not_place_is_left_alone_unless_forced() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    by_hand = build_instance(card("other"), ["node-a"], "by-hand")
    cluster.apply(InstanceCreated(instance=by_hand))
    cluster.drain("node-a")
    assert cluster.step(T) == []
    assert "by-hand" in cluster.state.instances
    cluster.drain("node-a", force=True)
    assert cluster.step(T + 1) == [InstanceDeleted(instance_id="by-hand")]
    assert cluster.step(T + 2) == [NodeDrainEnded(name="node-a")]


def test_uncordon_mid_move_deletes_the_surge_instance_and_ends_the_drain() -> None:
    cluster, _, (old,) = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    created = cluster.step(T + 10)[1]
    assert isinstance(created, InstanceCreated)
    new = created.instance.instance_id
    assert cluster.uncordon("node-a") == [
        NodeUncordoned(name="node-a"),
        InstanceDeleted(instance_id=new),
    ]
    assert cluster.state.drains == {} and cluster.state.cordoned == ()
    assert list(cluster.state.instances) == [old]
    assert cluster.uncordon("node-a") == []
    assert cluster.step(T + 11) == []


def test_a_replacement_lost_before_ready_backs_off_and_the_old_one_stays() -> None:
    cluster, _, (old,) = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    created = cluster.step(T + 10)[1]
    assert isinstance(created, InstanceCreated)
    cluster.delete_instance(created.instance.instance_id)  # its runner failed for good
    assert cluster.state.drains["node-a"].moves == ()
    assert cluster.step(T + 11) == []  # the keeper's backoff after a loss before ready
    assert old in cluster.state.instances
    again = [kinds(cluster.step(T + 11 + k)) for k in range(1, 40)]
    assert ["DrainReplacementPlaced", "InstanceCreated", "DeploymentPlaced"] in again


def test_a_state_that_trails_the_drains_events_gets_no_second_replacement() -> None:
    cluster, _, _ = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    first = cluster.step_keep(T + 10)
    assert any(isinstance(e, DrainReplacementPlaced) for e in first)
    # The state does not show the replacement yet: the next step places nothing more.
    assert cluster.step_keep(T + 11) == []
    cluster.apply(*first)
    assert cluster.step(T + 12) == []


def test_a_drain_places_only_in_a_step_that_placed_nothing_for_recovery() -> None:
    cluster, _, _ = serving_on("node-a", "node-b", "node-c")
    other = cluster.deploy("other")
    cluster.drain("node-a")
    first = cluster.step(T + 10)
    assert [e.deployment_id for e in first if isinstance(e, DeploymentPlaced)] == [other]
    assert not any(isinstance(e, DrainReplacementPlaced) for e in first)
    second = cluster.step(T + 11)
    assert any(isinstance(e, DrainReplacementPlaced) for e in second)


def test_a_drain_of_a_node_that_runs_nothing_is_done_at_once() -> None:
    cluster = Cluster(place=unplaceable())
    cluster.add_nodes("node-a")
    (started,) = cluster.drain("node-a")
    assert isinstance(started, NodeDrainStarted) and not started.force
    assert cluster.step(T) == [NodeDrainEnded(name="node-a")]
    assert cluster.drain("node-a") != []  # a new drain of a drained node starts again


def test_an_uncordon_lets_a_stuck_move_try_again_at_once() -> None:
    cluster, _, (old,) = serving_on("node-a", "node-b")
    cluster.cordon("node-b")
    cluster.drain("node-a")
    assert cluster.step(T + 10) == []
    note = cluster.keeper.drain_note("node-a")
    assert note is not None and "cordoned: node-a, node-b" in note
    cluster.uncordon("node-b")
    placed = cluster.step(T + 11)  # well inside the 30 s retry: the cordons changed
    assert any(isinstance(e, DrainReplacementPlaced) for e in placed)
    assert cluster.keeper.drain_note("node-a") is None
    assert old in cluster.state.instances


def test_a_stuck_note_names_the_nodes_left_out_for_anti_affinity() -> None:
    cluster, _, instances = serving_on("node-a", "node-b", replicas=2)
    cluster.drain("node-a")
    assert cluster.step(T + 10) == []
    assert cluster.keeper.drain_note("node-a") == (
        "cannot move m off node-a (cordoned: node-a; serving it already: node-b): "
        "No cycles found with sufficient memory"
    )
    assert len(instances) == 2


def two_models_on(node: str, *others: str) -> tuple[Cluster, list[str]]:
    """``m`` and ``n`` each placed (and ready) on ``node``, the freest, with ``others`` beside:
    (the cluster, their instance ids)."""
    cluster = Cluster(place=simple_place)
    cluster.add_nodes(node, *others)
    cluster.add_node(node, available_gb=64.0)
    for k, model in enumerate(("m", "n")):
        deployment_id = cluster.deploy(model)
        cluster.step(T + k)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    instances = [cluster.instances_of_model(m)[0].instance_id for m in ("m", "n")]
    assert all(cluster.nodes_of(i) == [node] for i in instances)
    return cluster, instances


def test_one_replacement_per_step_though_two_deployments_move() -> None:
    cluster, _ = two_models_on("node-a", "node-b")
    cluster.drain("node-a")
    first = cluster.step(T + 10)
    assert kinds(first) == ["DrainReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]
    second = cluster.step(T + 11)
    assert kinds(second) == ["DrainReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]
    assert len(cluster.state.drains["node-a"].moves) == 2


def test_each_move_finishes_on_its_own_when_its_replacement_is_ready() -> None:
    cluster, (old_m, old_n) = two_models_on("node-a", "node-b")
    cluster.drain("node-a")
    cluster.step(T + 10)
    cluster.step(T + 11)
    (move_m, move_n) = sorted(
        cluster.state.drains["node-a"].moves, key=lambda move: move.old_instance_id != old_m
    )
    cluster.make_ready(move_n.new_instance_id)  # the second move's only
    cluster.step(T + 12)
    assert cluster.step(T + 12 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old_n)]
    assert old_m in cluster.state.instances and move_m.old_instance_id == old_m


def test_what_the_drain_sent_is_not_sent_again_while_the_state_trails() -> None:
    cluster, _, (old,) = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    created = cluster.step(T + 10)[1]
    assert isinstance(created, InstanceCreated)
    cluster.make_ready(created.instance.instance_id)
    cluster.step(T + 11)
    deleted = cluster.step_keep(T + 11 + MOVE_SETTLE)
    assert deleted == [InstanceDeleted(instance_id=old)]
    assert cluster.step_keep(T + 12 + MOVE_SETTLE) == []  # not applied yet: not sent again
    cluster.apply(*deleted)
    ended = cluster.step_keep(T + 13 + MOVE_SETTLE)
    assert ended == [NodeDrainEnded(name="node-a")]
    assert cluster.step_keep(T + 14 + MOVE_SETTLE) == []
    cluster.apply(*ended)
    assert cluster.step(T + 15 + MOVE_SETTLE) == []


def test_a_forced_deletion_is_not_sent_again_while_the_state_trails() -> None:
    cluster, _, (old,) = serving_on("node-a")
    by_hand = build_instance(card("other"), ["node-a"], "by-hand")
    cluster.apply(InstanceCreated(instance=by_hand))
    cluster.drain("node-a", force=True)
    sent = cluster.step_keep(T + 10)
    assert sorted(kinds(sent)) == ["InstanceDeleted", "InstanceDeleted"]
    assert {e.instance_id for e in sent if isinstance(e, InstanceDeleted)} == {old, "by-hand"}
    assert cluster.step_keep(T + 11) == []


def test_a_drain_of_an_empty_node_does_not_hold_up_the_next_drain() -> None:
    cluster, _, _ = serving_on("node-b", "node-a", "node-c", first="node-b")
    cluster.drain("node-a")  # runs nothing
    cluster.drain("node-b")
    events = cluster.step(T + 10)
    assert NodeDrainEnded(name="node-a") in events
    assert any(isinstance(e, DrainReplacementPlaced) for e in events)


def test_a_stuck_move_is_tried_again_when_the_retry_is_due_not_before() -> None:
    recorder = RecordingPlace(inner=simple_place)
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy(
        "m", sharding=Sharding.TENSOR, instance_meta=InstanceMeta.MLX_JACCL
    )
    cluster.step(T)
    cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    cluster.drain("node-a")
    before = len(recorder.calls)
    cluster.step(T + 10)
    assert recorder.calls[before:] == [("m", "Tensor", "MlxJaccl", 1)]
    cluster.step(T + 11)
    cluster.step(T + 10 + UNPLACEABLE_RETRY - 0.5)
    assert len(recorder.calls) == before + 1  # the same cluster: not asked again yet
    cluster.step(T + 10 + UNPLACEABLE_RETRY)
    assert len(recorder.calls) == before + 2


def test_notes_of_two_stuck_moves_are_joined_in_deployment_order() -> None:
    cluster, _ = two_models_on("node-a")
    cluster.drain("node-a")
    cluster.step(T + 10)
    left_out = "(cordoned: node-a): No cycles found with sufficient memory"
    assert cluster.keeper.drain_note("node-a") == (
        f"cannot move m off node-a {left_out}; cannot move n off node-a {left_out}"
    )


def test_an_uncordon_forgets_its_own_stuck_moves_only() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    for model, node in (("m", "node-a"), ("n", "node-b")):
        cluster.cordon("node-b" if node == "node-a" else "node-a")
        deployment_id = cluster.deploy(model)
        cluster.step(T)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
        cluster.uncordon("node-b" if node == "node-a" else "node-a")
        assert cluster.nodes_of(cluster.instance_of(deployment_id).instance_id) == [node]
    cluster.drain("node-a")
    cluster.drain("node-b")
    cluster.step(T + 10)
    assert cluster.keeper.drain_note("node-a") and cluster.keeper.drain_note("node-b")
    cluster.uncordon("node-a")
    assert cluster.keeper.drain_note("node-a") is None
    assert cluster.keeper.drain_note("node-b") is not None


def test_a_drain_started_twice_is_started_once_and_again_once_it_ended() -> None:
    cluster = Cluster(place=unplaceable())
    cluster.add_nodes("node-a")
    assert cluster.drain("node-a") == [NodeDrainStarted(name="node-a", when=WHEN)]
    assert cluster.drain("node-a") == []
    assert cluster.drain("node-a", force=True) == [
        NodeDrainStarted(name="node-a", force=True, when=WHEN)
    ]
    assert cluster.state.drains["node-a"].force
    assert cluster.drain("node-a", force=True) == []
    assert cluster.step(T) == [NodeDrainEnded(name="node-a")]
    assert cluster.state.cordoned == ("node-a",)  # cordoned once, however many drains
    cluster.drain("node-a")  # at once, before any step prunes what the keeper remembers
    assert cluster.step(T + 1) == [NodeDrainEnded(name="node-a")]


def test_a_replacement_may_share_a_node_with_another_models_instance() -> None:
    cluster, _, _ = serving_on("node-a", "node-b")
    other = build_instance(card("other"), ["node-b"], "other-on-b")
    cluster.apply(InstanceCreated(instance=other))
    cluster.drain("node-a")
    placed = cluster.step(T + 10)
    created = placed[1]
    assert isinstance(created, InstanceCreated)
    assert cluster.nodes_of(created.instance.instance_id) == ["node-b"]


def test_the_keeper_remembers_nothing_of_drains_once_there_are_none() -> None:
    cluster, _, _ = serving_on("node-a")
    cluster.drain("node-a", force=True)
    cluster.step(T + 10)
    cluster.step(T + 11)
    assert cluster.state.drains == {}
    cluster.step(T + 12)
    keeper = cluster.keeper
    assert keeper._move_deleted == set() and keeper._drain_ended == set()  # pyright: ignore[reportPrivateUsage]
    assert keeper._drain_stuck == {} and keeper._move_ready_at == {}  # pyright: ignore[reportPrivateUsage]


def test_a_new_keeper_resumes_a_drain_from_the_state() -> None:
    cluster, _, (old,) = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    created = cluster.step(T + 10)[1]
    assert isinstance(created, InstanceCreated)
    # A restart: a keeper with no memory, the drain and its move in the State (the log).
    cluster.keeper = Keeper(0.0, place=simple_place)
    cluster.make_ready(created.instance.instance_id)
    assert cluster.step(T + 20) == []
    assert cluster.step(T + 20 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    assert cluster.step(T + 21 + MOVE_SETTLE) == [NodeDrainEnded(name="node-a")]


def test_a_new_keeper_starts_the_moves_of_a_drain_it_finds() -> None:
    cluster, _, _ = serving_on("node-a", "node-b")
    cluster.drain("node-a")
    cluster.keeper = Keeper(0.0, place=simple_place)  # a restart before any move was placed
    assert kinds(cluster.step(T + 20)) == [
        "DrainReplacementPlaced",
        "InstanceCreated",
        "DeploymentPlaced",
    ]
