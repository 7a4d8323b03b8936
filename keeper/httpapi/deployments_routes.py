"""The deployments routes (docs/design.md §7.2), for any service that keeps deployments: the master
(``keeper.sim.master.service``) and the bridge (``keeper.bridge.service``).

Both answer ``POST /deployments``, ``GET /deployments``, ``PATCH /deployments/{id}`` (replicas,
standby, priority, preempt, repair), ``POST /instances/{id}/repair``, ``DELETE
/deployments/{id}`` and ``GET /deployments/{id}/history`` with the same shapes
(``keeper.model.api_models``), so the TUI and ``exo-deploy list/deploy/scale/set/undeploy``
work against either unchanged; the routes are written once, over the small Protocol both
satisfy, and so is their contract: each declares its body and every refusal either service
answers.
"""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import APIRouter, Query
from fastapi.responses import Response

from keeper.httpapi.app import JSON, command_json
from keeper.httpapi.contract import ok_body, refusals
from keeper.model.api_models import (
    DEFAULT_HISTORY_HOURS,
    MAX_HISTORY_HOURS,
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentHistoryResponse,
    DeploymentsResponse,
    ScaleDeploymentRequest,
)
from keeper.model.state import DEFAULT_PRIORITY, InstanceMeta, RepairMode, Sharding


class DeploymentsService(Protocol):
    """What the deployments routes call; refusals raise ``keeper.model.refusals`` types."""

    async def create_deployment(
        self,
        model_id: str,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
        replicas: int,
        standby: int = 1,
        priority: int = DEFAULT_PRIORITY,
        preempt: bool = False,
        repair: RepairMode = "auto",
    ) -> CommandResponse: ...

    async def delete_deployment(self, deployment_id: str) -> CommandResponse: ...

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse: ...

    async def set_standby(self, deployment_id: str, standby: int) -> CommandResponse: ...

    async def set_priority(
        self, deployment_id: str, priority: int | None, preempt: bool | None
    ) -> CommandResponse:
        """Set the deployment's priority and preempt flag (each left as it is when None)."""
        ...

    async def set_options(
        self,
        deployment_id: str,
        sharding: Sharding | None,
        instance_meta: InstanceMeta | None,
        min_nodes: int | None,
    ) -> CommandResponse:
        """A rolling change of the deployment's placement options (each as it is when None)."""
        ...

    async def set_repair(self, deployment_id: str, repair: RepairMode) -> CommandResponse:
        """Set what the keeper does with a broken instance of the deployment."""
        ...

    async def repair_instance(self, instance_id: str) -> CommandResponse:
        """Replace ``instance_id`` now, whatever its deployment's ``repair`` (the operator
        said so): ``exo-deploy repair ID``."""
        ...

    def deployments_json(self) -> bytes:
        """The ``GET /deployments`` body (a ``DeploymentsResponse``)."""
        ...

    def history(self, deployment_id: str, hours: float) -> DeploymentHistoryResponse:
        """The deployment's last ``hours`` (``keeper.runtime.deployments.history_response``)."""
        ...


def deployments_router(service: DeploymentsService) -> APIRouter:
    router = APIRouter()

    @router.post(
        "/deployments",
        responses={
            **ok_body(CommandResponse),
            **refusals(
                (400, "Cannot work: min_nodes above the model's layer count"),
                (404, "No such model in the catalog"),
                (409, "The model already has a deployment (the message names it)"),
                503,
            ),
        },
    )
    async def create_deployment(request: CreateDeploymentRequest) -> Response:
        return command_json(
            await service.create_deployment(
                request.model_id,
                request.sharding,
                request.instance_meta,
                request.min_nodes,
                request.replicas,
                request.standby,
                request.priority,
                request.preempt,
                repair=request.repair,
            )
        )

    @router.get(
        "/deployments",
        responses={**ok_body(DeploymentsResponse), **refusals((503, "Not running yet"))},
    )
    async def list_deployments() -> Response:
        return Response(service.deployments_json(), media_type=JSON)

    @router.get(
        "/deployments/{deployment_id}/history",
        responses={
            **ok_body(DeploymentHistoryResponse),
            **refusals((404, "No deployment with this id"), (503, "Not running yet")),
        },
    )
    async def deployment_history(
        deployment_id: str,
        hours: Annotated[
            float,
            Query(
                gt=0,
                le=MAX_HISTORY_HOURS,
                allow_inf_nan=False,
                description="How many hours back from now (at most 720: 30 days)",
            ),
        ] = DEFAULT_HISTORY_HOURS,
    ) -> Response:
        history = service.history(deployment_id, hours)
        return Response(history.model_dump_json().encode(), media_type=JSON)

    @router.patch(
        "/deployments/{deployment_id}",
        responses={
            **ok_body(CommandResponse),
            **refusals(
                (404, "No deployment with this id"),
                (422, "Options the model cannot take (the field named)"),
                503,
            ),
        },
    )
    async def scale_deployment(deployment_id: str, request: ScaleDeploymentRequest) -> Response:
        answers: list[CommandResponse] = []
        # The options first: the one setting the model may refuse (422), before any other
        # setting of the request has changed anything.
        if (request.sharding, request.instance_meta, request.min_nodes) != (None, None, None):
            answers.append(
                await service.set_options(
                    deployment_id, request.sharding, request.instance_meta, request.min_nodes
                )
            )
        if request.standby is not None:
            answers.append(await service.set_standby(deployment_id, request.standby))
        if request.priority is not None or request.preempt is not None:
            answers.append(
                await service.set_priority(deployment_id, request.priority, request.preempt)
            )
        if request.repair is not None:
            answers.append(await service.set_repair(deployment_id, request.repair))
        if request.replicas is not None:
            answers.append(await service.scale_deployment(deployment_id, request.replicas))
        # The request holds one setting at least; the answer says what each one did.
        last = answers[-1]
        message = "; ".join(answer.message for answer in answers)
        return command_json(last.model_copy(update={"message": message}))

    @router.delete(
        "/deployments/{deployment_id}",
        responses={
            **ok_body(CommandResponse),
            **refusals((404, "No deployment with this id"), 503),
        },
    )
    async def delete_deployment(deployment_id: str) -> Response:
        return command_json(await service.delete_deployment(deployment_id))

    @router.post(
        "/instances/{instance_id}/repair",
        responses={
            **ok_body(CommandResponse),
            **refusals((404, "No such instance, or no deployment keeps its model"), 503),
        },
    )
    async def repair_instance(instance_id: str) -> Response:
        return command_json(await service.repair_instance(instance_id))

    return router
