"""Rolling changes (docs/design.md §5.16): after a change of sharding, instance_meta or
min_nodes, the keeper replaces each instance placed with the old options make-before-break, one
at a time per deployment, never more than replicas + 1 instances of a model, and never an
instance placed after the change."""

from __future__ import annotations

from keeper_harness import AFTER_GRACE, Cluster, shaped_place, simple_place, unplaceable

from keeper.core.keeper import MOVE_SETTLE, Keeper
from keeper.core.placement import PlaceFn
from keeper.model.constants import PLACEMENT_TIMEOUT, UNPLACEABLE_RETRY
from keeper.model.events import (
    AnyEvent,
    DeploymentReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
)
from keeper.model.readiness import chat_targets
from keeper.model.rollout import matches_options, update_progress
from keeper.model.state import (
    AnyInstance,
    InstanceMeta,
    MlxJacclInstance,
    ModelCard,
    Sharding,
    State,
    TensorShardMetadata,
)

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
    assert cluster.step(T + replicas) == []  # the keeper sees the last one ready: at rest
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
    assert kinds(placed) == ["DeploymentReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]
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
    assert kinds(cluster.step(T + 11))[0] == "DeploymentReplacementPlaced"
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
    assert kinds(placed)[0] == "DeploymentReplacementPlaced"
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
    assert kinds(cluster.step(T + 12))[0] == "DeploymentReplacementPlaced"


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
    assert kinds(placed)[0] == "DeploymentReplacementPlaced"


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


# --- several deployments changing at once ----------------------------------------------------

SIX = (*FOUR, "node-e", "node-f")


def unplaceable_for_model(*models: str) -> PlaceFn:
    """``shaped_place``, but ``models`` fit nowhere."""

    def place(
        state: State,
        model_card: ModelCard,
        sharding: Sharding | str,
        instance_meta: InstanceMeta | str,
        min_nodes: int,
    ) -> AnyInstance:
        if model_card.model_id in models:
            raise ValueError("No cycles found with sufficient memory")
        return shaped_place(state, model_card, sharding, instance_meta, min_nodes)

    return place


def two_changing(place: PlaceFn = shaped_place) -> tuple[Cluster, str, str]:
    """``m1`` and ``m2`` at replicas 1 on two nodes each of six (apart), both changed to
    tensor."""
    cluster = Cluster(place=shaped_place)
    cluster.add_nodes(*SIX)
    first = cluster.deploy("m1", min_nodes=2)
    second = cluster.deploy("m2", min_nodes=2)
    for k, deployment_id in enumerate((first, second)):
        cluster.step(T + k)
        instance_id = cluster.instance_of(deployment_id).instance_id
        cluster.make_ready(instance_id)
        for node in cluster.nodes_of(instance_id):  # the next goes to other nodes
            cluster.add_node(node, available_gb=15.0 - k)
    for deployment_id in (first, second):
        cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.keeper._place = place  # pyright: ignore[reportPrivateUsage]
    return cluster, first, second


def replaced_in(events: list[AnyEvent]) -> list[str]:
    return [e.deployment_id for e in events if isinstance(e, DeploymentReplacementPlaced)]


def test_one_replacement_per_step_across_deployments_the_next_while_one_settles() -> None:
    cluster, first, second = two_changing()
    assert replaced_in(cluster.step(T + 10)) == [first]  # one placement per step
    # The first's move runs (not ready yet): the second is placed beside it.
    assert replaced_in(cluster.step(T + 11)) == [second]


def test_a_refused_replacement_lets_the_next_deployment_place_in_the_same_step() -> None:
    refused = unplaceable_for_model("m1")
    cluster, first, second = two_changing(refused)
    assert replaced_in(cluster.step(T + 10)) == [second]
    note = cluster.keeper.update_note(first)
    assert note is not None and note.endswith(": No cycles found with sufficient memory")
    assert cluster.keeper.update_note(second) is None


def test_a_stuck_or_short_or_draining_deployment_does_not_hold_the_next_back() -> None:
    # Stuck: the first refused on this cluster; the second, changed since, is placed.
    cluster, first, second = two_changing(unplaceable_for_model("m1"))
    cluster.apply(cluster.change_options(second).model_copy(update={"replace": ()}))
    assert replaced_in(cluster.step(T + 10)) == []
    assert cluster.keeper.update_note(first) is not None
    cluster.change_options(second, sharding=Sharding.TENSOR, min_nodes=3)
    assert replaced_in(cluster.step(T + 11)) == [second]
    # Short and waiting for its own retry: no replacement for it, the second goes on.
    cluster, first, second = two_changing()
    lost = cluster.instance_of(first).instance_id
    cluster.keeper._place = unplaceable_for_model("m1")  # pyright: ignore[reportPrivateUsage]
    cluster.delete_instance(lost)
    assert cluster.state.deployments[first].replacing == ()
    # (m1 is short, refused, and retried only when the cluster changes or in 30 s.)
    assert replaced_in(cluster.step(T + 10)) == [second]
    # A drain moving the first: the second's change goes on.
    cluster, first, second = two_changing()
    cluster.drain(cluster.nodes_of(cluster.instance_of(first).instance_id)[0])
    placed = cluster.step(T + 10)
    assert kinds(placed)[0] == "DrainReplacementPlaced"
    assert replaced_in(placed) == []  # the drain's placement was the step's one
    assert replaced_in(cluster.step(T + 11)) == [second]


def test_a_short_deployment_gets_no_replacement_even_where_one_would_fit() -> None:
    cluster, deployment_id, instances = serving(*SIX, replicas=2)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)

    def only_on_the_whole_cluster(
        state: State,
        model_card: ModelCard,
        sharding: Sharding | str,
        instance_meta: InstanceMeta | str,
        min_nodes: int,
    ) -> AnyInstance:
        # The recovery's view leaves out the other instance's nodes; a replacement's does not.
        if len(state.topology.nodes) < len(SIX):
            raise ValueError("No cycles found with sufficient memory")
        return shaped_place(state, model_card, sharding, instance_meta, min_nodes)

    cluster.keeper._place = only_on_the_whole_cluster  # pyright: ignore[reportPrivateUsage]
    cluster.delete_instance(instances[0])
    assert replaced_in(cluster.step(T + 10)) == []  # recovery first, refused; no replacement
    assert cluster.deployment(deployment_id).placement_error is not None
    assert len(cluster.instances_of_model("m")) == 1


