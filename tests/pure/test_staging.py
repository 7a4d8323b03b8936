"""Staged failover (docs/design.md §5.12): the keeper keeps a deployment's model downloaded where
its replicas would fail over to. Pure: States built with the cluster's own events, the keeper
stepped at chosen times."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from keeper_harness import Cluster, RecordingPlace, build_instance, card

from keeper.core.keeper import MAX_STAGING_PLANS_PER_STEP, STAGING_INTERVAL, Keeper
from keeper.core.placement import place_instance
from keeper.core.staging import (
    STAGE_RETRY,
    STAGING_DISK_FLOOR_BYTES,
    has_room,
    holds_or_fetches,
    staging_plan,
)
from keeper.model.events import (
    DeploymentStandbyChanged,
    DownloadDeletionRequested,
    DownloadRequested,
    InstanceCreated,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
)
from keeper.model.state import (
    AnyShard,
    DiskUsage,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Memory,
    State,
)

GB = 1024**3
T0 = 100.0  # past the startup grace
WHEN = "2026-12-01T10:00:00Z"


def disk(node_id: str, free_gb: float, total_gb: float = 1000.0) -> NodeGatheredInfo:
    return NodeGatheredInfo(
        node_id=node_id,
        when=WHEN,
        disk=DiskUsage(total=Memory.from_gb(total_gb), available=Memory.from_gb(free_gb)),
    )


def cluster_of(*nodes: str, free_gb: float = 500.0) -> Cluster:
    cluster = Cluster()
    cluster.add_nodes(*nodes, available_gb=64.0)
    cluster.apply(*(disk(n, free_gb) for n in nodes))
    return cluster


def serving(cluster: Cluster, model: str = "m", size_gb: float = 1.0) -> str:
    """A deployment placed and ready, the keeper at rest."""
    deployment_id = cluster.deploy(card(model, size_gb=size_gb))
    cluster.step(T0)
    for instance in cluster.instances_of_model(model):
        cluster.make_ready(instance.instance_id)
    return deployment_id


def asks(events: Sequence[object]) -> list[tuple[str | None, str]]:
    return [(e.deployment_id, e.node_id) for e in events if isinstance(e, DownloadRequested)]


def shard_of(cluster: Cluster, model: str) -> AnyShard:
    (instance,) = cluster.instances_of_model(model)
    return next(iter(instance.shard_assignments.runner_to_shard.values()))


def progress(node: str, shard: AnyShard, kind: str) -> NodeDownloadProgress:
    total = shard.model_card.storage_size
    match kind:
        case "ongoing":
            data = DownloadProgressData(total=total, downloaded=Memory(in_bytes=1))
            entry = DownloadOngoing(node_id=node, shard_metadata=shard, download_progress=data)
        case "completed":
            entry = DownloadCompleted(node_id=node, shard_metadata=shard, total=total)
        case "pending":
            entry = DownloadPending(node_id=node, shard_metadata=shard)
        case _:
            entry = DownloadFailed(node_id=node, shard_metadata=shard, error_message="disk full")
    return NodeDownloadProgress(download_progress=entry)


def test_at_rest_the_model_is_staged_on_the_node_it_would_fail_over_to() -> None:
    cluster = cluster_of("a", "b", "c")
    deployment_id = serving(cluster)
    (serving_node,) = cluster.nodes_of(cluster.instance_of(deployment_id).instance_id)
    events = cluster.step(T0 + 1)
    fallback = place_instance(
        cluster.state.model_copy(
            update={
                "topology": cluster.state.topology.model_copy(
                    update={"nodes": [n for n in cluster.state.topology.nodes if n != serving_node]}
                )
            }
        ),
        card("m"),
        "Pipeline",
        "MlxRing",
        1,
    )
    (expected,) = fallback.shard_assignments.node_to_runner
    assert asks(events) == [(deployment_id, expected)]
    (ask,) = [e for e in events if isinstance(e, DownloadRequested)]
    assert ask.shard_metadata.model_card.model_id == "m"
    assert cluster.deployment(deployment_id).staged_on == (expected,)


def test_nothing_is_staged_while_a_deployment_is_short_or_before_anything_serves() -> None:
    cluster = cluster_of("a", "b", "c")
    cluster.deploy(card("m"))
    placing = cluster.step(T0)
    assert asks(placing) == []  # placing comes first
    (instance,) = cluster.instances_of_model("m")
    cluster.deploy(card("other"))
    assert asks(cluster.step(T0 + STAGING_INTERVAL)) == []  # "other" is short
    cluster.make_ready(instance.instance_id)


def test_standby_zero_stages_nothing_and_standby_two_uses_two_sets_apart() -> None:
    cluster = cluster_of("a", "b", "c", "d")
    none = serving(cluster, "m")
    cluster.apply(DeploymentStandbyChanged(deployment_id=none, standby=0))
    assert asks(cluster.step(T0 + 1)) == []
    cluster.apply(DeploymentStandbyChanged(deployment_id=none, standby=2))
    events = cluster.step(T0 + 1 + STAGING_INTERVAL)
    nodes = [node for _, node in asks(events)]
    serving_nodes = cluster.nodes_of(cluster.instance_of(none).instance_id)
    assert len(nodes) == 2 and len(set(nodes)) == 2
    assert not set(nodes) & set(serving_nodes)


def test_a_copy_is_asked_once_then_again_only_after_the_retry_unless_it_shows() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    first = asks(cluster.step(T0 + 1))
    assert len(first) == 1
    node = first[0][1]
    assert asks(cluster.step(T0 + 1 + STAGING_INTERVAL)) == []  # asked, not yet shown
    later = T0 + 1 + STAGE_RETRY
    assert asks(cluster.step(later)) == [(deployment_id, node)]  # lost: asked again
    cluster.apply(progress(node, shard_of(cluster, "m"), "ongoing"))
    assert asks(cluster.step(later + STAGE_RETRY)) == []  # coming
    cluster.apply(progress(node, shard_of(cluster, "m"), "completed"))
    assert asks(cluster.step(later + 2 * STAGE_RETRY)) == []  # held


@pytest.mark.parametrize("kind", ["pending", "failed"])
def test_a_pending_or_failed_copy_is_asked_for_again(kind: str) -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    ((_, node),) = asks(cluster.step(T0 + 1))
    cluster.apply(progress(node, shard_of(cluster, "m"), kind))
    assert asks(cluster.step(T0 + 1 + STAGE_RETRY)) == [(deployment_id, node)]


def test_staging_runs_at_most_once_per_interval() -> None:
    cluster = cluster_of("a", "b", "c")
    serving(cluster)
    assert len(asks(cluster.step(T0 + 1))) == 1
    cluster.deploy(card("n"))
    cluster.step(T0 + 2)  # places n
    for instance in cluster.instances_of_model("n"):
        cluster.make_ready(instance.instance_id)
    assert asks(cluster.step(T0 + 1 + STAGING_INTERVAL - 0.5)) == []
    assert len(asks(cluster.step(T0 + 1 + STAGING_INTERVAL))) == 1


def test_never_where_the_copy_would_leave_too_little_disk_free() -> None:
    size = 17.0
    cluster = cluster_of("a", "b", "c")
    deployment_id = serving(cluster, size_gb=size)
    serving_node = cluster.nodes_of(cluster.instance_of(deployment_id).instance_id)[0]
    others = [n for n in ("a", "b", "c") if n != serving_node]
    # The first other node would keep less than 20 GB free; the second has room.
    cluster.apply(
        disk(others[0], free_gb=size + 19.9, total_gb=100.0),
        disk(others[1], free_gb=size + 20.0, total_gb=100.0),
    )
    assert asks(cluster.step(T0 + 1)) == [(deployment_id, others[1])]


def test_no_room_anywhere_is_reported_in_numbers() -> None:
    cluster = cluster_of("a", "b", free_gb=30.0)
    deployment_id = serving(cluster, size_gb=17.0)
    assert asks(cluster.step(T0 + 1)) == []
    assert cluster.keeper.staging_note(deployment_id) == (
        "standby 0 of 1: no node apart has disk for 17.0 GB"
    )


def test_a_node_that_reports_no_disk_is_not_staged_on() -> None:
    cluster = Cluster()
    cluster.add_nodes("a", "b")
    deployment_id = serving(cluster)
    assert asks(cluster.step(T0 + 1)) == []
    note = cluster.keeper.staging_note(deployment_id)
    assert note is not None and note.startswith("standby 0 of 1: no node apart has disk")


def test_no_placement_apart_is_reported_with_placements_reason() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    cluster.apply(NodeTimedOut(node_id=next(n for n in "ab" if n not in _serving_nodes(cluster))))
    assert asks(cluster.step(T0 + 1)) == []
    note = cluster.keeper.staging_note(deployment_id)
    assert note is not None
    assert note.startswith("standby 0 of 1: no placement apart from the serving nodes: ")


def _serving_nodes(cluster: Cluster) -> list[str]:
    return [n for i in cluster.instances_of_model("m") for n in cluster.nodes_of(i.instance_id)]


def test_one_download_per_node_at_a_time() -> None:
    cluster = cluster_of("a", "b")
    first = serving(cluster, "m")
    second = serving(cluster, "n")
    nodes = {
        dep: cluster.nodes_of(cluster.instance_of(dep).instance_id)[0] for dep in (first, second)
    }
    events = cluster.step(T0 + 1)
    if nodes[first] == nodes[second]:
        # Both fall back to the other node: only one of them is asked for at once.
        assert len(asks(events)) == 1
    else:
        assert len(asks(events)) == 2  # each stages on the other's node: two nodes, one each
    # A node busy with another download gets no second one.
    busy = cluster_of("a", "b")
    dep = serving(busy, "m")
    other = next(n for n in ("a", "b") if n not in busy.nodes_of(busy.instance_of(dep).instance_id))
    shard = shard_of(busy, "m").model_copy(update={"model_card": card("x", size_gb=2.0)})
    busy.apply(progress(other, shard, "ongoing"))
    assert asks(busy.step(T0 + 1)) == []


def test_plans_are_recomputed_when_the_cluster_changes_and_bounded_per_step() -> None:
    cluster = cluster_of("a", "b", "c")
    deployment_id = serving(cluster)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    cluster.apply(NodeTimedOut(node_id=staged))  # the planned node leaves
    ((_, again),) = asks(cluster.step(T0 + 1 + STAGING_INTERVAL))
    assert again not in (staged, *_serving_nodes(cluster))
    assert cluster.deployment(deployment_id).staged_on == (staged, again)


def test_at_most_a_few_plans_are_computed_per_step_and_the_rest_wait_their_turn() -> None:
    many = cluster_of(*(f"n{i}" for i in range(MAX_STAGING_PLANS_PER_STEP + 3)))
    for i in range(MAX_STAGING_PLANS_PER_STEP + 2):
        serving(many, f"m{i}")
    counting = RecordingPlace(place_instance)
    many.keeper = Keeper(0.0, preview=counting)  # a keeper that has planned nothing yet
    many.step(T0 + 1)
    assert len(counting.models_tried()) == MAX_STAGING_PLANS_PER_STEP
    many.step(T0 + 1 + STAGING_INTERVAL)
    assert len(counting.models_tried()) == MAX_STAGING_PLANS_PER_STEP + 2
    assert len(set(counting.models_tried())) == MAX_STAGING_PLANS_PER_STEP + 2
    many.step(T0 + 1 + 2 * STAGING_INTERVAL)  # nothing changed: no plan again
    assert len(counting.models_tried()) == MAX_STAGING_PLANS_PER_STEP + 2


def test_deletion_removes_the_copies_it_made_and_no_other() -> None:
    cluster = cluster_of("a", "b", "c")
    deployment_id = serving(cluster)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    elsewhere = next(n for n in "abc" if n not in (staged, *_serving_nodes(cluster)))
    cluster.apply(progress(elsewhere, shard_of(cluster, "m"), "completed"))  # not the keeper's
    events = cluster.delete(deployment_id)
    deletions = [
        (e.node_id, e.model_id) for e in events if isinstance(e, DownloadDeletionRequested)
    ]
    assert deletions == [(staged, "m")]


def test_deletion_also_removes_a_copy_asked_for_but_not_yet_recorded() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    pending = cluster.step_keep(T0 + 1)  # DownloadRequested still on its way
    ((_, node),) = asks(pending)
    events = cluster.delete(deployment_id)
    assert [e.node_id for e in events if isinstance(e, DownloadDeletionRequested)] == [node]


def test_the_rules_read_only_the_state() -> None:
    state = State()
    assert not has_room(state, "x", 0)
    assert not holds_or_fetches(state, "x", "m")
    state = state.model_copy(
        update={
            "node_disk": {
                "x": DiskUsage(total=Memory(in_bytes=100 * GB), available=Memory(in_bytes=30 * GB))
            }
        }
    )
    # The floor is 20 GB here (10 % of 100 GB is less): exactly at it is room.
    assert has_room(state, "x", 10 * GB)
    assert not has_room(state, "x", 10 * GB + 1)
    big = state.model_copy(
        update={
            "node_disk": {
                "x": DiskUsage(
                    total=Memory(in_bytes=1000 * GB), available=Memory(in_bytes=130 * GB)
                )
            }
        }
    )
    # 10 % of 1000 GB is 100 GB, more than the 20 GB floor.
    assert has_room(big, "x", 30 * GB)
    assert not has_room(big, "x", 30 * GB + 1)
    assert STAGING_DISK_FLOOR_BYTES == 20 * GB


def test_a_plan_with_nothing_serving_is_empty() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = cluster.deploy(card("m"))
    plan = staging_plan(cluster.state, cluster.deployment(deployment_id), place_instance)
    assert plan.targets == () and plan.shortfall is None


# --- what each rule's edge must do (each pins a condition mutation testing showed open) -------


def test_a_node_already_holding_the_model_is_planned_even_with_a_full_disk() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    other = next(n for n in "ab" if n not in _serving_nodes(cluster))
    cluster.apply(disk(other, free_gb=1.0), progress(other, shard_of(cluster, "m"), "completed"))
    plan = staging_plan(cluster.state, cluster.deployment(deployment_id), place_instance)
    assert [t.node_id for t in plan.targets] == [other]
    assert plan.shortfall is None


def test_the_shortfall_names_placements_reason_and_the_size_exactly() -> None:
    cluster = cluster_of("a", "b", free_gb=30.0)
    deployment_id = serving(cluster, size_gb=17.3)
    cluster.step(T0 + 1)
    assert cluster.keeper.staging_note(deployment_id) == (
        "standby 0 of 1: no node apart has disk for 17.3 GB"
    )
    lone = cluster_of("a")
    alone = serving(lone)
    lone.step(T0 + 1)
    assert lone.keeper.staging_note(alone) == (
        "standby 0 of 1: no placement apart from the serving nodes: "
        "No cycles found with sufficient memory"
    )
    assert lone.keeper.staging_note("nope") is None


def test_a_held_or_busy_first_target_does_not_stop_the_next() -> None:
    for first_kind in ("completed", "busy"):
        cluster = cluster_of("a", "b", "c")
        deployment_id = serving(cluster)
        cluster.apply(DeploymentStandbyChanged(deployment_id=deployment_id, standby=2))
        plan = staging_plan(cluster.state, cluster.deployment(deployment_id), place_instance)
        first, second = (t.node_id for t in plan.targets)
        if first_kind == "completed":
            cluster.apply(progress(first, shard_of(cluster, "m"), "completed"))
        else:
            other_model = shard_of(cluster, "m").model_copy(update={"model_card": card("x")})
            cluster.apply(progress(first, other_model, "ongoing"))
        assert asks(cluster.step(T0 + 1)) == [(deployment_id, second)]


def test_a_deployment_being_deleted_does_not_stop_the_others_staging() -> None:
    cluster = cluster_of("a", "b", "c")
    first = serving(cluster, "m")
    second = serving(cluster, "n")
    pending = cluster.keeper.delete(first, cluster.state)  # not yet applied
    assert pending
    assert [dep for dep, _ in asks(cluster.step(T0 + 1))] == [second]


def test_a_failover_replans_even_when_the_cluster_looks_the_same() -> None:
    cluster = cluster_of("a", "b", "c")
    deployment_id = serving(cluster)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    cluster.apply(progress(staged, shard_of(cluster, "m"), "completed"))
    # The model moves to the staged node (any instance of it counts): the nodes serving it
    # changed while the cluster's signature did not.
    (instance,) = cluster.instances_of_model("m")
    moved = build_instance(card("m"), [staged], "moved")
    cluster.apply(InstanceCreated(instance=moved))
    cluster.delete_instance(instance.instance_id)
    cluster.make_ready("moved")
    later = asks(cluster.step(T0 + 1 + STAGING_INTERVAL))
    assert len(later) == 1
    ((dep, node),) = later
    assert dep == deployment_id and node != staged


def test_a_replan_keeps_when_each_copy_was_asked_for() -> None:
    cluster = cluster_of("a", "b", "c", "d")
    deployment_id = serving(cluster)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    # The cluster changes (a node leaves that is not the staged one): the plan is computed again
    # and still names the staged node, which was asked for moments ago.
    leaving = next(n for n in "abcd" if n not in (staged, *_serving_nodes(cluster)))
    cluster.apply(NodeTimedOut(node_id=leaving))
    assert asks(cluster.step(T0 + 1 + STAGING_INTERVAL)) == []
    assert asks(cluster.step(T0 + 1 + STAGE_RETRY)) == [(deployment_id, staged)]


def test_a_deployment_past_the_plan_cap_with_a_plan_still_asks() -> None:
    nodes = [f"n{i}" for i in range(MAX_STAGING_PLANS_PER_STEP + 3)]
    cluster = cluster_of(*nodes)
    late = cluster.deploy(card("zz"), deployment_id="z-last")
    cluster.step(T0)
    for instance in cluster.instances_of_model("zz"):
        cluster.make_ready(instance.instance_id)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    # New deployments that sort before it (and keep no standby, so they ask for nothing) take
    # this step's plans; its retry comes due.
    for i in range(MAX_STAGING_PLANS_PER_STEP + 1):
        cluster.deploy(card(f"m{i}"), deployment_id=f"a-{i}")
        cluster.apply(DeploymentStandbyChanged(deployment_id=f"a-{i}", standby=0))
        cluster.step(T0 + 2 + i)
        for instance in cluster.instances_of_model(f"m{i}"):
            cluster.make_ready(instance.instance_id)
    events = cluster.step(T0 + 1 + STAGE_RETRY)
    assert (late, staged) in asks(events)


def test_deletion_by_a_new_keeper_removes_the_recorded_copies() -> None:
    cluster = cluster_of("a", "b")
    deployment_id = serving(cluster)
    ((_, staged),) = asks(cluster.step(T0 + 1))
    cluster.keeper = Keeper(0.0)  # a new master: it asked for nothing itself
    events = cluster.delete(deployment_id)
    deletions = [e for e in events if isinstance(e, DownloadDeletionRequested)]
    assert [(e.deployment_id, e.node_id, e.model_id) for e in deletions] == [
        (deployment_id, staged, "m")
    ]


def test_a_deployment_created_again_under_the_same_id_starts_staging_afresh() -> None:
    cluster = cluster_of("a", "b", "c")
    kept = serving(cluster, "k")
    counting = RecordingPlace(place_instance)
    cluster.keeper = Keeper(0.0, preview=counting)
    gone = cluster.deploy(card("m"), deployment_id="again")
    cluster.step(T0)
    for instance in cluster.instances_of_model("m"):
        cluster.make_ready(instance.instance_id)
    first = asks(cluster.step(T0 + 1))
    assert {dep for dep, _ in first} >= {gone}
    plans_of_kept = counting.models_tried().count("k")
    cluster.delete(gone)
    cluster.step(T0 + 2)  # the keeper forgets the departed deployment
    cluster.deploy(card("m"), deployment_id="again")
    cluster.step(T0 + 3)
    for instance in cluster.instances_of_model("m"):
        cluster.make_ready(instance.instance_id)
    again = asks(cluster.step(T0 + 1 + STAGING_INTERVAL))
    assert gone in {dep for dep, _ in again}  # not held back by the old request's retry
    assert counting.models_tried().count("k") == plans_of_kept  # the kept plan was kept
    assert kept in cluster.state.deployments


def test_a_copy_asked_moments_ago_does_not_hold_back_the_next_sets() -> None:
    cluster = cluster_of("a", "b", "c", "d")
    deployment_id = serving(cluster)
    ((_, first),) = asks(cluster.step(T0 + 1))
    cluster.apply(DeploymentStandbyChanged(deployment_id=deployment_id, standby=2))
    later = asks(cluster.step(T0 + 1 + STAGING_INTERVAL))  # first was asked 5 s ago
    assert len(later) == 1
    ((dep, second),) = later
    assert dep == deployment_id and second not in (first, *_serving_nodes(cluster))
