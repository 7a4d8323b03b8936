"""The bridge's HTTP API: the master's deployments API (docs/design.md §7.2) in front of a
stock exo.

The same app as our master's (``keeper.httpapi.app``: exo's error bodies for every way a
request can be wrong, the request guard, a bearer token for changes when there is one) with the
same deployments routes (``keeper.httpapi.deployments_routes``), so ``exo-deploy-tui --url`` and
``exo-deploy list/deploy/scale/undeploy`` work against the bridge unchanged:

- ``POST /deployments``, ``GET /deployments``, ``PATCH`` and ``DELETE /deployments/{id}``: as
  the master's, the model checked against exo's own model list; each view may carry a
  ``detail`` in words ("exo unreachable since 12:03:04: ...");
- ``GET /state``: exo's State as exo sent it, with ``deployments`` merged in (503 until exo has
  answered once);
- ``GET /models``: exo's model list, passed on;
- ``DELETE /instance/{id}``: exo's own route, as the dashboard's ctrl+k sends it: the instance
  is deleted through exo like one the keeper deletes (``BridgeCommands.delete_instance``);
- ``GET /whatif?nodes=...``: what losing those nodes would do, as the master answers it
  (``keeper.httpapi.whatif_routes``), on exo's State; a 503 while it is not followed;
- ``GET /metrics``: Prometheus' text format, as the master's (``keeper.httpapi.metrics_routes``),
  with whether exo answers and gives a State to act on;
- ``POST /v1/chat/completions`` and ``GET /v1/models``: the front door
  (``keeper.httpapi.front_door_routes``, docs/design.md §8.6): OpenAI's chat forwarded to exo,
  held while the model fails over and continued when exo cuts it;
- ``GET /healthz``: the bridge's own health (``keeper.bridge.health``): whether it can reach
  exo and read its State, write its log, and step; a 503 while it cannot write or step.

There is no event stream (``GET /events`` is a 404): the TUI then polls ``/state`` and
``/deployments`` once a second, which is what the bridge itself does with exo.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

from keeper.bridge.health import BridgeHealth
from keeper.bridge.service import Bridge
from keeper.httpapi.app import JSON, command_json, new_app
from keeper.httpapi.contract import ok_body, refusals
from keeper.httpapi.deployments_routes import deployments_router
from keeper.httpapi.errors import MAX_BODY_BYTES
from keeper.httpapi.front_door_routes import mount_front_door
from keeper.httpapi.metrics_routes import metrics_router
from keeper.httpapi.nodes_routes import nodes_router
from keeper.httpapi.whatif_routes import whatif_router
from keeper.model.api_models import CommandResponse


def create_bridge_app(
    bridge: Bridge, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = new_app(
        "exo-deploy bridge",
        token,
        summary="Deployments for a stock exo cluster",
        max_body_bytes=max_body_bytes,
    )
    app.include_router(deployments_router(bridge))
    app.include_router(nodes_router(bridge))
    app.include_router(whatif_router(bridge))
    app.include_router(metrics_router(bridge))
    mount_front_door(app, bridge.front_door)

    @app.get("/state", responses=refusals((503, "exo has not answered yet")))
    async def state() -> Response:
        return Response(bridge.state_json(), media_type=JSON)

    @app.get("/models", responses=refusals((503, "exo's model list is not available")))
    async def models() -> Response:
        return Response(await bridge.models_body(), media_type=JSON)

    @app.delete(
        "/instance/{instance_id}",
        responses={
            **ok_body(CommandResponse),
            **refusals((404, "exo's State shows no instance with this id"), 503),
        },
    )
    async def delete_instance(instance_id: str) -> Response:
        return command_json(await bridge.delete_instance(instance_id))

    degraded = {
        "model": BridgeHealth,
        "description": "Degraded: the bridge's log cannot be written (it accepts no change) "
        "or its steps fail (it keeps nothing); the body says which",
    }

    @app.get("/healthz", responses={**ok_body(BridgeHealth), 503: degraded})
    async def healthz() -> JSONResponse:
        health = bridge.health().model_dump(mode="json")
        return JSONResponse(health, status_code=503 if bridge.degraded else 200)

    return app
