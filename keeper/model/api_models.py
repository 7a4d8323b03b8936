"""Wire shapes of the HTTP API (docs/design.md §7), shared by the master that serves them and
the clients (the TUI, the ``exo-deploy list/deploy/undeploy`` commands, the bridge) that read
them; and the checks of a deployment request against its model, which the master, the bridge
and the TUI's create form all make (``create_problems``).

They live beside the data model, not in the master, so that a client can parse responses
without importing any master internals. Request and response bodies use snake_case keys, as
exo's own API does; the domain objects inside them (``Deployment``, ``State``) keep their
camelCase JSON.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from keeper.model.state import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_STANDBY,
    MIN_PRIORITY,
    Deployment,
    InstanceMeta,
    InstanceMove,
    ModelCard,
    ModelId,
    RecoveryPhases,
    RepairMode,
    Sharding,
    State,
)
from keeper.model.wire import WireModel

DeploymentStatus = Literal["serving", "starting", "placing", "cant_place"]

# Why the keeper is not placing for a deployment right now (None: it would place at its next
# step, or it does not need to because an instance exists).
WaitReason = Literal["grace", "backoff", "unplaceable_retry", "placement_in_flight"]


def _whole_float_as_int(value: object) -> object:
    return int(value) if isinstance(value, float) and value.is_integer() else value


# A count in a request body. The OpenAPI document says ``integer``, and JSON Schema's integer is
# any number with no fractional part, so ``2.0`` is one and is read as 2; anything else that is
# not a JSON integer (``true``, ``"2"``, ``2.5``) is named as the wrong type, not coerced.
WholeNumber = Annotated[int, BeforeValidator(_whole_float_as_int), Field(strict=True)]
# A flag in a request body: JSON's true or false only (``1``, ``"yes"`` and ``"true"`` are named
# as the wrong type, not read as a wish).
Flag = Annotated[bool, Field(strict=True)]


class ApiModel(BaseModel):
    """Request/response bodies: snake_case, unknown keys rejected so typos are named."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# The largest min_nodes a request may ask for: more than the largest cluster exo can form, so a
# larger number is a typo, not a wish. The create form names it in words before sending.
MAX_MIN_NODES = 1024


class CreateDeploymentRequest(ApiModel):
    model_id: str = Field(min_length=1, max_length=512)
    sharding: Sharding = Sharding.PIPELINE
    instance_meta: InstanceMeta = InstanceMeta.MLX_RING
    # A whole number, 27.0 included (JSON Schema's integer); `true` and `"2"` are refused.
    min_nodes: WholeNumber = Field(default=1, ge=1, le=MAX_MIN_NODES)
    # How many instances of the model to keep, each on nodes apart (docs/design.md §5.11).
    replicas: WholeNumber = Field(default=1, ge=1, le=MAX_REPLICAS)
    # Standby node sets that keep the model downloaded for a failover (docs/design.md §5.12).
    standby: WholeNumber = Field(default=1, ge=0, le=MAX_STANDBY)
    # Placed before lower priorities; with preempt, may displace them (docs/design.md §5.13).
    priority: WholeNumber = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    preempt: Flag = False
    # What the keeper does with a broken instance of its own (docs/design.md §5.19).
    repair: RepairMode = "auto"


def _optional_count(low: int, high: int) -> dict[str, Any]:
    return {"anyOf": [{"type": "integer", "minimum": low, "maximum": high}, {"type": "null"}]}


def _within(value: int | None, low: int, high: int) -> int | None:
    """``value`` if it is None or within the bounds; refused in pydantic's own words else."""
    if value is not None and value < low:
        raise PydanticCustomError(
            "greater_than_equal", "Input should be greater than or equal to {ge}", {"ge": low}
        )
    if value is not None and value > high:
        raise PydanticCustomError(
            "less_than_equal", "Input should be less than or equal to {le}", {"le": high}
        )
    return value


# The settings ``PATCH /deployments/{id}`` changes in place, and the JSON type of each.
PATCHABLE = {
    "replicas": "integer",
    "standby": "integer",
    "priority": "integer",
    "preempt": "boolean",
    "sharding": "string",
    "instance_meta": "string",
    "min_nodes": "integer",
    "repair": "string",
}


