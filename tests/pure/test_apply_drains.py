"""``apply`` for cordons and drains: keyed by friendly name, idempotent, and a move ends with
either of its instances."""

from __future__ import annotations

from keeper_harness import Cluster, build_instance, card, node_info

from keeper.model.apply import apply
from keeper.model.events import (
    DeploymentCreated,
    DeploymentDeleted,
    DrainReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeUncordoned,
)
from keeper.model.state import (
    Deployment,
    InstanceMove,
    NodeDrain,
    NodeIdentity,
    State,
    cordoned_nodes,
    node_name,
    nodes_named,
)

MOVE = InstanceMove(deployment_id="d", old_instance_id="old", new_instance_id="new")


def draining(*events: object) -> State:
    state = State()
    for event in (NodeDrainStarted(name="studio", when="t"), *events):
        state = apply(state, event)  # type: ignore[arg-type]
    return state


def test_cordons_are_sorted_names_and_cordoning_twice_changes_nothing() -> None:
    state = apply(State(), NodeCordoned(name="mini"))
    state = apply(state, NodeCordoned(name="studio"))
    assert apply(state, NodeCordoned(name="mini")) is state
    state = apply(state, NodeCordoned(name="air"))
    assert state.cordoned == ("air", "mini", "studio")
    state = apply(state, NodeUncordoned(name="mini"))
    assert state.cordoned == ("air", "studio")
    assert apply(state, NodeUncordoned(name="mini")) is state


def test_a_drain_cordons_and_a_forced_one_over_it_keeps_its_moves() -> None:
    state = draining(DrainReplacementPlaced(name="studio", move=MOVE))
    assert state.cordoned == ("studio",)
    assert state.drains == {"studio": NodeDrain(node="studio", started="t", moves=(MOVE,))}
    again = apply(state, NodeDrainStarted(name="studio", when="later"))
    assert again.drains == state.drains  # not forced over not forced: nothing new
    forced = apply(state, NodeDrainStarted(name="studio", force=True, when="later"))
    assert forced.drains["studio"] == NodeDrain(
        node="studio", force=True, started="t", moves=(MOVE,)
    )
    assert apply(forced, NodeDrainStarted(name="studio", when="x")).drains["studio"].force


def test_one_move_per_deployment_and_none_without_a_drain() -> None:
    other = InstanceMove(deployment_id="d", old_instance_id="o2", new_instance_id="n2")
    state = draining(
        DrainReplacementPlaced(name="studio", move=MOVE),
        DrainReplacementPlaced(name="studio", move=other),
    )
    assert state.drains["studio"].moves == (MOVE,)
    assert apply(State(), DrainReplacementPlaced(name="studio", move=MOVE)) == State()


def test_a_move_ends_with_either_instance_or_its_deployment() -> None:
    for gone in ("old", "new"):
        state = draining(DrainReplacementPlaced(name="studio", move=MOVE))
        state = apply(state, InstanceDeleted(instance_id=gone))
        assert state.drains["studio"].moves == ()
    state = draining(DrainReplacementPlaced(name="studio", move=MOVE))
    unrelated = apply(state, InstanceDeleted(instance_id="other"))
    assert unrelated is state  # nothing to change: not even a copy
    state = apply(
        state, DeploymentCreated(deployment=Deployment(deployment_id="d", model_card=card("m")))
    )
    state = apply(state, DeploymentDeleted(deployment_id="d"))
    assert state.drains["studio"].moves == ()


def test_a_deleted_instance_that_exists_also_ends_its_move() -> None:
    state = draining(
        InstanceCreated(instance=build_instance(card("m"), ["n1"], "old")),
        DrainReplacementPlaced(name="studio", move=MOVE),
        InstanceDeleted(instance_id="old"),
    )
    assert "old" not in state.instances and state.drains["studio"].moves == ()


def test_the_drain_ends_and_an_uncordon_ends_drain_and_cordon() -> None:
    state = draining()
    ended = apply(state, NodeDrainEnded(name="studio"))
    assert ended.drains == {} and ended.cordoned == ("studio",)
    assert apply(ended, NodeDrainEnded(name="studio")) is ended
    uncordoned = apply(state, NodeUncordoned(name="studio"))
    assert uncordoned.drains == {} and uncordoned.cordoned == ()


def test_nodes_are_named_by_friendly_name_apart_from_namesakes_else_id() -> None:
    cluster = Cluster()
    cluster.add_nodes("n1", "n2", "n3")
    cluster.apply(
        NodeGatheredInfo(node_id="n1", when="t", identity=NodeIdentity(friendly_name="studio"))
    )
    cluster.apply(
        NodeGatheredInfo(node_id="n2", when="t", identity=NodeIdentity(friendly_name="studio"))
    )
    state = cluster.apply(NodeCordoned(name="studio"))
    # Namesakes reporting no address: the end of their ids tells them apart.
    assert node_name(state, "n1") == "studio#n1" and node_name(state, "n3") == "n3"
    assert nodes_named(state, "studio#n2") == {"n2"}
    assert nodes_named(state, "studio") == {"n1", "n2"}  # the name they share
    assert cordoned_nodes(state) == {"n1", "n2"}
    assert cordoned_nodes(cluster.apply(NodeCordoned(name="n3"))) == {"n1", "n2", "n3"}
    assert cordoned_nodes(State().model_copy(update={"cordoned": ("gone",)})) == set()
    assert node_info("x").node_id == "x"


def test_a_forced_drain_of_a_cordoned_node_is_forced_and_cordons_it_once() -> None:
    state = apply(State(), NodeCordoned(name="studio"))
    state = apply(state, NodeDrainStarted(name="studio", force=True, when="t"))
    assert state.cordoned == ("studio",)
    assert state.drains["studio"] == NodeDrain(node="studio", force=True, started="t")
