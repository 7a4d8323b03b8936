"""Cordons and drains as the services offer them: naming a node, the commands, the view.

The master and the bridge take the same commands (``POST``/``DELETE /nodes/{node}/cordon``,
``POST /nodes/{node}/drain``, ``GET /nodes``) and hand them to the keeper, which returns the
events (``keeper.core.keeper``); this module holds what both do around that, once: reading the
operator's NODE (a friendly name or a node id) as the name cordons are keyed by, refusing one the
cluster does not know (404 naming it and the names it does know), and building the views.
"""

from __future__ import annotations

from typing import Protocol

from keeper.core.draining import drain_picture
from keeper.model.api_models import CommandResponse, DrainView, NodesResponse, NodeView
from keeper.model.events import AnyEvent
from keeper.model.ids import IdFactory, new_id
from keeper.model.refusals import NotFoundError
from keeper.model.state import NodeDrain, State, node_name, nodes_named


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
    if nodes_named(state, node) or node in state.cordoned or node in state.drains:
        return node
    known = sorted({node_name(state, n) for n in state.topology.nodes} | set(state.cordoned))
    raise NotFoundError(
        f"No node {node!r} in the cluster (known: {', '.join(known) or 'none'}); "
        "name a node by its friendly name or its id",
        param="node",
    )


def nodes_response(state: State, keeper: DrainsKeeper) -> NodesResponse:
    """Every node by name, with its cordon and drain; names cordoned while away included."""
    names = sorted({node_name(state, n) for n in state.topology.nodes} | set(state.cordoned))
    return NodesResponse(
        nodes=[
            NodeView(
                name=name,
                node_ids=sorted(nodes_named(state, name)),
                cordoned=name in state.cordoned,
                drain=_drain_view(state, drain, keeper.drain_note(name))
                if (drain := state.drains.get(name)) is not None
                else None,
            )
            for name in names
        ]
    )


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
