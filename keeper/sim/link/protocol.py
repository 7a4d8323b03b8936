"""The node <-> master protocol: JSON messages, one per WebSocket text frame.

Shared by the master (``keeper.sim.master``) and the simulated node (``keeper.sim.node``), and
carried
by either a real WebSocket (``/node/ws``) or an in-memory channel for virtual-time tests, so the
node logic never knows which. Messages are tagged unions like everything else on our wire.

A session: the master sends a fresh ``Challenge``; the node answers ``Hello`` with its id and the
challenge signed by the key that id is made of (``keeper.sim.link.identity``); the master answers
``Welcome`` with a full State snapshot and then streams every ``IndexedEvent`` as
``EventMessage``. The node sends ``NodeInfo`` when
what it knows about itself changes (and at least every ``INFO_REFRESH_S``), ``Heartbeat`` every
``HEARTBEAT_S``, ``RunnerStatusReport`` as its runners move through exo's lifecycle, ``LinkUp`` /
``LinkDown`` for its links to other nodes, ``DownloadReport`` as a model's download on it moves
(exo's entries), and ``RequestInstanceDeletion`` when a runner keeps failing. The master
forwards chat requests for an instance to the node holding its rank-0 runner with
``ChatRequest`` and the node streams ``ChatChunk`` back (``ChatError`` on failure); it passes on
exo's download commands as ``StartDownload``, ``DeleteDownload`` and ``CancelDownload``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, TypeAdapter

from keeper.model.events import IndexedEvent
from keeper.model.state import (
    Backend,
    DiskUsage,
    DownloadEntry,
    Edge,
    MemoryUsage,
    ModelId,
    NodeId,
    NodeIdentity,
    NodeNetwork,
    RdmaCtl,
    RunnerId,
    RunnerStatus,
    Shard,
    State,
    SystemVitals,
)
from keeper.model.wire import TAGGED, TaggedModel, WireModel

# A node sends a heartbeat this often; the master times a node out after 30 s of silence, so a
# few lost heartbeats never cost a node its membership.
HEARTBEAT_S = 1.0
# A node re-sends its info at least this often even when nothing changed, so a master that
# missed a report (restart, partition) learns the truth within this bound; and each info moves
# the node's ``lastSeen``, which exo's nodes do about once a second (their memory sample), so a
# bridge judging silence from ``lastSeen`` sees our nodes as it sees exo's (docs/design.md §5.18).
INFO_REFRESH_S = 1.0
# How often a node re-sends its links when nothing changed (their refresh need not follow the
# info's: links are not what silence is judged on).
LINK_REFRESH_S = 5.0


# --- node -> master -----------------------------------------------------------------------


class Hello(TaggedModel):
    node_id: NodeId
    name: str
    # The master's challenge signed with the node's key, hex (``keeper.sim.link.identity``).
    signature: str = Field(max_length=256)
    # Instance ids this node currently runs a runner for (so a new master hears about them).
    running_instances: list[str] = []


class NodeInfo(TaggedModel):
    memory: MemoryUsage
    backends: list[Backend]
    identity: NodeIdentity
    network: NodeNetwork
    rdma_ctl: RdmaCtl | None = None
    disk: DiskUsage | None = None  # its models directory
    system: SystemVitals | None = None


class Heartbeat(TaggedModel):
    pass


class RunnerStatusReport(TaggedModel):
    runner_id: RunnerId
    runner_status: RunnerStatus


class LinkUp(TaggedModel):
    sink: NodeId
    edge: Edge


class LinkDown(TaggedModel):
    sink: NodeId
    edge: Edge


class RequestInstanceDeletion(TaggedModel):
    instance_id: str
    reason: str


class DownloadReport(TaggedModel):
    """The node's entry for one model moved (the master logs it as NodeDownloadProgress)."""

    download_progress: DownloadEntry


class ChatChunk(TaggedModel):
    request_id: str
    text: str = ""
    finish_reason: str | None = None  # "stop" or "length" on the last chunk


class ChatError(TaggedModel):
    request_id: str
    message: str


# Each message union once: the plain union is the type for isinstance and match, the Annotated
# one the same union for pydantic, each member read under its class name (``keeper.model.wire``).
AnyNodeMessage = (
    Hello
    | NodeInfo
    | Heartbeat
    | RunnerStatusReport
    | LinkUp
    | LinkDown
    | RequestInstanceDeletion
    | DownloadReport
    | ChatChunk
    | ChatError
)
NodeMessage = Annotated[AnyNodeMessage, TAGGED]
NODE_MESSAGE: TypeAdapter[AnyNodeMessage] = TypeAdapter(NodeMessage)


# --- master -> node -----------------------------------------------------------------------


class Challenge(TaggedModel):
    """The master's first message: what the node signs to prove its id (hex, fresh each time)."""

    nonce: str


class Welcome(TaggedModel):
    state: State


class EventMessage(TaggedModel):
    indexed: IndexedEvent


class ChatMessage(WireModel):
    role: str
    content: str


class ChatRequest(TaggedModel):
    request_id: str
    instance_id: str
    messages: list[ChatMessage]
    max_tokens: int = Field(default=64, ge=1)


class CancelChat(TaggedModel):
    request_id: str


class StartDownload(TaggedModel):
    """Download the shard's whole model unless it is on disk (exo's StartDownload command)."""

    shard_metadata: Shard


class DeleteDownload(TaggedModel):
    """Delete the model's files (exo's DeleteDownload command)."""

    model_id: ModelId


class CancelDownload(TaggedModel):
    """Stop the model's download, keeping what it has (exo's CancelDownload command)."""

    model_id: ModelId


AnyMasterMessage = (
    Challenge
    | Welcome
    | EventMessage
    | ChatRequest
    | CancelChat
    | StartDownload
    | DeleteDownload
    | CancelDownload
)
MasterMessage = Annotated[AnyMasterMessage, TAGGED]
MASTER_MESSAGE: TypeAdapter[AnyMasterMessage] = TypeAdapter(MasterMessage)
