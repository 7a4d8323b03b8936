"""Apply's rules for a repair (docs/design.md §5.19): one replacement per deployment at a time, of
an instance the State shows; either instance's deletion ends it; the mode changes in place; a
repair's old instance takes no new chat once its replacement is ready."""

from __future__ import annotations

from keeper_harness import build_instance, card

from keeper.model.apply import apply
from keeper.model.events import (
    DeploymentCreated,
    DeploymentRepairChanged,
    DeploymentRepairPlaced,
    InstanceCreated,
    InstanceDeleted,
    RunnerStatusUpdated,
)
from keeper.model.readiness import instances_leaving
from keeper.model.state import Deployment, InstanceMove, RunnerReady, State

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
