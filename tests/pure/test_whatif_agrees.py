"""What-if says what a real node loss then does (docs/design.md §5.14), on generated clusters.

Each example is a small cluster (two to six nodes of assorted memory, some pairs linked, some nodes
holding a model already, now and then one cordoned) with one to three deployments (assorted sizes,
replicas, node counts, sharding and engine), placed by a real ``Keeper`` with the real placement
until it is at rest, every instance then ready. What-if is asked about one or two of its nodes; then
those nodes really go (``NodeTimedOut``, then the harness's sweep: ``InstanceDeleted`` for each
instance that used one) and the same keeper is stepped on, in virtual time, its events applied,
until it is at rest again. Where each deployment's instances are then (their node sets), how many
there are, and the deployment's placementError are what what-if said.

At rest: every deployment has its replicas, or the keeper waits to retry it as unplaceable (nothing
joins the cluster, so the retry changes nothing). The bound on the steps is there to fail a keeper
that never comes to rest, not to wait for one.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from keeper_harness import AFTER_GRACE, Cluster, card, link_events, node_info

from keeper.core.placement import place_instance
from keeper.core.view import models_instance_counts
from keeper.core.whatif import what_if
from keeper.model.events import NodeCordoned, NodeDownloadProgress, NodeGatheredInfo
from keeper.model.state import (
    DownloadCompleted,
    InstanceMeta,
    NodeIdentity,
    PipelineShardMetadata,
    Sharding,
)

# Steps (one a virtual second) a keeper gets to come to rest: more than the placements an
# example can need (three deployments of three replicas) plus a retry of each unplaceable one.
MAX_STEPS = 120
MEMORY_GB = (4.0, 8.0, 16.0, 24.0, 32.0)
MODEL_GB = (2.0, 6.0, 12.0, 20.0)


@dataclass(frozen=True)
class Spec:
    model_gb: float
    replicas: int
    min_nodes: int
    sharding: Sharding
    instance_meta: InstanceMeta


@dataclass(frozen=True)
class Example:
    memory: tuple[float, ...]  # per node n0, n1, ...
    links: frozenset[tuple[int, int]]  # pairs linked both ways
    deployments: tuple[Spec, ...]
    on_disk: frozenset[tuple[int, int]]  # (node, deployment) whose model the node holds
    cordoned: frozenset[int]  # nodes no placement may use (by friendly name, §5.15)
    lost: frozenset[int]


@st.composite
def examples(draw: st.DrawFn) -> Example:
    memory = tuple(draw(st.lists(st.sampled_from(MEMORY_GB), min_size=2, max_size=6)))
    pairs = [(a, b) for a in range(len(memory)) for b in range(a + 1, len(memory))]
    links = frozenset(draw(st.lists(st.sampled_from(pairs), unique=True)))
    specs = st.builds(
        Spec,
        model_gb=st.sampled_from(MODEL_GB),
        replicas=st.integers(1, 3),
        min_nodes=st.integers(1, 2),
        sharding=st.sampled_from([Sharding.PIPELINE, Sharding.PIPELINE, Sharding.TENSOR]),
        instance_meta=st.sampled_from([InstanceMeta.MLX_RING] * 3 + [InstanceMeta.MLX_JACCL]),
    )
    deployments = tuple(draw(st.lists(specs, min_size=1, max_size=3)))
    cells = [(n, d) for n in range(len(memory)) for d in range(len(deployments))]
    on_disk = frozenset(draw(st.lists(st.sampled_from(cells), unique=True, max_size=3)))
    cordoned = frozenset(draw(st.lists(st.integers(0, len(memory) - 1), max_size=1)))
    lost = frozenset(
        draw(st.lists(st.integers(0, len(memory) - 1), min_size=1, max_size=2, unique=True))
    )
    return Example(memory, links, deployments, on_disk, cordoned, lost)


def node(index: int) -> str:
    return f"n{index}"


def build(example: Example) -> Cluster:
    cluster = Cluster(place=place_instance)
    for index, gb in enumerate(example.memory):
        cluster.apply(node_info(node(index), gb))
        identity = NodeIdentity(friendly_name=f"mac-{index}")
        cluster.apply(
            NodeGatheredInfo(node_id=node(index), when="2026-01-01T00:00:00Z", identity=identity)
        )
    for a, b in sorted(example.links):
        cluster.apply(*link_events(node(a), node(b)))
    for index, spec in enumerate(example.deployments):
        model = card(f"model-{index}", size_gb=spec.model_gb)
        cluster.deploy(
            model,
            deployment_id=f"dep-{index}",
            sharding=spec.sharding,
            instance_meta=spec.instance_meta,
            min_nodes=spec.min_nodes,
            replicas=spec.replicas,
        )
    for node_index, deployment_index in sorted(example.on_disk):
        model = card(
            f"model-{deployment_index}", size_gb=example.deployments[deployment_index].model_gb
        )
        shard = PipelineShardMetadata(
            model_card=model,
            device_rank=0,
            world_size=1,
            start_layer=0,
            end_layer=model.n_layers,
            n_layers=model.n_layers,
        )
        entry = DownloadCompleted(
            node_id=node(node_index), shard_metadata=shard, total=model.storage_size
        )
        cluster.apply(NodeDownloadProgress(download_progress=entry))
    for index in sorted(example.cordoned):
        cluster.apply(NodeCordoned(name=f"mac-{index}"))
    return cluster


def at_rest(cluster: Cluster, now: float) -> bool:
    counts = models_instance_counts(cluster.state)
    timers = cluster.keeper.timers(cluster.state, now)
    return all(
        counts.get(deployment.model_card.model_id, 0) >= deployment.replicas
        or timers[deployment_id].waiting == "unplaceable_retry"
        for deployment_id, deployment in cluster.state.deployments.items()
    )


def run_to_rest(cluster: Cluster, start: float) -> float:
    """Steps the keeper once a virtual second from ``start`` until it is at rest; the time."""
    now = start
    for _ in range(MAX_STEPS):
        cluster.step(now)
        now += 1.0
        if at_rest(cluster, now):
            return now
    raise AssertionError(f"the keeper did not come to rest in {MAX_STEPS} steps")


def node_sets(cluster: Cluster, model_id: str) -> Counter[frozenset[str]]:
    return Counter(
        frozenset(instance.shard_assignments.node_to_runner)
        for instance in cluster.instances_of_model(model_id)
    )


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(examples())
def test_what_if_says_where_a_real_loss_leaves_every_deployment(example: Example) -> None:
    cluster = build(example)
    now = run_to_rest(cluster, AFTER_GRACE)
    for instance_id in list(cluster.state.instances):
        cluster.make_ready(instance_id)
    cluster.step(now)  # the keeper sees them ready: their loss is re-placed at once (§5.4)
    before = cluster.state
    lost = [node(index) for index in sorted(example.lost)]

    answer = what_if(before, lost)

    for node_id in lost:
        cluster.kill_node(node_id)
    run_to_rest(cluster, now + 1.0)
    said = {deployment.deployment_id: deployment for deployment in answer.deployments}
    assert sorted(said) == sorted(before.deployments)
    for deployment_id, deployment in cluster.state.deployments.items():
        what = said[deployment_id]
        event(what.outcome)
        model_id = deployment.model_card.model_id
        gone = {instance.instance_id for instance in what.lost}
        kept = Counter(
            frozenset(instance.shard_assignments.node_to_runner)
            for instance in before.instances.values()
            if instance.shard_assignments.model_id == model_id and instance.instance_id not in gone
        )
        placed = Counter(frozenset(n.node_id for n in p.nodes) for p in what.placed)
        assert node_sets(cluster, model_id) == kept + placed, (deployment_id, what)
        assert len(cluster.instances_of_model(model_id)) == what.after
        if what.reason is not None:
            assert deployment.placement_error == what.reason
        elif what.lost:
            assert deployment.placement_error is None
    # Its lost instances are exactly those that used a lost node, and only those.
    used = {
        instance.instance_id
        for instance in before.instances.values()
        if set(instance.shard_assignments.node_to_runner) & set(lost)
    }
    assert {i.instance_id for d in answer.deployments for i in d.lost} == used
