"""Events: the only way the State changes.

The master turns every command into events, numbers them, logs them and applies them with
``keeper.model.apply``; nodes and dashboards receive the same events in the same order. Each event
is a tagged union member (``{"DeploymentCreated": {...}}``) so the log and the stream are exo's
JSON. ``EVENT_ADAPTER`` reads and writes any event; ``IndexedEvent`` is what the log and stream
carry.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from keeper.model.state import (
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_STANDBY,
    MIN_PRIORITY,
    Backend,
    Connection,
    Deployment,
    DeploymentId,
    DiskUsage,
    DownloadEntry,
    Instance,
    InstanceId,
    InstanceMeta,
    InstanceMove,
    MemoryUsage,
    ModelId,
    NodeId,
    NodeIdentity,
    NodeNetwork,
    RdmaCtl,
    RepairMode,
    RunnerId,
    RunnerStatus,
    ServingRecord,
    Shard,
    Sharding,
    SystemVitals,
)
from keeper.model.wire import TAGGED, TaggedModel, WireModel


class DeploymentCreated(TaggedModel):
    deployment: Deployment


class DeploymentDeleted(TaggedModel):
    deployment_id: DeploymentId


class DeploymentPlaced(TaggedModel):
    deployment_id: DeploymentId
    instance_id: InstanceId


class DeploymentPlacementFailed(TaggedModel):
    deployment_id: DeploymentId
    error: str


class DeploymentScaled(TaggedModel):
    """The deployment now keeps ``replicas`` instances of its model (``Keeper.scale`` emits it,
    followed by the InstanceDeleted of any instance it removes)."""

    deployment_id: DeploymentId
    replicas: int = Field(ge=1, le=MAX_REPLICAS)


class DeploymentStandbyChanged(TaggedModel):
    """The deployment now keeps ``standby`` node sets with its model downloaded."""

    deployment_id: DeploymentId
    standby: int = Field(ge=0, le=MAX_STANDBY)


class DeploymentPriorityChanged(TaggedModel):
    """The deployment now has ``priority`` and may (``preempt``) or may not have lower-priority
    deployments' instances deleted to place its own; both are carried, so one event is the whole
    setting."""

    deployment_id: DeploymentId
    priority: int = Field(ge=MIN_PRIORITY, le=MAX_PRIORITY)
    preempt: bool


class DownloadRequested(TaggedModel):
    """A node is asked to hold a model's files without running it: the keeper staging a standby
    copy for ``deployment_id``, or (None) exo's ``POST /download/start``. The node downloads the
    whole model (exo fetches every file for any shard)."""

    deployment_id: DeploymentId | None = None
    node_id: NodeId
    shard_metadata: Shard


class DownloadDeletionRequested(TaggedModel):
    """A node is asked to delete a model's files (the keeper removing a copy it staged, when its
    deployment goes; or exo's ``DELETE /download/...``)."""

    deployment_id: DeploymentId | None = None
    node_id: NodeId
    model_id: ModelId


class DeploymentServingChanged(TaggedModel):
    """The service saw the deployment start or stop serving (or, while it is down, learn why):
    one ``ServingRecord`` of its history (``keeper.model.history.serving_changes`` emits it)."""

    deployment_id: DeploymentId
    record: ServingRecord


class InstanceCreated(TaggedModel):
    instance: Instance


class InstanceDeleted(TaggedModel):
    instance_id: InstanceId


class RunnerStatusUpdated(TaggedModel):
    runner_id: RunnerId
    runner_status: RunnerStatus


class NodeGatheredInfo(TaggedModel):
    """What a node reports about itself; fields left None are not part of this report.

    Applying it adds the node to the topology if it is not there yet (a node rejoining arrives
    in pieces: first this, then its edges) and records ``when`` as its last-seen time.
    """

    node_id: NodeId
    when: str  # ISO-8601 UTC
    memory: MemoryUsage | None = None
    backends: list[Backend] | None = None
    identity: NodeIdentity | None = None
    network: NodeNetwork | None = None
    rdma_ctl: RdmaCtl | None = None
    disk: DiskUsage | None = None  # its models directory
    system: SystemVitals | None = None


class NodeDownloadProgress(TaggedModel):
    """A node's download of a model moved (exo's event): the entry replaces the node's entry for
    the same model, or joins its list."""

    download_progress: DownloadEntry


class TopologyEdgeCreated(TaggedModel):
    conn: Connection


class TopologyEdgeDeleted(TaggedModel):
    conn: Connection


class NodeTimedOut(TaggedModel):
    node_id: NodeId


class NodeSuspected(TaggedModel):
    """The node has been silent too long: a replacement may be placed, nothing is deleted."""

    node_id: NodeId
    last_heard: float  # Unix time of its last report, as the service saw it arrive
    at: float  # Unix time of the verdict


