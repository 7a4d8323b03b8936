"""``keeper.core.failover``'s rules one at a time, on States built by hand (docs/design.md
§5.18): when a replacement may be placed (counting healthy and at-risk instances against
``replicas``), one candidate per deployment and per step, the record dated from the verdict,
the note's words, and the picture an operator sees. ``test_failover.py`` runs them through the
keeper; here each boundary is pinned down where the rule makes it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from keeper_harness import build_instance, card

from keeper.core.failover import FailoverMoves, _replicas_at_risk, failover_picture
from keeper.core.moves import Candidate
from keeper.model.events import FailoverReplacementPlaced
from keeper.model.state import (
    AnyInstance,
    Deployment,
    InstanceMove,
    NodeWatch,
    NodeWatchPhase,
    State,
)


def watch(phase: NodeWatchPhase = "suspect", since: float = 100.0) -> NodeWatch:
    return NodeWatch(phase=phase, last_heard=since - 3, since=since)


def state_of(
    instances: list[AnyInstance],
    node_watch: dict[str, NodeWatch],
    deployments: Sequence[Deployment] = (),
) -> State:
    return State(
        instances={i.instance_id: i for i in instances},
        node_watch=node_watch,
        deployments={d.deployment_id: d for d in deployments},
    )


def deployment(
    replicas: int = 1,
    model: str = "m",
    deployment_id: str = "d",
    failover: InstanceMove | None = None,
    failover_since: float | None = None,
) -> Deployment:
    return Deployment(
        deployment_id=deployment_id,
        model_card=card(model),
        replicas=replicas,
        failover=failover,
        failover_since=failover_since,
    )


def m(instance_id: str, *nodes: str, model: str = "m") -> AnyInstance:
    return build_instance(card(model), list(nodes), instance_id)


# --- when a replacement may be placed ---------------------------------------------------------


def test_another_models_instance_sorted_first_does_not_hide_the_models_ones() -> None:
    state = state_of([m("a-other", "n1", model="x"), m("b", "n2")], {"n2": watch()})
    assert _replicas_at_risk(state, deployment()) == ["b"]


@pytest.mark.parametrize(
    ("replicas", "healthy", "at_risk", "expected"),
    [
        (2, 1, 1, ["r0"]),  # one short, one at risk: its replacement is the one extra
        (2, 2, 1, []),  # the replicas are there off suspect nodes: nothing to replace
        (2, 1, 2, []),  # already replicas + 1: a replacement would be one too many
        (2, 0, 2, ["r0", "r1"]),  # every instance at risk: each may be replaced, in id order
        (3, 2, 1, ["r0"]),
        (3, 3, 1, []),
        (1, 0, 1, ["r0"]),
        (1, 1, 0, []),
    ],
)
def test_replicas_at_risk_counts_healthy_and_at_risk_instances_against_replicas(
    replicas: int, healthy: int, at_risk: int, expected: list[str]
) -> None:
    instances = [m(f"h{k}", f"ok{k}") for k in range(healthy)]
    instances += [m(f"r{k}", f"bad{k}") for k in range(at_risk)]
    state = state_of(instances, {f"bad{k}": watch() for k in range(at_risk)})
    assert _replicas_at_risk(state, deployment(replicas=replicas)) == expected


# --- candidates ---------------------------------------------------------------------------


def test_one_candidate_per_deployment_a_step_even_with_several_at_risk() -> None:
    state = state_of(
        [m("r0", "n0"), m("r1", "n1")],
        {"n0": watch(), "n1": watch()},
        [deployment(replicas=2)],
    )
    assert list(FailoverMoves(state.node_watch).candidates(state)) == [
        Candidate("d", "r0", scope="n0")
    ]


def test_a_deployment_already_failing_over_does_not_hide_the_next_one() -> None:
    busy = InstanceMove(deployment_id="a", old_instance_id="x0", new_instance_id="x1")
    state = state_of(
        [m("x0", "n0", model="x"), m("x1", "n9", model="x"), m("r0", "n1")],
        {"n0": watch(), "n1": watch()},
        [deployment(model="x", deployment_id="a", failover=busy), deployment(deployment_id="b")],
    )
    assert list(FailoverMoves(state.node_watch).candidates(state)) == [
        Candidate("b", "r0", scope="n1")
    ]


def test_a_candidate_on_two_watched_nodes_names_both_comma_separated() -> None:
    state = state_of(
        [m("r0", "n2", "n1", "n3")],
        {"n1": watch(), "n2": watch("dead")},
        [deployment()],
    )
    (candidate,) = FailoverMoves(state.node_watch).candidates(state)
    assert candidate.scope == "n1,n2"


# --- the record -----------------------------------------------------------------------------


def test_the_record_is_dated_from_the_latest_verdict_on_the_old_instances_nodes() -> None:
    node_watch = {"n1": watch(since=100.0), "n2": watch(since=107.0), "n3": watch(since=200.0)}
    move = InstanceMove(deployment_id="d", old_instance_id="r0", new_instance_id="r1")
    recorded = FailoverMoves(node_watch).recorded(Candidate("d", "r0", scope="n1,n2"), move)
    assert recorded == FailoverReplacementPlaced(deployment_id="d", move=move, at=107.0)


def test_the_record_of_nodes_no_longer_watched_is_dated_zero() -> None:
    move = InstanceMove(deployment_id="d", old_instance_id="r0", new_instance_id="r1")
    recorded = FailoverMoves({}).recorded(Candidate("d", "r0", scope="n1"), move)
    assert recorded == FailoverReplacementPlaced(deployment_id="d", move=move, at=0.0)


# --- the note -------------------------------------------------------------------------------


def test_the_note_names_every_suspect_node_and_nothing_left_out_when_none_was() -> None:
    state = state_of([m("r0", "n1", "n2")], {"n1": watch(), "n2": watch()}, [deployment()])
    words = FailoverMoves(state.node_watch).words(
        state, Candidate("d", "r0", scope="n1,n2"), [], "no room"
    )
    assert words == (
        "cannot place a replacement for instance r0 on suspect node n1, n2: no room;"
        " it is left running"
    )


def test_the_note_lists_what_was_left_out_semicolon_separated() -> None:
    state = state_of([m("r0", "n1")], {"n1": watch()}, [deployment()])
    words = FailoverMoves(state.node_watch).words(
        state, Candidate("d", "r0", scope="n1"), ["suspect or dead: n1", "cordoned: n4"], "full"
    )
    assert words == (
        "cannot place a replacement for instance r0 on suspect node n1"
        " (suspect or dead: n1; cordoned: n4): full; it is left running"
    )


# --- its end --------------------------------------------------------------------------------


@pytest.mark.parametrize("gone", ["r0", "r1"])
def test_a_move_with_either_instance_gone_is_not_ended_by_the_kind(gone: str) -> None:
    instances = [i for i in (m("r0", "n1"), m("r1", "n2")) if i.instance_id != gone]
    state = state_of(instances, {"n1": watch("dead")}, [deployment()])
    move = InstanceMove(deployment_id="d", old_instance_id="r0", new_instance_id="r1")
    assert FailoverMoves(state.node_watch).early_end(state, move) is None


# --- the picture ----------------------------------------------------------------------------


def test_the_picture_names_the_watched_nodes_in_every_phase() -> None:
    instances = [m("r0", "n2", "n1"), m("r1", "n3")]
    suspect = state_of(instances, {"n1": watch(since=5.0), "n2": watch(since=3.0)})
    picture = failover_picture(deployment(), suspect)
    assert picture is not None
    assert (picture.phase, picture.nodes, picture.since) == ("suspect", ("n1", "n2"), 3.0)
    confirmed = state_of(instances, {"n1": watch("dead", 9.0), "n2": watch(since=3.0)})
    picture = failover_picture(deployment(), confirmed)
    assert picture is not None
    assert (picture.phase, picture.nodes, picture.since) == ("confirmed", ("n1", "n2"), 9.0)


def test_a_replacing_picture_is_dated_from_the_record_else_from_the_verdict() -> None:
    move = InstanceMove(deployment_id="d", old_instance_id="r0", new_instance_id="r1")
    state = state_of([m("r0", "n1"), m("r1", "n2")], {"n1": watch(since=100.0)})
    recorded = failover_picture(deployment(failover=move, failover_since=104.0), state)
    assert recorded is not None
    assert (recorded.phase, recorded.nodes, recorded.since) == ("replacing", ("n1",), 104.0)
    undated = failover_picture(deployment(failover=move), state)
    assert undated is not None and (undated.phase, undated.since) == ("replacing", 100.0)
