"""A pure, seeded simulation of an exo cluster around one Keeper, in whole simulated seconds.

Why it is shaped this way:
- Pure Python, one ``random.Random`` and no clock or asyncio, so hours of cluster life run in
  seconds and any failure is replayed exactly from its seed (instance and runner ids are
  renamed from a counter for the same reason: placement mints uuid4s).
- It keeps two States. ``true_state`` has every event applied the moment it is emitted: the
  cluster's log. ``view`` is what the master's keeper sees: the same events, in the same order,
  delivered only after a delay (``max_lag_s``), as the master's event router does. Safety
  invariants are checked on the true state; the keeper only ever reads the view.
- The world (nodes, runners, the master's membership sweep) reacts to events as they are
  emitted, through a per-second schedule: runners go Connecting -> Loading -> Ready over a few
  seconds, a dead node falls silent and is timed out later, a node rejoins in pieces (shows up;
  reports memory and backends; links follow), and a node gives up on an instance whose runner
  failed by asking for its deletion.
- Users act through the master's API semantics over the view (``create_deployment`` refuses a
  model that already has a deployment *there*; ``delete_deployment`` calls ``Keeper.delete``),
  so duplicates can only come from lag, never from the simulator cheating.

Observers (``on_event``, ``on_step``, ``on_delete``, ``on_scale``, ``on_restart``,
``on_place``) let checks
watch everything without the simulator knowing about them. ``Chaos`` drives random faults.
"""

from __future__ import annotations

import random
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from keeper import STARTUP_GRACE, Keeper, place_instance
from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
)
from keeper.model.state import (
    SERVING_RUNNER_TYPES,
    AnyInstance,
    Backend,
    Connection,
    Deployment,
    InstanceMeta,
    Memory,
    MemoryUsage,
    MlxRingInstance,
    ModelCard,
    Multiaddr,
    NodeIdentity,
    RunnerConnecting,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerShutdown,
    ShardAssignments,
    Sharding,
    SocketConnection,
    State,
)

# The master sweeps instances that use a node missing from the topology this often
# (docs/design.md §6.3).
SWEEP_EVERY_S = 10
# The port in every node's socket multiaddr (exo's default API port; only its shape matters).
NODE_PORT = 52415
# Instance ports in the simulation count up from here (real ones derive from the uuid4 id).
FIRST_SIM_PORT = 49153
# Wall-clock origin for the ISO timestamps nodes report; any fixed instant keeps runs identical.
EPOCH = datetime(2025, 1, 1, tzinfo=UTC)

PlaceFn = Callable[[State, ModelCard, Sharding, InstanceMeta, int], AnyInstance]


@dataclass(frozen=True)
class NodeSpec:
    name: str
    memory_gb: float
    backends: tuple[Backend, ...] = (Backend.MLX_METAL,)


@dataclass(frozen=True)
class DeploymentSpec:
    card: ModelCard
    sharding: Sharding = Sharding.PIPELINE
    instance_meta: InstanceMeta = InstanceMeta.MLX_RING
    min_nodes: int = 1
    replicas: int = 1


@dataclass(frozen=True)
class RunnerTiming:
    """Seconds (inclusive ranges) each step of a runner's start takes after the previous one."""

    connect_s: tuple[int, int] = (0, 1)
    load_s: tuple[int, int] = (1, 2)
    ready_s: tuple[int, int] = (2, 6)
    # How long a node retries a failing runner before asking for the instance's deletion
    # (exo: 5 tries with backoff 0.5 s doubling, about 15 s).
    give_up_s: tuple[int, int] = (3, 15)


@dataclass
class _Node:
    spec: NodeSpec
    node_id: str
    ip: str
    alive: bool = True
    # Bumped on every death and rejoin, so actions scheduled for an earlier life are dropped.
    generation: int = 0
    reported_available: int | None = None


@dataclass
class Observers:
    on_event: list[Callable[[AnyEvent, State, State], None]] = field(default_factory=list)
    on_step: list[Callable[[State, float, list[AnyEvent]], None]] = field(default_factory=list)
    on_delete: list[Callable[[str, State, float, list[AnyEvent]], None]] = field(
        default_factory=list
    )
    # (deployment_id, replicas, view, now, events), once the scaling's events are emitted.
    on_scale: list[Callable[[str, int, State, float, list[AnyEvent]], None]] = field(
        default_factory=list
    )
    on_restart: list[Callable[[float, State], None]] = field(default_factory=list)
    # (model_id, now, error or None): every placement the keeper attempts and how it went.
    on_place: list[Callable[[str, float, str | None], None]] = field(default_factory=list)


