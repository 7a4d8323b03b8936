"""Priorities and preemption (docs/design.md §5.13), rule by rule.

The keeper rules are stepped on ``MemoryCluster``: a ``keeper_harness.Cluster`` whose nodes report
their free memory as simulated nodes do (total less the shards of the runners they hold) after
every step, and whose instances are ready as soon as they exist. Placement is the real one, on
nodes that are not linked, so each model fits on one node or not at all. The search itself
(``keeper.core.preemption.find``) is checked against a brute force with hypothesis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from itertools import combinations
from typing import Any

from hypothesis import given, settings, target
from hypothesis import strategies as st
from keeper_harness import (
    AFTER_GRACE,
    WHEN,
    Cluster,
    RecordingPlace,
    build_instance,
    card,
    simple_place,
)

from keeper.core.placement import place_instance
from keeper.core.preemption import (
    MAX_CANDIDATES,
    MAX_PREEMPTION_TRIALS_PER_STEP,
    Preemption,
    TrialBudget,
    Victim,
    by_priority,
    candidates,
    find,
    without_instances,
)
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentPriorityChanged,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeGatheredInfo,
)
from keeper.model.state import (
    AnyInstance,
    Deployment,
    Memory,
    MemoryUsage,
    MlxRingInstance,
    ModelCard,
    PipelineShardMetadata,
    RunnerReady,
    ShardAssignments,
    State,
    TensorShardMetadata,
    preempted_by,
)

T = AFTER_GRACE
GIB = 1024**3
NO_MEMORY = "No cycles found with sufficient memory"


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def failures_of(events: list[AnyEvent]) -> list[tuple[str, str]]:
    return [(e.deployment_id, e.error) for e in events if isinstance(e, DeploymentPlacementFailed)]


def deleted(events: list[AnyEvent]) -> list[str]:
    return [e.instance_id for e in events if isinstance(e, InstanceDeleted)]


def held_on(state: State, node_id: str) -> int:
    """The bytes the runners on ``node_id`` hold, as a simulated node counts them."""
    held = 0
    for instance in state.instances.values():
        runner = instance.shard_assignments.node_to_runner.get(node_id)
        if runner is None:
            continue
        shard = instance.shard_assignments.runner_to_shard[runner]
        size = shard.model_card.storage_size.in_bytes
        held += size * (shard.end_layer - shard.start_layer) // shard.n_layers
    return held


class MemoryCluster(Cluster):
    """Unlinked nodes of ``totals`` GB that report what their runners leave free after every
    step, and instances ready as soon as they exist."""

    def __init__(self, totals: Mapping[str, float], place: RecordingPlace | None = None) -> None:
        super().__init__(place=place or RecordingPlace(inner=place_instance))
        self.totals = dict(totals)
        for node_id in totals:
            self.revive(node_id)

    def revive(self, node_id: str) -> None:
        self.add_node(node_id, self.totals[node_id])
        self.report()

    def report(self) -> None:
        for node_id, total in self.totals.items():
            if node_id in self.state.topology.nodes:
                free = max(int(total * GIB) - held_on(self.state, node_id), 0)
                memory = MemoryUsage(
                    ram_total=Memory.from_gb(total), ram_available=Memory(in_bytes=free)
                )
                self.apply(NodeGatheredInfo(node_id=node_id, when=WHEN, memory=memory))

    def step(self, now: float) -> list[AnyEvent]:
        events = super().step(now)
        for event in events:
            if isinstance(event, InstanceCreated):
                self.make_ready(event.instance.instance_id)
        if any(isinstance(event, InstanceCreated | InstanceDeleted) for event in events):
            self.report()
        return events

    def kill(self, node_id: str) -> None:
        self.kill_node(node_id)
        self.report()

    def only_instance(self, deployment_id: str) -> str:
        (instance_id,) = self.deployment(deployment_id).placed_instance_ids
        return instance_id


def placed_by_the_keeper(
    cluster: MemoryCluster, deployment_id: str, model: ModelCard, node: str, priority: int
) -> str:
    """A deployment of ``model`` whose instance the keeper placed on ``node`` (as the State
    records it: created, then placed), its nodes reporting the memory it holds: the instance."""
    cluster.deploy(model, deployment_id, priority=priority)
    instance = build_instance(model, [node])
    cluster.apply(
        InstanceCreated(instance=instance),
        DeploymentPlaced(deployment_id=deployment_id, instance_id=instance.instance_id),
    )
    cluster.make_ready(instance.instance_id)
    cluster.report()
    return instance.instance_id


def crowded(
    *, preempt: bool = True, priority: int = 900, low: tuple[int, int] = (100, 200)
) -> tuple[MemoryCluster, str]:
    """Two 16 GB nodes each serving a 12 GB model of priority ``low[0]`` (dep-l1, on node-a) and
    ``low[1]`` (dep-l2, on node-b), and a new 12 GB deployment dep-h of ``priority``: nothing is
    left for it. (The cluster, dep-h.)"""
    cluster = MemoryCluster({"node-a": 16, "node-b": 16})
    placed_by_the_keeper(cluster, "dep-l1", card("low-1", size_gb=12), "node-a", low[0])
    placed_by_the_keeper(cluster, "dep-l2", card("low-2", size_gb=12), "node-b", low[1])
    high = cluster.deploy(card("high", size_gb=12), "dep-h", priority=priority, preempt=preempt)
    return cluster, high


# --- ordering -----------------------------------------------------------------------------


def test_higher_priority_is_placed_first_and_equal_ones_keep_the_id_order() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b", "node-c", "node-d")
    for deployment_id, priority in [("dep-a", 100), ("dep-b", 900), ("dep-c", 500), ("dep-d", 500)]:
        cluster.deploy(f"model-{deployment_id}", deployment_id, priority=priority)
    order: list[str] = []
    for now in range(4):
        order += [e.deployment_id for e in cluster.step(T + now) if isinstance(e, DeploymentPlaced)]
    assert order == ["dep-b", "dep-c", "dep-d", "dep-a"]


def test_a_high_priority_is_tried_first_even_when_the_attempts_cap_cuts_the_step_short() -> None:
    recorder = RecordingPlace()
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-a")
    for i in range(9):  # more than the cap, all before it in id order, none placeable
        cluster.deploy(f"stuck-{i}", f"dep-{i:02d}")
        recorder.failing[f"stuck-{i}"] = ValueError(NO_MEMORY)
    cluster.deploy("urgent", "dep-99", priority=501)
    placed = [e for e in cluster.step(T) if isinstance(e, DeploymentPlaced)]
    assert recorder.models_tried() == ["urgent"]  # the first attempt, and it ends the step
    assert [e.deployment_id for e in placed] == ["dep-99"]


def test_by_priority_sorts_highest_first_and_is_stable() -> None:
    def dep(deployment_id: str, priority: int) -> Deployment:
        return Deployment(deployment_id=deployment_id, model_card=card("m"), priority=priority)

    due = [dep("c", 500), dep("a", 100), dep("d", 900), dep("b", 500)]
    assert [d.deployment_id for d in by_priority(due)] == ["d", "c", "b", "a"]


# --- preemption ---------------------------------------------------------------------------


def test_a_preempting_deployment_deletes_the_lowest_priority_instance_that_makes_room() -> None:
    cluster, high = crowded()
    victim = cluster.only_instance("dep-l1")
    events = cluster.step(T + 2)
    assert kinds(events) == [
        "DeploymentPlacementFailed",
        "InstanceDeleted",
        "InstanceCreated",
        "DeploymentPlaced",
    ]
    assert failures_of(events) == [("dep-l1", "preempted by high")]
    assert deleted(events) == [victim]
    assert cluster.nodes_of(cluster.only_instance(high)) == ["node-a"]
    assert cluster.deployment("dep-l1").placement_error == preempted_by("high")
    assert cluster.deployment("dep-l1").placed_instance_ids == ()
    assert cluster.deployment("dep-l2").placed_instance_ids != ()  # the higher one is spared
    assert cluster.deployment(high).placement_error is None


def test_a_preemption_is_the_step_s_one_placement() -> None:
    cluster, high = crowded()
    # A tiny model, lower and due in the same step, fits in what is left: it waits for the next.
    cluster.deploy(card("tiny", size_gb=1), "dep-t", priority=50)
    events = cluster.step(T + 2)
    assert [e.deployment_id for e in events if isinstance(e, DeploymentPlaced)] == [high]
    events = cluster.step(T + 3)
    assert [e.deployment_id for e in events if isinstance(e, DeploymentPlaced)] == ["dep-t"]


def test_a_victim_is_told_once_and_its_instances_are_deleted_once() -> None:
    cluster = MemoryCluster({"node-a": 16, "node-b": 16})
    cluster.deploy(card("low", size_gb=12), "dep-l", replicas=2, priority=100)
    cluster.step(T)
    cluster.step(T + 1)
    older, newer = cluster.deployment("dep-l").placed_instance_ids
    cluster.deploy(card("high", size_gb=12), "dep-h", replicas=2, priority=900, preempt=True)
    first = cluster.step(T + 2)
    assert (deleted(first), failures_of(first)) == ([newer], [("dep-l", "preempted by high")])
    second = cluster.step_keep(T + 3)  # the second replica takes the other: already said why
    assert (deleted(second), failures_of(second)) == ([older], [])
    # Deleting the victim before the State shows that does not delete its instance again.
    assert older not in deleted(cluster.keeper.delete("dep-l", cluster.state))


def test_an_instance_lost_to_preemption_before_it_was_ready_is_no_failure() -> None:
    cluster = MemoryCluster({"node-a": 16})
    cluster.deploy(card("low", size_gb=12), "dep-l", priority=100)
    events = cluster.step(T)
    (created,) = [e for e in events if isinstance(e, InstanceCreated)]
    cluster.make_loading(created.instance.instance_id)  # still loading
    cluster.step(T + 1)
    cluster.deploy(card("high", size_gb=12), "dep-h", priority=900, preempt=True)
    assert deleted(cluster.step(T + 2)) == [created.instance.instance_id]
    cluster.step(T + 3)
    timers = cluster.keeper.timers(cluster.state, T + 3)
    assert (timers["dep-l"].failures, timers["dep-l"].waiting) == (0, "unplaceable_retry")


def test_a_preemption_on_its_way_is_waited_for_like_any_placement() -> None:
    cluster, high = crowded()
    events = cluster.step_keep(T + 2)  # not applied yet: the State lags
    assert [e.deployment_id for e in events if isinstance(e, DeploymentPlaced)] == [high]
    # The next step, on the same State, neither places it again nor takes another victim for it.
    assert cluster.step_keep(T + 3) == []
    assert cluster.keeper.timers(cluster.state, T + 3)[high].waiting == "placement_in_flight"


def test_a_victim_keeps_the_failures_it_had() -> None:
    cluster = MemoryCluster({"node-a": 16})
    cluster.deploy(card("low", size_gb=12), "dep-l", priority=100)
    cluster.step(T)
    cluster.delete_instance(cluster.only_instance("dep-l"))  # lost before it was ready
    cluster.report()
    cluster.step(T + 1)
    assert cluster.keeper.timers(cluster.state, T + 1)["dep-l"].failures == 1
    (created,) = [e for e in cluster.step(T + 12) if isinstance(e, InstanceCreated)]
    cluster.make_loading(created.instance.instance_id)
    cluster.step(T + 13)
    cluster.deploy(card("high", size_gb=12), "dep-h", priority=900, preempt=True)
    assert deleted(cluster.step(T + 14)) == [created.instance.instance_id]
    assert cluster.keeper.timers(cluster.state, T + 14)["dep-l"].failures == 1


def test_a_preemption_never_places_on_a_cordoned_node() -> None:
    cluster, high = crowded()
    cluster.apply(NodeCordoned(name="node-a"))  # dep-l1's node: the lowest victim's room
    events = cluster.step(T + 2)
    # Room is made on node-b instead, at the cost of the higher of the two.
    assert failures_of(events) == [("dep-l2", "preempted by high")]
    assert cluster.nodes_of(cluster.only_instance(high)) == ["node-b"]
    cluster.apply(NodeCordoned(name="node-b"))
    cluster.deploy(card("top", size_gb=12), "dep-t", priority=1000, preempt=True)
    events = cluster.step(T + 3)
    assert deleted(events) == []  # every node with room to make is cordoned


def test_without_opt_in_nothing_is_preempted() -> None:
    cluster, high = crowded(preempt=False)
    events = cluster.step(T + 2)
    assert failures_of(events) == [(high, NO_MEMORY)]
    assert deleted(events) == []
    for now in range(3, 200):
        assert deleted(cluster.step(T + now)) == []
    assert cluster.deployment(high).placed_instance_ids == ()


def test_equal_or_higher_priorities_are_never_victims() -> None:
    for low in [(900, 900), (900, 1000)]:
        cluster, high = crowded(priority=900, low=low)
        events = cluster.step(T + 2)
        assert deleted(events) == []
        assert failures_of(events) == [(high, NO_MEMORY)]


def test_an_instance_placed_by_hand_is_never_a_victim() -> None:
    cluster = MemoryCluster({"node-a": 16})
    manual = build_instance(card("manual", size_gb=12), ["node-a"], instance_id="by-hand")
    cluster.apply(InstanceCreated(instance=manual))
    # A deployment of that model, of the lowest priority, counts it but does not own it.
    cluster.deploy(card("manual", size_gb=12), "dep-m", priority=0)
    cluster.report()
    high = cluster.deploy(card("high", size_gb=12), "dep-h", priority=1000, preempt=True)
    for now in range(120):
        events = cluster.step(T + now)
        assert deleted(events) == []
    assert "by-hand" in cluster.state.instances
    assert cluster.deployment(high).placement_error == NO_MEMORY


def test_the_fewest_victims_are_chosen_before_the_lowest_priorities() -> None:
    cluster = MemoryCluster({"node-a": 16, "node-b": 16})
    placed_by_the_keeper(cluster, "dep-s1", card("small-1", size_gb=6), "node-a", 100)
    placed_by_the_keeper(cluster, "dep-s3", card("small-3", size_gb=6), "node-a", 120)
    big = placed_by_the_keeper(cluster, "dep-b", card("big", size_gb=12), "node-b", 300)
    # node-a: 4 GB free, 10 with one small gone, 16 with both; node-b: 4 GB free, 16 without big.
    cluster.deploy(card("top", size_gb=12), "dep-t", priority=900, preempt=True)
    events = cluster.step(T)
    assert deleted(events) == [big]
    assert failures_of(events) == [("dep-b", "preempted by top")]
    assert cluster.nodes_of(cluster.only_instance("dep-t")) == ["node-b"]


def test_victims_of_several_deployments_are_each_told() -> None:
    cluster = MemoryCluster({"node-a": 16})
    first = placed_by_the_keeper(cluster, "dep-s1", card("small-1", size_gb=6), "node-a", 100)
    second = placed_by_the_keeper(cluster, "dep-s2", card("small-2", size_gb=6), "node-a", 200)
    cluster.deploy(card("top", size_gb=12), "dep-t", priority=900, preempt=True)
    events = cluster.step(T)
    assert failures_of(events) == [("dep-s1", "preempted by top"), ("dep-s2", "preempted by top")]
    assert deleted(events) == [first, second]
    assert cluster.nodes_of(cluster.only_instance("dep-t")) == ["node-a"]


def test_among_as_few_victims_the_newest_replica_of_the_lowest_goes() -> None:
    cluster = MemoryCluster({"node-a": 16, "node-b": 16})
    cluster.deploy(card("low", size_gb=12), "dep-l", replicas=2, priority=100)
    cluster.step(T)
    cluster.step(T + 1)
    older, newer = cluster.deployment("dep-l").placed_instance_ids
    cluster.deploy(card("high", size_gb=12), "dep-h", priority=900, preempt=True)
    events = cluster.step(T + 2)
    assert deleted(events) == [newer]
    assert cluster.deployment("dep-l").placed_instance_ids == (older,)


def test_the_victim_waits_its_retry_and_then_says_why_it_still_cannot_be_placed() -> None:
    cluster, _ = crowded()
    cluster.step(T + 2)
    timers = cluster.keeper.timers(cluster.state, T + 2)
    assert timers["dep-l1"].waiting == "unplaceable_retry"
    assert timers["dep-l1"].failures == 0  # its instance was removed, not lost
    for now in range(3, 2 + int(UNPLACEABLE_RETRY)):
        assert cluster.step(T + now) == []  # no attempt before its retry
    events = cluster.step(T + 2 + UNPLACEABLE_RETRY)
    assert failures_of(events) == [("dep-l1", f"preempted by high: {NO_MEMORY}")]
    assert cluster.deployment("dep-l1").placement_error == f"preempted by high: {NO_MEMORY}"


def test_the_victim_is_placed_again_once_there_is_room_and_forgets_why() -> None:
    cluster, _ = crowded()
    cluster.step(T + 2)
    cluster.totals["node-c"] = 16
    cluster.revive("node-c")  # a new node: the cluster changed, so the victim retries at once
    events = cluster.step(T + 3)
    assert [e.deployment_id for e in events if isinstance(e, DeploymentPlaced)] == ["dep-l1"]
    assert cluster.deployment("dep-l1").placement_error is None
    cluster.step(T + 4)  # the keeper sees it ready: its loss is then placed again at once
    cluster.kill("node-c")
    cluster.step(T + 5)
    assert cluster.deployment("dep-l1").placement_error == NO_MEMORY  # not preempted this time


def test_preemption_never_flaps_and_a_victim_never_preempts_back() -> None:
    cluster, high = crowded()
    # The victims may preempt too: they rank lower, so they have nobody to take from.
    for victim in ("dep-l1", "dep-l2"):
        deployment = cluster.deployment(victim)
        cluster.apply(
            DeploymentPriorityChanged(
                deployment_id=victim, priority=deployment.priority, preempt=True
            )
        )
    cluster.step(T + 2)
    kept = cluster.only_instance(high)
    for now in range(3, 900):
        events = cluster.step(T + now)
        assert deleted(events) == []
        assert not any(isinstance(e, InstanceCreated) for e in events)
    assert cluster.only_instance(high) == kept


def test_a_new_priority_or_leave_to_preempt_is_tried_at_once() -> None:
    cluster, high = crowded(preempt=False)
    assert failures_of(cluster.step(T + 2)) == [(high, NO_MEMORY)]
    assert cluster.step(T + 3) == []  # waiting for its retry
    cluster.apply(DeploymentPriorityChanged(deployment_id=high, priority=900, preempt=True))
    events = cluster.step(T + 4)
    assert failures_of(events) == [("dep-l1", "preempted by high")]
    assert cluster.deployment(high).placed_instance_ids != ()


def test_a_deployment_being_deleted_or_an_instance_being_removed_is_no_victim() -> None:
    cluster, high = crowded()
    pending = cluster.keeper.delete("dep-l1", cluster.state)  # not applied yet
    assert cluster.only_instance("dep-l1") in deleted(pending)
    events = cluster.step_keep(T + 2)
    assert deleted(events) == [cluster.only_instance("dep-l2")]  # the other one

    cluster, high = crowded(low=(100, 100))
    cluster.deploy(card("spare", size_gb=1), "dep-x", replicas=2, priority=50)
    cluster.step(T + 2)  # high preempts dep-l1; dep-x has nothing to give (1 GB each)
    assert cluster.deployment(high).placed_instance_ids != ()


def test_a_replica_scaled_away_is_not_a_victim_twice() -> None:
    cluster = MemoryCluster({"node-a": 16, "node-b": 16})
    cluster.deploy(card("low", size_gb=12), "dep-l", replicas=2, priority=100)
    cluster.step(T)
    cluster.step(T + 1)
    older, newer = cluster.deployment("dep-l").placed_instance_ids
    pending = cluster.keeper.scale("dep-l", 1, cluster.state)  # not applied: newer is leaving
    assert deleted(pending) == [newer]
    cluster.deploy(card("high", size_gb=12), "dep-h", priority=900, preempt=True)
    events = cluster.step_keep(T + 2)
    assert deleted(events) == [older]


def test_anti_affinity_holds_for_a_preempting_replica() -> None:
    cluster = MemoryCluster({"node-a": 32, "node-b": 16})
    low = placed_by_the_keeper(cluster, "dep-l", card("low", size_gb=12), "node-b", 100)
    cluster.deploy(card("high", size_gb=12), "dep-h", replicas=2, priority=900, preempt=True)
    cluster.step(T)  # the first replica on node-a, which has room for a second one too
    events = cluster.step(T + 1)
    # The second may only go where the first is not: node-b, which low holds.
    assert deleted(events) == [low]
    nodes = sorted(
        n for i in cluster.instances_of_model("high") for n in cluster.nodes_of(i.instance_id)
    )
    assert nodes == ["node-a", "node-b"]


NODES = {"node-a": 16.0, "node-b": 16.0, "node-c": 24.0}
# Faults end by then (the latest start plus the longest outage); the cluster is left alone after.
LAST_FAULT_S = 150 + 100
# Long enough after the last fault for every chain of preemptions to play out: each link is a
# deployment retrying (at most UNPLACEABLE_RETRY) after the one above it took its room, plus one
# backoff (at most a minute) for an instance lost before it was seen ready.
SETTLED_S = LAST_FAULT_S + 5 * UNPLACEABLE_RETRY + 60


@settings(max_examples=60, deadline=None)
@given(
    specs=st.lists(
        st.tuples(
            st.integers(4, 14),
            st.sampled_from([100, 500, 900]),
            st.booleans(),
            st.integers(0, 100),
        ),
        min_size=3,
        max_size=6,
    ),
    faults=st.lists(
        st.tuples(st.integers(0, 150), st.sampled_from(sorted(NODES)), st.integers(5, 100)),
        max_size=3,
    ),
)
def test_over_many_steps_and_node_losses_preemption_only_takes_from_lower_and_settles(
    specs: list[tuple[int, int, bool, int]], faults: list[tuple[int, str, int]]
) -> None:
    cluster = MemoryCluster(NODES)
    manual = build_instance(card("manual", size_gb=2), ["node-c"], instance_id="by-hand")
    cluster.apply(InstanceCreated(instance=manual))
    cluster.report()
    down_until: dict[str, int] = {}
    preemptions = 0
    for now in range(int(SETTLED_S) + 150):
        for n, (size, priority, preempt, created_at) in enumerate(specs):
            if created_at == now:
                model = card(f"m{n}", size_gb=size)
                cluster.deploy(model, f"dep-{n}", priority=priority, preempt=preempt)
        for at, node_id, down_s in faults:
            if at == now and node_id not in down_until:
                cluster.kill(node_id)
                down_until[node_id] = now + down_s
        for node_id, until in list(down_until.items()):
            if until == now:
                del down_until[node_id]
                cluster.revive(node_id)
        before = cluster.state
        events = cluster.step(T + now)
        gone = deleted(events)
        if now > SETTLED_S:
            assert events == [], f"still changing at {now} s: {kinds(events)}"
        if not gone:
            continue
        preemptions += 1
        (placed,) = [e for e in events if isinstance(e, DeploymentPlaced)]
        preemptor = before.deployments[placed.deployment_id]
        assert preemptor.preempt
        for instance_id in gone:
            assert instance_id != "by-hand"
            (owner,) = [
                d for d in before.deployments.values() if instance_id in d.placed_instance_ids
            ]
            assert owner.priority < preemptor.priority
            assert cluster.deployment(owner.deployment_id).placement_error == preempted_by(
                preemptor.model_card.model_id
            )
    # Each preemption displaced someone strictly lower: they cannot outnumber what the faults
    # (and the first placements) set in motion.
    assert preemptions <= len(specs) * (len(faults) + 1)
    target(float(preemptions))  # steer the search towards crowded clusters that preempt


# --- the search ---------------------------------------------------------------------------


def ring(instance_id: str, model: ModelCard, node: str) -> AnyInstance:
    return build_instance(model, [node], instance_id=instance_id)


def state_with(*instances: AnyInstance, totals: Mapping[str, float] | None = None) -> State:
    state = State(instances={i.instance_id: i for i in instances})
    for node_id, total in (totals or {}).items():
        free = max(int(total * GIB) - held_on(state, node_id), 0)
        memory = MemoryUsage(ram_total=Memory.from_gb(total), ram_available=Memory(in_bytes=free))
        state = state.model_copy(
            update={
                "node_memory": {**state.node_memory, node_id: memory},
                "topology": state.topology.model_copy(
                    update={"nodes": [*state.topology.nodes, node_id]}
                ),
            }
        )
    return state


def test_without_instances_frees_each_runner_s_shard_up_to_the_node_s_total() -> None:
    pipeline = build_instance(card("p", size_gb=8, n_layers=16), ["node-a", "node-b"], "pipe")
    state = state_with(pipeline, totals={"node-a": 16, "node-b": 16})
    assert state.node_memory["node-a"].ram_available.in_bytes == 12 * GIB
    view = without_instances(state, frozenset({"pipe"}))
    assert view.instances == {}
    assert view.node_memory["node-a"].ram_available.in_bytes == 16 * GIB
    assert view.node_memory["node-b"].ram_available.in_bytes == 16 * GIB
    # A node that reports more free than it has in all (or a total it does not know) gets
    # nothing back beyond what it reports.
    odd = state.model_copy(
        update={
            "node_memory": {
                **state.node_memory,
                "node-a": MemoryUsage(
                    ram_total=Memory.from_gb(13), ram_available=Memory.from_gb(12)
                ),
                "node-b": MemoryUsage(ram_available=Memory.from_gb(3)),
            }
        }
    )
    view = without_instances(odd, frozenset({"pipe"}))
    assert view.node_memory["node-a"].ram_available.in_bytes == 13 * GIB
    assert view.node_memory["node-b"].ram_available.in_bytes == 3 * GIB
    # Runners go with their instance; the rest of the State stays.
    runners = {r: RunnerReady() for r in pipeline.shard_assignments.node_to_runner.values()} | {
        "other": RunnerReady()
    }
    with_runners = state.model_copy(update={"runners": runners})
    assert without_instances(with_runners, frozenset({"pipe"})).runners == {"other": RunnerReady()}
    assert without_instances(state, frozenset()) == state


def test_a_tensor_shard_frees_an_even_share_of_the_model() -> None:
    model = card("t", size_gb=8, n_layers=16)
    runner_to_shard = {
        f"r{rank}": TensorShardMetadata(
            model_card=model,
            device_rank=rank,
            world_size=2,
            start_layer=0,
            end_layer=16,
            n_layers=16,
        )
        for rank in range(2)
    }
    tensor = MlxRingInstance(
        instance_id="tens",
        shard_assignments=ShardAssignments(
            model_id="t",
            runner_to_shard=dict(runner_to_shard),
            node_to_runner={"node-a": "r0", "node-b": "r1"},
        ),
    )
    memory = MemoryUsage(ram_total=Memory.from_gb(16), ram_available=Memory.from_gb(8))
    state = State(instances={"tens": tensor}, node_memory={"node-a": memory, "node-b": memory})
    view = without_instances(state, frozenset({"tens"}))
    assert view.node_memory["node-a"].ram_available.in_bytes == 12 * GIB


def test_degenerate_shards_free_what_they_hold_and_never_divide_by_zero() -> None:
    model = card("odd", size_gb=8, n_layers=1)

    def shard(kind: type[TensorShardMetadata] | type[PipelineShardMetadata], **fields: int) -> Any:
        base = {"device_rank": 0, "world_size": 1, "start_layer": 0, "end_layer": 1, "n_layers": 1}
        return kind(model_card=model, **(base | fields))

    shards = {
        "tensor-alone": shard(TensorShardMetadata, world_size=1),  # 8 GB
        "tensor-none": shard(TensorShardMetadata, world_size=0),  # 8 GB, as for one
        "one-layer": shard(PipelineShardMetadata, n_layers=1),  # 8 GB
        "no-layers": shard(PipelineShardMetadata, n_layers=0, end_layer=0),  # nothing
        "backwards": shard(PipelineShardMetadata, start_layer=1, end_layer=0),  # nothing
    }
    runner_to_shard = dict(shards)
    node_to_runner = {f"node-{name}": name for name in shards}
    odd = MlxRingInstance(
        instance_id="odd",
        shard_assignments=ShardAssignments(
            model_id="odd",
            runner_to_shard=runner_to_shard,
            # The shardless runner first: the runners after it still count.
            node_to_runner={"node-shardless": "no-shard", **node_to_runner},
        ),
    )
    memory = MemoryUsage(ram_total=Memory.from_gb(64), ram_available=Memory.from_gb(10))
    nodes = [*node_to_runner, "node-shardless"]
    state = State(instances={"odd": odd}, node_memory=dict.fromkeys(nodes, memory))
    freed = {
        node: view_memory.ram_available.in_bytes // GIB - 10
        for node, view_memory in without_instances(state, frozenset({"odd"})).node_memory.items()
    }
    assert freed == {
        "node-tensor-alone": 8,
        "node-tensor-none": 8,
        "node-one-layer": 8,
        "node-no-layers": 0,
        "node-backwards": 0,
        "node-shardless": 0,
    }


def test_freed_memory_is_whole_bytes() -> None:
    model = card("odd").model_copy(update={"storage_size": Memory(in_bytes=7), "n_layers": 2})
    pipeline = build_instance(model, ["node-a", "node-b"], "pipe")  # a layer each: 3 bytes
    tensor = MlxRingInstance(
        instance_id="tens",
        shard_assignments=ShardAssignments(
            model_id="odd",
            runner_to_shard={
                "t0": TensorShardMetadata(
                    model_card=model,
                    device_rank=0,
                    world_size=2,
                    start_layer=0,
                    end_layer=2,
                    n_layers=2,
                )
            },
            node_to_runner={"node-c": "t0"},
        ),
    )
    memory = MemoryUsage(ram_total=Memory.from_gb(1), ram_available=Memory(in_bytes=10))
    state = State(
        instances={"pipe": pipeline, "tens": tensor},
        node_memory=dict.fromkeys(["node-a", "node-b", "node-c"], memory),
    )
    view = without_instances(state, frozenset({"pipe", "tens"}))
    freed = {node: usage.ram_available.in_bytes for node, usage in view.node_memory.items()}
    assert freed == {"node-a": 13, "node-b": 13, "node-c": 13}
    assert all(type(value) is int for value in freed.values())


def test_freed_memory_adds_up_below_the_node_s_total() -> None:
    kept = build_instance(card("kept", size_gb=8), ["node-a"], "kept")
    gone = [build_instance(card(f"g{n}", size_gb=2), ["node-a"], f"g{n}") for n in range(2)]
    state = state_with(kept, *gone, totals={"node-a": 24})
    assert state.node_memory["node-a"].ram_available.in_bytes == 12 * GIB
    view = without_instances(state, frozenset({"g0", "g1"}))
    assert view.node_memory["node-a"].ram_available.in_bytes == 16 * GIB
    assert set(view.instances) == {"kept"}


def test_candidates_are_the_keeper_s_own_of_strictly_lower_priorities_lowest_first() -> None:
    instances = [ring(f"i{n}", card(f"m{n}"), "node-a") for n in range(6)]
    state = state_with(*instances)

    def dep(deployment_id: str, priority: int, *placed: str) -> Deployment:
        return Deployment(
            deployment_id=deployment_id,
            model_card=card(f"model-{deployment_id}"),
            priority=priority,
            placed_instance_ids=placed,
        )

    deployments = [
        dep("d-top", 900, "i0"),
        dep("d-same", 700, "i1"),
        dep("d-b", 300, "i2", "i3"),  # i3 newer
        dep("d-a", 300, "i4", "gone"),  # an id the State no longer shows
        dep("d-low", 100, "i5"),
    ]
    state = state.model_copy(update={"deployments": {d.deployment_id: d for d in deployments}})
    preemptor = dep("d-me", 700)
    found = candidates(state, preemptor)
    assert [(v.deployment_id, v.instance_id, v.priority) for v in found] == [
        ("d-low", "i5", 100),
        ("d-a", "i4", 300),
        ("d-b", "i3", 300),
        ("d-b", "i2", 300),
    ]
    spared = candidates(state, preemptor, spared={"d-a"}, leaving={"i3"})
    assert [v.instance_id for v in spared] == ["i5", "i2"]
    # A deployment written before its record names its one instance.
    legacy = deployments[-1].model_copy(update={"placed_instance_ids": (), "instance_id": "i5"})
    state = state.model_copy(update={"deployments": {**state.deployments, "d-low": legacy}})
    assert candidates(state, preemptor)[0].instance_id == "i5"


def test_candidates_are_capped_at_the_lowest_ranked() -> None:
    count = MAX_CANDIDATES + 5
    instances = [ring(f"i{n:02d}", card(f"m{n}"), "node-a") for n in range(count)]
    deployments = {
        f"d{n:02d}": Deployment(
            deployment_id=f"d{n:02d}",
            model_card=card(f"model-{n}"),
            priority=n,
            placed_instance_ids=(f"i{n:02d}",),
        )
        for n in range(count)
    }
    state = state_with(*instances).model_copy(update={"deployments": deployments})
    preemptor = Deployment(deployment_id="me", model_card=card("me"), priority=1000)
    found = candidates(state, preemptor)
    assert [v.priority for v in found] == list(range(MAX_CANDIDATES))


def test_the_search_spends_what_it_must_and_no_more() -> None:
    def trials(weights: list[int], need: int, budget: int = 1000) -> tuple[int, list[str] | None]:
        state, victims = _victims(weights)
        by_id = {v.instance_id: w for v, w in zip(victims, weights, strict=True)}
        inner = _fits_when_freed(need, by_id)
        calls: list[int] = []

        def place(view: State) -> AnyInstance:
            calls.append(1)
            return inner(view)

        found = find(place, state, victims, TrialBudget(budget))
        return len(calls), None if found is None else [v.instance_id for v in found.victims]

    # A lone candidate: its one trial says all there is.
    assert trials([5], 5) == (1, ["i0"])
    # All (1), spare i2 (no), spare i1 (yes), spare i0 (yes): i2 alone, no smaller set to seek.
    assert trials([1, 1, 10], 10) == (4, ["i2"])
    # All (1), sparing each of four (4, only i3 is spared), then sets of one: i0, i1, i2, i3.
    assert trials([3, 3, 3, 8], 8) == (9, ["i3"])
    # With one trial less, the search stops at the set it had: it fits, it is not the fewest.
    assert trials([3, 3, 3, 8], 8, budget=8) == (8, ["i0", "i1", "i2"])


def test_victims_are_grouped_by_deployment_in_their_order() -> None:
    victims = (Victim("d1", "i1", 1), Victim("d2", "i2", 1), Victim("d1", "i3", 1))
    preemption = Preemption(victims, ring("new", card("new"), "node-a"))
    assert preemption.by_deployment() == {"d1": ("i1", "i3"), "d2": ("i2",)}


def test_the_documented_bounds() -> None:
    # docs/design.md §5.13 gives their reasons; a change there is a change here.
    assert (MAX_PREEMPTION_TRIALS_PER_STEP, MAX_CANDIDATES) == (32, 15)


def _fits_when_freed(need: int, weights: Mapping[str, int]) -> Callable[[State], AnyInstance]:
    """A placement that fits once the instances missing from the view weigh ``need``."""

    def place(view: State) -> AnyInstance:
        freed = sum(w for instance_id, w in weights.items() if instance_id not in view.instances)
        if freed < need:
            raise ValueError(NO_MEMORY)
        return ring("new", card("new"), "node-a")

    return place


def _victims(weights: list[int]) -> tuple[State, list[Victim]]:
    instances = [ring(f"i{n}", card(f"m{n}"), "node-a") for n in range(len(weights))]
    victims = [Victim(f"d{n}", f"i{n}", n) for n in range(len(weights))]
    return state_with(*instances), victims


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=6),
    need=st.integers(1, 30),
)
def test_the_search_finds_the_fewest_sparing_the_highest_ranked_as_a_brute_force_does(
    weights: list[int], need: int
) -> None:
    state, victims = _victims(weights)
    by_id = {v.instance_id: w for v, w in zip(victims, weights, strict=True)}
    place = _fits_when_freed(need, by_id)
    found = find(place, state, victims, TrialBudget(10_000))
    fitting = [
        subset
        for size in range(1, len(weights) + 1)
        for subset in combinations(range(len(weights)), size)
        if sum(weights[i] for i in subset) >= need
    ]
    if not fitting:
        assert found is None
        return
    fewest = min(len(subset) for subset in fitting)
    # Among as few: the set whose highest index is lowest, then its next highest, ...
    expected = min(
        (s for s in fitting if len(s) == fewest), key=lambda s: tuple(sorted(s, reverse=True))
    )
    assert found is not None
    assert [v.instance_id for v in found.victims] == [f"i{i}" for i in expected]


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.integers(1, 9), min_size=1, max_size=MAX_CANDIDATES),
    need=st.integers(1, 60),
)
def test_the_search_spends_no_more_than_its_budget_and_what_it_finds_fits(
    weights: list[int], need: int
) -> None:
    state, victims = _victims(weights)
    by_id = {v.instance_id: w for v, w in zip(victims, weights, strict=True)}
    calls: list[int] = []
    inner = _fits_when_freed(need, by_id)

    def place(view: State) -> AnyInstance:
        calls.append(1)
        return inner(view)

    budget = TrialBudget()
    found = find(place, state, victims, budget)
    assert len(calls) <= MAX_PREEMPTION_TRIALS_PER_STEP
    assert budget.left == MAX_PREEMPTION_TRIALS_PER_STEP - len(calls)
    if sum(weights) < need:
        assert found is None and len(calls) == 1  # one trial with them all says so
    else:
        assert found is not None
        assert sum(by_id[v.instance_id] for v in found.victims) >= need
        # Nobody can be spared from the answer, whether or not it is the fewest.
        for victim in found.victims:
            assert sum(by_id[v.instance_id] for v in found.victims if v != victim) < need


def test_no_trial_left_means_no_preemption_this_step() -> None:
    state, victims = _victims([5, 5])
    budget = TrialBudget(0)
    assert find(_fits_when_freed(1, {"i0": 5, "i1": 5}), state, victims, budget) is None
    assert budget.left == 0 and not budget.spend()
    # No candidate: no preemption, even where placement would fit anyway.
    assert find(_fits_when_freed(0, {}), state, [], TrialBudget()) is None


def test_a_search_cut_short_keeps_an_answer_that_fits() -> None:
    weights = [1] * 10 + [10]
    state, victims = _victims(weights)
    by_id = {v.instance_id: w for v, w in zip(victims, weights, strict=True)}
    # All deleted fits (1 trial), sparing the top one still fits (10 ones): 2 trials spent.
    found = find(_fits_when_freed(10, by_id), state, victims, TrialBudget(2))
    assert found is not None
    assert [v.instance_id for v in found.victims] == [f"i{n}" for n in range(10)]


def test_a_placement_that_crashes_on_a_view_is_no_room() -> None:
    state, victims = _victims([5])

    def place(view: State) -> AnyInstance:
        raise RuntimeError("bug")

    assert find(place, state, victims, TrialBudget()) is None
