"""``apply`` for a node gone quiet: suspected, confirmed dead, heard again, gone — the verdicts
the service reaches are facts in the State, so readiness and the history read one answer."""

from __future__ import annotations

from keeper_harness import node_info

from keeper.model.apply import apply
from keeper.model.events import (
    NodeConfirmedDead,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
)
from keeper.model.state import NodeWatch, State


def with_node(node_id: str = "a") -> State:
    return apply(State(), node_info(node_id))


def test_a_suspicion_records_the_last_report_and_when() -> None:
    state = apply(with_node(), NodeSuspected(node_id="a", last_heard=10.0, at=13.0))
    assert state.node_watch == {"a": NodeWatch(phase="suspect", last_heard=10.0, since=13.0)}


def test_a_node_outside_the_topology_is_never_suspected_nor_confirmed() -> None:
    state = with_node()
    assert apply(state, NodeSuspected(node_id="b", last_heard=1.0, at=4.0)) is state
    assert apply(state, NodeConfirmedDead(node_id="b", last_heard=1.0, at=9.0, why="x")) is state


def test_a_second_suspicion_keeps_the_first_and_does_not_undo_dead() -> None:
    state = apply(with_node(), NodeSuspected(node_id="a", last_heard=10.0, at=13.0))
    assert apply(state, NodeSuspected(node_id="a", last_heard=11.0, at=14.0)) is state
    dead = apply(state, NodeConfirmedDead(node_id="a", last_heard=10.0, at=18.0, why="closed"))
    assert apply(dead, NodeSuspected(node_id="a", last_heard=10.0, at=19.0)) is dead


def test_confirmation_makes_it_dead_with_its_sign_once() -> None:
    state = apply(with_node(), NodeSuspected(node_id="a", last_heard=10.0, at=13.0))
    dead = apply(state, NodeConfirmedDead(node_id="a", last_heard=10.0, at=18.0, why="closed"))
    assert dead.node_watch["a"] == NodeWatch(
        phase="dead", last_heard=10.0, since=18.0, why="closed"
    )
    again = NodeConfirmedDead(node_id="a", last_heard=10.0, at=20.0, why="other")
    assert apply(dead, again) is dead


def test_dead_without_a_suspicion_first_is_dead() -> None:
    dead = apply(with_node(), NodeConfirmedDead(node_id="a", last_heard=5.0, at=6.0, why="x"))
    assert dead.node_watch["a"].phase == "dead"


def test_heard_again_clears_the_verdict_and_is_a_no_op_otherwise() -> None:
    state = apply(with_node(), NodeSuspected(node_id="a", last_heard=10.0, at=13.0))
    cleared = apply(state, NodeHeardAgain(node_id="a", at=14.0))
    assert cleared.node_watch == {}
    assert apply(cleared, NodeHeardAgain(node_id="a", at=15.0)) is cleared


def test_a_node_timed_out_leaves_no_verdict_behind() -> None:
    state = apply(with_node(), NodeConfirmedDead(node_id="a", last_heard=1.0, at=9.0, why="x"))
    assert apply(state, NodeTimedOut(node_id="a")).node_watch == {}
