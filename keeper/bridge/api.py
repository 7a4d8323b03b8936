"""The bridge's HTTP API: the master's deployments API (SPEC §5) in front of a stock exo.

The same request and response shapes as our master (``keeper.api_models``), the same error
bodies for every way a request can be wrong (``keeper.master.http_errors``) and the same security
rules (``keeper.master.auth``: loopback without a token, a bearer token for changes otherwise),
so ``exo-deploy-tui --url`` and ``exo-deploy list/deploy/undeploy`` work against the bridge
unchanged:

- ``POST /deployments``, ``GET /deployments``, ``DELETE /deployments/{id}``: as the master's, the
  model checked against exo's own model list; each view may carry a ``detail`` in words
  ("exo unreachable since 12:03:04: ...");
- ``GET /state``: exo's State as exo sent it, with ``deployments`` merged in (503 until exo has
  answered once);
- ``GET /models``: exo's model list, passed on;
- ``GET /healthz``: the bridge's own health, and whether it can reach exo.

There is no event stream (``GET /events`` is a 404): the TUI then polls ``/state`` and
``/deployments`` once a second, which is what the bridge itself does with exo.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from keeper.api_models import CreateDeploymentRequest
from keeper.bridge.service import Bridge
from keeper.master.auth import BearerTokenMiddleware
from keeper.master.http_errors import MAX_BODY_BYTES, RequestGuardMiddleware, install_error_handlers

JSON = "application/json"


def create_bridge_app(
    bridge: Bridge, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = FastAPI(
        title="exo-deploy bridge",
        summary="Deployments for a stock exo cluster",
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app)
    # Added innermost first: the token check runs before the body is even looked at.
    app.add_middleware(RequestGuardMiddleware, max_body_bytes=max_body_bytes)
    if token:
        app.add_middleware(BearerTokenMiddleware, token=token)

    @app.post("/deployments")
    async def create_deployment(request: CreateDeploymentRequest) -> Response:
        created = await bridge.create_deployment(
            request.model_id, request.sharding, request.instance_meta, request.min_nodes
        )
        return Response(created.model_dump_json(exclude_none=True), media_type=JSON)

    @app.get("/deployments")
    async def list_deployments() -> Response:
        return Response(bridge.deployments_view().model_dump_json(), media_type=JSON)

    @app.delete("/deployments/{deployment_id}")
    async def delete_deployment(deployment_id: str) -> Response:
        deleted = await bridge.delete_deployment(deployment_id)
        return Response(deleted.model_dump_json(exclude_none=True), media_type=JSON)

    @app.get("/state")
    async def state() -> Response:
        return Response(bridge.state_json(), media_type=JSON)

    @app.get("/models")
    async def models() -> Response:
        return Response(await bridge.models_body(), media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(bridge.health())

    return app
