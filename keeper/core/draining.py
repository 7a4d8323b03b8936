"""What a drain has left to do on its node, and where a moved instance may go (pure).

A drain moves the keeper's instances off a node make-before-break (docs/design.md §5.15): a
replacement is placed elsewhere, the old instance is deleted once the replacement is ready, one
instance per deployment at a time. The keeper (``keeper.core.keeper``) decides when; this
module reads the State for it: which instances still use the draining node and who placed
them (``drain_picture``), and the State a replacement is placed on (``replacement_view``):
without the cordoned and draining nodes and, for anti-affinity, without the nodes of the
model's *other* instances — the instance being moved may share nodes with its replacement, as
it is about to go.

An instance the keeper did not place (by hand, through exo's own API) is never moved: the drain
lists it and leaves it alone unless forced.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper.core.view import node_names, without_nodes
from keeper.model.rollout import options_words
from keeper.model.state import (
    Deployment,
    DeploymentId,
    InstanceId,
    InstanceMove,
    NodeDrain,
    State,
    cordoned_nodes,
    instances_on,
    keeper_placements,
    nodes_named,
)


@dataclass(frozen=True)
class DrainPicture:
    """A draining node as the State shows it."""

    moving: tuple[InstanceMove, ...]  # moves under way
    # The keeper's instances on the node with no move under way, by deployment, in id order.
    to_move: tuple[tuple[DeploymentId, InstanceId], ...]
    unmanaged: tuple[InstanceId, ...]  # instances on the node the keeper did not place

    @property
    def empty(self) -> bool:
        """Nothing uses the node any more: the drain is done."""
        return not (self.moving or self.to_move or self.unmanaged)


def drain_picture(state: State, drain: NodeDrain) -> DrainPicture:
    on_node = instances_on(state, nodes_named(state, drain.node))
    owner = keeper_placements(state)
    moving_old = {move.old_instance_id for move in drain.moves}
    moving_deployments = {move.deployment_id for move in drain.moves}
    to_move = sorted(
        (owner[instance_id], instance_id)
        for instance_id in on_node
        if instance_id in owner
        and instance_id not in moving_old
        and owner[instance_id] not in moving_deployments
    )
    unmanaged = tuple(i for i in on_node if i not in owner)
    return DrainPicture(drain.moves, tuple(to_move), unmanaged)


def replacement_view(state: State, old_instance_id: InstanceId) -> State:
    """The State a replacement for ``old_instance_id`` is placed on: without the cordoned (and
    draining) nodes and without the nodes of the model's other instances."""
    old = state.instances[old_instance_id]
    model_id = old.shard_assignments.model_id
    others = frozenset(
        node
        for instance_id, instance in state.instances.items()
        if instance_id != old_instance_id and instance.shard_assignments.model_id == model_id
        for node in instance.shard_assignments.node_to_runner
    )
    return without_nodes(state, others | cordoned_nodes(state))


def stuck_note(state: State, drain: NodeDrain, old_instance_id: InstanceId, reason: str) -> str:
    """Why a drain cannot move an instance, in the placement's own numbers, naming the nodes
    left out and why."""
    model_id = state.instances[old_instance_id].shard_assignments.model_id
    left_out = _left_out(state, old_instance_id)  # the draining node is one of the cordoned
    return f"cannot move {model_id} off {drain.node} ({'; '.join(left_out)}): {reason}"


def update_stuck_note(
    state: State, deployment: Deployment, old_instance_id: InstanceId, reason: str
) -> str:
    """Why a rolling change cannot replace an instance, in the placement's own numbers, naming
    the nodes left out and why (as for a drain)."""
    left_out = _left_out(state, old_instance_id)
    where = f" ({'; '.join(left_out)})" if left_out else ""
    options = options_words(deployment)
    return f"cannot replace instance {old_instance_id} with {options}{where}: {reason}"


def _left_out(state: State, old_instance_id: InstanceId) -> list[str]:
    """The nodes a replacement for ``old_instance_id`` may not use, and why, in words: the
    cordoned ones, and those serving the model already (``replacement_view``)."""
    cordoned = cordoned_nodes(state)
    serving = frozenset(without_nodes(state, cordoned).topology.nodes) - frozenset(
        replacement_view(state, old_instance_id).topology.nodes
    )
    left_out = [f"cordoned: {node_names(state, cordoned)}"] if cordoned else []
    if serving:
        left_out.append(f"serving it already: {node_names(state, serving)}")
    return left_out
