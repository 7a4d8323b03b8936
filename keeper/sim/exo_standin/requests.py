"""exo's request models, as strict as exo's own, for the stand-in's ``POST /instance`` and
``POST /download/start`` and ``/download/cancel``.

exo's ``CamelCaseModel`` refuses unknown keys and loose types; a body the bridge gets wrong must
fail here as it would on exo, naming the field, not be read leniently. These models are written
from exo's JSON (``tests/fixtures/exo_recordings/post-instance-request.json``), separately from
the bridge's encoder (``keeper.bridge.exo_wire``), so the contract tests compare two independent
readings of exo's format instead of one module with itself. ``insufficient_memory`` is exo's
one check of a posted instance: the whole cluster's free memory against the model's size.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from keeper.model.state import Memory, State


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


def _one_tag_schema(schema: dict[str, Any]) -> None:
    """The JSON schema says what ``_Tag._one_tag`` checks: one key, whose value is not null (the
    stand-in's OpenAPI document shows it, and is fuzzed against it)."""
    schema["minProperties"] = 1
    schema["maxProperties"] = 1
    for field in schema.get("properties", {}).values():
        field.pop("default", None)
        options = [option for option in field.pop("anyOf", []) if option.get("type") != "null"]
        if len(options) == 1:
            field.update(options[0])
        elif options:
            field["anyOf"] = options


class _Tag(BaseModel):
    """A tagged union written ``{"ClassName": {...}}``: exactly one known tag."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_extra=_one_tag_schema
    )

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
    """The body of exo's ``POST /instance``. As strict as exo's: an integer must be written as
    one (``2``, not ``2.0``, which JSON Schema also calls an integer), a string as a string."""

    instance: ExoTaggedInstance


class ExoStartDownload(_Strict):
    """The body of exo's ``POST /download/start`` (its ``StartDownloadParams``): the node, and
    a shard naming the model (exo downloads the whole model for any shard)."""

    target_node_id: str
    shard_metadata: ExoTaggedShard


class ExoCancelDownload(_Strict):
    """The body of exo's ``POST /download/cancel`` (its ``CancelDownloadParams``)."""

    target_node_id: str
    model_id: str


class ExoCommandAccepted(BaseModel):
    """exo's answer to a download command (``StartDownloadResponse`` and its siblings)."""

    model_config = ConfigDict(
        alias_generator=to_camel, validate_by_name=True, serialize_by_alias=True, frozen=True
    )

    command_id: str


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
