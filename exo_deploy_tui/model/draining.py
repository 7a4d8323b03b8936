"""Cordons and drains as the dashboard reads them (pure): which deployments are being moved,
how far each drain has got, and what a drain would move.

The State says which nodes are cordoned and which drain (both by friendly name, as the master
keys them) and the moves under way, and it says so at once, through the event stream. What a
drain has left, and above all why a move is stuck, the keeper says only in ``GET /nodes``
(``NodesResponse``), which the app reads while a drain is under way: the progress here takes an
answer for a drain only if it is about the drain the State holds now (the same start and the
same moves), so an answer from before the drain began, or from before its latest move (it is
asked again at once, one round trip behind), never speaks for it.

Who placed an instance decides whether a drain moves it: the keeper moves the instances it
placed (``Deployment.placed_instance_ids``) and leaves the others alone unless forced, so the
drain confirm (``drain_plan``) reads the same field the keeper does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from keeper.model.api_models import NodeView
from keeper.model.state import (
    DeploymentId,
    InstanceId,
    NodeDrain,
    NodeId,
    State,
    instances_on,
    keeper_placements,
    nodes_named,
)
from keeper.model.state import node_name as master_name


@dataclass(frozen=True)
class DrainProgress:
    """A drain under way: its moves, and what ``GET /nodes`` last said it has left."""

    moving: int  # moves under way (a replacement placed, the old instance not yet deleted)
    to_move: int | None  # the keeper's instances still to move; None until GET /nodes says
    left_alone: int | None  # instances the keeper did not place, which the drain leaves alone
    stuck: str | None  # the keeper's reason a move cannot be placed, if it said one
    force: bool = False


@dataclass(frozen=True)
class PlannedInstance:
    instance_id: InstanceId
    model_id: str
    nodes: tuple[str, ...]  # the names of all its nodes


@dataclass(frozen=True)
class DrainPlan:
    """What draining a node would do with the instances on it now."""

    moved: tuple[PlannedInstance, ...]  # the keeper's: each gets a replacement elsewhere first
    left_alone: tuple[PlannedInstance, ...]  # placed some other way: they keep running


def handle_of(state: State, node_id: NodeId) -> str:
    """What the master calls a node in cordons and drains: its friendly name, else its id."""
    return master_name(state, node_id)


def moving_deployments(state: State) -> dict[DeploymentId, str]:
    """Each deployment with a move under way, and the node it is moving off."""
    return {
        move.deployment_id: name for name, drain in state.drains.items() for move in drain.moves
    }


def drain_progress(drain: NodeDrain, answer: NodeView | None) -> DrainProgress:
    """The drain as the State says it, with what ``answer`` (the node in ``GET /nodes``) adds
    when it is about this drain as it stands."""
    view = answer.drain if answer is not None else None
    if view is None or view.started != drain.started or tuple(view.moving) != drain.moves:
        return DrainProgress(len(drain.moves), None, None, None, drain.force)
    return DrainProgress(
        moving=len(view.moving),
        to_move=len(view.to_move),
        left_alone=len(view.unmanaged),
        stuck=view.stuck,
        force=drain.force,
    )


def progress_words(progress: DrainProgress) -> str:
    """``draining · 1 moving, 2 to move``, and what is left alone."""
    head = "draining (forced)" if progress.force else "draining"
    parts = [f"{progress.moving} moving"]
    if progress.to_move is not None:
        parts.append(f"{progress.to_move} to move")
    if progress.left_alone:
        parts.append(f"{progress.left_alone} not the keeper's (left alone)")
    return f"{head} · {', '.join(parts)}"


def drain_plan(state: State, name: str, name_of: Callable[[NodeId], str]) -> DrainPlan:
    """What a drain of the node called ``name`` would move and leave alone, as of ``state``."""
    owned = keeper_placements(state)
    moved: list[PlannedInstance] = []
    left_alone: list[PlannedInstance] = []
    for instance_id in instances_on(state, nodes_named(state, name)):
        instance = state.instances[instance_id]
        on = instance.shard_assignments.node_to_runner
        planned = PlannedInstance(
            instance_id, instance.shard_assignments.model_id, tuple(name_of(n) for n in on)
        )
        (moved if instance_id in owned else left_alone).append(planned)
    return DrainPlan(tuple(moved), tuple(left_alone))
