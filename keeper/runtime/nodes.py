"""Cordons and drains as the services offer them: naming a node, the commands, the view.

The master and the bridge take the same commands (``POST``/``DELETE /nodes/{node}/cordon``,
``POST /nodes/{node}/drain``, ``GET /nodes``) and hand them to the keeper, which returns the
events (``keeper.core.keeper``); this module holds what both do around that, once: reading the
operator's NODE (a friendly name or a node id) as the name cordons are keyed by, refusing one the
cluster does not know (404 naming it and the names it does know), and building the views.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from keeper.core.draining import drain_picture
from keeper.model.api_models import CommandResponse, DrainView, NodesResponse, NodeView
from keeper.model.events import AnyEvent
from keeper.model.ids import IdFactory, new_id
from keeper.model.liveness import Phase, watched_liveness
from keeper.model.refusals import ConflictError, NotFoundError
from keeper.model.state import (
    NodeDrain,
    NodeId,
    State,
    cordoned_nodes,
    node_name,
    nodes_named,
)


class DrainsKeeper(Protocol):
    """What the node commands need of a keeper (``keeper.core.keeper.Keeper``)."""

    def cordon(self, name: str, state: State) -> list[AnyEvent]: ...
    def uncordon(self, name: str, state: State) -> list[AnyEvent]: ...
    def drain(self, name: str, force: bool, when: str, state: State) -> list[AnyEvent]: ...
    def drain_note(self, name: str) -> str | None: ...


def node_name_for(state: State, node: str) -> str:
    """The name an operator's NODE stands for: a node id's friendly name, a friendly name the
    cluster knows, or one cordoned while its node is away; NotFoundError otherwise."""
    if node in state.topology.nodes:
        return node_name(state, node)
    named = nodes_named(state, node)
    handles = sorted({node_name(state, n) for n in named})
    if len(named) > 1 and node not in handles:
        # A friendly name several nodes share (docs/design.md §5.15): which one is meant?
        raise ConflictError(
            f"{len(named)} nodes are named {node!r}: {', '.join(handles)}; name one of them",
            param="node",
        )
    if named or node in state.cordoned or node in state.drains:
        return node
    known = sorted({node_name(state, n) for n in state.topology.nodes} | set(state.cordoned))
    raise NotFoundError(
        f"No node {node!r} in the cluster (known: {', '.join(known) or 'none'}); "
        "name a node by its friendly name or its id",
        param="node",
    )


# The phases, the furthest gone last: a name held by two nodes shows the worse.
_PHASE_ORDER: tuple[Phase, ...] = ("alive", "suspect", "dead", "gone")


def nodes_response(
    state: State,
    keeper: DrainsKeeper,
    silent_s: Callable[[NodeId], float | None] = lambda _node: None,
) -> NodesResponse:
    """Every node by name, with its cordon and drain, its liveness (``State.node_watch``) and
    how long it has been silent (``silent_s``, the service's own measure); names cordoned while
    away included."""
    handles = {node_name(state, n) for n in state.topology.nodes}
    cordoned = cordoned_nodes(state)
    # A cordon recorded by a name the nodes now go by otherwise shows on their rows.
    away = {name for name in state.cordoned if not nodes_named(state, name)}
    names = sorted(handles | away)
    views: list[NodeView] = []
    for name in names:
        node_ids = sorted(nodes_named(state, name))
        present = [n for n in node_ids if n in state.topology.nodes]
        phases: list[Phase] = [watched_liveness(state, n) for n in present] or ["gone"]
        silences = [s for n in present if (s := silent_s(n)) is not None]
        views.append(
            NodeView(
                name=name,
                node_ids=node_ids,
                cordoned=name in state.cordoned or not cordoned.isdisjoint(node_ids),
                drain=_drain_view(state, drain, keeper.drain_note(name))
                if (drain := state.drains.get(name)) is not None
                else None,
                liveness=max(phases, key=_PHASE_ORDER.index),
                silent_s=round(max(silences), 1) if silences else None,
            )
        )
    return NodesResponse(nodes=views)


def _drain_view(state: State, drain: NodeDrain, stuck: str | None) -> DrainView:
    picture = drain_picture(state, drain)
    return DrainView(
        force=drain.force,
        started=drain.started,
        moving=list(picture.moving),
        to_move=[instance_id for _, instance_id in picture.to_move],
        unmanaged=list(picture.unmanaged),
        stuck=stuck,
    )


def node_command_response(
    name: str, done: str, unchanged: str, events: list[AnyEvent], new_id_: IdFactory = new_id
) -> CommandResponse:
    """The answer to a node command: what was done, or that it already was."""
    message = f"Node {name} {done}" if events else f"Node {name} {unchanged}"
    return CommandResponse(message=message, command_id=new_id_())
