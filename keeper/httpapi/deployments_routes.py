"""The deployments routes (docs/design.md §7.2), for any service that keeps deployments: the master
(``keeper.master.service``) and the bridge (``keeper.bridge.service``).

Both answer ``POST /deployments``, ``GET /deployments`` and ``DELETE /deployments/{id}`` with the
same shapes (``keeper.api_models``), so the TUI and ``exo-deploy list/deploy/undeploy`` work
against either unchanged; the routes are written once, over the small Protocol both satisfy.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter
from fastapi.responses import Response

from keeper.api_models import CommandResponse, CreateDeploymentRequest
from keeper.httpapi.app import JSON, command_json
from keeper.state import InstanceMeta, Sharding


class DeploymentsService(Protocol):
    """What the deployments routes call; refusals raise ``keeper.runtime.errors`` types."""

    async def create_deployment(
        self, model_id: str, sharding: Sharding, instance_meta: InstanceMeta, min_nodes: int
    ) -> CommandResponse: ...

    async def delete_deployment(self, deployment_id: str) -> CommandResponse: ...

    def deployments_json(self) -> bytes:
        """The ``GET /deployments`` body (a ``DeploymentsResponse``)."""
        ...


def deployments_router(service: DeploymentsService) -> APIRouter:
    router = APIRouter()

    @router.post("/deployments")
    async def create_deployment(request: CreateDeploymentRequest) -> Response:
        return command_json(
            await service.create_deployment(
                request.model_id, request.sharding, request.instance_meta, request.min_nodes
            )
        )

    @router.get("/deployments")
    async def list_deployments() -> Response:
        return Response(service.deployments_json(), media_type=JSON)

    @router.delete("/deployments/{deployment_id}")
    async def delete_deployment(deployment_id: str) -> Response:
        return command_json(await service.delete_deployment(deployment_id))

    return router
