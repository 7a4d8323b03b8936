"""The master's HTTP API (docs/design.md §7): exo's shapes on FastAPI.

Handlers are thin: parse with the shared wire models (``keeper.model.api_models``), call the
``Master`` command, return its result. Every way a request can be wrong is answered with exo's
error body and a 4xx (see ``keeper.httpapi.errors``), and a refused request changes
nothing, because the master validates before it emits. ``create_app`` builds the app for one
master (from ``keeper.httpapi.app``, with the deployments and what-if routes the bridge serves
too, ``keeper.httpapi.deployments_routes`` and ``keeper.httpapi.whatif_routes``);
``keeper.sim.master.server`` runs it under uvicorn, and tests drive it in-process with
``httpx.ASGITransport``. Each route declares its 200 body and its
refusals (``keeper.httpapi.contract``): the OpenAPI document is the contract the tests fuzz.

OpenAI's ``POST /v1/chat/completions`` and ``GET /v1/models`` are the bridge's front door
(``keeper.httpapi.front_door_routes.mount_front_door`` over ``Master.front_door``, with the count
of the chats the app's guard refuses before they reach it; docs/design.md §8.6): a chat is
held while its deployment does not serve, sent again, and continued after a cut, its upstream the
master's own chat routing. The raw chat route below it (``exo_routes``) is exo's stand-in's only,
as a stock exo has no front door.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, FastAPI, WebSocket
from fastapi.responses import JSONResponse, Response
from sse_starlette import EventSourceResponse

from keeper.httpapi.app import JSON, command_json, new_app
from keeper.httpapi.contract import ok_body, refusals
from keeper.httpapi.deployments_routes import deployments_router
from keeper.httpapi.errors import MAX_BODY_BYTES
from keeper.httpapi.front_door_routes import mount_front_door
from keeper.httpapi.metrics_routes import metrics_router
from keeper.httpapi.nodes_routes import nodes_router
from keeper.httpapi.whatif_routes import whatif_router
from keeper.model.api_models import CommandResponse, CreateDeploymentRequest, ModelList
from keeper.model.refusals import NotRunningError
from keeper.sim.master.chat_upstream import model_list_json
from keeper.sim.master.dashboard_stream import dashboard_response
from keeper.sim.master.openai_chat import ChatCompletionRequest, chat_completion
from keeper.sim.master.service import Master
from keeper.sim.master.ws import NODE_WS_PATH, serve_node_websocket


class PlaceInstanceRequest(CreateDeploymentRequest):
    """exo's ``POST /place_instance`` body: the same fields as a deployment request."""


def create_app(
    master: Master, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    app = new_app(
        "exo-deploy master",
        token,
        summary="Deployments for exo clusters",
        max_body_bytes=max_body_bytes,
    )
    app.include_router(deployments_router(master))
    app.include_router(nodes_router(master))
    app.include_router(whatif_router(master))
    app.include_router(metrics_router(master))
    app.include_router(exo_routes(master, token, raw_chat=False))
    mount_front_door(app, master.front_door)

    @app.get("/state")
    async def state() -> Response:
        return Response(master.state.model_dump_json(), media_type=JSON)

    @app.get("/models", responses=ok_body(ModelList))
    async def models() -> Response:
        return Response(model_list_json(master.catalog.values()), media_type=JSON)

    @app.delete(
        "/instance/{instance_id}",
        responses={**ok_body(CommandResponse), **refusals((404, "No instance with this id"), 503)},
    )
    async def delete_instance(instance_id: str) -> Response:
        return command_json(await master.delete_instance(instance_id))

    @app.get(
        "/events",
        response_class=EventSourceResponse,
        responses={
            200: {"content": {"text/event-stream": {}}, "description": "The dashboard stream"},
            **refusals(503),
        },
    )
    async def events() -> EventSourceResponse:
        if not master.running:
            raise NotRunningError("the master is not running")
        return dashboard_response(master)

    @app.get("/healthz", responses=refusals(503))
    async def healthz() -> JSONResponse:
        if not master.running:
            raise NotRunningError("the master is not running")
        write_error = master.write_error
        # 503 while the log cannot be written: reads work, but no change can be accepted.
        return JSONResponse(
            {
                "status": "ok" if write_error is None else "degraded",
                "last_event_applied_idx": master.state.last_event_applied_idx,
                "nodes_connected": len(master.connected_nodes()),
                # Node messages refused since start, by kind (unproven Hellos, reports about
                # another node's runners or instances): nonzero means a misbehaving peer.
                "node_messages_refused": master.membership_refusals(),
                "deployments": len(master.state.deployments),
                "event_log": {
                    "writable": write_error is None,
                    "error": write_error,
                    "events_held": master.events_held_unwritable,
                    "events_dropped": master.events_dropped_unwritable,
                },
                # Alert webhooks' deliveries (keeper.runtime.webhooks): pending, delivered,
                # dropped and failed attempts per webhook.
                "webhooks": master.webhooks.health().model_dump(),
            },
            status_code=200 if write_error is None else 503,
        )

    return app


def exo_routes(master: Master, token: str | None, *, raw_chat: bool = True) -> APIRouter:
    """The routes of exo's API that both of the master's APIs serve alike, ours and exo's
    stand-in's (``keeper.sim.exo_standin.app``): placing an instance, the nodes' connection,
    and with ``raw_chat`` the chat straight to the master's routing, as a stock exo serves it
    (ours serves the chat through its front door instead). (Each serves its own ``GET /state``:
    the stand-in's is in exo's keys.)"""
    router = APIRouter()

    @router.post(
        "/place_instance",
        responses={
            **ok_body(CommandResponse),
            **refusals(
                (400, "Placement refused (the message says why)"),
                (404, "No such model in the catalog"),
                503,
            ),
        },
    )
    async def place_instance(request: PlaceInstanceRequest) -> Response:
        return command_json(
            await master.place_instance(
                request.model_id, request.sharding, request.instance_meta, request.min_nodes
            )
        )

    if raw_chat:

        @router.post(
            "/v1/chat/completions",
            responses=refusals(
                (404, "No instance of the model is ready to serve"),
                (503, "The master is not running, or the chat's node went away"),
            ),
        )
        async def chat_completions(request: ChatCompletionRequest) -> Any:
            return await chat_completion(master.chat_source, request)

    @router.websocket(NODE_WS_PATH)
    async def node_ws(websocket: WebSocket) -> None:
        await serve_node_websocket(master, websocket, token)

    return router
