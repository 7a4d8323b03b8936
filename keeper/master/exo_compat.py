"""``exo-deploy master --exo-compat``: a stand-in for a stock exo master, for tests and demos.

``exo-deploy bridge`` keeps deployments beside a stock exo master, through exo's public HTTP API
only. To run and test it without a cluster of Macs, this serves the same ``Master`` (its event
log, membership and sweep; simulated nodes join it as usual) behind exo's API instead of ours:

- no keeper and no deployments endpoints (``MasterConfig.keeper_enabled`` off);
- ``POST /instance`` as exo does it: the body ``{"instance": <tagged Instance>}`` is checked by a
  parser as strict as exo's (unknown keys and wrong types refused, 422 naming the field; JSON
  that does not parse, 400), then exo's memory check (400 "Insufficient memory to create
  instance. Required: ...GB, Available: ...GB"), then the command is *accepted*: the answer
  comes before the instance is applied, and it shows in ``GET /state`` shortly after;
- ``DELETE /instance/{id}`` likewise accepted, and applied shortly after (404 if unknown);
- ``GET /models`` in exo's list shape (``ExoModelListEntry``), which carries no layer count;
- ``GET /state``, ``POST /place_instance`` and ``POST /v1/chat/completions`` as our master's
  (the same routes: ``keeper.master.api.exo_routes``).

The strict models below are written from exo's JSON (``tests/fixtures/exo_*.json``), separately
from the bridge's encoder (``keeper.bridge.exo_wire``), so the contract tests compare two
independent readings of exo's format instead of one module with itself.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from keeper.api_models import CommandResponse
from keeper.events import InstanceCreated, InstanceDeleted
from keeper.ids import new_id
from keeper.master.api import exo_routes, model_entry
from keeper.master.errors import BadRequestError, NotFoundError, NotRunningError
from keeper.master.http_app import command_json, new_app
from keeper.master.http_errors import MAX_BODY_BYTES
from keeper.master.service import Master
from keeper.state import Memory, ModelCard, State

# exo's own answer to an accepted command.
ACCEPTED = "Command received."

# --- exo's strict models ------------------------------------------------------------------


class _Strict(BaseModel):
    """exo's ``CamelCaseModel``: camelCase (snake_case also read), unknown keys and loose types
    refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        strict=True,
        frozen=True,
    )


class _Tag(BaseModel):
    """A tagged union written ``{"ClassName": {...}}``: exactly one known tag."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @model_validator(mode="after")
    def _one_tag(self) -> _Tag:
        present = [name for name in type(self).model_fields if getattr(self, name) is not None]
        if len(present) != 1:
            tags = ", ".join(field.alias or name for name, field in type(self).model_fields.items())
            raise ValueError(f"expected exactly one of {tags}")
        return self


ExoBackend = Literal["MlxMetal", "MlxCuda", "MlxCpu"]


class ExoMemory(_Strict):
    in_bytes: int


class ExoSamplingParams(_Strict):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


class ExoSamplingDefaults(ExoSamplingParams):
    thinking: ExoSamplingParams | None = None
    non_thinking: ExoSamplingParams | None = None


class ExoModelCard(_Strict):
    model_id: str
    storage_size: ExoMemory
    n_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    supports_tensor: bool
    tasks: list[str]
    num_key_value_heads: int | None = None
    components: list[dict[str, Any]] | None = None
    family: str = ""
    quantization: str = ""
    base_model: str = ""
    capabilities: list[str] = []
    backends: list[ExoBackend] = ["MlxMetal", "MlxCuda", "MlxCpu"]
    reasoning_dialect: str = "none"
    context_length: int = 0
    uses_cfg: bool = False
    trust_remote_code: bool = True
    is_custom: bool = False
    vision: dict[str, Any] | None = None
    sampling_defaults: ExoSamplingDefaults | None = None


class ExoShard(_Strict):
    model_card: ExoModelCard
    device_rank: int = Field(ge=0)
    world_size: int = Field(ge=1)
    immediate_exception: bool = False
    should_timeout: float | None = None
    start_layer: int = Field(ge=0)
    end_layer: int = Field(ge=1)
    n_layers: int = Field(ge=1)


class ExoTaggedShard(_Tag):
    pipeline: ExoShard | None = Field(default=None, alias="PipelineShardMetadata")
    tensor: ExoShard | None = Field(default=None, alias="TensorShardMetadata")


class ExoShardAssignments(_Strict):
    model_id: str
    runner_to_shard: dict[str, ExoTaggedShard]
    node_to_runner: dict[str, str]


class ExoHost(_Strict):
    ip: str
    port: int


class ExoRingInstance(_Strict):
    instance_id: str
    shard_assignments: ExoShardAssignments
    hosts_by_node: dict[str, list[ExoHost]]
    ephemeral_port: int


class ExoJacclInstance(_Strict):
    instance_id: str
    shard_assignments: ExoShardAssignments
    jaccl_devices: list[list[str | None]]
    jaccl_coordinators: dict[str, str]


class ExoTaggedInstance(_Tag):
    ring: ExoRingInstance | None = Field(default=None, alias="MlxRingInstance")
    jaccl: ExoJacclInstance | None = Field(default=None, alias="MlxJacclInstance")

    @property
    def body(self) -> ExoRingInstance | ExoJacclInstance:
        found = self.ring if self.ring is not None else self.jaccl
        assert found is not None  # _one_tag guarantees it
        return found


class ExoCreateInstance(_Strict):
    """The body of exo's ``POST /instance``."""

    instance: ExoTaggedInstance