class ScaleDeploymentRequest(ApiModel):
    """``PATCH /deployments/{id}``: the settings a deployment may change in place, any of them
    (its placement settings are its identity: delete it and create it again to change them)."""

    # The document says what the validator below requires: one of them at least, of its type.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"type": kind}}}
                for name, kind in PATCHABLE.items()
            ]
        },
    )

    # Bounds checked below and written into the OpenAPI document by hand: pydantic cannot put
    # them inside an optional whole number's schema.
    replicas: Annotated[WholeNumber | None, WithJsonSchema(_optional_count(1, MAX_REPLICAS))] = None
    standby: Annotated[WholeNumber | None, WithJsonSchema(_optional_count(0, MAX_STANDBY))] = None
    priority: Annotated[
        WholeNumber | None, WithJsonSchema(_optional_count(MIN_PRIORITY, MAX_PRIORITY))
    ] = None
    preempt: Annotated[
        Flag | None, WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "null"}]})
    ] = None

    # A rolling change (docs/design.md §5.16): each instance placed with other options is
    # replaced, make-before-break, one at a time.
    sharding: Sharding | None = None
    instance_meta: InstanceMeta | None = None
    min_nodes: Annotated[WholeNumber | None, WithJsonSchema(_optional_count(1, MAX_MIN_NODES))] = (
        None
    )
    # "auto" replaces a broken instance, "report" only says it (docs/design.md §5.19).
    repair: RepairMode | None = None

    @field_validator("min_nodes")
    @classmethod
    def _min_nodes_bounded(cls, value: int | None) -> int | None:
        return _within(value, 1, MAX_MIN_NODES)

    @field_validator("replicas")
    @classmethod
    def _replicas_bounded(cls, value: int | None) -> int | None:
        return _within(value, 1, MAX_REPLICAS)

    @field_validator("standby")
    @classmethod
    def _standby_bounded(cls, value: int | None) -> int | None:
        return _within(value, 0, MAX_STANDBY)

    @field_validator("priority")
    @classmethod
    def _priority_bounded(cls, value: int | None) -> int | None:
        return _within(value, MIN_PRIORITY, MAX_PRIORITY)

    @model_validator(mode="after")
    def _one_at_least(self) -> ScaleDeploymentRequest:
        if all(getattr(self, name) is None for name in PATCHABLE):
            raise ValueError(
                "give one at least of replicas, standby, priority, preempt, sharding,"
                " instance_meta, min_nodes and repair"
            )
        return self


class ModelFacts(Protocol):
    """What the create checks read of a model: a ``ModelCard`` (the master, the bridge) and a
    ``ModelListEntry`` (the TUI's form, from ``GET /models``) both have it."""

    @property
    def n_layers(self) -> int: ...
    @property
    def supports_tensor(self) -> bool: ...


@dataclass(frozen=True)
class RequestProblem:
    """Why a deployment request cannot work, and the request field at fault."""

    field: str
    message: str


def create_problems(
    model_id: ModelId, model: ModelFacts, sharding: Sharding, min_nodes: int
) -> list[RequestProblem]:
    """What is wrong with deploying ``model`` as asked, judged as exo's placement would, so that
    a request no cluster could place is refused when it is made instead of waiting forever as
    ``cant_place``. The master, the bridge and the TUI's create form all check this.

    min_nodes is at least 1, and at most the model's layer count when it is known (every node
    of an instance holds at least one layer; 0 layers means not known, as for a model the
    bridge knows only from exo's list, and exo's own placement judges then). Tensor sharding
    needs a model that supports it.
    """
    problems: list[RequestProblem] = []
    if min_nodes < 1:
        problems.append(
            RequestProblem("min_nodes", f"min_nodes must be at least 1, got {min_nodes}")
        )
    elif 0 < model.n_layers < min_nodes:
        problems.append(
            RequestProblem(
                "min_nodes",
                f"min_nodes {min_nodes} is more than {model_id} has layers ({model.n_layers}); "
                "no cluster could place it",
            )
        )
    if sharding is Sharding.TENSOR and not model.supports_tensor:
        problems.append(
            RequestProblem("sharding", f"{model_id} does not support tensor sharding; use Pipeline")
        )
    return problems


class CommandResponse(ApiModel):
    message: str
    command_id: str
    deployment_id: str | None = None
    instance_id: str | None = None


class StagedCopyView(BaseModel):
    """A standby copy of a deployment's model on one node."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    node_id: str
    # "completed", "downloading", "pending", "failed", or "missing" (asked for, not yet shown)
    state: str
    fraction: float = 0.0  # of the model's bytes on the node's disk
    error: str | None = None


class UpdateView(BaseModel):
    """A rolling change under way (docs/design.md §5.16): ``replaced`` of ``replicas``
    instances are as the options ask; ``note`` says why the next replacement cannot be placed
    now, in the placement's numbers."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    replaced: int
    replicas: int
    note: str | None = None


