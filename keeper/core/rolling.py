"""A rolling change's kind of move (docs/design.md §5.16): the instances a deployment placed
with options it no longer has, replaced make-before-break by the moves' part
(``keeper.core.moves``).

Which instances is judged once, when the change is made, and carried by the State
(``Deployment.replacing``, ``keeper.model.rollout``); the move under way is the deployment's
``moving``. So this kind only reads the State, for the deployments the keeper says have a
change under way (``RollingMoves.deployments``: kept by the keeper from one step to the next, as
the steady step must not look through every deployment, docs/design.md §5.9). A deployment
short of instances waits: its recovery already places with the new options.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from keeper.core.moves import Candidate, MoveKind
from keeper.model.events import AnyEvent, DeploymentReplacementPlaced
from keeper.model.rollout import options_words
from keeper.model.state import DeploymentId, InstanceMove, State


@dataclass(frozen=True)
class RollingMoves(MoveKind):
    """The rolling changes of ``deployments`` (in id order, none being deleted)."""

    deployments: Sequence[DeploymentId]
    name = "rolling"
    waits_while_short = True

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        for deployment_id in self.deployments:
            moving = state.deployments[deployment_id].moving
            if moving is not None:
                yield moving

    def candidates(self, state: State) -> Iterable[Candidate]:
        for deployment_id in self.deployments:
            deployment = state.deployments[deployment_id]
            if deployment.moving is not None:
                continue
            # The first still to replace that the State shows (on the bridge, exo's State may
            # drop one a moment before the bridge's log records its deletion).
            old = next((i for i in deployment.replacing if i in state.instances), None)
            if old is not None:
                yield Candidate(deployment_id, old, scope=deployment_id)

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        return DeploymentReplacementPlaced(deployment_id=candidate.deployment_id, move=move)

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        """Why a rolling change cannot replace an instance, in the placement's own numbers,
        naming the nodes left out and why (as for a drain)."""
        where = f" ({'; '.join(left_out)})" if left_out else ""
        options = options_words(state.deployments[candidate.deployment_id])
        return f"cannot replace instance {candidate.old} with {options}{where}: {why}"


def rolling_deployments(state: State) -> tuple[DeploymentId, ...]:
    """The deployments with an instance still to replace or a replacement under way, in id
    order."""
    return tuple(
        deployment_id
        for deployment_id, deployment in sorted(state.deployments.items())
        if deployment.replacing or deployment.moving is not None
    )
