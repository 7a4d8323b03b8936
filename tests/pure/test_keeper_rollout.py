"""Rolling changes (docs/design.md §5.16): after a change of sharding, instance_meta or
min_nodes, the keeper replaces each instance placed with the old options make-before-break, one
at a time per deployment, never more than replicas + 1 instances of a model, and never an
instance placed after the change."""

from __future__ import annotations

from keeper_harness import AFTER_GRACE, Cluster, shaped_place, simple_place, unplaceable

from keeper.core.keeper import MOVE_SETTLE, Keeper
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import (
    AnyEvent,
    DeploymentReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.readiness import chat_targets
from keeper.model.rollout import matches_options, update_progress
from keeper.model.state import InstanceMeta, MlxJacclInstance, Sharding, TensorShardMetadata

FOUR = ("node-a", "node-b", "node-c", "node-d")
ALL = frozenset({*FOUR, "node-e", "node-f"})  # connected nodes
T = AFTER_GRACE


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def serving(*nodes: str, replicas: int = 1, min_nodes: int = 2) -> tuple[Cluster, str, list[str]]:
    """``m`` deployed at ``replicas`` on ``nodes``, every instance ready, placed as asked (on
    two nodes each by default: a one-node instance is a pipeline ring whatever was asked)."""
    cluster = Cluster(place=shaped_place)
    cluster.add_nodes(*nodes)
    deployment_id = cluster.deploy("m", replicas=replicas, min_nodes=min_nodes)
    for k in range(replicas):
        cluster.step(T + k)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    return cluster, deployment_id, sorted(cluster.state.instances)


def placed_instance(events: list[AnyEvent]) -> str:
    created = next(e for e in events if isinstance(e, InstanceCreated))
    return created.instance.instance_id


def test_a_change_of_sharding_replaces_the_instance_make_before_break() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    change = cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    assert change.replace == (old,)
    assert update_progress(cluster.deployment(deployment_id)) == (0, 1)
    placed = cluster.step(T + 10)
    assert kinds(placed) == ["InstanceCreated", "DeploymentPlaced", "DeploymentReplacementPlaced"]
    new = placed_instance(placed)
    replacement = cluster.state.instances[new]
    assert all(
        isinstance(shard, TensorShardMetadata)
        for shard in replacement.shard_assignments.runner_to_shard.values()
    )
    # Until the replacement is ready the old one serves (replicas + 1 instances).
    assert cluster.step(T + 11) == []
    assert len(cluster.instances_of_model("m")) == 2
    assert chat_targets(cluster.state, "m", ALL) == [(old, cluster.nodes_of(old)[0])]
    assert update_progress(cluster.deployment(deployment_id)) == (0, 1)
    cluster.make_ready(new)
    assert chat_targets(cluster.state, "m", ALL) == [(new, cluster.nodes_of(new)[0])]
    assert cluster.step(T + 12) == []
    assert cluster.step(T + 12 + MOVE_SETTLE - 0.5) == []
    assert cluster.step(T + 12 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    deployment = cluster.deployment(deployment_id)
    assert deployment.moving is None and deployment.replacing == ()
    assert update_progress(deployment) is None
    assert deployment.placed_instance_ids == (new,)
    assert cluster.step(T + 20 + MOVE_SETTLE) == []


def test_replicas_are_replaced_one_at_a_time_never_more_than_replicas_plus_one() -> None:
    cluster, deployment_id, instances = serving(*FOUR, replicas=2)
    cluster.change_options(deployment_id, instance_meta=InstanceMeta.MLX_JACCL)
    progress: list[tuple[int, int] | None] = []
    most = 0
    now = T + 10
    while now < T + 200:
        events = cluster.step(now)
        most = max(most, len(cluster.instances_of_model("m")))
        for event in events:
            if isinstance(event, DeploymentReplacementPlaced):
                cluster.make_ready(event.move.new_instance_id)
        progress.append(update_progress(cluster.deployment(deployment_id)))
        now += 1
    assert most == 3
    assert [p for i, p in enumerate(progress) if i == 0 or p != progress[i - 1]] == [
        (0, 2),
        (1, 2),
        None,
    ]
    left = cluster.instances_of_model("m")
    assert len(left) == 2 and all(isinstance(i, MlxJacclInstance) for i in left)
    assert not {i.instance_id for i in left} & set(instances)


def test_an_instance_placed_after_the_change_is_never_replaced_by_it() -> None:
    # A placement that answers in a shape of its own (always a pipeline ring here): the change
    # replaces the instance it named once, then stops, instead of replacing for ever.
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b", "node-c")
    deployment_id = cluster.deploy("m", min_nodes=2)
    cluster.step(T)
    old = cluster.instance_of(deployment_id).instance_id
    cluster.make_ready(old)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    new = placed_instance(cluster.step(T + 10))
    cluster.make_ready(new)
    cluster.step(T + 11)
    assert cluster.step(T + 11 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    assert not matches_options(cluster.state.instances[new], cluster.deployment(deployment_id))
    for k in range(30):
        assert cluster.step(T + 20 + k) == []


def test_recovery_comes_first_and_the_change_waits_while_the_deployment_is_short() -> None:
    cluster, deployment_id, instances = serving(*FOUR, replicas=2)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.delete_instance(instances[0])  # a fault: one replica short
    recovered = cluster.step(T + 10)
    assert kinds(recovered) == ["InstanceCreated", "DeploymentPlaced"]  # not a replacement
    # The lost instance is no longer one to replace; the recovery is placed with the new options.
    assert cluster.deployment(deployment_id).replacing == (instances[1],)
    fresh = placed_instance(recovered)
    assert matches_options(cluster.state.instances[fresh], cluster.deployment(deployment_id))
    # Once the State shows it, the deployment is not short: the change goes on (replicas + 1).
    assert kinds(cluster.step(T + 11))[-1] == "DeploymentReplacementPlaced"
    assert len(cluster.instances_of_model("m")) == 3


def test_a_replacement_that_cannot_be_placed_leaves_the_instance_and_says_why() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    cluster.keeper = Keeper(0.0, place=unplaceable())
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    assert cluster.step(T + 10) == []
    note = cluster.keeper.update_note(deployment_id)
    assert note is not None
    assert note.startswith(f"cannot replace instance {old} with Tensor/MlxRing, min_nodes 2")
    assert note.endswith(": No cycles found with sufficient memory")
    assert "serving it already" not in note  # the only instance is the one being replaced
    assert list(cluster.state.instances) == [old]
    # Not tried again on the same cluster until the retry is due; then tried (and placed).
    cluster.keeper._place = shaped_place  # pyright: ignore[reportPrivateUsage]
    assert cluster.step(T + 10 + UNPLACEABLE_RETRY - 0.5) == []
    placed = cluster.step(T + 10 + UNPLACEABLE_RETRY)
    assert kinds(placed)[-1] == "DeploymentReplacementPlaced"
    assert cluster.keeper.update_note(deployment_id) is None


def test_a_cluster_change_retries_a_refused_replacement_at_once() -> None:
    cluster, deployment_id, instances = serving(*FOUR, replicas=2)
    cluster.keeper = Keeper(0.0, place=unplaceable())
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    assert cluster.step(T + 10) == []
    note = cluster.keeper.update_note(deployment_id)
    other = ", ".join(sorted(cluster.nodes_of(instances[1])))
    assert note is not None and f"(serving it already: {other})" in note
    cluster.keeper._place = shaped_place  # pyright: ignore[reportPrivateUsage]
    assert cluster.step(T + 11) == []  # the same cluster: not before the retry
    cluster.add_nodes("node-e")
    cluster.link("node-a", "node-e")
    assert kinds(cluster.step(T + 12))[-1] == "DeploymentReplacementPlaced"


def test_a_lost_replacement_leaves_the_old_instance_to_replace_again() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b", "node-c")
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    new = placed_instance(cluster.step(T + 10))
    cluster.delete_instance(new)  # lost before it was ready
    deployment = cluster.deployment(deployment_id)
    assert deployment.moving is None and deployment.replacing == (old,)
    assert old in cluster.state.instances
    assert cluster.step(T + 11) == []  # a lost placement: the keeper's backoff
    placed: list[AnyEvent] = []
    now = T + 12
    while not placed and now < T + 400:
        placed = cluster.step(now)
        now += 1
    assert kinds(placed)[-1] == "DeploymentReplacementPlaced"


def test_a_new_keeper_finishes_the_move_it_finds_in_the_state() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    new = placed_instance(cluster.step(T + 10))
    cluster.make_ready(new)
    cluster.keeper = Keeper(0.0, place=shaped_place)  # a restarted master
    assert cluster.step(T + 100) == []
    assert cluster.step(T + 100 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    assert cluster.step(T + 101 + MOVE_SETTLE) == []  # nothing placed twice


def test_a_drain_and_a_change_never_surge_one_deployment_twice() -> None:
    cluster, deployment_id, instances = serving(*FOUR, "node-e", "node-f", replicas=2)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    on = cluster.nodes_of(instances[1])[0]
    cluster.drain(on)
    most = 0
    now = T + 10
    while now < T + 300:
        events = cluster.step(now)
        for event in events:
            if isinstance(event, InstanceCreated):
                cluster.make_ready(event.instance.instance_id)
        most = max(most, len(cluster.instances_of_model("m")))
        now += 1
    assert most == 3
    left = cluster.instances_of_model("m")
    assert len(left) == 2
    assert all(matches_options(i, cluster.deployment(deployment_id)) for i in left)
    assert all(on not in i.shard_assignments.node_to_runner for i in left)


def test_the_same_options_again_and_options_the_instances_already_have_replace_nothing() -> None:
    cluster, deployment_id, _ = serving("node-a", "node-b", replicas=1)
    assert cluster.change_options(deployment_id, sharding=Sharding.PIPELINE).replace == ()
    # min_nodes lowered (or kept below the instance's node count) leaves it: it spans enough.
    assert cluster.change_options(deployment_id, min_nodes=1).replace == ()
    assert cluster.step(T + 10) == []
    assert update_progress(cluster.deployment(deployment_id)) is None


def test_a_one_node_instance_is_as_any_sharding_asks() -> None:
    # One node is always a pipeline ring, whatever was asked: replacing it would place the same.
    cluster, deployment_id, (only,) = serving("node-a", "node-b", min_nodes=1)
    assert len(cluster.nodes_of(only)) == 1
    change = cluster.change_options(
        deployment_id, sharding=Sharding.TENSOR, instance_meta=InstanceMeta.MLX_JACCL
    )
    assert change.replace == ()
    # Asking for two nodes does replace it.
    assert cluster.change_options(deployment_id, min_nodes=2).replace == (only,)


def test_a_deleted_deployment_replaces_nothing_more() -> None:
    cluster, deployment_id, _ = serving(*FOUR, replicas=2)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.step(T + 10)
    deleted = cluster.delete(deployment_id)
    assert kinds(deleted).count("InstanceDeleted") == 3  # both instances and the replacement
    assert cluster.step(T + 11) == []
    assert cluster.state.instances == {}