FailoverPhase = Literal["suspect", "replacing", "confirmed"]


class FailoverView(BaseModel):
    """A deployment's fast failover (docs/design.md §5.18): ``suspect`` (an instance of it is
    on a suspect node and no replacement is placed yet; ``why`` says so when none fits),
    ``replacing`` (the replacement is placed, the node is still only suspect) or ``confirmed``
    (the node is dead: its instance goes); ``nodes`` by name; ``since`` ISO-8601 UTC."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    phase: FailoverPhase
    nodes: list[str]
    since: str
    why: str | None = None


class HealthView(BaseModel):
    """An instance that looks alive but serves nothing, as ``GET /deployments`` says it."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance: str
    problem: Literal["stalled", "hollow", "unfulfilled", "failing"]
    why: str
    since: str  # ISO-8601 UTC


class RequestsView(BaseModel):
    """A deployment's chats through the front door (docs/design.md §8.6) over the last
    ``window_s``: requests per second, how many failed, the 95th percentile of time to first
    token (None when none got one)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    window_s: float
    rate: float
    errors: int
    p95_ttft_s: float | None
    # How many ended each way (``ok``, ``held``, ``retried``, ``migrated``, ``failed``,
    # ``cancelled``); an outcome none had is left out.
    outcomes: dict[str, int] = Field(default_factory=dict[str, int])


class DeploymentView(BaseModel):
    """One deployment as ``GET /deployments`` reports it, with the keeper's timers."""

    # ``readyReplicas`` is camelCase on the wire beside the snake_case timers: the name operators
    # and clients know it by (it sits next to the deployment's own camelCase ``replicas``).
    model_config = ConfigDict(extra="ignore", frozen=True, serialize_by_alias=True)

    deployment: Deployment
    status: DeploymentStatus
    # The deployment's replicas, and how many instances of its model can serve now.
    replicas: int = 1
    ready_replicas: int = Field(
        default=0,
        validation_alias=AliasChoices("readyReplicas", "ready_replicas"),
        serialization_alias="readyReplicas",
    )
    # Standby copies: each node the keeper staged the model on, and how far it is.
    staged: list[StagedCopyView] = Field(default_factory=list[StagedCopyView])
    # The staging in words: "standby 1 of 1 staged", or why fewer ("standby 0 of 1: no node
    # apart has disk for 17.0 GB"); None when the deployment keeps no standby.
    staging: str | None = None
    # Placements lost before they were ready, in a row (drives the backoff).
    failures: int = 0
    # When the keeper will next try to place, if it is waiting for something.
    next_attempt_at: str | None = None  # ISO-8601 UTC
    next_attempt_in_s: float | None = None
    waiting: WaitReason | None = None
    # Anything else the operator should know about this deployment right now, in words (the
    # bridge: "exo unreachable since 12:03:04: ..."); None from a master, which has nothing to add.
    detail: str | None = None
    # A rolling change under way, or None.
    updating: UpdateView | None = None
    # A ready instance of its model has a node the service suspects (keeper.model.readiness,
    # docs/design.md §5.18): it serves now, and stops if that node is confirmed dead.
    at_risk: bool = False
    # A fast failover under way (an instance on a suspect or dead node), or None.
    failover: FailoverView | None = None
    # What is wrong with an instance of its model, or None (docs/design.md §5.19).
    health: HealthView | None = None
    # Its chats through the front door over the last five minutes, or None: none came, or
    # the service has no front door (docs/design.md §8.6).
    requests: RequestsView | None = None


# The longest history ``GET /deployments/{id}/history`` answers: 30 days. Serving records are
# kept a day longer (keeper.model.state.SERVING_HISTORY_KEEP_S), so such a window is complete.
MAX_HISTORY_HOURS = 720.0
DEFAULT_HISTORY_HOURS = 24.0


class IncidentChats(WireModel):
    """The chats through the front door that ended during a deployment's incident, by how each
    ended (docs/design.md §3.5, ``keeper.model.incident_chats``): held until it served again,
    retried before their first token, migrated after a cut, failed."""

    held: int = 0
    retried: int = 0
    migrated: int = 0
    failed: int = 0


class IncidentView(WireModel):
    """One stretch in which a deployment was not serving (``keeper.model.history.Incident``)."""

    start: str  # ISO-8601 UTC
    end: str | None  # None while ongoing
    downtime_s: float
    cause: str
    # Where the down time went, once it ended (seconds; they add up to downtimeS): detected,
    # placed, downloaded, loaded (docs/design.md 3.5); None while ongoing or with no recovery.
    phases: RecoveryPhases | None = None
    # A broken instance's problem when one caused it ("stalled", "hollow", "failing": §5.19;
    # the cause then names the instance and its nodes); None for any other cause.
    problem: str | None = None
    # The chats that ended during it, by outcome; None when the service cannot say (it has no
    # front door, or restarted since the incident began: chats are counted in memory only).
    chats: IncidentChats | None = None


