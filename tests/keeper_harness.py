"""A small cluster for keeper tests: states built through the events the cluster applies.

``Cluster`` holds a State and a Keeper; every change goes through ``apply`` with the same events
a master would log (NodeGatheredInfo, TopologyEdgeCreated, DeploymentCreated, ...), and
``step(now)`` runs the keeper and applies what it returns, as the master does. Tests choose the
times, so no clock is involved.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import count, repeat

from keeper.core.keeper import Keeper, PlaceFn
from keeper.core.placement import place_instance
from keeper.model.apply import apply
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentOptionsChanged,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.rollout import outdated_instances
from keeper.model.state import (
    DEFAULT_PRIORITY,
    AnyInstance,
    Backend,
    Connection,
    Deployment,
    InstanceMeta,
    Memory,
    MemoryUsage,
    MlxJacclInstance,
    MlxRingInstance,
    ModelCard,
    Multiaddr,
    PipelineShardMetadata,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    ShardAssignments,
    Sharding,
    SocketConnection,
    State,
    TensorShardMetadata,
)

WHEN = "2026-01-01T00:00:00Z"
# The first moment the keeper may place (it is started at 0).
AFTER_GRACE = STARTUP_GRACE

ALL_BACKENDS = (Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU)


def card(
    model_id: str, size_gb: float = 1.0, n_layers: int = 16, hidden_size: int = 2048
) -> ModelCard:
    return ModelCard(
        model_id=model_id,
        storage_size=Memory.from_gb(size_gb),
        n_layers=n_layers,
        hidden_size=hidden_size,
        supports_tensor=True,
        num_key_value_heads=8,
    )


def memory(available_gb: float, total_gb: float | None = None) -> MemoryUsage:
    total = available_gb if total_gb is None else total_gb
    return MemoryUsage(ram_total=Memory.from_gb(total), ram_available=Memory.from_gb(available_gb))


def node_info(
    node_id: str,
    available_gb: float | None = 16.0,
    backends: Iterable[Backend] | None = ALL_BACKENDS,
) -> NodeGatheredInfo:
    return NodeGatheredInfo(
        node_id=node_id,
        when=WHEN,
        memory=None if available_gb is None else memory(available_gb),
        backends=None if backends is None else list(backends),
    )


def socket_edge(source: str, sink: str, port: int = 52415) -> Connection:
    host = sum(map(ord, sink)) % 250 + 1
    return Connection(
        source=source,
        sink=sink,
        edge=SocketConnection(sink_multiaddr=Multiaddr(address=f"/ip4/192.0.2.{host}/tcp/{port}")),
    )


def link_events(a: str, b: str) -> list[AnyEvent]:
    return [
        TopologyEdgeCreated(conn=socket_edge(a, b)),
        TopologyEdgeCreated(conn=socket_edge(b, a)),
    ]


def unlink_events(a: str, b: str) -> list[AnyEvent]:
    return [
        TopologyEdgeDeleted(conn=socket_edge(a, b)),
        TopologyEdgeDeleted(conn=socket_edge(b, a)),
    ]


class Cluster:
    """A State driven by real events, and a keeper stepped at chosen times."""

    def __init__(
        self,
        place: PlaceFn = place_instance,
        started_at: float = 0.0,
        startup_grace: float = STARTUP_GRACE,
    ) -> None:
        self.state = State()
        self.keeper = Keeper(started_at, place=place, startup_grace=startup_grace)
        self.log: list[AnyEvent] = []
        self._ids = count(1)
        self._place = place

    def restart_keeper(self, now: float) -> None:
        """A new keeper from ``now`` on the same State, with no grace (a new master once its
        nodes reported, or a bridge taking over): it remembers nothing but the State."""
        self.keeper = Keeper(now, place=self._place, startup_grace=0.0)

    # --- building the cluster -------------------------------------------------------------

    def apply(self, *events: AnyEvent) -> State:
        for event in events:
            self.state = apply(self.state, event)
            self.log.append(event)
        return self.state

    def add_node(
        self,
        node_id: str,
        available_gb: float | None = 16.0,
        backends: Iterable[Backend] | None = ALL_BACKENDS,
    ) -> None:
        self.apply(node_info(node_id, available_gb, backends))

    def add_nodes(self, *node_ids: str, available_gb: float = 16.0) -> None:
        """Nodes with memory and backends, fully linked to one another."""
        for node_id in node_ids:
            self.add_node(node_id, available_gb)
        for i, a in enumerate(node_ids):
            for b in node_ids[i + 1 :]:
                self.apply(*link_events(a, b))

    def link(self, a: str, b: str) -> None:
        self.apply(*link_events(a, b))

    def deploy(
        self,
        model: ModelCard | str,
        deployment_id: str | None = None,
        sharding: Sharding = Sharding.PIPELINE,
        instance_meta: InstanceMeta = InstanceMeta.MLX_RING,
        min_nodes: int = 1,
        replicas: int = 1,
        priority: int = DEFAULT_PRIORITY,
        preempt: bool = False,
    ) -> str:
        model_card = card(model) if isinstance(model, str) else model
        deployment_id = deployment_id or f"dep-{next(self._ids):04d}"
        self.apply(
            DeploymentCreated(
                deployment=Deployment(
                    deployment_id=deployment_id,
                    model_card=model_card,
                    sharding=sharding,
                    instance_meta=instance_meta,
                    min_nodes=min_nodes,
                    replicas=replicas,
                    priority=priority,
                    preempt=preempt,
                )
            )
        )
        return deployment_id

    # --- running the keeper ---------------------------------------------------------------

    def step(self, now: float) -> list[AnyEvent]:
        """One keeper step at ``now``; its events are applied, as the master does."""
        events = self.keeper.step(self.state, now)
        self.apply(*events)
        return events

    def step_keep(self, now: float) -> list[AnyEvent]:
        """One keeper step whose events are returned but not applied (still on their way)."""
        return self.keeper.step(self.state, now)

    def delete(self, deployment_id: str) -> list[AnyEvent]:
        events = self.keeper.delete(deployment_id, self.state)
        self.apply(*events)
        return events

    def scale(self, deployment_id: str, replicas: int) -> list[AnyEvent]:
        events = self.keeper.scale(deployment_id, replicas, self.state)
        self.apply(*events)
        return events

    def cordon(self, name: str) -> list[AnyEvent]:
        events = self.keeper.cordon(name, self.state)
        self.apply(*events)
        return events

    def uncordon(self, name: str) -> list[AnyEvent]:
        events = self.keeper.uncordon(name, self.state)
        self.apply(*events)
        return events

    def drain(self, name: str, force: bool = False) -> list[AnyEvent]:
        events = self.keeper.drain(name, force, WHEN, self.state)
        self.apply(*events)
        return events

    def change_options(
        self,
        deployment_id: str,
        sharding: Sharding | None = None,
        instance_meta: InstanceMeta | None = None,
        min_nodes: int | None = None,
    ) -> DeploymentOptionsChanged:
        """A rolling change as the services make it: the instances to replace judged now."""
        deployment = self.deployment(deployment_id)
        changed = deployment.model_copy(
            update={
                "sharding": sharding or deployment.sharding,
                "instance_meta": instance_meta or deployment.instance_meta,
                "min_nodes": min_nodes or deployment.min_nodes,
            }
        )
        event = DeploymentOptionsChanged(
            deployment_id=deployment_id,
            sharding=changed.sharding,
            instance_meta=changed.instance_meta,
            min_nodes=changed.min_nodes,
            replace=outdated_instances(self.state, changed),
        )
        self.apply(event)
        return event

    # --- what runners and nodes do --------------------------------------------------------

    def deployment(self, deployment_id: str) -> Deployment:
        return self.state.deployments[deployment_id]

    def instance_of(self, deployment_id: str) -> AnyInstance:
        instance_id = self.deployment(deployment_id).instance_id
        assert instance_id is not None, f"{deployment_id} has no instance"
        return self.state.instances[instance_id]

    def instances_of_model(self, model_id: str) -> list[AnyInstance]:
        return [
            i for i in self.state.instances.values() if i.shard_assignments.model_id == model_id
        ]

    def nodes_of(self, instance_id: str) -> list[str]:
        return list(self.state.instances[instance_id].shard_assignments.node_to_runner)

    def make_ready(self, instance_id: str) -> None:
        instance = self.state.instances[instance_id]
        for runner_id in instance.shard_assignments.node_to_runner.values():
            self.apply(RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerReady()))

    def make_loading(self, instance_id: str) -> None:
        instance = self.state.instances[instance_id]
        for runner_id in instance.shard_assignments.node_to_runner.values():
            self.apply(
                RunnerStatusUpdated(
                    runner_id=runner_id,
                    runner_status=RunnerLoading(layers_loaded=1, total_layers=16),
                )
            )

    def fail_runner(self, instance_id: str) -> None:
        instance = self.state.instances[instance_id]
        runner_id = next(iter(instance.shard_assignments.node_to_runner.values()))
        self.apply(
            RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerFailed(error_message="x"))
        )

    def delete_instance(self, instance_id: str) -> None:
        self.apply(InstanceDeleted(instance_id=instance_id))

    def kill_node(self, node_id: str) -> None:
        """The node goes silent: NodeTimedOut, then the sweep deletes instances that used it."""
        self.apply(NodeTimedOut(node_id=node_id))
        for instance_id, instance in list(self.state.instances.items()):
            if node_id in instance.shard_assignments.node_to_runner:
                self.apply(InstanceDeleted(instance_id=instance_id))


# --- a stand-in placement -------------------------------------------------------------------

_instance_ids = count(1)


def build_instance(
    model_card: ModelCard, nodes: list[str], instance_id: str | None = None
) -> AnyInstance:
    """A pipeline ring instance of ``model_card`` over ``nodes``, layers split evenly."""
    instance_id = instance_id or f"inst-{next(_instance_ids):05d}"
    n_layers = model_card.n_layers
    runner_to_shard: dict[str, PipelineShardMetadata] = {}
    node_to_runner: dict[str, str] = {}
    for rank, node in enumerate(nodes):
        runner_id = f"{instance_id}-runner-{rank}"
        node_to_runner[node] = runner_id
        runner_to_shard[runner_id] = PipelineShardMetadata(
            model_card=model_card,
            device_rank=rank,
            world_size=len(nodes),
            start_layer=rank * n_layers // len(nodes),
            end_layer=(rank + 1) * n_layers // len(nodes),
            n_layers=n_layers,
        )
    return MlxRingInstance(
        instance_id=instance_id,
        shard_assignments=ShardAssignments(
            model_id=model_card.model_id,
            runner_to_shard=dict(runner_to_shard),
            node_to_runner=node_to_runner,
        ),
    )


def _freest_fitting_nodes(state: State, model_card: ModelCard, min_nodes: int) -> list[str]:
    usable = [
        n for n in state.topology.nodes if n in state.node_memory and state.node_backends.get(n)
    ]
    usable.sort(key=lambda n: (-state.node_memory[n].ram_available.in_bytes, n))
    chosen = usable[: max(min_nodes, 1)]
    free = sum(state.node_memory[n].ram_available.in_bytes for n in chosen)
    if len(chosen) < min_nodes or free < model_card.storage_size.in_bytes:
        raise ValueError("No cycles found with sufficient memory")
    return chosen


def simple_place(
    state: State,
    model_card: ModelCard,
    sharding: Sharding | str,
    instance_meta: InstanceMeta | str,
    min_nodes: int,
) -> AnyInstance:
    """Placement reduced to what keeper rules need: the freest usable nodes that hold the model."""
    return build_instance(model_card, _freest_fitting_nodes(state, model_card, min_nodes))


def shaped_place(
    state: State,
    model_card: ModelCard,
    sharding: Sharding | str,
    instance_meta: InstanceMeta | str,
    min_nodes: int,
) -> AnyInstance:
    """``simple_place`` that gives the instance the kind and the shards its options ask for."""
    ring = simple_place(state, model_card, sharding, instance_meta, min_nodes)
    assignments = ring.shard_assignments
    if Sharding(sharding) is Sharding.TENSOR:
        shards = {
            runner: TensorShardMetadata(
                model_card=shard.model_card,
                device_rank=shard.device_rank,
                world_size=shard.world_size,
                start_layer=shard.start_layer,
                end_layer=shard.end_layer,
                n_layers=shard.n_layers,
            )
            for runner, shard in assignments.runner_to_shard.items()
        }
        assignments = assignments.model_copy(update={"runner_to_shard": shards})
    if InstanceMeta(instance_meta) is InstanceMeta.MLX_JACCL:
        return MlxJacclInstance(instance_id=ring.instance_id, shard_assignments=assignments)
    return ring.model_copy(update={"shard_assignments": assignments})


def numbered_place() -> PlaceFn:
    """``simple_place`` with instance ids of its own (p-1, p-2, ...), so two runs compare equal."""
    numbers = count(1)

    def place(
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        nodes = _freest_fitting_nodes(state, model_card, min_nodes)
        return build_instance(model_card, nodes, instance_id=f"p-{next(numbers)}")

    return place


class RecordingPlace:
    """Wraps a placement function and records every call (model id, sharding, meta, min_nodes).

    ``failing`` maps a model id to an exception raised instead of placing it, so one test can
    mix deployments that place with ones that cannot.
    """

    def __init__(self, inner: PlaceFn = simple_place) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str, str, int]] = []
        self.instances_seen: list[int] = []  # how many instances each call's state held
        self.failing: dict[str, Exception] = {}

    def __call__(
        self,
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        self.calls.append((model_card.model_id, str(sharding), str(instance_meta), min_nodes))
        self.instances_seen.append(len(state.instances))
        failure = self.failing.get(model_card.model_id)
        if failure is not None:
            raise failure
        return self.inner(state, model_card, sharding, instance_meta, min_nodes)

    def models_tried(self) -> list[str]:
        return [call[0] for call in self.calls]


def unplaceable(reason: str = "No cycles found with sufficient memory") -> PlaceFn:
    """A placement that always fails with ``reason``."""
    return _failing_with(repeat(reason))


def unplaceable_for(*reasons: str) -> PlaceFn:
    """A placement that fails with each of ``reasons`` in turn."""
    return _failing_with(iter(reasons))


def _failing_with(reasons: Iterator[str]) -> PlaceFn:
    def place(
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        raise ValueError(next(reasons))

    return place