def iso(now: float) -> str:
    return (EPOCH + timedelta(seconds=now)).isoformat().replace("+00:00", "Z")


def instance_nodes(instance: AnyInstance) -> list[str]:
    return list(instance.shard_assignments.node_to_runner)


def is_ready(instance: AnyInstance, state: State) -> bool:
    """Every runner of the instance Ready or Running (what `serving` means)."""
    return all(
        isinstance(state.runners.get(runner), SERVING_RUNNER_TYPES)
        for runner in instance.shard_assignments.node_to_runner.values()
    )


def instances_of(state: State, model_id: str) -> list[AnyInstance]:
    return [i for i in state.instances.values() if i.shard_assignments.model_id == model_id]


class SimCluster:
    def __init__(
        self,
        nodes: list[NodeSpec],
        *,
        seed: int,
        max_lag_s: float = 0.0,
        timing: RunnerTiming | None = None,
        place: PlaceFn = place_instance,
    ) -> None:
        self.rng = random.Random(seed)
        self.max_lag_s = max_lag_s
        self.timing = timing or RunnerTiming()
        self.now = 0.0
        self.true_state = State()
        self.view = State()
        self.events_emitted = 0
        self.observers = Observers()
        self._pending: deque[tuple[float, AnyEvent]] = deque()
        self._last_deliver_at = 0.0
        self._schedule: defaultdict[int, list[Callable[[], None]]] = defaultdict(list)
        self._memory_dirty: set[str] = set()
        # model_id -> how many of its next instances will have a runner fail before ready.
        self._doomed_models: dict[str, int] = {}
        # model_id -> how many of the keeper's next placement attempts for it crash (a bug in
        # placement: an exception other than ValueError).
        self._crashing_models: dict[str, int] = {}
        self._id_counter = 0
        self._inner_place = place
        self.nodes: dict[str, _Node] = {}
        for index, spec in enumerate(nodes):
            node_id = f"node-{spec.name}"
            self.nodes[node_id] = _Node(spec=spec, node_id=node_id, ip=f"10.0.0.{index + 1}")
        for node in self.nodes.values():
            self._emit(self._node_info(node, full=True))
            self._link(node)  # to the nodes already up, both ways
        self.deliver()  # the cluster formed before the simulation starts
        self.keeper = Keeper(started_at=self.now, place=self._place)
        self.keeper_started_at = self.now

    # --- the lagging event router ------------------------------------------------------------

    def _emit(self, event: AnyEvent) -> None:
        before = self.true_state
        if isinstance(event, InstanceDeleted):
            gone = before.instances.get(event.instance_id)
            if gone is not None:
                self._after_instance_deleted(gone)
        self.true_state = apply(before, event)
        self.events_emitted += 1
        lag = self.rng.uniform(0.0, self.max_lag_s) if self.max_lag_s > 0 else 0.0
        self._last_deliver_at = max(self._last_deliver_at, self.now + lag)
        self._pending.append((self._last_deliver_at, event))
        for observe in self.observers.on_event:
            observe(event, before, self.true_state)
        if isinstance(event, InstanceCreated):
            self._after_instance_created(event.instance)

    def deliver_due(self) -> None:
        while self._pending and self._pending[0][0] <= self.now:
            self.view = apply(self.view, self._pending.popleft()[1])

    def deliver(self, count: int | None = None) -> int:
        """Deliver the next `count` lagged events (all when None) ahead of time."""
        n = len(self._pending) if count is None else min(count, len(self._pending))
        for _ in range(n):
            self.view = apply(self.view, self._pending.popleft()[1])
        if not self._pending:
            self._last_deliver_at = self.now
        return n

    @property
    def pending_events(self) -> int:
        return len(self._pending)

    # --- time ----------------------------------------------------------------------------

    def tick(self) -> None:
        """One simulated second: the world acts, the router delivers, the keeper steps once."""
        self.now += 1.0
        for action in self._schedule.pop(int(self.now), []):
            action()
        if int(self.now) % SWEEP_EVERY_S == 0:
            self._sweep()
        self._report_memory()
        self.deliver_due()
        events = self.keeper.step(self.view, self.now)
        for observe in self.observers.on_step:
            observe(self.view, self.now, events)
        for event in events:
            self._emit(event)
        self.deliver_due()

    def run(self, seconds: int, every_tick: Callable[[], None] | None = None) -> None:
        for _ in range(seconds):
            if every_tick is not None:
                every_tick()
            self.tick()

    def at(self, delay_s: int, action: Callable[[], None]) -> None:
        self._schedule[int(self.now) + max(1, delay_s)].append(action)

    # --- what users do (through the master's API, which reads the view) -------------------

    def create_deployment(self, spec: DeploymentSpec) -> str | None:
        """POST /deployments: None (409) if the model already has a deployment in the view."""
        model_id = spec.card.model_id
        if any(d.model_card.model_id == model_id for d in self.view.deployments.values()):
            return None
        deployment_id = f"dep-{self._next_id():05d}"
        self._emit(
            DeploymentCreated(
                deployment=Deployment(
                    deployment_id=deployment_id,
                    model_card=spec.card,
                    sharding=spec.sharding,
                    instance_meta=spec.instance_meta,
                    min_nodes=spec.min_nodes,
                    replicas=spec.replicas,
                )
            )
        )
        return deployment_id

    def scale_deployment(self, deployment_id: str, replicas: int) -> list[AnyEvent]:
        """PATCH /deployments/{id}: the keeper's scaling, emitted under the master's lock."""
        events = self.keeper.scale(deployment_id, replicas, self.view)
        for event in events:
            self._emit(event)
        for observe in self.observers.on_scale:
            observe(deployment_id, replicas, self.view, self.now, events)
        return events

    def delete_deployment(self, deployment_id: str) -> list[AnyEvent]:
        """DELETE /deployments/{id}: the keeper's deletion, emitted under the master's lock."""
        events = self.keeper.delete(deployment_id, self.view)
        for observe in self.observers.on_delete:
            observe(deployment_id, self.view, self.now, events)
        for event in events:
            self._emit(event)
        return events

    def delete_instance(self, instance_id: str) -> None:
        """Someone deletes an instance (DELETE /instance, or a node giving up on it)."""
        if instance_id in self.true_state.instances:
            self._emit(InstanceDeleted(instance_id=instance_id))

    def place_by_hand(self, spec: DeploymentSpec) -> AnyInstance | None:
        """POST /place_instance: an instance the keeper did not place (None if nothing fits)."""
        try:
            instance = self._renamed(
                place_instance(
                    self.view, spec.card, spec.sharding, spec.instance_meta, spec.min_nodes
                )
            )
        except ValueError:
            return None
        self._emit(InstanceCreated(instance=instance))
        return instance

    # --- faults ----------------------------------------------------------------------------

    def kill_node(self, node_id: str, detect_after_s: int = 0) -> None:
        """The node dies; the master times it out after `detect_after_s` of silence and its
        sweep deletes the instances that used it."""
        node = self.nodes[node_id]
        if not node.alive:
            return
        node.alive = False
        node.generation += 1
        generation = node.generation

        def time_out() -> None:
            if node.generation != generation:
                return
            self._time_out(node)

        if detect_after_s <= 0:
            time_out()
        else:
            self.at(detect_after_s, time_out)

    def revive_node(self, node_id: str) -> None:
        """A timed-out node comes back, in pieces: it shows up; then reports memory and
        backends; then its links come up."""
        node = self.nodes[node_id]
        if node.alive or node_id in self.true_state.topology.nodes:
            return
        node.alive = True
        node.generation += 1
        node.reported_available = None
        generation = node.generation
        self._emit(NodeGatheredInfo(node_id=node_id, when=iso(self.now)))

        def report() -> None:
            if node.generation == generation:
                self._emit(self._node_info(node, full=True))
                self.at(self.rng.randint(2, 6), link)

        def link() -> None:
            if node.generation == generation:
                self._link(node)

        self.at(self.rng.randint(1, 3), report)

    def time_out_silent_nodes(self) -> None:
        """The master times out every dead node it has not timed out yet."""
        for node in self.nodes.values():
            if not node.alive:
                self._time_out(node)

    def stop_runner_failures(self) -> None:
        """No more runner failures or placement crashes than those already under way."""
        self._doomed_models.clear()
        self._crashing_models.clear()

    def crash_next_placements(self, model_id: str, count: int) -> None:
        """The keeper's next `count` placement attempts for the model raise RuntimeError."""
        self._crashing_models[model_id] = self._crashing_models.get(model_id, 0) + count

    def doom_next_instances(self, model_id: str, count: int) -> None:
        """The next `count` instances of the model get a runner that fails before ready."""
        self._doomed_models[model_id] = self._doomed_models.get(model_id, 0) + count

    def restart_master(self) -> None:
        """The master restarts: its State is rebuilt from the whole log and a new keeper with
        empty memory starts (and waits STARTUP_GRACE)."""
        self.deliver()
        self.keeper = Keeper(started_at=self.now, place=self._place)
        self.keeper_started_at = self.now
        for observe in self.observers.on_restart:
            observe(self.now, self.view)

    @property
    def grace_ends_at(self) -> float:
        return self.keeper_started_at + STARTUP_GRACE

    def alive_nodes(self) -> list[str]:
        return [n for n, node in self.nodes.items() if node.alive]

    def dead_nodes(self) -> list[str]:
        """Dead nodes the master has already timed out (those can rejoin)."""
        return [
            n
            for n, node in self.nodes.items()
            if not node.alive and n not in self.true_state.topology.nodes
        ]

    # --- the world's reactions ---------------------------------------------------------------

    def _place(
        self,
        state: State,
        card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        try:
            if self._crashing_models.get(card.model_id, 0) > 0:
                self._crashing_models[card.model_id] -= 1
                raise RuntimeError("simulated placement bug")
            instance = self._inner_place(state, card, sharding, instance_meta, min_nodes)
        except Exception as error:
            for observe in self.observers.on_place:
                observe(card.model_id, self.now, f"{type(error).__name__}: {error}")
            raise
        for observe in self.observers.on_place:
            observe(card.model_id, self.now, None)
        return self._renamed(instance)

    def _next_id(self) -> int:
        self._id_counter += 1
        return self._id_counter

    def _renamed(self, instance: AnyInstance) -> AnyInstance:
        """The same instance with ids (and the port placement derives from the id) from a
        counter, so a seed replays exactly."""
        number = self._next_id()
        port = FIRST_SIM_PORT + number
        assignments = instance.shard_assignments
        new_runner = {
            old: f"runner-{number:05d}-{rank}"
            for rank, old in enumerate(assignments.node_to_runner.values())
        }
        renamed = ShardAssignments(
            model_id=assignments.model_id,
            runner_to_shard={new_runner[r]: s for r, s in assignments.runner_to_shard.items()},
            node_to_runner={n: new_runner[r] for n, r in assignments.node_to_runner.items()},
        )
        update: dict[str, object] = {
            "instance_id": f"instance-{number:05d}",
            "shard_assignments": renamed,
        }
        if isinstance(instance, MlxRingInstance):
            update["ephemeral_port"] = port
            update["hosts_by_node"] = {
                node: [host.model_copy(update={"port": port}) for host in hosts]
                for node, hosts in instance.hosts_by_node.items()
            }
        else:
            update["jaccl_coordinators"] = {
                node: f"{address.rsplit(':', 1)[0]}:{port}"
                for node, address in instance.jaccl_coordinators.items()
            }
        return instance.model_copy(update=update)

    def _after_instance_created(self, instance: AnyInstance) -> None:
        model_id = instance.shard_assignments.model_id
        doomed = self._doomed_models.get(model_id, 0) > 0
        if doomed:
            self._doomed_models[model_id] -= 1
        runners = list(instance.shard_assignments.node_to_runner.items())
        failing_rank = self.rng.randrange(len(runners)) if doomed else -1
        for rank, (node_id, runner_id) in enumerate(runners):
            self._memory_dirty.add(node_id)
            node = self.nodes.get(node_id)
            if node is None or not node.alive:
                continue  # a runner on a dead node never starts; the sweep will clean up
            self._start_runner(node, instance, runner_id, fails=rank == failing_rank)

    def _start_runner(
        self, node: _Node, instance: AnyInstance, runner_id: str, *, fails: bool
    ) -> None:
        generation = node.generation
        instance_id = instance.instance_id
        n_layers = next(iter(instance.shard_assignments.runner_to_shard.values())).n_layers
        timing = self.timing

        def live() -> bool:
            return node.generation == generation and instance_id in self.true_state.instances

        def connect() -> None:
            if live():
                self._emit(
                    RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerConnecting())
                )
                self.at(self.rng.randint(*timing.load_s), load)

        def load() -> None:
            if live():
                status = RunnerLoading(layers_loaded=0, total_layers=n_layers)
                self._emit(RunnerStatusUpdated(runner_id=runner_id, runner_status=status))
                self.at(self.rng.randint(*timing.ready_s), fail if fails else ready)

        def ready() -> None:
            if live():
                self._emit(RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerReady()))

        def fail() -> None:
            if live():
                status = RunnerFailed(error_message="simulated runner crash")
                self._emit(RunnerStatusUpdated(runner_id=runner_id, runner_status=status))
                self.at(self.rng.randint(*timing.give_up_s), give_up)

        def give_up() -> None:
            if live():
                self._emit(InstanceDeleted(instance_id=instance_id))

        self.at(self.rng.randint(*timing.connect_s), connect)

    def _after_instance_deleted(self, instance: AnyInstance) -> None:
        runners = list(instance.shard_assignments.node_to_runner.items())
        for node_id, _ in runners:
            self._memory_dirty.add(node_id)

        def shut_down() -> None:
            for _, runner_id in runners:
                if runner_id in self.true_state.runners:
                    self._emit(
                        RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerShutdown())
                    )

        self.at(1, shut_down)

    def _time_out(self, node: _Node) -> None:
        if node.node_id not in self.true_state.topology.nodes:
            return
        self._emit(NodeTimedOut(node_id=node.node_id))
        self._sweep()

    def _sweep(self) -> None:
        topology = set(self.true_state.topology.nodes)
        for instance in list(self.true_state.instances.values()):
            if any(n not in topology for n in instance_nodes(instance)):
                self._emit(InstanceDeleted(instance_id=instance.instance_id))

    def _available_bytes(self, node: _Node) -> int:
        used = 0
        for instance in self.true_state.instances.values():
            runner = instance.shard_assignments.node_to_runner.get(node.node_id)
            if runner is None:
                continue
            shard = instance.shard_assignments.runner_to_shard[runner]
            size = shard.model_card.storage_size.in_bytes
            used += size * (shard.end_layer - shard.start_layer) // max(1, shard.n_layers)
        return max(0, Memory.from_gb(node.spec.memory_gb).in_bytes - used)

    def _report_memory(self) -> None:
        for node_id in sorted(self._memory_dirty):
            node = self.nodes.get(node_id)
            if node is None or not node.alive or node.reported_available is None:
                continue
            if self._available_bytes(node) != node.reported_available:
                self._emit(self._node_info(node, full=False))
        self._memory_dirty.clear()

    def _node_info(self, node: _Node, *, full: bool) -> NodeGatheredInfo:
        total = Memory.from_gb(node.spec.memory_gb)
        available = self._available_bytes(node)
        node.reported_available = available
        memory = MemoryUsage(ram_total=total, ram_available=Memory(in_bytes=available))
        if not full:
            return NodeGatheredInfo(node_id=node.node_id, when=iso(self.now), memory=memory)
        return NodeGatheredInfo(
            node_id=node.node_id,
            when=iso(self.now),
            memory=memory,
            backends=list(node.spec.backends),
            identity=NodeIdentity(friendly_name=node.spec.name, model_id="Mac Studio"),
        )

    def _link(self, node: _Node) -> None:
        """Socket edges both ways between this node and every live node in the topology."""
        topology = self.true_state.topology.nodes
        for other in self.nodes.values():
            if other is node or not other.alive or other.node_id not in topology:
                continue
            for source, sink in ((node, other), (other, node)):
                address = Multiaddr(address=f"/ip4/{sink.ip}/tcp/{NODE_PORT}")
                conn = Connection(
                    source=source.node_id,
                    sink=sink.node_id,
                    edge=SocketConnection(sink_multiaddr=address),
                )
                self._emit(TopologyEdgeCreated(conn=conn))