class DeploymentHistoryResponse(WireModel):
    """``GET /deployments/{id}/history?hours=H``: the deployment's last H hours. camelCase, as
    the State: it is a summary of the State's serving records (docs/design.md 3.5)."""

    deployment_id: str
    window_hours: float
    # The fraction of the window it served, of the time it served or was out (a start-up is not
    # an outage); None before it first served.
    availability: float | None
    incidents: list[IncidentView]
    mttr_s: float | None  # mean time to recover over the incidents that ended
    # When what is known begins, if later than the window's start (ISO-8601 UTC): a deployment
    # the service first saw after the window began (a log from before serving records).
    complete_from: str | None = None


class DeploymentsResponse(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    deployments: list[DeploymentView]


class ErrorBody(BaseModel):
    message: str
    type: str  # the HTTP reason phrase, e.g. "Bad Request"
    param: str | None = None
    code: int


class ErrorResponse(BaseModel):
    error: ErrorBody


class ModelListEntry(BaseModel):
    """One model of ``GET /models``, in exo's shape plus the card fields placement needs."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "exo"
    hugging_face_id: str = ""
    name: str = ""
    storage_size_megabytes: int = 0
    supports_tensor: bool = False
    tasks: list[str] = Field(default_factory=list)
    n_layers: int = 0
    hidden_size: int = 0
    num_key_value_heads: int | None = None
    base_model: str | None = None


def model_entry(card: ModelCard) -> ModelListEntry:
    """A catalog card as ``GET /models`` lists it (the master's answer, and the TUI's picker when
    ``/models`` cannot be read)."""
    return ModelListEntry(
        id=card.model_id,
        hugging_face_id=card.model_id,
        name=card.base_model or card.model_id,
        storage_size_megabytes=card.storage_size.in_bytes // 1024**2,
        supports_tensor=card.supports_tensor,
        tasks=list(card.tasks),
        n_layers=card.n_layers,
        hidden_size=card.hidden_size,
        num_key_value_heads=card.num_key_value_heads,
        base_model=card.base_model,
    )


class ModelList(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    object: Literal["list"] = "list"
    data: list[ModelListEntry]


class StreamSnapshot(BaseModel):
    """First message of the dashboard stream (SSE ``event: snapshot``); then ``event: event``
    messages carry one ``IndexedEvent`` each, and ``event: deployments`` messages carry a
    ``DeploymentsResponse`` whenever the keeper's timers change (at most once a second)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    state: State
    deployments: list[DeploymentView]


def error_body(message: str, code: int, type_: str, param: str | None = None) -> dict[str, Any]:
    return ErrorResponse(
        error=ErrorBody(message=message, type=type_, param=param, code=code)
    ).model_dump()


# --- nodes: cordons and drains (docs/design.md §5.15) ---------------------------------------


class DrainView(ApiModel):
    """A drain under way: what moves, what is left, and why it is stuck, if it is."""

    force: bool
    started: str
    moving: list[InstanceMove]
    # Instances still on the node: the keeper's to move, and those it did not place (left
    # alone unless forced).
    to_move: list[str]
    unmanaged: list[str]
    stuck: str | None = None


NodeLiveness = Literal["alive", "suspect", "dead", "gone"]


class NodeView(ApiModel):
    name: str  # the friendly name (cordons and drains are keyed by it)
    node_ids: list[str]  # the cluster's nodes of that name; none while it is away
    cordoned: bool
    drain: DrainView | None = None
    # Fast failover (docs/design.md §5.18): the phase of its node (of the one furthest gone,
    # should two nodes share the name), ``gone`` while none is in the cluster; and how long it
    # has been silent, on the service's running clock (null: not heard since the service started,
    # or the service does not time reports).
    liveness: NodeLiveness = "alive"
    silent_s: float | None = None


class NodesResponse(ApiModel):
    nodes: list[NodeView]


class DrainRequest(ApiModel):
    """``POST /nodes/{node}/drain``: ``force`` deletes what cannot be moved and what the keeper
    did not place."""

    force: StrictBool = False


# --- which service answers (GET /healthz) ----------------------------------------------------

# A bridge's part when several share one store: the acting one keeps the deployments, a
# standby waits to take over.
BridgeRole = Literal["acting", "standby"]


class ServiceHealthView(BaseModel):
    """What the TUI reads of any service's ``GET /healthz``: the bridge's name, its role and the
    name of the acting bridge, when bridges share a store. Each is optional (today's bridges
    and the master send none) and every other key is the service's own, ignored here."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str | None = None
    role: BridgeRole | None = None
    leader: str | None = None  # the acting bridge's name


# --- what-if (GET /whatif, docs/design.md §5.14) ---------------------------------------------

# What happens to a deployment if some nodes go now: none of its instances uses them; every
# instance it keeps is there again (those that used them re-placed); fewer are (some could not
# be re-placed); or none is.
WhatIfOutcome = Literal["stays", "moves", "loses_replica", "cannot_place"]


class WhatIfAnswer(BaseModel):
    """What-if answers: snake_case like the other bodies; keys a newer service adds are ignored
    by a client reading them."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class WhatIfNode(WhatIfAnswer):
    node_id: str
    name: str  # its friendly name when it reports one, else its id


class WhatIfInstance(WhatIfAnswer):
    """An instance of the model that uses the nodes asked about, and would be deleted."""

    instance_id: str
    nodes: list[WhatIfNode]  # sorted by name


class WhatIfThresholds(WhatIfAnswer):
    """How soon the service acts on a lost node (docs/design.md §5.14, "In seconds"): fast
    failover's thresholds (0: off), and exo's own node timeout and the sweep after it."""

    suspect_after_s: float
    dead_after_s: float
    exo_timeout_s: float
    exo_sweep_s: float


class WhatIfEstimate(WhatIfAnswer):
    """The time to serve again on a replacement, in seconds, by its parts: detection (suspicion
    with fast failover on, exo's timeout and sweep off), download (0 on disk; None: the node's
    rate is unknown) and load (the largest shard's bytes at a measured rate, else an assumed
    one)."""

    detection_s: float
    download_s: float | None
    load_s: float
    total_s: float | None  # None while the download's time is unknown
    load_rate: float  # bytes per second the load is reckoned at
    # No load was measured where the answer is computed (the rates the repairs measure are not
    # in the State): ``load_rate`` is the assumed one, and the words say so.
    load_rate_assumed: bool


class WhatIfPlacement(WhatIfAnswer):
    """An instance the keeper would place in its stead (hypothetical: it has no id)."""

    nodes: list[WhatIfNode]  # sorted by name
    # Every one of its nodes holds the whole model already (a staged copy, or an old one), so
    # the replacement loads without downloading first.
    model_on_disk: bool
    # How long until it serves (docs/design.md §5.14, "In seconds"); None from a service older
    # than the estimate.
    estimate: WhatIfEstimate | None = None


class WhatIfDeployment(WhatIfAnswer):
    deployment_id: str
    model_id: str
    outcome: WhatIfOutcome
    replicas: int  # how many instances the deployment keeps
    before: int  # instances of its model now
    after: int  # instances of its model once the keeper has re-placed what it can
    lost: list[WhatIfInstance]
    placed: list[WhatIfPlacement]
    # Why the keeper could not place one more, in placement's own words as the deployment's
    # placementError would say it; None when nothing it tried failed.
    reason: str | None = None


class WhatIfResponse(WhatIfAnswer):
    """``GET /whatif?nodes=...``: per deployment, in placement order, what losing ``nodes`` now
    would do (``keeper.core.whatif``)."""

    nodes: list[WhatIfNode]
    deployments: list[WhatIfDeployment]
    # The thresholds the service runs with, that the placements' estimates count from; None
    # from a service older than the estimate.
    thresholds: WhatIfThresholds | None = None


# --- alert webhooks (``GET /healthz`` of the master and the bridge) ---------------------------


class WebhookEndpointHealth(ApiModel):
    """One webhook's deliveries since the service started (``keeper.runtime.webhooks``)."""

    url: str  # scheme://host[:port] and "/…": a webhook's path often holds its secret
    pending: int  # notices queued for it, not yet delivered
    delivered_total: int
    dropped_total: int  # the oldest, dropped past the outbox's bound
    failed_attempts_total: int  # POSTs that got no 2xx (retried with backoff)
    last_error: str | None  # the last failed attempt's error, None once one succeeds


class WebhooksHealth(ApiModel):
    endpoints: list[WebhookEndpointHealth]
    durable: bool  # the outbox is on disk (a --data-dir), so a restart delivers what is queued
    outbox_write_failures_total: int  # notices the outbox could not write (kept in memory)
