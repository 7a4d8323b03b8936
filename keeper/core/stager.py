"""The keeper's staging memory and pace: each deployment's standby plan, what it was computed
on, and the copies asked for (docs/design.md §5.12).

The plans themselves are pure functions (``keeper.core.staging``); what the State cannot show
is kept here, apart from the keeper's placements: a plan is computed again only when what it
reads changed (the cluster's signature, the nodes serving the model, the standby count), for
at most ``MAX_STAGING_PLANS_PER_STEP`` deployments per step, and staging runs at most once per
``STAGING_INTERVAL``. The keeper decides *when* it runs (at rest: placing comes first).
"""

from __future__ import annotations

import math
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from keeper.core.placement import PlaceFn
from keeper.core.staging import StagingPlan, downloading_nodes, staging_plan, staging_requests
from keeper.core.view import ClusterSignature, cluster_signature, nodes_serving
from keeper.model.events import AnyEvent
from keeper.model.state import DeploymentId, NodeId, State

# Staging asks at most this often: downloads take minutes, and a plan costs placements.
STAGING_INTERVAL = 5.0
# Staging plans computed again in one step at most (each is up to ``standby`` placements).
MAX_STAGING_PLANS_PER_STEP = 4


@dataclass
class _Staging:
    """A deployment's staging plan, the inputs it was computed on, and when each copy was
    asked for (node -> keeper time)."""

    key: tuple[ClusterSignature, frozenset[NodeId], int]
    plan: StagingPlan
    requested: dict[NodeId, float]


class Stager:
    """Staging's memory (module doc); ``preview`` is the placement a plan asks where a replica
    would fail over to."""

    def __init__(self, preview: PlaceFn) -> None:
        self.preview = preview
        self._staging: dict[DeploymentId, _Staging] = {}
        # Staging runs at rest, at most once per STAGING_INTERVAL of the keeper's clock.
        self._next_at = -math.inf

    def due(self, now: float) -> bool:
        """Whether staging may run at ``now`` (its interval has passed)."""
        return now >= self._next_at

    def step(self, state: State, deleting: Container[DeploymentId], now: float) -> list[AnyEvent]:
        """Ask for the standby copies the deployments' plans call for, none being deleted."""
        self._next_at = now + STAGING_INTERVAL
        signature = cluster_signature(state)
        busy = downloading_nodes(state)
        planned = 0
        events: list[AnyEvent] = []
        for deployment_id, deployment in sorted(state.deployments.items()):
            if deployment_id in deleting:
                continue
            serving = nodes_serving(state, deployment.model_card.model_id)
            key = (signature, serving, deployment.standby)
            staging = self._staging.get(deployment_id)
            if (staging is None or staging.key != key) and planned < MAX_STAGING_PLANS_PER_STEP:
                planned += 1
                plan = staging_plan(state, deployment, self.preview)
                requested = {} if staging is None else staging.requested
                staging = _Staging(key, plan, requested)
                self._staging[deployment_id] = staging
            if staging is None:
                continue  # planned at a later step: this one has planned its share
            # (A plan left stale by the cap still asks: what it asks for was right a step ago.)
            asks = staging_requests(state, deployment, staging.plan, staging.requested, busy, now)
            for ask in asks:
                staging.requested[ask.node_id] = now
            events.extend(asks)
        return events

    def note(self, deployment_id: str) -> str | None:
        """Why the deployment has fewer standby sets planned than it asks for, or None."""
        staging = self._staging.get(deployment_id)
        return None if staging is None else staging.plan.shortfall

    def asked(self, deployment_id: str) -> Iterable[NodeId]:
        """The nodes a copy was asked of for the deployment (their record may be on its way)."""
        staging = self._staging.get(deployment_id)
        return staging.requested if staging is not None else ()

    def forget_departed(self, live: Mapping[DeploymentId, object]) -> None:
        """Drop the plans of deployments the State no longer holds, so memory cannot grow.
        (Rebuilt only when one departed: at rest, every step would copy every plan.)"""
        if not self._staging.keys() <= live.keys():  # pragma: no mutate (rebuilding: the same)
            self._staging = {d: plan for d, plan in self._staging.items() if d in live}
