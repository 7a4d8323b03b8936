"""A drain's kind of move: what a drain has left to do on its node (pure).

A drain moves the keeper's instances off a node make-before-break (docs/design.md §5.15). How a
move runs (its replacement's placement, settling, one per deployment, the words of a move that
does not fit) is the moves' part, ``keeper.core.moves``; this module is the drain's kind of move
(``DrainMoves``): it reads the State for which instances still use a draining node and who
placed them (``drain_picture``), in the drain's words, and says when a drain is done
(``drains_ended``).

An instance the keeper did not place (by hand, through exo's own API) is never moved: the drain
lists it and leaves it alone unless forced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from keeper.core.moves import Candidate, MoveKind
from keeper.model.events import AnyEvent, DrainReplacementPlaced
from keeper.model.state import (
    DeploymentId,
    InstanceId,
    InstanceMove,
    NodeDrain,
    State,
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


class DrainMoves(MoveKind):
    """A drain's moves (``keeper.core.moves``): the keeper's instances on each draining node,
    drains in name order; a forced drain deletes what cannot be moved and what the keeper did
    not place."""

    name = "drain"

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        return [move for _, drain in sorted(state.drains.items()) for move in drain.moves]

    def candidates(self, state: State) -> Iterable[Candidate]:
        for name, drain in sorted(state.drains.items()):
            for deployment_id, old in drain_picture(state, drain).to_move:
                yield Candidate(deployment_id, old, scope=name, force=drain.force)

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        return DrainReplacementPlaced(name=candidate.scope, move=move)

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        """Why a drain cannot move an instance, in the placement's own numbers, naming the
        nodes left out and why (the draining node is one of the cordoned)."""
        model_id = state.instances[candidate.old].shard_assignments.model_id
        return f"cannot move {model_id} off {candidate.scope} ({'; '.join(left_out)}): {why}"

    def doomed(self, state: State) -> Iterable[InstanceId]:
        for _, drain in sorted(state.drains.items()):
            if drain.force:
                yield from drain_picture(state, drain).unmanaged


DRAINS = DrainMoves()


def drains_ended(state: State) -> list[str]:
    """The draining nodes nothing uses any more, in name order: their drains are done."""
    return [
        name for name, drain in sorted(state.drains.items()) if drain_picture(state, drain).empty
    ]
