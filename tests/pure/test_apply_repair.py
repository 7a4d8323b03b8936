"""Apply's rules for a repair (docs/design.md §5.19): one replacement per deployment at a time, of
an instance the State shows; either instance's deletion ends it; the mode changes in place; a
repair's old instance takes no new chat once its replacement is ready."""

from __future__ import annotations

from keeper_harness import build_instance, card

from keeper.model.apply import apply
from keeper.model.events import (
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentRepairChanged,
    DeploymentRepairPlaced,
    InstanceCreated,
    InstanceDeleted,
    InstanceFoundBroken,
    RepairIncidentsExpired,
    RunnerStatusUpdated,
)
from keeper.model.readiness import instances_leaving
from keeper.model.state import (
    AVOID_AFTER,
    INCIDENT_WINDOW_S,
    Deployment,
    InstanceMove,
    RepairIncident,
    RunnerReady,
    State,
)

MOVE = InstanceMove(deployment_id="d", old_instance_id="old", new_instance_id="new")


def with_both() -> State:
    state = State()
    state = apply(
        state, DeploymentCreated(deployment=Deployment(deployment_id="d", model_card=card("m")))
    )
    for instance_id, node in (("old", "a"), ("new", "b")):
        state = apply(
            state, InstanceCreated(instance=build_instance(card("m"), [node], instance_id))
        )
    return state


def test_a_repair_is_recorded_once_per_deployment() -> None:
    state = with_both()
    assert state.deployments["d"].repair == "auto" and state.deployments["d"].repairing is None
    placed = apply(state, DeploymentRepairPlaced(deployment_id="d", move=MOVE))
    assert placed.deployments["d"].repairing == MOVE
    other = InstanceMove(deployment_id="d", old_instance_id="new", new_instance_id="old")
    assert apply(placed, DeploymentRepairPlaced(deployment_id="d", move=other)) is placed
    # Whatever the State's instances: the bridge's log holds none.
    bare = State(deployments=state.deployments)
    assert (
        apply(bare, DeploymentRepairPlaced(deployment_id="d", move=MOVE)).deployments["d"].repairing
        == MOVE
    )
    assert apply(state, DeploymentRepairPlaced(deployment_id="x", move=MOVE)) is state


def test_either_instance_deleted_ends_the_repair() -> None:
    placed = apply(with_both(), DeploymentRepairPlaced(deployment_id="d", move=MOVE))
    for instance_id in ("old", "new"):
        after = apply(placed, InstanceDeleted(instance_id=instance_id))
        assert after.deployments["d"].repairing is None
    unrelated = apply(placed, InstanceDeleted(instance_id="other"))
    assert unrelated.deployments["d"].repairing == MOVE


def test_the_mode_changes_in_place() -> None:
    state = with_both()
    changed = apply(state, DeploymentRepairChanged(deployment_id="d", repair="report"))
    assert changed.deployments["d"].repair == "report"
    assert apply(state, DeploymentRepairChanged(deployment_id="x", repair="report")) is state


def test_the_old_instance_takes_no_new_chat_once_the_replacement_is_ready() -> None:
    placed = apply(with_both(), DeploymentRepairPlaced(deployment_id="d", move=MOVE))
    assert instances_leaving(placed) == frozenset()
    runner = next(iter(placed.instances["new"].shard_assignments.node_to_runner.values()))
    ready = apply(placed, RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()))
    assert instances_leaving(ready) == frozenset({"old"})


# --- the backoff's incidents (docs/design.md §5.19) -------------------------------------------


def broken(instance_id: str, *nodes: str, at: float, model: str = "m") -> InstanceFoundBroken:
    return InstanceFoundBroken(
        instance_id=instance_id, model_id=model, node_ids=nodes, problem="stalled", at=at
    )


def incident(instance_id: str, node: str, at: float) -> RepairIncident:
    return RepairIncident(
        model_id="m", node_id=node, instance_id=instance_id, problem="stalled", at=at
    )


def test_an_instance_found_broken_is_an_incident_on_each_of_its_nodes_once() -> None:
    state = apply(with_both(), broken("old", "a", "b", "a", at=10.0))
    assert state.repair_incidents == (incident("old", "a", 10.0), incident("old", "b", 10.0))
    assert apply(state, broken("old", "a", at=20.0)) is state  # found again by a new keeper
    again = apply(state, broken("old", "a", "c", at=20.0))
    assert again.repair_incidents == (*state.repair_incidents, incident("old", "c", 20.0))


def test_an_incident_of_a_model_no_deployment_keeps_changes_nothing() -> None:
    state = with_both()
    assert apply(state, broken("x", "a", at=1.0, model="other")) is state


def test_incidents_are_bounded_per_model_and_node_and_by_the_window() -> None:
    state = with_both()
    for n in range(5):
        state = apply(state, broken(f"i{n}", "a", at=float(n)))
    state = apply(state, broken("j", "b", at=5.0))
    # The last AVOID_AFTER of node a; b's own.
    assert [(i.instance_id, i.node_id) for i in state.repair_incidents] == [
        ("i2", "a"),
        ("i3", "a"),
        ("i4", "a"),
        ("j", "b"),
    ]
    # One at exactly the window after the oldest keeps it; a moment later it goes.
    at_edge = apply(state, broken("k", "c", at=2.0 + INCIDENT_WINDOW_S))
    assert at_edge.repair_incidents[0] == incident("i2", "a", 2.0)
    later = apply(state, broken("k", "c", at=2.5 + INCIDENT_WINDOW_S))
    assert [i.instance_id for i in later.repair_incidents] == ["i3", "i4", "j", "k"]
    assert AVOID_AFTER == 3


def test_expired_incidents_leave_the_state() -> None:
    state = with_both()
    for n, node in enumerate(("a", "b", "c")):
        state = apply(state, broken(f"i{n}", node, at=float(n)))
    assert apply(state, RepairIncidentsExpired(before=0.0)) is state
    kept = apply(state, RepairIncidentsExpired(before=1.0))
    assert [i.instance_id for i in kept.repair_incidents] == ["i1", "i2"]  # at >= before stays
    assert apply(state, RepairIncidentsExpired(before=9.0)).repair_incidents == ()


def test_a_deployment_deleted_takes_its_models_incidents() -> None:
    state = apply(with_both(), broken("old", "a", at=1.0))
    other = Deployment(deployment_id="e", model_card=card("x"))
    state = apply(state, DeploymentCreated(deployment=other))
    state = apply(state, broken("y", "a", at=2.0, model="x"))
    gone = apply(state, DeploymentDeleted(deployment_id="d"))
    assert [i.model_id for i in gone.repair_incidents] == ["x"]
