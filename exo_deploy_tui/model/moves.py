"""The moves under way, as the rows show them: drains (a node's instances moved off it) and
rolling changes (a deployment's instances replaced one at a time with its new options).

Both are in the State, at once, through the event stream: the drains and their moves by node
name, each deployment's rolling change in its options and its ``moving``. Only the keeper says
what a drain has left and why a move is stuck, in ``GET /nodes``; this part keeps the last such
answer (a ``NodesUpdate``) and gives it to a drain only when it is about that drain as the State
holds it (``draining.drain_progress``). The rules are ``draining.py``'s and
``keeper.model.rollout``'s; this part is where the model holds what they need between frames.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from exo_deploy_tui.model.draining import (
    DrainPlan,
    DrainProgress,
    drain_plan,
    drain_progress,
    moving_deployments,
)
from keeper.model.api_models import NodeView
from keeper.model.rollout import update_progress
from keeper.model.state import Deployment, DeploymentId, NodeId, State


class Moves:
    """The drains' last ``GET /nodes`` answer, and the moves the State says are under way."""

    def __init__(self) -> None:
        # The master's GET /nodes as last read, by name (read while a drain is under way); None
        # when the last read failed or none was made.
        self._answer: dict[str, NodeView] | None = None

    def answered(self, nodes: Sequence[NodeView] | None) -> None:
        """``GET /nodes`` was read (None: it could not be)."""
        self._answer = None if nodes is None else {n.name: n for n in nodes}

    def drain_of(self, state: State, name: str) -> DrainProgress | None:
        """The drain of the node called ``name``, while one is under way."""
        drain = state.drains.get(name)
        if drain is None:
            return None
        answer = self._answer.get(name) if self._answer is not None else None
        return drain_progress(drain, answer)

    @staticmethod
    def moving(state: State) -> dict[DeploymentId, str]:
        """Each deployment a drain is moving, and the node it is moving off."""
        return moving_deployments(state) if state.drains else {}

    @staticmethod
    def updating(deployment: Deployment) -> tuple[int, int] | None:
        """A rolling change under way: (instances as the options ask, replicas), or None."""
        return update_progress(deployment)

    @staticmethod
    def plan(state: State, name: str, name_of: Callable[[NodeId], str]) -> DrainPlan:
        """What draining the node called ``name`` would move, and leave alone, now."""
        return drain_plan(state, name, name_of)
