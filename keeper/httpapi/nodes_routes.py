"""The node routes (docs/design.md §5.15): cordon, uncordon, drain, and the nodes' view.

``GET /nodes``, ``POST``/``DELETE /nodes/{node}/cordon`` and ``POST /nodes/{node}/drain``, for
any service whose keeper drains (the master; the rules in ``keeper.runtime.nodes``), written
once over the Protocol a service satisfies, with every refusal it answers declared.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import APIRouter, Body
from fastapi.responses import Response

from keeper.httpapi.app import JSON, command_json
from keeper.httpapi.contract import ok_body, refusals
from keeper.model.api_models import CommandResponse, DrainRequest, NodesResponse

_UNKNOWN = (404, "No node of this name or id")


class NodesService(Protocol):
    """What the node routes call; refusals raise ``keeper.model.refusals`` types."""

    def nodes_view(self) -> NodesResponse: ...
    async def cordon_node(self, node: str) -> CommandResponse: ...
    async def uncordon_node(self, node: str) -> CommandResponse: ...
    async def drain_node(self, node: str, force: bool) -> CommandResponse: ...


def nodes_router(service: NodesService) -> APIRouter:
    router = APIRouter()

    @router.get("/nodes", responses=ok_body(NodesResponse))
    async def list_nodes() -> Response:
        return Response(service.nodes_view().model_dump_json().encode(), media_type=JSON)

    @router.post(
        "/nodes/{node}/cordon",
        responses={**ok_body(CommandResponse), **refusals(_UNKNOWN, 503)},
    )
    async def cordon_node(node: str) -> Response:
        return command_json(await service.cordon_node(node))

    @router.delete(
        "/nodes/{node}/cordon",
        responses={**ok_body(CommandResponse), **refusals(_UNKNOWN, 503)},
    )
    async def uncordon_node(node: str) -> Response:
        return command_json(await service.uncordon_node(node))

    @router.post(
        "/nodes/{node}/drain",
        responses={**ok_body(CommandResponse), **refusals(_UNKNOWN, 503)},
    )
    async def drain_node(
        node: str, request: Annotated[DrainRequest | None, Body()] = None
    ) -> Response:
        force = request.force if request is not None else False
        return command_json(await service.drain_node(node, force))

    return router
