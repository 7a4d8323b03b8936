"""``exo-deploy master --exo-compat``: a stand-in for a stock exo master, for tests and demos.

``exo-deploy bridge`` keeps deployments beside a stock exo master, through exo's public HTTP API
only. To run and test it without a cluster of Macs, this serves the same ``Master`` (its event
log, membership and sweep; simulated nodes join it as usual) behind exo's API instead of ours,
answering as exo 0.3.70 does in ``tests/fixtures/exo_recordings`` (a test diffs the key sets of
every answer below against those recordings):

- no keeper and no deployments endpoints (``MasterConfig.keeper_enabled`` off);
- ``GET /instance/placement`` and ``GET /instance/previews``: exo's placement, with exo's full
  model card in every shard and exo's refusals (``keeper.sim.exo_standin.placement_answers``) as
  400s;
- ``GET /state`` in exo's keys (no ``deployments``), each instance with exo's full card in its
  shards when one is shipped for its model (as exo keeps the card it was given; for a model
  with no shipped card, our card), and ``GET /state/{path}`` walking that JSON;
- ``POST /instance``: the body ``{"instance": <tagged Instance>}`` checked by a parser as strict
  as exo's (``keeper.sim.exo_standin.requests``), then exo's memory check against the card exo
  knows for ``shardAssignments.modelId`` (400 "Insufficient memory to create instance.
  Required: ...GB, Available: ...GB"), then *accepted*: the answer (with that card) comes before
  the instance is applied, and it shows in ``GET /state`` shortly after;
- ``DELETE /instance/{id}`` likewise accepted, and applied shortly after (404 if unknown);
- ``POST /download/start`` ``{"target_node_id", "shard_metadata"}``, ``DELETE
  /download/{node_id}/{model_id}`` and ``POST /download/cancel`` ``{"target_node_id",
  "model_id"}``: the command passed to the node (``Master.start_download`` and friends), answered
  ``{"commandId"}`` at once, as exo does; the node's entry in ``downloads`` moves after. exo
  publishes the command for whichever node it names and answers 200 even when none does, so a
  command for a node not connected is dropped (logged), not refused;
- ``GET /models``: exo's own list (``keeper.sim.exo_standin.model_list``), and under OpenAI's
  ``GET /v1/models`` too, as exo serves it;
- ``POST /v1/chat/completions`` routed and ended as exo's (``MasterConfig.exo_chats``): to the
  model's instance with the fewest chats in flight, ready or not, held until it is ready; a
  deleted instance's chats closed (a stream ends with no ``finish_reason`` or ``[DONE]``, a
  non-streamed chat is a 200 with an empty body); no instance, exo's 404 "No instance found for
  model M";
- ``POST /v1/cancel/{command_id}``: a streamed chat cancelled by its chunks' id, as exo cancels
  it (``keeper.sim.exo_standin.chat_cancels``);
- ``GET /node_id``: as exo, the id of the node serving the API, a JSON string. The stand-in's
  master runs no worker, so it is no node of the topology: it answers an id of its own, made
  when its API is, and a bridge that asks finds no node behind this URL to probe (it confirms a
  silent node by ``--dead-after-s`` instead, docs/design.md §5.18);
- ``GET /events`` as exo answers it: not a stream but one ``application/json`` array of the
  whole event log from the beginning, each event ``{"EventTag": {snake_case fields}}``
  (``exo_event_log``), so a client that mistakes it for a stream is caught by our tests;
- a body or query that fails validation gets FastAPI's ``{"detail": [...]}`` 422, as on exo;
  everything else refused gets exo's ``{"error": {...}}`` envelope.

A model exo does not know: exo would try to fetch its card from Hugging Face, and fail (a 500 on
``/instance/placement``, a 400 "Failed to load model card: ..." on ``/instance/previews``). The
stand-in has no network and never answers 500, so both answer that 400.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, TypeAdapter, ValidationError

from keeper.httpapi.app import JSON, command_json, new_app
from keeper.httpapi.contract import ok_body, refusals
from keeper.httpapi.errors import MAX_BODY_BYTES
from keeper.model.api_models import CommandResponse
from keeper.model.events import IndexedEvent, InstanceCreated, InstanceDeleted
from keeper.model.ids import new_id
from keeper.model.refusals import BadRequestError, NotFoundError, NotRunningError
from keeper.model.state import AnyShard, InstanceMeta, Shard, Sharding
from keeper.model.wire import JsonObject
from keeper.runtime.event_log import LOG_FILE
from keeper.sim.exo_standin.chat_cancels import install_chat_cancels
from keeper.sim.exo_standin.model_list import ExoModel, exo_catalog, exo_models_payload
from keeper.sim.exo_standin.placement_answers import (
    exo_instance_json,
    exo_place,
    exo_previews,
    exo_shard_json,
    state_at,
)
from keeper.sim.exo_standin.requests import (
    ExoCancelDownload,
    ExoCommandAccepted,
    ExoCreateInstance,
    ExoStartDownload,
    insufficient_memory,
    total_available,
)
from keeper.sim.master.api import exo_routes
from keeper.sim.master.server import MasterApp
from keeper.sim.master.service import Master

__all__ = ["STANDIN_API", "ExoCreateInstance", "create_exo_compat_app", "insufficient_memory"]

log = logging.getLogger(__name__)
B = TypeVar("B", bound=BaseModel)
# Our tolerant reading of a shard exo's strict parser accepted.
SHARD: TypeAdapter[AnyShard] = TypeAdapter(Shard)

# exo's own answer to an accepted command.
ACCEPTED = "Command received."
# Our State's keys that exo's has not: the stand-in runs no keeper (and exo has no cordons, nor
# the fast failover's verdicts, docs/design.md §5.18, nor the repairs' notes and incidents,
# §5.19).
NOT_EXO_STATE_KEYS = frozenset(
    {
        "deployments",
        "servingHistory",
        "cordoned",
        "drains",
        "nodeWatch",
        "repairNotes",
        "repairIncidents",
    }
)


def known_model(model_id: str) -> ExoModel:
    model = exo_catalog().get(model_id)
    if model is None:
        raise BadRequestError(
            f"Failed to load model card: exo lists no model {model_id!r} (GET /models)",
            param="model_id",
        )
    return model


def exo_event_log(log_path: Path | None) -> bytes:
    """The master's whole event log as exo's ``GET /events`` body: a JSON array, oldest first,
    each event tagged with its class and its fields in snake_case (exo writes its events so).

    It is read from the log file, so it holds every event since the log began, not only those
    of this run. A master without a data directory keeps no log: its array is empty. A last
    line without its newline is a write still in progress and is left for the next request.
    """
    if log_path is None or not log_path.exists():
        return b"[]"
    events: list[object] = []
    with log_path.open("rb") as file:
        for line in file:
            if not line.endswith(b"\n"):
                break
            indexed = IndexedEvent.model_validate_json(line)
            events.append(indexed.event.model_dump(mode="json", by_alias=False))
    return json.dumps(events).encode()


def create_exo_compat_app(
    master: Master, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """exo's HTTP API over ``master`` (whose keeper should be off: ``keeper_enabled=False``)."""
    # exo leaves validation errors to FastAPI: 422 {"detail": [...]}, not its error envelope.
    app = new_app("exo (stand-in)", token, max_body_bytes=max_body_bytes, exo_validation=True)

    def state_json() -> JsonObject:
        state = cast(JsonObject, json.loads(master.state.model_dump_json()))
        instances = cast(JsonObject, state["instances"])
        catalog = exo_catalog()
        for instance_id, instance in master.state.instances.items():
            model = catalog.get(instance.shard_assignments.model_id)
            if model is not None and model.full_card is not None:
                instances[instance_id] = exo_instance_json(instance, model.full_card)
        # A download entry's shard carries exo's full card too.
        for entries in cast(dict[str, list[JsonObject]], state["downloads"]).values():
            for entry in entries:
                fields = cast(JsonObject, next(iter(entry.values())))
                shard = cast(JsonObject, fields["shardMetadata"])
                model_id = cast(JsonObject, next(iter(shard.values())))["modelCard"]["modelId"]
                model = catalog.get(model_id)
                if model is not None and model.full_card is not None:
                    fields["shardMetadata"] = exo_shard_json(shard, model.full_card)
        return {key: value for key, value in state.items() if key not in NOT_EXO_STATE_KEYS}

    @app.get("/state")
    async def state() -> JSONResponse:
        return JSONResponse(state_json())

    @app.get("/state/{path:path}", responses=refusals((404, "No such path in the State")))
    async def state_path(path: str) -> Response:
        try:
            value = state_at(state_json(), path)
        except KeyError as exc:
            raise NotFoundError(str(exc.args[0])) from None
        return Response(json.dumps(value), media_type=JSON)

    app.include_router(exo_routes(master, token))
    install_chat_cancels(app)

    @app.get("/models")
    async def models() -> JSONResponse:
        return JSONResponse(exo_models_payload())

    @app.get("/v1/models")  # exo serves its list under OpenAI's path too, the same answer
    async def v1_models() -> JSONResponse:
        return JSONResponse(exo_models_payload())

    @app.get("/events")
    async def events() -> Response:
        log_path = master.data_dir / LOG_FILE if master.data_dir is not None else None
        body = await anyio.to_thread.run_sync(exo_event_log, log_path)
        return Response(body, media_type="application/json")

    @app.get(
        "/instance/placement",
        responses=refusals((400, "exo lists no such model, or placement refused (says why)")),
    )
    async def placement(
        model_id: str,
        sharding: Sharding = Sharding.PIPELINE,
        instance_meta: InstanceMeta = InstanceMeta.MLX_RING,
        min_nodes: int = 1,
    ) -> JSONResponse:
        model = known_model(model_id)
        try:
            instance = exo_place(master.state, model, sharding, instance_meta, min_nodes)
        except ValueError as exc:
            raise BadRequestError(str(exc)) from None
        return JSONResponse(instance)

    @app.get("/instance/previews", responses=refusals((400, "exo lists no such model")))
    async def previews(model_id: str) -> JSONResponse:
        if not master.state.topology.nodes:
            return JSONResponse({"previews": []})
        return JSONResponse({"previews": exo_previews(master.state, known_model(model_id))})

    @app.post(
        "/instance",
        openapi_extra={"requestBody": app.body_ref(ExoCreateInstance)},
        responses=refusals(
            (400, "exo lists no such model, or not enough memory in the cluster"), 503
        ),
    )
    async def create_instance(request: Request) -> JSONResponse:
        raw = await request.body()
        body = _parsed(ExoCreateInstance, raw)
        model_id = body.instance.body.shard_assignments.model_id
        model = known_model(model_id)
        refusal = insufficient_memory(model.storage_size, total_available(master.state))
        if refusal is not None:
            raise BadRequestError(refusal)
        card = _card_of(model, body)
        if not master.running:
            raise NotRunningError("the master is not running")
        instance_json = cast(JsonObject, json.loads(raw)["instance"])
        # Our tolerant model reads the same JSON (exo's extra card fields are dropped; the
        # State shows exo's full card again, from the catalog).
        created = InstanceCreated.model_validate({"instance": instance_json})
        await master.emit([created])  # accepted; applied once the router gets to it
        return JSONResponse({"message": ACCEPTED, "command_id": new_id(), "model_card": card})

    @app.delete(
        "/instance/{instance_id}",
        responses={**ok_body(CommandResponse), **refusals((404, "Instance not found"), 503)},
    )
    async def delete_instance(instance_id: str) -> Response:
        if instance_id not in master.state.instances:
            raise NotFoundError("Instance not found")
        await master.emit([InstanceDeleted(instance_id=instance_id)])
        return command_json(
            CommandResponse(message=ACCEPTED, command_id=new_id(), instance_id=instance_id)
        )

    # exo's download commands: accepted at once, and passed to the node if it is connected.
    accepted = {**ok_body(ExoCommandAccepted), **refusals(503)}

    async def to_node(command: str, node_id: str, sent: Awaitable[CommandResponse]) -> JSONResponse:
        try:
            command_id = (await sent).command_id  # NotRunningError: a 503
        except NotFoundError as exc:  # exo answers as if someone heard it
            log.info("%s for node %s dropped: %s", command, node_id, exc.message)
            command_id = new_id()
        return JSONResponse(ExoCommandAccepted(command_id=command_id).model_dump(mode="json"))

    @app.post(
        "/download/start",
        openapi_extra={"requestBody": app.body_ref(ExoStartDownload)},
        responses=accepted,
    )
    async def start_download(request: Request) -> JSONResponse:
        body = _parsed(ExoStartDownload, await request.body())
        tagged = body.shard_metadata.model_dump(mode="json", by_alias=True, exclude_none=True)
        shard = SHARD.validate_python(tagged)
        node_id = body.target_node_id
        return await to_node("StartDownload", node_id, master.start_download(node_id, shard))

    @app.delete("/download/{node_id}/{model_id:path}", responses=accepted)
    async def delete_download(node_id: str, model_id: str) -> JSONResponse:
        return await to_node("DeleteDownload", node_id, master.delete_download(node_id, model_id))

    @app.post(
        "/download/cancel",
        openapi_extra={"requestBody": app.body_ref(ExoCancelDownload)},
        responses=accepted,
    )
    async def cancel_download(request: Request) -> JSONResponse:
        body = _parsed(ExoCancelDownload, await request.body())
        node_id = body.target_node_id
        return await to_node(
            "CancelDownload", node_id, master.cancel_download(node_id, body.model_id)
        )

    # exo's node ids are uuid4s; this one names the stand-in's API and no node (module doc).
    own_id = new_id()

    @app.get("/node_id")
    async def node_id() -> JSONResponse:
        return JSONResponse(own_id)

    @app.get("/healthz", responses=refusals(503))
    async def healthz() -> JSONResponse:
        if not master.running:
            raise NotRunningError("the master is not running")
        return JSONResponse({"status": "ok", "exo_compat": True})

    return app


