"""A new instance of a deployment's model, apart: the one rule for where a replica may go.

The keeper (``keeper.core.keeper``) and what-if (``keeper.core.whatif``) both place a
deployment's next instance the same way: on the State without the nodes already serving the
model (anti-affinity, docs/design.md §5.11) and without the cordoned ones (§5.15), and when
that fails they say so in the same words, which the deployment's ``placementError`` shows. So
the rule and its wording live here once.
"""

from __future__ import annotations

from keeper.core.placement import PlaceFn
from keeper.core.view import node_names, without_nodes
from keeper.model.state import AnyInstance, Deployment, NodeId, State


def place_apart(
    place: PlaceFn,
    state: State,
    deployment: Deployment,
    serving: frozenset[NodeId],
    cordoned: frozenset[NodeId],
    watched: frozenset[NodeId] = frozenset(),
) -> AnyInstance:
    """One more instance of the deployment's model off ``serving``, ``cordoned`` and
    ``watched`` (nodes suspect or confirmed dead, docs/design.md §5.18); a refusal is ValueError
    in the keeper's words (naming the nodes left out and why). Anything else placement raises
    is passed on: a bug, not a reason."""
    try:
        return place(
            without_nodes(state, serving | cordoned | watched),
            deployment.model_card,
            deployment.sharding,
            deployment.instance_meta,
            deployment.min_nodes,
        )
    except ValueError as reason:
        error = str(reason)
        if serving:
            model_id = deployment.model_card.model_id
            names = node_names(state, serving)
            error = f"no placement apart from the nodes serving {model_id} ({names}): {error}"
        if cordoned:
            error = f"{error} (cordoned, left out: {node_names(state, cordoned)})"
        if watched:
            error = f"{error} (suspect or dead, left out: {node_names(state, watched)})"
        raise ValueError(error) from None
