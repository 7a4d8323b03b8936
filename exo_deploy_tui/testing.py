"""A scripted master for the dashboard's tests, benchmarks and screenshots.

``ScriptedClient`` implements the client protocol in memory: it hands the app whatever updates a
test pushes, answers ``/models`` from the built-in catalog and ``/nodes``, ``/whatif`` and
``/healthz`` with what the test scripts, and records create/delete/scale/edit and
cordon/uncordon/drain requests (or refuses them with a chosen error). ``ClusterBuilder`` writes
States the way a master would hold them, with deterministic ids so screenshots are stable. Both
live in the package, not in tests/, because the benchmarks drive the real app with them too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.updates import ConnectionUpdate, SnapshotUpdate, Update
from keeper.model.api_models import (
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentView,
    DrainView,
    ModelListEntry,
    NodesResponse,
    NodeView,
    RequestsView,
    ServiceHealthView,
    WaitReason,
    WhatIfResponse,
    model_entry,
)
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.readiness import deployment_statuses, ready_replicas
from keeper.model.request_window import WINDOW_S
from keeper.model.state import (
    AnyDownload,
    AnyRunnerStatus,
    Backend,
    Deployment,
    DiskUsage,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Edge,
    InstanceMove,
    Memory,
    MemoryUsage,
    MlxRingInstance,
    ModelCard,
    Multiaddr,
    NodeDrain,
    NodeIdentity,
    NodeWatch,
    NodeWatchPhase,
    PipelineShardMetadata,
    RunnerReady,
    ServingRecord,
    ShardAssignments,
    SocketConnection,
    State,
    SystemVitals,
    Topology,
    download_model_id,
    node_name,
)

# Frozen "now" for screenshots and tests: 2026-11-30 12:00:00 UTC.
FROZEN_NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC).timestamp()

# Room for a burst of updates a test pushes before the app reads them.
_QUEUE_DEPTH = 10_000


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat().replace("+00:00", "Z")


def node_id_for(name: str) -> str:
    return f"12D3KooW{name}"


def _slug(model_id: str) -> str:
    """How the builder names a model's deployment and instances: ``dep-<slug>``."""
    return model_id.rsplit("/", 1)[-1].lower()