class NodeConfirmedDead(TaggedModel):
    """A second, independent sign confirmed a suspect node: its instances are to be deleted."""

    node_id: NodeId
    last_heard: float
    at: float
    why: str  # the second sign, in plain words ("session closed", "GET /node_id unanswered")


class NodeHeardAgain(TaggedModel):
    """A suspect (or dead) node reported again before it left the topology."""

    node_id: NodeId
    at: float


class NodeCordoned(TaggedModel):
    """The node (by friendly name) gets no new placement; what runs there keeps running."""

    name: str


class NodeUncordoned(TaggedModel):
    """The node may be placed on again; a drain of it ends (a move under way is abandoned)."""

    name: str


class NodeDrainStarted(TaggedModel):
    """Cordon the node and move the keeper's instances off it, make-before-break."""

    name: str
    force: bool = False
    when: str = ""  # ISO-8601 UTC


class DrainReplacementPlaced(TaggedModel):
    """A replacement for ``old_instance_id`` was placed off the draining node."""

    name: str
    move: InstanceMove


class DeploymentOptionsChanged(TaggedModel):
    """A deployment's placement options changed: ``replace``, its instances placed with
    options it no longer has, are replaced one at a time, make-before-break (a rolling change).
    The list is judged when the change is made, on the State then, so that an instance placed
    afterwards is never replaced by this change, whatever its shape."""

    deployment_id: DeploymentId
    sharding: Sharding
    instance_meta: InstanceMeta
    min_nodes: int = Field(ge=1)
    replace: tuple[InstanceId, ...] = ()


class DeploymentReplacementPlaced(TaggedModel):
    """A rolling change placed the replacement of one of the deployment's instances."""

    deployment_id: DeploymentId
    move: InstanceMove


class FailoverReplacementPlaced(TaggedModel):
    """Fast failover placed a replacement for an instance on a suspect node (docs/design.md
    §5.18); ``at`` is Unix time."""

    deployment_id: DeploymentId
    move: InstanceMove
    at: float


class DeploymentRepairPlaced(TaggedModel):
    """A replacement for a broken instance of the deployment was placed (docs/design.md §5.19):
    the problem and why, in words, as the keeper recognised it."""

    deployment_id: DeploymentId
    move: InstanceMove
    problem: str = ""
    why: str = ""


class InstanceFoundBroken(TaggedModel):
    """The keeper recognised an instance of a deployment's model broken (docs/design.md
    §5.19): an incident on each of its nodes, the facts the repair backoff is computed from;
    ``at`` is Unix time."""

    instance_id: InstanceId
    model_id: ModelId
    node_ids: tuple[NodeId, ...]
    problem: str
    at: float


class RepairIncidentsExpired(TaggedModel):
    """The incidents recognised before ``before`` (Unix time) count for nothing any more (they
    are older than the backoff's window): they leave the State."""

    before: float


class DeploymentRepairChanged(TaggedModel):
    """A deployment's ``repair`` changed: "auto" replaces broken instances, "report" says them."""

    deployment_id: DeploymentId
    repair: RepairMode


class NodeDrainEnded(TaggedModel):
    """Nothing runs on the node any more: the drain is done (the node stays cordoned)."""

    name: str


# Every event, once: the plain union is the type for isinstance checks and match statements, and
# ``Event`` is the same union for pydantic, each member read under its class name.
AnyEvent = (
    DeploymentCreated
    | DeploymentDeleted
    | DeploymentPlaced
    | DeploymentPlacementFailed
    | DeploymentScaled
    | DeploymentStandbyChanged
    | DeploymentPriorityChanged
    | DeploymentServingChanged
    | DownloadRequested
    | DownloadDeletionRequested
    | InstanceCreated
    | InstanceDeleted
    | RunnerStatusUpdated
    | NodeGatheredInfo
    | NodeDownloadProgress
    | TopologyEdgeCreated
    | TopologyEdgeDeleted
    | NodeTimedOut
    | NodeSuspected
    | FailoverReplacementPlaced
    | NodeConfirmedDead
    | NodeHeardAgain
    | NodeCordoned
    | NodeUncordoned
    | NodeDrainStarted
    | DrainReplacementPlaced
    | DeploymentOptionsChanged
    | DeploymentReplacementPlaced
    | DeploymentRepairPlaced
    | DeploymentRepairChanged
    | InstanceFoundBroken
    | RepairIncidentsExpired
    | NodeDrainEnded
)
Event = Annotated[AnyEvent, TAGGED]

EVENT_ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(Event)


class IndexedEvent(WireModel):
    """An event with its place in the master's total order (0, 1, 2, ...)."""

    idx: int = Field(ge=0)
    event: Event
