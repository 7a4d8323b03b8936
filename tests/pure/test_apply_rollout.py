"""A rolling change in the State (docs/design.md §5.16): what DeploymentOptionsChanged,
DeploymentReplacementPlaced and InstanceDeleted do to a deployment's ``replacing`` and
``moving``."""

from __future__ import annotations

from keeper_harness import build_instance, card

from keeper.model.apply import apply
from keeper.model.events import (
    DeploymentCreated,
    DeploymentOptionsChanged,
    DeploymentPlaced,
    DeploymentReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.state import Deployment, InstanceMeta, InstanceMove, Sharding, State

MOVE = InstanceMove(deployment_id="d", old_instance_id="i1", new_instance_id="j")


def placed_state() -> State:
    state = State()
    m = card("m")
    events = [
        DeploymentCreated(deployment=Deployment(deployment_id="d", model_card=m, replicas=2)),
        InstanceCreated(instance=build_instance(m, ["a", "b"], "i1")),
        InstanceCreated(instance=build_instance(m, ["c", "e"], "i2")),
        DeploymentPlaced(deployment_id="d", instance_id="i1"),
        DeploymentPlaced(deployment_id="d", instance_id="i2"),
        DeploymentOptionsChanged(
            deployment_id="d",
            sharding=Sharding.TENSOR,
            instance_meta=InstanceMeta.MLX_JACCL,
            min_nodes=2,
            replace=("i1", "i2"),
        ),
    ]
    for event in events:
        state = apply(state, event)
    return state


def test_the_change_sets_the_options_and_what_it_replaces_and_clears_the_error() -> None:
    state = placed_state()
    deployment = state.deployments["d"]
    refused = deployment.model_copy(update={"placement_error": "no room"})
    before = state.model_copy(update={"deployments": {"d": refused}})
    change = DeploymentOptionsChanged(
        deployment_id="d",
        sharding=Sharding.TENSOR,
        instance_meta=InstanceMeta.MLX_JACCL,
        min_nodes=2,
        replace=("i1", "i2"),
    )
    assert apply(before, change).deployments["d"].placement_error is None
    assert (deployment.sharding, deployment.instance_meta, deployment.min_nodes) == (
        Sharding.TENSOR,
        InstanceMeta.MLX_JACCL,
        2,
    )
    assert deployment.replacing == ("i1", "i2") and deployment.moving is None
    # An unknown deployment: nothing.
    other = DeploymentOptionsChanged(
        deployment_id="x",
        sharding=Sharding.TENSOR,
        instance_meta=InstanceMeta.MLX_RING,
        min_nodes=1,
    )
    assert apply(state, other) is state


def test_a_replacement_takes_its_instance_off_the_list_and_one_at_a_time() -> None:
    state = apply(placed_state(), DeploymentReplacementPlaced(deployment_id="d", move=MOVE))
    deployment = state.deployments["d"]
    assert deployment.moving == MOVE and deployment.replacing == ("i2",)
    second = MOVE.model_copy(update={"old_instance_id": "i2", "new_instance_id": "k"})
    assert apply(state, DeploymentReplacementPlaced(deployment_id="d", move=second)) is state
    # Of an instance not on the list, or of an unknown deployment: nothing.
    fresh = placed_state()
    stray = MOVE.model_copy(update={"old_instance_id": "zz"})
    assert apply(fresh, DeploymentReplacementPlaced(deployment_id="d", move=stray)) is fresh
    assert apply(fresh, DeploymentReplacementPlaced(deployment_id="x", move=MOVE)) is fresh


def test_the_move_ends_with_the_old_instance_and_a_lost_replacement_puts_it_back_first() -> None:
    moving = apply(placed_state(), DeploymentReplacementPlaced(deployment_id="d", move=MOVE))
    done = apply(moving, InstanceDeleted(instance_id="i1")).deployments["d"]
    assert done.moving is None and done.replacing == ("i2",)
    lost = apply(moving, InstanceDeleted(instance_id="j")).deployments["d"]
    assert lost.moving is None and lost.replacing == ("i1", "i2")
    gone = apply(placed_state(), InstanceDeleted(instance_id="i2")).deployments["d"]
    assert gone.replacing == ("i1",) and gone.placed_instance_ids == ("i1",)


def test_a_change_while_a_move_runs_leaves_the_moving_instance_to_its_move() -> None:
    moving = apply(placed_state(), DeploymentReplacementPlaced(deployment_id="d", move=MOVE))
    again = DeploymentOptionsChanged(
        deployment_id="d",
        sharding=Sharding.PIPELINE,
        instance_meta=InstanceMeta.MLX_RING,
        min_nodes=3,
        replace=("i1", "i2", "j"),
    )
    deployment = apply(moving, again).deployments["d"]
    assert deployment.replacing == ("i2", "j") and deployment.moving == MOVE
    assert deployment.min_nodes == 3
