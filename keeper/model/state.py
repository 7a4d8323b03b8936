"""The subset of exo's cluster State that deployments need, with exo's own JSON.

``GET /state`` on our master returns a document a real exo master could have produced, and
``State.model_validate_json`` reads a real exo master's document: camelCase keys, tagged unions,
unknown keys ignored (see ``keeper.model.wire``). Everything here is data: no I/O, no clock, and no
import of anything else of ours, so every other layer can depend on it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import StrEnum
from fractions import Fraction
from typing import Annotated, Any, Literal, cast

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    computed_field,
    field_validator,
    model_serializer,
)

from keeper.model.wire import TAGGED, TaggedModel, WireModel

NodeId = str
InstanceId = str
RunnerId = str
DeploymentId = str
ModelId = str


class Sharding(StrEnum):
    PIPELINE = "Pipeline"
    TENSOR = "Tensor"


class InstanceMeta(StrEnum):
    MLX_RING = "MlxRing"
    MLX_JACCL = "MlxJaccl"


class Backend(StrEnum):
    """The backends placement knows how to run an instance on (``ENGINE_BACKENDS``)."""

    MLX_METAL = "MlxMetal"
    MLX_CUDA = "MlxCuda"
    MLX_CPU = "MlxCpu"


# A backend as exo names it, kept as text: exo adds backends (a model card added through exo's
# own ``POST /models/add`` lists every backend exo knows, ``Vllm`` among them), and the State
# only carries them; placement compares them with the ``Backend`` values it runs on, so one it
# does not know matches nothing rather than making the card unreadable (docs/design.md §8.2).
BackendName = str


class Memory(WireModel):
    in_bytes: int = 0

    @classmethod
    def from_gb(cls, gb: float) -> Memory:
        return cls(in_bytes=int(gb * 1024**3))

    @property
    def in_gb(self) -> float:
        return self.in_bytes / 1024**3


class ModelCard(WireModel):
    model_id: ModelId
    storage_size: Memory
    n_layers: int
    hidden_size: int
    supports_tensor: bool
    tasks: tuple[str, ...] = ("TextGeneration",)
    backends: tuple[BackendName, ...] = (Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU)
    num_key_value_heads: int | None = None
    base_model: str | None = None


# --- shards -------------------------------------------------------------------------------


class BaseShardMetadata(TaggedModel):
    """The fields both kinds of shard carry; only the kind (the tag) tells them apart."""

    model_card: ModelCard
    device_rank: int
    world_size: int
    start_layer: int
    end_layer: int  # exclusive
    n_layers: int


class PipelineShardMetadata(BaseShardMetadata):
    pass


class TensorShardMetadata(BaseShardMetadata):
    pass


# Each tagged union once: the plain union is the type for isinstance and match, the Annotated one
# the same union for pydantic, each member read under its class name (``keeper.model.wire``).
AnyShard = PipelineShardMetadata | TensorShardMetadata
Shard = Annotated[AnyShard, TAGGED]


# --- instances ----------------------------------------------------------------------------


class ShardAssignments(WireModel):
    model_id: ModelId
    runner_to_shard: dict[RunnerId, Shard]
    node_to_runner: dict[NodeId, RunnerId]


class Host(WireModel):
    ip: str
    port: int


class MlxRingInstance(TaggedModel):
    instance_id: InstanceId
    shard_assignments: ShardAssignments
    hosts_by_node: dict[NodeId, list[Host]] = Field(default_factory=dict)
    ephemeral_port: int = 0


class MlxJacclInstance(TaggedModel):
    instance_id: InstanceId
    shard_assignments: ShardAssignments
    # jaccl_devices[i][j]: the RDMA interface rank i uses to reach rank j (None on the diagonal).
    jaccl_devices: list[list[str | None]] = []
    jaccl_coordinators: dict[NodeId, str] = Field(default_factory=dict)


AnyInstance = MlxRingInstance | MlxJacclInstance
Instance = Annotated[AnyInstance, TAGGED]


# --- runners ------------------------------------------------------------------------------


class RunnerIdle(TaggedModel):
    pass


class RunnerConnecting(TaggedModel):
    pass


class RunnerConnected(TaggedModel):
    pass


class RunnerLoading(TaggedModel):
    layers_loaded: int = 0
    total_layers: int = 0


class RunnerLoaded(TaggedModel):
    pass


class RunnerWarmingUp(TaggedModel):
    pass


class RunnerReady(TaggedModel):
    pass


class RunnerRunning(TaggedModel):
    pass


class RunnerShuttingDown(TaggedModel):
    pass


class RunnerShutdown(TaggedModel):
    pass


class RunnerFailed(TaggedModel):
    error_message: str | None = None
    # What exo's runner reported beside its error (exo's ``diagnostics``), carried as text for
    # the operator: each entry as exo wrote it, or its JSON when it is not a string.
    diagnostics: tuple[str, ...] = ()

    @field_validator("diagnostics", mode="before")
    @classmethod
    def _as_text(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            items = cast(list[Any] | tuple[Any, ...], value)
            return tuple(item if isinstance(item, str) else _json_text(item) for item in items)
        return value


AnyRunnerStatus = (
    RunnerIdle
    | RunnerConnecting
    | RunnerConnected
    | RunnerLoading
    | RunnerLoaded
    | RunnerWarmingUp
    | RunnerReady
    | RunnerRunning
    | RunnerShuttingDown
    | RunnerShutdown
    | RunnerFailed
)
RunnerStatus = Annotated[AnyRunnerStatus, TAGGED]

# A runner in one of these states can serve requests; an instance whose every runner is in one
# of them is ready (the keeper's backoff rule and the `serving` status both read this).
SERVING_RUNNER_TYPES = (RunnerReady, RunnerRunning)


def _json_text(value: Any) -> str:
    """A value exo sent, as compact JSON text (its own words when it cannot be encoded)."""
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


# --- topology -----------------------------------------------------------------------------


class Multiaddr(WireModel):
    """A libp2p address such as ``/ip4/192.0.2.11/tcp/52415``; exo adds its parsed parts."""

    address: str

    def _parts(self) -> list[str]:
        return self.address.strip("/").split("/")

    @computed_field(alias="address_type")
    @property
    def address_type(self) -> str:
        parts = self._parts()
        return parts[0] if parts else ""

    @computed_field(alias="ip_address")
    @property
    def ip_address(self) -> str:
        parts = self._parts()
        return parts[1] if len(parts) > 1 else ""

    @computed_field(alias="port")
    @property
    def port(self) -> int:
        parts = self._parts()
        return int(parts[3]) if len(parts) > 3 and parts[3].isdigit() else 0


class SocketConnection(WireModel):
    sink_multiaddr: Multiaddr


class RDMAConnection(WireModel):
    source_rdma_iface: str
    sink_rdma_iface: str


# Edges are untagged in exo's JSON; their keys tell them apart, so pydantic's smart union picks
# the one whose required fields are present.
Edge = SocketConnection | RDMAConnection


class Connection(WireModel):
    """A directed edge of the topology, as carried by TopologyEdgeCreated/Deleted."""

    source: NodeId
    sink: NodeId
    edge: Edge


class Topology(WireModel):
    nodes: list[NodeId] = []
    connections: dict[NodeId, dict[NodeId, list[Edge]]] = Field(default_factory=dict)


# --- per-node information -----------------------------------------------------------------


class MemoryUsage(WireModel):
    ram_total: Memory = Field(default_factory=Memory)
    ram_available: Memory = Field(default_factory=Memory)
    swap_total: Memory = Field(default_factory=Memory)
    swap_available: Memory = Field(default_factory=Memory)


class NodeIdentity(WireModel):
    friendly_name: str = ""
    model_id: str = ""
    chip_id: str = ""
    os_version: str = ""


class NetworkInterface(WireModel):
    name: str
    ip_address: str
    interface_type: str = "ethernet"


class NodeNetwork(WireModel):
    interfaces: list[NetworkInterface] = []


class RdmaCtl(WireModel):
    enabled: bool = False


# What a deployment does with a broken instance of its own (docs/design.md §5.19).
RepairMode = Literal["auto", "report"]
REPAIR_MODES: tuple[RepairMode, ...] = ("auto", "report")

# --- deployments --------------------------------------------------------------------------

# The most instances one deployment may keep. Replicas exist so that one node fault does not stop
# a model, and each replica needs nodes of its own (anti-affinity): 16 is already more nodes than
# the clusters exo runs on, and the cap keeps a typo from asking the keeper for thousands.
MAX_REPLICAS = 16
# The most standby node sets a deployment may keep: each is a full copy of the model on disk, and
# beyond a few the copies cost more disk than the faults they shorten.
MAX_STANDBY = 4
# A deployment's priority, highest first when several wait for a placement and the only ground
# on which one may preempt another (docs/design.md §5.13). A thousand levels leave room between
# any two an operator picks; the default sits in the middle so either side can be chosen later.
MIN_PRIORITY = 0
MAX_PRIORITY = 1000
DEFAULT_PRIORITY = 500
# What a deployment whose instance was deleted to make room for a higher-priority model says
# (its placementError), followed by that model's id; the serving history reads it as the cause.
PREEMPTED_BY = "preempted by "


def preempted_by(model_id: ModelId) -> str:
    """The placement error of a deployment preempted by a deployment of ``model_id``."""
    return f"{PREEMPTED_BY}{model_id}"


class RepairNote(WireModel):
    """A broken instance a repair was placed for (docs/design.md §5.19), as the keeper said it."""

    instance_id: InstanceId
    problem: str
    why: str


class Deployment(WireModel):
    deployment_id: DeploymentId
    model_card: ModelCard
    sharding: Sharding = Sharding.PIPELINE
    instance_meta: InstanceMeta = InstanceMeta.MLX_RING
    min_nodes: int = Field(default=1, ge=1)
    # The instance the keeper placed last, or None; it may since have been deleted.
    instance_id: InstanceId | None = None
    # Why the last placement failed, until one succeeds.
    placement_error: str | None = None
    # How many instances of the model the keeper keeps (any instance of the model counts).
    # A deployment written before replicas existed reads as 1, so older logs replay unchanged.
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    # The keeper's placements for this deployment that still exist, oldest first: appended by
    # DeploymentPlaced, removed by InstanceDeleted. Durable, so that a new master (whose keeper
    # remembers nothing) still knows which instances scaling down and deletion may remove.
    placed_instance_ids: tuple[InstanceId, ...] = ()
    # Standby node sets beyond the serving ones that keep the model downloaded, where its
    # replicas would fail over to, so a fault costs detection and load but no download
    # (docs/design.md §5.12). A deployment written before standby reads as 1.
    standby: int = Field(default=1, ge=0, le=MAX_STANDBY)
    # The nodes the keeper asked to hold the model for this deployment and has not asked to
    # delete it: the copies it made, and the only ones it may delete.
    staged_on: tuple[NodeId, ...] = ()
    # Placed before lower priorities when several are due; with ``preempt``, a deployment that
    # cannot be placed may have the keeper delete instances of strictly lower-priority ones
    # (docs/design.md §5.13). A deployment written before either reads as 500 and false, so
    # older logs and snapshots replay unchanged.
    priority: int = Field(default=DEFAULT_PRIORITY, ge=MIN_PRIORITY, le=MAX_PRIORITY)
    preempt: bool = False
    # A rolling change (docs/design.md §5.16): after a change of sharding, instance_meta or
    # min_nodes, the instances placed with the old options that it still has to replace, and
    # the replacement under way (make-before-break, one at a time). Durable, so a new keeper
    # carries on where the last stopped: it deletes the old instance of a move it finds ready,
    # and never places a second replacement for one.
    replacing: tuple[InstanceId, ...] = ()
    moving: InstanceMove | None = None
    # Fast failover (docs/design.md §5.18): the replacement placed for an instance on a suspect
    # node, with when it was placed (Unix time). Durable, so a new keeper neither places a
    # second one nor forgets to remove the surplus once the node is heard again. It ends with
    # either instance's deletion.
    failover: InstanceMove | None = None
    failover_since: float | None = None
    # Broken instances (docs/design.md §5.19): "auto" replaces one the keeper placed, "report"
    # only says it; and the replacement under way for one (make-before-break, durable like a
    # rolling change's). A deployment written before either reads as "auto" and None.
    repair: RepairMode = "auto"
    repairing: InstanceMove | None = None


# --- downloads ----------------------------------------------------------------------------
# A node fetches a model's files before a runner of it can load: exo's DownloadCoordinator
# reports each (node, model) as one of these entries, replaced as it moves (docs/design.md §3.6).
# exo downloads every file of the model for any shard, so an entry stands for the whole model.


class DownloadProgressData(WireModel):
    total: Memory = Field(default_factory=Memory)
    downloaded: Memory = Field(default_factory=Memory)
    downloaded_this_session: Memory = Field(default_factory=Memory)
    completed_files: int = 0
    total_files: int = 0
    speed: float = 0.0  # bytes per second
    eta_ms: int = 0
    # Per file, in exo's nested shape; carried, not read.
    files: dict[str, Any] = Field(default_factory=dict)


class DownloadPending(TaggedModel):
    """Known but not downloading (queued, or reset after its files were deleted)."""

    node_id: NodeId
    shard_metadata: Shard
    model_directory: str = ""
    downloaded: Memory = Field(default_factory=Memory)
    total: Memory = Field(default_factory=Memory)


class DownloadOngoing(TaggedModel):
    node_id: NodeId
    shard_metadata: Shard
    model_directory: str = ""
    download_progress: DownloadProgressData


class DownloadCompleted(TaggedModel):
    node_id: NodeId
    shard_metadata: Shard
    model_directory: str = ""
    total: Memory
    read_only: bool = False


class DownloadFailed(TaggedModel):
    node_id: NodeId
    shard_metadata: Shard
    model_directory: str = ""
    error_message: str


AnyDownload = DownloadPending | DownloadOngoing | DownloadCompleted | DownloadFailed
DownloadEntry = Annotated[AnyDownload, TAGGED]


def download_model_id(entry: AnyDownload) -> ModelId:
    """The model an entry is for (exo keys a node's entries by it)."""
    return entry.shard_metadata.model_card.model_id


def entry_for(entries: Iterable[AnyDownload], model_id: ModelId) -> AnyDownload | None:
    """A node's entry for the model: the first that names it (exo keeps one per model)."""
    for entry in entries:
        if download_model_id(entry) == model_id:
            return entry
    return None


def download_entry(state: State, node_id: NodeId, model_id: ModelId) -> AnyDownload | None:
    """The node's entry for the model in ``state``, if it reported one."""
    return entry_for(state.downloads.get(node_id, ()), model_id)


def download_fraction(entries: Iterable[AnyDownload], model_id: ModelId) -> Fraction:
    """How much of ``model_id`` a node holds by its download entries, as exo's placement counts
    it (docs/design.md §4.1): its first entry for the model decides; completed is 1, ongoing and
    pending are downloaded / total bytes (0 when the total is 0), failed is 0, and no entry is 0.
    Exact, where exo divides floats, so that sums of it compare without rounding."""
    entry = entry_for(entries, model_id)
    if isinstance(entry, DownloadCompleted):
        return Fraction(1)
    if isinstance(entry, DownloadOngoing):
        return _share(entry.download_progress.downloaded, entry.download_progress.total)
    if isinstance(entry, DownloadPending):
        return _share(entry.downloaded, entry.total)
    return Fraction(0)  # DownloadFailed, or no entry


def _share(downloaded: Memory, total: Memory) -> Fraction:
    if total.in_bytes <= 0:
        return Fraction(0)
    return Fraction(downloaded.in_bytes, total.in_bytes)


class DiskUsage(WireModel):
    """A node's models directory: its disk's size and what is free on it."""

    total: Memory = Field(default_factory=Memory)
    available: Memory = Field(default_factory=Memory)


class SystemVitals(WireModel):
    """What a node's GPU and power report (exo's system profile): fractions 0-1, °C, watts."""

    gpu_usage: float = 0.0
    temp: float = 0.0
    sys_power: float = 0.0
    pcpu_usage: float = 0.0
    ecpu_usage: float = 0.0


# --- serving history ----------------------------------------------------------------------

# How a deployment's first serving record came to be: with the deployment ("created": nothing
# before it is missing), or when a service first saw a deployment it had no record of
# ("observed": a log written before records existed; the history is complete from then on).
HistoryBegins = Literal["created", "observed"]

# How far back a deployment's serving records are kept: the longest history the API answers
# (720 hours) and a day more, so a 30-day window always starts inside the kept span.
SERVING_HISTORY_KEEP_S = 31 * 24 * 3600.0

# The most serving records kept per deployment, whatever their age. A deployment that flaps every
# five minutes makes about 600 a day; the cap bounds the State (and so every snapshot and the
# dashboard's first message) at a few hundred kB per deployment, and a history that lost its
# oldest records says from when it is complete.
MAX_SERVING_RECORDS = 2000


# A step of a recovery under way, recorded while the deployment is down (docs/design.md 3.5):
# its replacement placed (the replacement's InstanceCreated), that replacement's download done,
# the broken instance that stopped it recognised ("diagnosed", with its problem); and, while it
# still serves, a make-before-break replacement ready while every serving instance was on a
# suspect node ("covered", with the phases of the incident it ends should that node be
# confirmed dead); and ("explained") exo's master changing during an incident that a node's loss
# began, added to its cause.
RecoveryStep = Literal["placed", "downloaded", "diagnosed", "covered", "explained"]


class RecoveryPhases(WireModel):
    """Where an incident's down time went, in seconds, each phase from the end of the one before
    (so they add up to the down time): ``detected`` from the last heartbeat of the node that
    caused it to the verdict, timeout or deletion that showed it (0 for a cause seen at once);
    ``placed`` to the replacement's InstanceCreated; ``downloaded`` to its download completed
    (0 when the model was on disk); ``loaded`` to serving again."""

    detected: float
    placed: float
    downloaded: float
    loaded: float


class ServingRecord(WireModel):
    """One change in whether a deployment serves, as the service saw it (docs/design.md 3.5).

    The history of a deployment is the sequence of these: what ``GET /deployments/{id}/history``
    and the TUI's AVAIL column summarise. They live in the State (so snapshots, compaction and
    the dashboard stream carry them with no extra store); ``keeper.model.apply`` keeps a bounded
    span. A record with a ``step`` changes nothing about serving: it dates a step of the
    recovery under way, so the record that ends the incident can say its ``phases``.
    """

    # Unix time in seconds, from the service's wall clock when it saw the change; for a stop
    # caused by a node, that node's last heartbeat (never before the record ahead of it).
    at: float
    serving: bool
    cause: str | None = None  # why it is not serving, in plain words; None: not (yet) known
    begins: HistoryBegins | None = None  # set on the first record of a deployment
    # On a stop dated back to a node's last heartbeat: when the service saw it (its wall time).
    noticed: float | None = None
    step: RecoveryStep | None = None  # set on a record that dates a step of a recovery
    # The replacement a "placed" step (or a stop that found one under way already) names.
    instance_id: InstanceId | None = None
    phases: RecoveryPhases | None = None  # on the record that ends an incident (serving again)
    # On a "diagnosed" step: the broken instance's problem ("stalled", "hollow", "failing", ...).
    problem: str | None = None

    @model_serializer(mode="wrap")
    def _without_absent_parts(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The optional parts are left out where absent (None), as most records have them:
        every snapshot and dashboard connect carries a month of records, and reading one back
        gives the same record."""
        dumped: dict[str, Any] = handler(self)
        return {key: value for key, value in dumped.items() if value is not None}


# --- planned change: cordons and drains -----------------------------------------------------
# Keyed by a node's friendly name, not its id: exo gives a node a new id on every restart, and
# an operator who cordons a Mac before its update means that Mac when it comes back
# (docs/design.md §5.15).


class InstanceMove(WireModel):
    """One instance being moved (off a draining node, or replaced by a rolling change): its
    replacement is placed, and the old one is deleted once the replacement is ready
    (make-before-break)."""

    deployment_id: DeploymentId
    old_instance_id: InstanceId
    new_instance_id: InstanceId


class NodeDrain(WireModel):
    node: str  # the friendly name
    force: bool = False  # delete what cannot be moved (and what the keeper did not place)
    started: str = ""  # ISO-8601 UTC
    moves: tuple[InstanceMove, ...] = ()


# --- a node gone quiet: suspect, then dead ----------------------------------------------------
# What the service concluded of a node that stopped reporting, before exo's own timeout takes it
# out of the topology (docs/design.md §5.18). It lives in the State, as events, so that readiness,
# the serving records, the dashboard stream and a restarted service all read the same verdict.

NodeWatchPhase = Literal["suspect", "dead"]


class NodeWatch(WireModel):
    phase: NodeWatchPhase
    last_heard: float  # Unix time of its last report, as the service saw it arrive
    since: float  # Unix time the service reached this phase
    why: str = ""  # for dead: the second, independent sign, in plain words


# --- broken instances remembered: the repair backoff's facts ----------------------------------
# Each instance recognised broken (docs/design.md §5.19) is an incident on each of its nodes for
# its model. The keeper's backoff is computed from these; they live in the State, as events, so
# that a master rebuilt from its log or a bridge taking over from etcd avoids the same nodes until
# the same moment. Bounded by the rule's own window: an incident older than INCIDENT_WINDOW_S
# counts for nothing and leaves the State (``keeper.model.apply``).

# Broken instances of one model on one node, within INCIDENT_WINDOW_S, before its replacements
# avoid the node: once is a fault, twice may be bad luck, three times is the node (or the model
# on it: a corrupt download, a driver the model trips).
AVOID_AFTER = 3
INCIDENT_WINDOW_S = 30 * 60.0


class RepairIncident(WireModel):
    """One broken instance of ``model_id`` with a runner on ``node_id``, as recognised."""

    model_id: ModelId
    node_id: NodeId
    instance_id: InstanceId
    problem: str  # "stalled", "hollow", "failing"
    at: float  # Unix time the keeper recognised it


# --- the state ----------------------------------------------------------------------------


class State(WireModel):
    instances: dict[InstanceId, Instance] = Field(default_factory=dict)
    runners: dict[RunnerId, RunnerStatus] = Field(default_factory=dict)
    topology: Topology = Field(default_factory=Topology)
    node_memory: dict[NodeId, MemoryUsage] = Field(default_factory=dict)
    node_backends: dict[NodeId, list[BackendName]] = Field(default_factory=dict)
    node_identities: dict[NodeId, NodeIdentity] = Field(default_factory=dict)
    node_network: dict[NodeId, NodeNetwork] = Field(default_factory=dict)
    node_rdma_ctl: dict[NodeId, RdmaCtl] = Field(default_factory=dict)
    last_seen: dict[NodeId, str] = Field(default_factory=dict)  # ISO-8601 UTC
    downloads: dict[NodeId, list[DownloadEntry]] = Field(default_factory=dict)
    node_disk: dict[NodeId, DiskUsage] = Field(default_factory=dict)
    node_system: dict[NodeId, SystemVitals] = Field(default_factory=dict)
    last_event_applied_idx: int = -1
    deployments: dict[DeploymentId, Deployment] = Field(default_factory=dict)
    # Per deployment, its serving records, oldest first (ServingRecord).
    serving_history: dict[DeploymentId, tuple[ServingRecord, ...]] = Field(default_factory=dict)
    # Per deployment, the last broken instance a repair was placed for, with its problem and
    # why, kept after the repair ends (a hollow instance is often deleted at once): the serving
    # records name it as the cause of the incident it made (docs/design.md 3.5). Deleted with
    # the deployment.
    repair_notes: dict[DeploymentId, RepairNote] = Field(default_factory=dict)
    # Nodes that get no new placement, by friendly name, sorted; and the drains under way.
    cordoned: tuple[str, ...] = ()
    drains: dict[str, NodeDrain] = Field(default_factory=dict)
    # Nodes the service suspects or has confirmed dead (NodeWatch); absent: alive, or gone.
    node_watch: dict[NodeId, NodeWatch] = Field(default_factory=dict)
    # Broken instances of the deployments' models, oldest first, AVOID_AFTER at most per (model,
    # node), none older than INCIDENT_WINDOW_S before the newest (RepairIncident).
    repair_incidents: tuple[RepairIncident, ...] = ()


# How much of a node id tells namesakes apart when nothing else does: its last characters (exo's
# ids are random hex, or libp2p peer ids whose first characters are the same for every node).
NODE_ID_SHOWN = 6


def friendly_name(state: State, node_id: NodeId) -> str | None:
    """The name the node reported (exo's display name), or None."""
    identity = state.node_identities.get(node_id)
    return identity.friendly_name if identity is not None and identity.friendly_name else None


def node_address(state: State, node_id: NodeId) -> str | None:
    """The node's first address on its network, as it reported them: an IPv4 address that is
    not loopback or link-local, else such an IPv6 one; None if it reported none. An address
    outlives a restart (exo gives the node a new id), which is why it tells namesakes apart."""
    network = state.node_network.get(node_id)
    if network is None:
        return None
    addresses = [interface.ip_address for interface in network.interfaces]
    v4 = sorted(a for a in addresses if "." in a and not a.startswith(("127.", "169.254.")))
    v6 = sorted(
        a for a in addresses if ":" in a and a != "::1" and not a.lower().startswith("fe80")
    )
    return (v4 or v6 or [None])[0]


def node_name(state: State, node_id: NodeId) -> str:
    """A node as an operator knows it (docs/design.md §5.15): its friendly name when no other
    node in the cluster goes by it; among namesakes (two Macs called "Mac Studio"), the name
    with the node's address when that tells it apart (``Mac Studio@192.0.2.11``: kept across a
    restart), else with the end of its id; its id when it reported no name. Cordons, drains,
    ``GET /nodes``, the history and the dashboard all name a node so, so namesakes stay apart."""
    name = friendly_name(state, node_id)
    if name is None:
        return node_id
    namesakes = [
        other
        for other in state.topology.nodes
        if other != node_id and friendly_name(state, other) == name
    ]
    if not namesakes:
        return name
    address = node_address(state, node_id)
    if address is not None and all(node_address(state, n) != address for n in namesakes):
        return f"{name}@{address}"
    return f"{name}#{node_id[-NODE_ID_SHOWN:]}"


def nodes_named(state: State, name: str) -> frozenset[NodeId]:
    """The cluster's nodes that go by ``name``: its name as ``node_name`` gives it, or an id;
    else every node whose friendly name it is (a cordon recorded by a name that namesakes have
    since come to share still holds for each of them)."""
    named = frozenset(node for node in state.topology.nodes if node_name(state, node) == name)
    if named:
        return named
    return frozenset(node for node in state.topology.nodes if friendly_name(state, node) == name)


def cordoned_nodes(state: State) -> frozenset[NodeId]:
    """The cluster's nodes that get no new placement: cordoned, or draining."""
    if not state.cordoned:
        return frozenset()
    return frozenset(node for name in state.cordoned for node in nodes_named(state, name))


def keeper_placements(state: State) -> dict[InstanceId, DeploymentId]:
    """Each instance the keeper placed and its deployment still records, with that deployment:
    the ones a drain moves (the others it leaves alone unless forced)."""
    return {
        instance_id: deployment_id
        for deployment_id, deployment in state.deployments.items()
        for instance_id in deployment.placed_instance_ids
    }


def instances_on(state: State, node_ids: frozenset[NodeId]) -> list[InstanceId]:
    """The instances with a runner on any of ``node_ids``, in id order."""
    return sorted(
        instance_id
        for instance_id, instance in state.instances.items()
        if not node_ids.isdisjoint(instance.shard_assignments.node_to_runner)
    )