def test_a_deployment_being_deleted_gets_no_replacement() -> None:
    cluster, deployment_id, _ = serving("node-a", "node-b")
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    assert cluster.keeper.delete(deployment_id, cluster.state)  # on its way, not applied yet
    assert replaced_in(cluster.step_keep(T + 10)) == []


def test_an_instance_to_replace_the_state_no_longer_shows_is_skipped() -> None:
    # The bridge: exo's State drops an instance before the bridge's log records its deletion.
    cluster, deployment_id, (only,) = serving("node-a", "node-b")
    event = cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.apply(event.model_copy(update={"replace": ("gone", only)}))
    assert cluster.deployment(deployment_id).replacing == ("gone", only)
    assert replaced_in(cluster.step(T + 10)) == [deployment_id]
    # Nothing it can replace: nothing, no error, and the next deployment is not held back.
    cluster, first, second = two_changing()
    gone = cluster.change_options(first).model_copy(update={"replace": ("gone",)})
    cluster.apply(gone)
    assert replaced_in(cluster.step(T + 10)) == [second]


def test_a_short_deployment_does_not_hold_the_next_back() -> None:
    cluster = Cluster(place=shaped_place)
    cluster.add_nodes(*SIX, "node-g", "node-h")
    first = cluster.deploy("m1", min_nodes=2, replicas=2)
    second = cluster.deploy("m2", min_nodes=2)
    for k in range(3):
        for event in cluster.step(T + k):
            if isinstance(event, InstanceCreated):
                cluster.make_ready(event.instance.instance_id)
                for node in event.instance.shard_assignments.node_to_runner:
                    cluster.add_node(node, available_gb=15.0 - k)  # the next goes elsewhere
    assert len(cluster.instances_of_model("m1")) == 2 and cluster.instances_of_model("m2")
    cluster.change_options(first, sharding=Sharding.TENSOR)
    cluster.change_options(second, sharding=Sharding.TENSOR)
    cluster.keeper._place = unplaceable_for_model("m1")  # pyright: ignore[reportPrivateUsage]
    cluster.delete_instance(cluster.deployment(first).replacing[0])  # m1 short, refused
    assert replaced_in(cluster.step(T + 10)) == [second]


def test_a_replacement_whose_events_were_lost_is_placed_again_after_the_timeout() -> None:
    cluster, deployment_id, _ = serving("node-a", "node-b")
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    assert replaced_in(cluster.step_keep(T + 10)) == [deployment_id]  # never applied
    assert cluster.step_keep(T + 11) == []  # in flight
    again = cluster.step_keep(T + 10 + PLACEMENT_TIMEOUT + 1)
    assert replaced_in(again) == [deployment_id]


def test_the_stuck_note_names_the_nodes_left_out_and_why() -> None:
    cluster, deployment_id, instances = serving(*SIX, replicas=2)
    cluster.keeper = Keeper(0.0, place=unplaceable())
    cluster.cordon("node-f")
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.step(T + 10)
    old = cluster.deployment(deployment_id).replacing[0]
    other = next(i for i in instances if i != old)
    serving_nodes = ", ".join(sorted(cluster.nodes_of(other)))
    assert cluster.keeper.update_note(deployment_id) == (
        f"cannot replace instance {old} with Tensor/MlxRing, min_nodes 2 "
        f"(cordoned: node-f; serving it already: {serving_nodes}): "
        "No cycles found with sufficient memory"
    )
    # Nothing left out: no parenthesis.
    cluster, deployment_id, (only,) = serving("node-a", "node-b")
    cluster.keeper = Keeper(0.0, place=unplaceable())
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    cluster.step(T + 10)
    assert cluster.keeper.update_note(deployment_id) == (
        f"cannot replace instance {only} with Tensor/MlxRing, min_nodes 2: "
        "No cycles found with sufficient memory"
    )


def test_an_instance_matches_by_its_kind_its_shards_and_its_node_count() -> None:
    cluster, deployment_id, (ring,) = serving("node-a", "node-b")
    deployment = cluster.deployment(deployment_id)
    instance = cluster.state.instances[ring]
    assert matches_options(instance, deployment)
    jaccl = shaped_place(cluster.state, deployment.model_card, "Pipeline", "MlxJaccl", 2)
    assert not matches_options(jaccl, deployment)
    as_jaccl = deployment.model_copy(update={"instance_meta": InstanceMeta.MLX_JACCL})
    assert matches_options(jaccl, as_jaccl) and not matches_options(instance, as_jaccl)
    tensor = shaped_place(cluster.state, deployment.model_card, "Tensor", "MlxRing", 2)
    as_tensor = deployment.model_copy(update={"sharding": Sharding.TENSOR})
    assert matches_options(tensor, as_tensor) and not matches_options(tensor, deployment)
    assert not matches_options(instance, deployment.model_copy(update={"min_nodes": 3}))