@dataclass
class ClusterBuilder:
    """Builds a State and the matching /deployments answer, as of ``now``."""

    now: float = FROZEN_NOW
    state: State = field(default_factory=State)
    views: dict[str, DeploymentView] = field(default_factory=dict)

    def node(
        self,
        name: str,
        ram_gb: float = 64,
        free_gb: float = 48,
        backends: Sequence[Backend] = (Backend.MLX_METAL,),
        seen_ago_s: float = 1.0,
        chip: str = "Apple M4 Pro",
    ) -> ClusterBuilder:
        node = node_id_for(name)
        s = self.state
        self.state = s.model_copy(
            update={
                "topology": Topology(
                    nodes=[*s.topology.nodes, node], connections=s.topology.connections
                ),
                "node_memory": {
                    **s.node_memory,
                    node: MemoryUsage(
                        ram_total=Memory.from_gb(ram_gb), ram_available=Memory.from_gb(free_gb)
                    ),
                },
                "node_backends": {**s.node_backends, node: list(backends)},
                "node_identities": {
                    **s.node_identities,
                    node: NodeIdentity(
                        friendly_name=name, model_id="Mac mini", chip_id=chip, os_version="26.1"
                    ),
                },
                "last_seen": {**s.last_seen, node: iso(self.now - seen_ago_s)},
            }
        )
        return self

    def link_all(self) -> ClusterBuilder:
        nodes = self.state.topology.nodes
        connections: dict[str, dict[str, list[Edge]]] = {
            src: {
                dst: [
                    SocketConnection(
                        sink_multiaddr=Multiaddr(address=f"/ip4/192.0.2.{i + 10}/tcp/52415")
                    )
                ]
                for i, dst in enumerate(nodes)
                if dst != src
            }
            for src in nodes
        }
        self.state = self.state.model_copy(
            update={"topology": Topology(nodes=list(nodes), connections=connections)}
        )
        return self

    def deployment(
        self,
        model_id: str,
        *,
        on: Sequence[str] = (),
        runners: Sequence[AnyRunnerStatus] | None = None,
        error: str | None = None,
        min_nodes: int = 1,
        failures: int = 0,
        next_attempt_in_s: float | None = None,
        waiting: WaitReason | None = None,
        card: ModelCard | None = None,
        replicas: int = 1,
        by_keeper: bool = False,
    ) -> ClusterBuilder:
        """A deployment of a catalog model (or of ``card``) keeping ``replicas``; ``on`` places
        an instance on those nodes (``instance`` adds more). ``by_keeper`` records that
        instance as the keeper's placement (``placed_instance_ids``, what a drain moves), as a
        master does; without it the instance reads as placed some other way."""
        card = card or catalog_by_id()[model_id]
        slug = model_id.rsplit("/", 1)[-1].lower()
        deployment_id = f"dep-{slug}"
        instance_id = f"inst-{slug}" if on else None
        deployment = Deployment(
            deployment_id=deployment_id,
            model_card=card,
            min_nodes=min_nodes,
            instance_id=instance_id,
            placement_error=error,
            replicas=replicas,
            placed_instance_ids=(instance_id,) if instance_id and by_keeper else (),
        )
        s = self.state
        self.state = s.model_copy(
            update={"deployments": {**s.deployments, deployment_id: deployment}}
        )
        if on:
            self.instance(model_id, on=on, runners=runners, card=card)
        due = None if next_attempt_in_s is None else iso(self.now + next_attempt_in_s)
        self.views[deployment_id] = DeploymentView(
            deployment=deployment,
            # The status the master would report, by the TUI's own rule (the TUI derives it
            # from the State; describe shows this view as received).
            status=deployment_statuses(self.state)[deployment_id],
            failures=failures,
            next_attempt_at=due,
            next_attempt_in_s=next_attempt_in_s,
            waiting=waiting,
        )
        return self

    def instance(
        self,
        model_id: str,
        *,
        on: Sequence[str],
        runners: Sequence[AnyRunnerStatus] | None = None,
        card: ModelCard | None = None,
        suffix: str = "",
    ) -> ClusterBuilder:
        """An instance of the model on the nodes ``on`` (ids ``inst-<model><suffix>`` and
        ``run-<model><suffix>-<rank>``), runners Ready unless ``runners`` says otherwise."""
        card = card or catalog_by_id()[model_id]
        slug = model_id.rsplit("/", 1)[-1].lower() + suffix
        instance_id = f"inst-{slug}"
        statuses = list(runners) if runners is not None else [RunnerReady()] * len(on)
        runner_to_shard: dict[str, PipelineShardMetadata] = {}
        node_to_runner: dict[str, str] = {}
        per_node = max(1, card.n_layers // len(on))
        for rank, name in enumerate(on):
            runner_id = f"run-{slug}-{rank}"
            start = rank * per_node
            end = card.n_layers if rank == len(on) - 1 else start + per_node
            runner_to_shard[runner_id] = PipelineShardMetadata(
                model_card=card,
                device_rank=rank,
                world_size=len(on),
                start_layer=start,
                end_layer=end,
                n_layers=card.n_layers,
            )
            node_to_runner[node_id_for(name)] = runner_id
        instance = MlxRingInstance(
            instance_id=instance_id,
            shard_assignments=ShardAssignments(
                model_id=model_id,
                runner_to_shard=dict(runner_to_shard),
                node_to_runner=node_to_runner,
            ),
        )
        s = self.state
        self.state = s.model_copy(
            update={
                "instances": {**s.instances, instance_id: instance},
                "runners": {
                    **s.runners,
                    **{f"run-{slug}-{rank}": st for rank, st in enumerate(statuses)},
                },
            }
        )
        return self

    def chats(
        self, model_id: str, *, p95_ttft_s: float | None = 0.42, **outcomes: int
    ) -> ClusterBuilder:
        """The deployment's chats through the front door over the last five minutes, as the
        service sums them (``keeper.model.request_window``): ``outcomes`` counted by outcome
        (``ok=112, held=3``); no outcome at all is no sum (``requests`` None)."""
        deployment_id = f"dep-{_slug(model_id)}"
        ended = sum(outcomes.values())
        requests = (
            RequestsView(
                window_s=WINDOW_S,
                rate=ended / WINDOW_S,
                errors=outcomes.get("failed", 0),
                p95_ttft_s=p95_ttft_s,
                outcomes={name: count for name, count in outcomes.items() if count},
            )
            if ended
            else None
        )
        view = self.views[deployment_id]
        self.views[deployment_id] = view.model_copy(update={"requests": requests})
        return self

    def suspect(
        self,
        name: str,
        heard_ago_s: float = 4.0,
        *,
        phase: NodeWatchPhase = "suspect",
        since_ago_s: float | None = None,
        why: str = "",
    ) -> ClusterBuilder:
        """A service's verdict on the node (``State.node_watch``): last heard ``heard_ago_s``
        ago (its lastSeen too), in ``phase`` since ``since_ago_s`` ago (by default, since it
        was suspected at the default threshold, 3 s after its last report)."""
        node = node_id_for(name)
        last = self.now - heard_ago_s
        since = self.now - since_ago_s if since_ago_s is not None else last + 3.0
        watch = NodeWatch(phase=phase, last_heard=last, since=since, why=why)
        s = self.state
        self.state = s.model_copy(
            update={
                "node_watch": {**s.node_watch, node: watch},
                "last_seen": {**s.last_seen, node: iso(last)},
            }
        )
        return self

    def replacement(
        self,
        model_id: str,
        *,
        on: Sequence[str],
        runners: Sequence[AnyRunnerStatus] | None = None,
        placed_ago_s: float = 1.0,
    ) -> ClusterBuilder:
        """The failover's replacement for the deployment's instance (``inst-<model>-r``),
        recorded on the deployment as the keeper records it (``Deployment.failover``)."""
        self.instance(model_id, on=on, runners=runners, suffix="-r")
        slug = _slug(model_id)
        deployment_id = f"dep-{slug}"
        move = InstanceMove(
            deployment_id=deployment_id,
            old_instance_id=f"inst-{slug}",
            new_instance_id=f"inst-{slug}-r",
        )
        s = self.state
        deployment = s.deployments[deployment_id].model_copy(
            update={"failover": move, "failover_since": self.now - placed_ago_s}
        )
        self.state = s.model_copy(
            update={"deployments": {**s.deployments, deployment_id: deployment}}
        )
        return self

    def disk(self, name: str, total_gb: float = 500, free_gb: float = 320) -> ClusterBuilder:
        """The node's models directory, as its NodeGatheredInfo reports it."""
        usage = DiskUsage(total=Memory.from_gb(total_gb), available=Memory.from_gb(free_gb))
        s = self.state
        self.state = s.model_copy(update={"node_disk": {**s.node_disk, node_id_for(name): usage}})
        return self

    def vitals(
        self, name: str, gpu: float = 0.0, temp: float = 40.0, power: float = 12.0
    ) -> ClusterBuilder:
        """The node's GPU use (0-1), temperature (°C) and power (W)."""
        vitals = SystemVitals(gpu_usage=gpu, temp=temp, sys_power=power)
        s = self.state
        self.state = s.model_copy(
            update={"node_system": {**s.node_system, node_id_for(name): vitals}}
        )
        return self

    def download(
        self,
        name: str,
        model_id: str,
        *,
        done_gb: float | None = None,
        speed_mb: float = 0.0,
        eta_s: float | None = None,
        failed: str | None = None,
        queued: bool = False,
        card: ModelCard | None = None,
    ) -> ClusterBuilder:
        """The node's download of the model, as exo reports it: ongoing with ``done_gb`` of the
        model's size at ``speed_mb`` MB/s, or ``queued``, or ``failed`` with that message, else
        completed. It replaces the node's entry for the model, as exo's does."""
        card = card or catalog_by_id()[model_id]
        node = node_id_for(name)
        shard = PipelineShardMetadata(
            model_card=card,
            device_rank=0,
            world_size=1,
            start_layer=0,
            end_layer=card.n_layers,
            n_layers=card.n_layers,
        )
        total = card.storage_size
        entry: AnyDownload
        if failed is not None:
            entry = DownloadFailed(node_id=node, shard_metadata=shard, error_message=failed)
        elif queued:
            entry = DownloadPending(node_id=node, shard_metadata=shard, total=total)
        elif done_gb is not None:
            progress = DownloadProgressData(
                total=total,
                downloaded=Memory.from_gb(done_gb),
                downloaded_this_session=Memory.from_gb(done_gb),
                speed=speed_mb * 1024**2,
                eta_ms=int(eta_s * 1000) if eta_s is not None else 0,
            )
            entry = DownloadOngoing(node_id=node, shard_metadata=shard, download_progress=progress)
        else:
            entry = DownloadCompleted(node_id=node, shard_metadata=shard, total=total)
        s = self.state
        entries = s.downloads.get(node, [])
        if any(download_model_id(e) == model_id for e in entries):
            entries = [entry if download_model_id(e) == model_id else e for e in entries]
        else:
            entries = [*entries, entry]
        self.state = s.model_copy(update={"downloads": {**s.downloads, node: entries}})
        return self

    def served(self, model_id: str, *changes: tuple[float, bool, str | None]) -> ClusterBuilder:
        """Serving records of the model's deployment, as the master logs them: each change is
        ``(seconds before now, serving, cause)``, oldest first, the first one its creation."""
        deployment_id = f"dep-{model_id.rsplit('/', 1)[-1].lower()}"
        records = tuple(
            ServingRecord(
                at=self.now - ago,
                serving=serving,
                cause=cause,
                begins="created" if index == 0 else None,
            )
            for index, (ago, serving, cause) in enumerate(changes)
        )
        s = self.state
        history = {**s.serving_history, deployment_id: records}
        self.state = s.model_copy(update={"serving_history": history})
        return self

    def cordon(self, name: str) -> ClusterBuilder:
        """The node called ``name`` gets no new placement (it need not be in the cluster)."""
        s = self.state
        self.state = s.model_copy(update={"cordoned": tuple(sorted({*s.cordoned, name}))})
        return self

    def drain(
        self, name: str, *moves: tuple[str, str], started_ago_s: float = 30.0
    ) -> ClusterBuilder:
        """A drain of the node called ``name`` (cordoned too), with a move under way for each
        ``(model_id, suffix)``: the model's deployment's instance being replaced by the
        instance ``inst-<model><suffix>`` (which ``instance`` adds)."""
        drain_moves = tuple(
            InstanceMove(
                deployment_id=f"dep-{_slug(model_id)}",
                old_instance_id=f"inst-{_slug(model_id)}",
                new_instance_id=f"inst-{_slug(model_id)}{suffix}",
            )
            for model_id, suffix in moves
        )
        drain = NodeDrain(node=name, started=iso(self.now - started_ago_s), moves=drain_moves)
        self.cordon(name)
        s = self.state
        self.state = s.model_copy(update={"drains": {**s.drains, name: drain}})
        return self

    def nodes_answer(self, stuck: dict[str, str] | None = None) -> NodesResponse:
        """What GET /nodes answers for this State, as the master builds it: each drain's moves,
        the keeper's instances still to move and the others left alone, and ``stuck``'s
        reason for a node, by name."""
        s = self.state
        names = {node_name(s, n) for n in s.topology.nodes} | set(s.cordoned)
        owner = {i: d for d, dep in s.deployments.items() for i in dep.placed_instance_ids}
        views: list[NodeView] = []
        for name in sorted(names):
            ids = sorted(n for n in s.topology.nodes if node_name(s, n) == name)
            drain = s.drains.get(name)
            view = None
            if drain is not None:
                moving = {m.deployment_id for m in drain.moves}
                on = sorted(
                    i
                    for i, inst in s.instances.items()
                    if set(ids) & set(inst.shard_assignments.node_to_runner)
                )
                old = {m.old_instance_id for m in drain.moves}
                view = DrainView(
                    force=drain.force,
                    started=drain.started,
                    moving=list(drain.moves),
                    to_move=[
                        i for i in on if i in owner and i not in old and owner[i] not in moving
                    ],
                    unmanaged=[i for i in on if i not in owner],
                    stuck=(stuck or {}).get(name),
                )
            views.append(NodeView(name=name, node_ids=ids, cordoned=name in s.cordoned, drain=view))
        return NodesResponse(nodes=views)

    def snapshot(self) -> SnapshotUpdate:
        deployments = self.state.deployments
        views = tuple(
            v.model_copy(
                update={
                    "deployment": deployments[d],
                    "replicas": deployments[d].replicas,
                    "ready_replicas": ready_replicas(deployments[d], self.state),
                }
            )
            for d, v in self.views.items()
            if d in deployments
        )
        return SnapshotUpdate(self.state, views)


@dataclass
class ScriptedClient:
    """An in-memory master: pushes what the test says, records what the app asks."""

    initial: Sequence[Update] = ()
    url: str = "http://127.0.0.1:52415"
    models_list: list[ModelListEntry] = field(
        default_factory=lambda: [model_entry(c) for c in BUILTIN_MODEL_CARDS]
    )
    created: list[CreateDeploymentRequest] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    scaled: list[tuple[str, int]] = field(default_factory=list)
    # Each PATCH of settings: the deployment and the body as sent.
    updated: list[tuple[str, dict[str, int | bool | str]]] = field(default_factory=list)
    deleted_instances: list[str] = field(default_factory=list)
    # Node commands in the order sent: ("cordon", name), ("uncordon", name), ("drain", name).
    node_commands: list[tuple[str, str]] = field(default_factory=list)
    drained_forced: list[bool] = field(default_factory=list)  # each drain's force
    nodes_answer: NodesResponse = field(default_factory=lambda: NodesResponse(nodes=[]))
    nodes_asked: int = 0  # how often GET /nodes was read
    whatif_answer: WhatIfResponse = field(
        default_factory=lambda: WhatIfResponse(nodes=[], deployments=[])
    )
    whatif_asked: list[str] = field(default_factory=list)  # the node of each GET /whatif
    refuse_with: ApiError | None = None
    # What GET /healthz says of the service (a bridge's role); None: nothing of the kind.
    health_answer: ServiceHealthView | None = None
    on_create: Callable[[CreateDeploymentRequest], None] | None = None
    resyncs: int = 0  # how often the app asked to start again from a snapshot
    _send: MemoryObjectSendStream[Update] | None = None
    _receive: MemoryObjectReceiveStream[Update] | None = None

    def __post_init__(self) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[Update](_QUEUE_DEPTH)

    def push(self, *updates: Update) -> None:
        assert self._send is not None
        for update in updates:
            self._send.send_nowait(update)

    async def run(self, emit: Callable[[Update], None]) -> None:
        assert self._receive is not None
        emit(ConnectionUpdate("connecting", self.url))
        for update in self.initial:
            emit(update)
        async for update in self._receive:
            emit(update)
            # Hand over everything already queued at once, as a socket read hands over a
            # whole buffer, rather than one update per turn of the event loop.
            while True:
                try:
                    emit(self._receive.receive_nowait())
                except anyio.WouldBlock:
                    break

    def resync(self) -> None:
        self.resyncs += 1

    async def models(self) -> list[ModelListEntry]:
        return list(self.models_list)

    async def create_deployment(self, request: CreateDeploymentRequest) -> CommandResponse:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.created.append(request)
        if self.on_create is not None:
            self.on_create(request)
        return CommandResponse(message="created", command_id="cmd-1", deployment_id="dep-new")

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.deleted.append(deployment_id)
        return CommandResponse(message="deleted", command_id="cmd-2", deployment_id=deployment_id)

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.scaled.append((deployment_id, replicas))
        return CommandResponse(message="scaled", command_id="cmd-3", deployment_id=deployment_id)

    async def update_deployment(
        self, deployment_id: str, changes: Mapping[str, int | bool | str]
    ) -> CommandResponse:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.updated.append((deployment_id, dict(changes)))
        return CommandResponse(message="updated", command_id="cmd-5", deployment_id=deployment_id)

    async def service_health(self) -> ServiceHealthView | None:
        return self.health_answer

    async def delete_instance(self, instance_id: str) -> None:
        if self.refuse_with is not None:
            raise self.refuse_with
        self.deleted_instances.append(instance_id)

    async def nodes(self) -> NodesResponse:
        self.nodes_asked += 1
        if self.refuse_with is not None:
            raise self.refuse_with
        return self.nodes_answer

    async def what_if(self, node: str) -> WhatIfResponse:
        self.whatif_asked.append(node)
        if self.refuse_with is not None:
            raise self.refuse_with
        return self.whatif_answer

    async def cordon(self, node: str) -> CommandResponse:
        return self._node_command("cordon", node, "cordoned")

    async def uncordon(self, node: str) -> CommandResponse:
        return self._node_command("uncordon", node, "uncordoned")

    async def drain(self, node: str, force: bool) -> CommandResponse:
        self.drained_forced.append(force)
        return self._node_command("drain", node, "draining")

    def _node_command(self, command: str, node: str, done: str) -> CommandResponse:
        """Record the command, then answer as the master does (or refuse)."""
        if self.refuse_with is not None:
            raise self.refuse_with
        self.node_commands.append((command, node))
        return CommandResponse(message=f"Node {node} {done}", command_id="cmd-4")

    async def aclose(self) -> None:
        return None