@dataclass(frozen=True)
class ChaosConfig:
    """Mean seconds between random faults (None: never) and their shapes."""

    node_death_mean_s: float | None = None
    # Silence before the master times a dead node out (docs/design.md §6.3: 30 s).
    node_silence_s: tuple[int, int] = (0, 30)
    node_down_s: tuple[int, int] = (20, 180)
    max_nodes_down: int = 1
    instance_deletion_mean_s: float | None = None
    # A streak of placements of one model whose runner fails before ready (drives backoff).
    failure_streak_mean_s: float | None = None
    failure_streak_len: tuple[int, int] = (1, 5)
    # A run of the keeper's placement attempts for one model that crash.
    placement_crash_mean_s: float | None = None
    placement_crash_len: tuple[int, int] = (1, 3)
    master_restart_mean_s: float | None = None
    deployment_create_mean_s: float | None = None
    deployment_delete_mean_s: float | None = None
    # An operator changes a deployment's replica count to one drawn from this range.
    deployment_scale_mean_s: float | None = None
    scale_replicas: tuple[int, int] = (1, 3)
    double_delete_probability: float = 0.2
    # An impatient user deletes a new deployment within seconds, often while its first
    # placement is still on its way to the state.
    quick_delete_probability: float = 0.0
    quick_delete_after_s: tuple[int, int] = (2, 25)
    deployable: tuple[DeploymentSpec, ...] = ()