def _card_of(model: ExoModel, body: ExoCreateInstance) -> JsonObject:
    """The card exo answers a POST with: its own for the model; for a model it lists without a
    full card here, the one the posted shards carry (the only full card there is)."""
    if model.full_card is not None:
        return model.full_card
    shards = body.instance.body.shard_assignments.runner_to_shard.values()
    shard = next((tagged.pipeline or tagged.tensor for tagged in shards), None)
    if shard is None:
        raise BadRequestError("instance.shardAssignments.runnerToShard: no shard")
    return shard.model_card.model_dump(mode="json", by_alias=True)


def _parsed(model: type[B], raw: bytes) -> B:
    """The request body read by one of exo's strict request models; FastAPI's 422 if it does
    not read."""
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise RequestValidationError(_in_body(exc)) from None


def _in_body(exc: ValidationError) -> list[Any]:
    """pydantic's errors located in the request body, as FastAPI's own validation reports
    them."""
    return [
        {**error, "loc": ("body", *error["loc"]), "input": _shown(error["input"])}
        for error in exc.errors(include_url=False, include_context=False)
    ]


def _shown(value: object) -> object:
    # A body that is not JSON is reported as its raw bytes, which need not be UTF-8 (the answer
    # would then fail to encode, a 500): shown as text with the undecodable bytes replaced.
    return value.decode(errors="replace") if isinstance(value, bytes) else value


# What ``exo-deploy master --exo-compat`` serves: exo's API over a master with no keeper.
STANDIN_API = MasterApp(
    create_exo_compat_app,
    keeper_enabled=False,
    exo_chats=True,
    banner="serving exo's API (--exo-compat): no keeper, no deployments endpoints",
)