class ExoModelListEntry(BaseModel):
    """One entry of exo's ``GET /models``: what a dashboard lists, not the whole model card
    (no layer count or hidden size)."""

    model_config = ConfigDict(frozen=True)

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "exo"
    hugging_face_id: str = ""
    name: str = ""
    description: str = ""
    context_length: int = 0
    tags: list[str] = []
    storage_size_megabytes: int = 0
    supports_tensor: bool = False
    tasks: list[str] = []
    is_custom: bool = False
    family: str = ""
    quantization: str = ""
    base_model: str = ""
    capabilities: list[str] = []


def exo_model_entry(card: ModelCard) -> ExoModelListEntry:
    """Our master's entry for ``card`` (``keeper.master.api.model_entry``) as exo lists it: the
    card fields exo leaves out are dropped, and exo's own fields take exo's defaults."""
    ours = model_entry(card).model_dump()
    return ExoModelListEntry.model_validate(
        {**ours, "base_model": card.base_model or "", "capabilities": ["text"]}
    )


def insufficient_memory(required: Memory, available: Memory) -> str | None:
    """exo's refusal when the whole cluster's free memory cannot hold the model, else None."""
    if required.in_bytes <= available.in_bytes:
        return None
    return (
        f"Insufficient memory to create instance. Required: {required.in_gb:.1f}GB, "
        f"Available: {available.in_gb:.1f}GB"
    )


def total_available(state: State) -> Memory:
    return Memory(
        in_bytes=sum(usage.ram_available.in_bytes for usage in state.node_memory.values())
    )


# --- the app --------------------------------------------------------------------------------


def create_exo_compat_app(
    master: Master, token: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """exo's HTTP API over ``master`` (whose keeper should be off: ``keeper_enabled=False``)."""
    app = new_app("exo (stand-in)", token, max_body_bytes=max_body_bytes)
    app.include_router(exo_routes(master, token))

    @app.get("/models")
    async def models() -> JSONResponse:
        entries = [exo_model_entry(card).model_dump() for card in master.catalog.values()]
        return JSONResponse({"object": "list", "data": entries})

    @app.post("/instance")
    async def create_instance(request: Request) -> JSONResponse:
        raw = await request.body()
        try:
            body = ExoCreateInstance.model_validate_json(raw)
        except ValidationError as exc:
            raise RequestValidationError(_in_body(exc)) from None
        shards = body.instance.body.shard_assignments.runner_to_shard.values()
        shard = next((tagged.pipeline or tagged.tensor for tagged in shards), None)
        if shard is None:
            raise BadRequestError("instance.shardAssignments.runnerToShard: no shard")
        required = Memory(in_bytes=shard.model_card.storage_size.in_bytes)
        refusal = insufficient_memory(required, total_available(master.state))
        if refusal is not None:
            raise BadRequestError(refusal)
        if not master.running:
            raise NotRunningError("the master is not running")
        # Our tolerant model reads the same JSON (exo's extra card fields are dropped).
        created = InstanceCreated.model_validate({"instance": json.loads(raw)["instance"]})
        command_id = new_id()
        await master.emit([created])  # accepted; applied once the router gets to it
        return JSONResponse(
            {
                "message": ACCEPTED,
                "command_id": command_id,
                "model_card": shard.model_card.model_dump(mode="json", by_alias=True),
            }
        )

    @app.delete("/instance/{instance_id}")
    async def delete_instance(instance_id: str) -> Response:
        if instance_id not in master.state.instances:
            raise NotFoundError("Instance not found", param="instance_id")
        await master.emit([InstanceDeleted(instance_id=instance_id)])
        return command_json(
            CommandResponse(message=ACCEPTED, command_id=new_id(), instance_id=instance_id)
        )

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        if not master.running:
            raise NotRunningError("the master is not running")
        return JSONResponse({"status": "ok", "exo_compat": True})

    return app


def _in_body(exc: ValidationError) -> list[Any]:
    """pydantic's errors located in the request body, as FastAPI's own validation reports
    them (so ``describe_validation`` names the field, and a JSON syntax error is a 400)."""
    return [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