@dataclass
class ChaosCounts:
    node_deaths: int = 0
    node_revivals: int = 0
    instance_deletions: int = 0
    failure_streaks: int = 0
    placement_crashes: int = 0
    master_restarts: int = 0
    deployments_created: int = 0
    deployments_deleted: int = 0
    deployments_scaled: int = 0
    creations_refused: int = 0


class Chaos:
    """Random faults and user actions on a SimCluster, one draw per simulated second."""

    def __init__(self, sim: SimCluster, config: ChaosConfig) -> None:
        self.sim = sim
        self.config = config
        self.counts = ChaosCounts()
        self._revive_at: dict[str, float] = {}
        self._healed = False

    def _happens(self, mean_s: float | None) -> bool:
        return mean_s is not None and self.sim.rng.random() < 1.0 / mean_s

    def act(self) -> None:
        sim, config, rng = self.sim, self.config, self.sim.rng
        for node_id, when in sorted(self._revive_at.items()):
            if sim.now >= when and node_id in sim.dead_nodes():
                del self._revive_at[node_id]
                sim.revive_node(node_id)
                self.counts.node_revivals += 1
        down = len(sim.nodes) - len(sim.alive_nodes())
        if self._happens(config.node_death_mean_s) and down < config.max_nodes_down:
            victim = rng.choice(sim.alive_nodes())
            sim.kill_node(victim, detect_after_s=rng.randint(*config.node_silence_s))
            self._revive_at[victim] = sim.now + rng.randint(*config.node_down_s)
            self.counts.node_deaths += 1
        if self._happens(config.instance_deletion_mean_s) and sim.true_state.instances:
            sim.delete_instance(rng.choice(sorted(sim.true_state.instances)))
            self.counts.instance_deletions += 1
        if self._happens(config.failure_streak_mean_s) and sim.view.deployments:
            deployment = sim.view.deployments[rng.choice(sorted(sim.view.deployments))]
            sim.doom_next_instances(
                deployment.model_card.model_id, rng.randint(*config.failure_streak_len)
            )
            self.counts.failure_streaks += 1
        if self._happens(config.placement_crash_mean_s) and sim.view.deployments:
            deployment = sim.view.deployments[rng.choice(sorted(sim.view.deployments))]
            sim.crash_next_placements(
                deployment.model_card.model_id, rng.randint(*config.placement_crash_len)
            )
            self.counts.placement_crashes += 1
        if self._happens(config.master_restart_mean_s):
            sim.restart_master()
            self.counts.master_restarts += 1
        if self._happens(config.deployment_create_mean_s) and config.deployable:
            deployment_id = sim.create_deployment(rng.choice(config.deployable))
            if deployment_id is None:
                self.counts.creations_refused += 1
            else:
                self.counts.deployments_created += 1
                if rng.random() < config.quick_delete_probability:
                    sim.at(rng.randint(*config.quick_delete_after_s), self._deleter(deployment_id))
        if self._happens(config.deployment_scale_mean_s) and sim.view.deployments:
            deployment_id = rng.choice(sorted(sim.view.deployments))
            if sim.scale_deployment(deployment_id, rng.randint(*config.scale_replicas)):
                self.counts.deployments_scaled += 1
        if self._happens(config.deployment_delete_mean_s) and sim.view.deployments:
            deployment_id = rng.choice(sorted(sim.view.deployments))
            sim.delete_deployment(deployment_id)
            if rng.random() < config.double_delete_probability:
                sim.delete_deployment(deployment_id)
            self.counts.deployments_deleted += 1

    def _deleter(self, deployment_id: str) -> Callable[[], None]:
        def delete() -> None:
            if self._healed:
                return
            if deployment_id in self.sim.view.deployments:  # else the API answers 404
                self.sim.delete_deployment(deployment_id)
                self.counts.deployments_deleted += 1

        return delete

    def heal(self) -> None:
        """Stop the faults: revive every dead node (a silent one is timed out first)."""
        self._healed = True
        self._revive_at.clear()
        self.sim.time_out_silent_nodes()
        for node_id in self.sim.dead_nodes():
            self.sim.revive_node(node_id)
        self.sim.stop_runner_failures()
