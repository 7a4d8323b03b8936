"""Fast failover in the keeper (``keeper.core.failover``, a kind of move; docs/design.md
§5.18): an instance on a suspect node gets a replacement off every node with a verdict, before
anything is deleted, never more than replicas + 1; dead: the old instance goes; heard again:
the surplus goes (the replacement, unless only it is ready); one that cannot be placed leaves
the suspect instance alone and says why; the record is durable, so a new keeper carries on."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import AFTER_GRACE, Cluster, build_instance, card, simple_place, unplaceable

from keeper.core.failover import (
    failover_picture,
    instances_on_dead_nodes,
    trusted_targets,
)
from keeper.core.keeper import Keeper
from keeper.model.events import (
    AnyEvent,
    FailoverReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeHeardAgain,
    NodeSuspected,
)
from keeper.model.readiness import chat_targets
from keeper.model.state import InstanceMove

T = AFTER_GRACE


def kinds(events: list[AnyEvent]) -> list[str]:
    return [type(event).__name__ for event in events]


def serving(replicas: int = 1, nodes: int = 3) -> tuple[Cluster, str, list[str]]:
    """``m`` deployed with ``replicas`` on ``nodes`` nodes, node-a the freest (the first
    instance is there), every instance ready."""
    cluster = Cluster(place=simple_place)
    names = [f"node-{c}" for c in "abcdefg"[:nodes]]
    cluster.add_nodes(*names[1:])
    cluster.add_node("node-a", available_gb=32.0)
    deployment_id = cluster.deploy("m", replicas=replicas)
    for k in range(replicas):
        cluster.step(T + k)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    return cluster, deployment_id, sorted(cluster.state.instances)


def suspect(cluster: Cluster, node_id: str, at: float = 1000.0) -> None:
    cluster.apply(NodeSuspected(node_id=node_id, last_heard=at - 3, at=at))


def on(cluster: Cluster, instance_id: str) -> list[str]:
    return cluster.nodes_of(instance_id)


def test_a_suspect_nodes_instance_gets_a_replacement_elsewhere_and_nothing_is_deleted() -> None:
    cluster, deployment_id, (old,) = serving()
    suspect(cluster, "node-a")
    events = cluster.step(T + 10)
    assert kinds(events) == ["FailoverReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]
    created = events[1]
    assert isinstance(created, InstanceCreated)
    new = created.instance.instance_id
    assert on(cluster, new) != ["node-a"]
    assert events[0] == FailoverReplacementPlaced(
        deployment_id=deployment_id,
        move=InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id=new),
        at=1000.0,
    )
    deployment = cluster.deployment(deployment_id)
    assert deployment.failover is not None and deployment.failover_since == 1000.0
    # Ready, settled, long after: still nothing deleted while the node is only suspect.
    cluster.make_ready(new)
    for k in range(30):
        assert cluster.step(T + 11 + k) == []
    assert set(cluster.state.instances) == {old, new}
    picture = failover_picture(deployment, cluster.state)
    assert picture is not None and picture.phase == "replacing" and picture.nodes == ("node-a",)


def test_a_move_whose_old_instance_is_gone_does_not_hold_back_a_failover() -> None:
    # The bridge records exo's deletion of an instance only once its absence lasts (and counts
    # again after a move to another URL): an operator's repair finished, its old instance gone
    # from exo's State, its record still there. Found on a real cluster: the serving node froze
    # and the replacement waited 2 s for that record.
    cluster, deployment_id, (old,) = serving()
    assert cluster.keeper.repair(old, cluster.state) is None
    new = next(e for e in cluster.step(T + 1) if isinstance(e, InstanceCreated)).instance
    cluster.make_ready(new.instance_id)
    cluster.step(T + 2)
    deleted = cluster.step_keep(T + 30)  # settled: the old one's deletion, sent to exo
    assert deleted == [InstanceDeleted(instance_id=old)]
    trailing = cluster.state.model_copy(
        update={"instances": {new.instance_id: cluster.state.instances[new.instance_id]}}
    )
    cluster.state = trailing  # exo dropped it; the move's record not ended yet
    assert cluster.deployment(deployment_id).repairing is not None
    suspect(cluster, cluster.nodes_of(new.instance_id)[0])
    events = cluster.step(T + 31)
    assert kinds(events) == ["FailoverReplacementPlaced", "InstanceCreated", "DeploymentPlaced"]


def test_dead_deletes_the_old_instance_and_ends_the_failover() -> None:
    cluster, deployment_id, (old,) = serving()
    suspect(cluster, "node-a")
    cluster.step(T + 10)
    new = cluster.deployment(deployment_id).failover.new_instance_id  # type: ignore[union-attr]
    cluster.apply(NodeConfirmedDead(node_id="node-a", last_heard=997.0, at=1005.0, why="x"))
    assert instances_on_dead_nodes(cluster.state) == {old: ["node-a"]}
    picture = failover_picture(cluster.deployment(deployment_id), cluster.state)
    assert picture is not None and (picture.phase, picture.since) == ("confirmed", 1005.0)
    assert cluster.step(T + 11) == [InstanceDeleted(instance_id=old)]
    assert cluster.step(T + 12) == []  # sent once
    assert set(cluster.state.instances) == {new}
    assert cluster.deployment(deployment_id).failover is None
    assert failover_picture(cluster.deployment(deployment_id), cluster.state) is None


def test_heard_again_the_replacement_goes() -> None:
    cluster, deployment_id, (old,) = serving()
    suspect(cluster, "node-a")
    events = cluster.step(T + 10)
    new = events[1].instance.instance_id  # type: ignore[attr-defined]
    cluster.make_ready(new)
    cluster.apply(NodeHeardAgain(node_id="node-a", at=1004.0))
    assert cluster.step(T + 11) == [InstanceDeleted(instance_id=new)]
    assert set(cluster.state.instances) == {old}
    assert cluster.deployment(deployment_id).failover is None
    assert cluster.step(T + 12) == []  # nothing placed again: the model has its replicas


def test_heard_again_when_only_the_replacement_is_ready_the_old_goes() -> None:
    cluster, _deployment_id, (old,) = serving()
    suspect(cluster, "node-a")
    new = cluster.step(T + 10)[1].instance.instance_id  # type: ignore[attr-defined]
    cluster.make_ready(new)
    cluster.make_loading(old)  # its runner restarted meanwhile
    cluster.apply(NodeHeardAgain(node_id="node-a", at=1004.0))
    assert cluster.step(T + 11) == [InstanceDeleted(instance_id=old)]
    assert set(cluster.state.instances) == {new}


def test_heard_again_before_the_replacement_is_ready_the_replacement_goes() -> None:
    cluster, _, (old,) = serving()
    suspect(cluster, "node-a")
    new = cluster.step(T + 10)[1].instance.instance_id  # type: ignore[attr-defined]
    cluster.apply(NodeHeardAgain(node_id="node-a", at=1004.0))
    assert cluster.step(T + 11) == [InstanceDeleted(instance_id=new)]
    assert set(cluster.state.instances) == {old}


def test_a_replacement_that_does_not_fit_leaves_the_suspect_instance_and_says_so() -> None:
    cluster, deployment_id, (old,) = serving(nodes=1)
    suspect(cluster, "node-a")
    assert cluster.step(T + 10) == []
    assert set(cluster.state.instances) == {old}
    note = cluster.keeper.failover_note(deployment_id)
    assert note is not None
    assert note.startswith(f"cannot place a replacement for instance {old} on suspect node")
    assert "suspect or dead: node-a" in note and note.endswith("it is left running")
    picture = failover_picture(cluster.deployment(deployment_id), cluster.state)
    assert picture is not None and (picture.phase, picture.since) == ("suspect", 1000.0)
    assert cluster.keeper.failover_note("other") is None


def test_a_placement_refused_says_the_placements_reason() -> None:
    cluster, deployment_id, _ = serving()
    cluster.keeper = Keeper(0.0, place=unplaceable("nothing fits"))
    suspect(cluster, "node-a")
    cluster.step(T + 10)
    note = cluster.keeper.failover_note(deployment_id)
    assert note is not None and "nothing fits" in note


def test_replicas_plus_one_at_most_with_two_suspect_nodes() -> None:
    cluster, deployment_id, instances = serving(replicas=2, nodes=4)
    for instance_id in instances:
        suspect(cluster, on(cluster, instance_id)[0])
    first = cluster.step(T + 10)
    assert kinds(first).count("InstanceCreated") == 1
    for k in range(10):
        cluster.step(T + 11 + k)
        for instance_id in list(cluster.state.instances):
            cluster.make_ready(instance_id)
        assert len(cluster.instances_of_model("m")) <= 3
    assert cluster.deployment(deployment_id).failover is not None


def test_no_replacement_while_the_model_already_has_its_replicas_off_suspect_nodes() -> None:
    cluster, _, (_old,) = serving()
    spare = build_instance(card("m"), ["node-b"], "spare")  # placed by hand
    cluster.apply(InstanceCreated(instance=spare))
    cluster.make_ready("spare")
    suspect(cluster, "node-a")
    assert cluster.step(T + 10) == []


def test_a_new_keeper_carries_on_from_the_record() -> None:
    cluster, _deployment_id, (_old,) = serving()
    suspect(cluster, "node-a")
    new = cluster.step(T + 10)[1].instance.instance_id  # type: ignore[attr-defined]
    cluster.keeper = Keeper(0.0, place=simple_place)  # a restart: memory gone, State kept
    assert cluster.step(T + 11) == []  # no second replacement
    cluster.apply(NodeHeardAgain(node_id="node-a", at=1004.0))
    assert cluster.step(T + 12) == [InstanceDeleted(instance_id=new)]


def test_placement_for_recovery_leaves_out_suspect_nodes() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-b")
    cluster.add_node("node-a", available_gb=32.0)
    suspect(cluster, "node-a")
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    assert on(cluster, cluster.instance_of(deployment_id).instance_id) == ["node-b"]


def test_chats_leave_out_dead_nodes_and_suspect_ones_while_another_is_ready() -> None:
    cluster, _, instances = serving(replicas=2)
    a, b = sorted(instances, key=lambda i: on(cluster, i))

    def targets() -> list[tuple[str, str]]:
        # What the master's routing asks: the chat targets, then the trusted ones among them.
        ready = chat_targets(cluster.state, "m", set(cluster.state.topology.nodes))
        return trusted_targets(cluster.state, ready)

    both = [(a, on(cluster, a)[0]), (b, on(cluster, b)[0])]
    assert targets() == both
    suspect(cluster, on(cluster, a)[0])
    assert targets() == [both[1]]
    suspect(cluster, on(cluster, b)[0])
    assert targets() == both  # both suspect: still try
    cluster.apply(NodeConfirmedDead(node_id=on(cluster, a)[0], last_heard=1, at=9, why="x"))
    assert targets() == [both[1]]  # readiness leaves the dead node's instance out


def test_no_verdict_no_failover() -> None:
    cluster, deployment_id, _ = serving()
    assert failover_picture(cluster.deployment(deployment_id), cluster.state) is None
    assert instances_on_dead_nodes(cluster.state) == {}
    suspect(cluster, "node-b")  # a node the model does not use
    assert failover_picture(cluster.deployment(deployment_id), cluster.state) is None


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(
            st.sampled_from(["suspect", "dead", "heard", "ready", "step"]),
            st.sampled_from(["node-a", "node-b", "node-c", "node-d", "node-e"]),
        ),
        max_size=30,
    ),
)
def test_never_more_than_replicas_plus_one_and_never_a_deletion_for_a_suspicion(
    replicas: int, script: list[tuple[str, str]]
) -> None:
    cluster, _, _ = serving(replicas=replicas, nodes=5)
    now = T + 10
    for action, node_id in script:
        now += 1
        dead_before = {n for n, w in cluster.state.node_watch.items() if w.phase == "dead"}
        match action:
            case "suspect":
                suspect(cluster, node_id, at=now)
            case "dead":
                cluster.apply(NodeConfirmedDead(node_id=node_id, last_heard=1, at=now, why="x"))
            case "heard":
                cluster.apply(NodeHeardAgain(node_id=node_id, at=now))
            case "ready":
                for instance_id in list(cluster.state.instances):
                    cluster.make_ready(instance_id)
            case _:
                pass
        before = dict(cluster.state.instances)
        watch = dict(cluster.state.node_watch)
        events = cluster.step(now)
        assert len(cluster.instances_of_model("m")) <= replicas + 1
        for event in events:
            if isinstance(event, InstanceDeleted) and event.instance_id in before:
                nodes = set(before[event.instance_id].shard_assignments.node_to_runner)
                # A deletion is of an instance on a dead node, or a surplus after a node was
                # heard again: then the instance it was paired with stays, on nodes with no
                # verdict (the surplus may itself sit on a node suspected since: it goes, and
                # the model keeps its healthy copy).
                suspect_only = {n for n in nodes if n in watch and watch[n].phase == "suspect"}
                kept_healthy = any(
                    not set(instance.shard_assignments.node_to_runner) & set(watch)
                    for instance_id, instance in cluster.state.instances.items()
                    if instance_id in before and instance_id != event.instance_id
                )
                assert (
                    not suspect_only
                    or nodes & dead_before
                    or any(w.phase == "dead" for n, w in watch.items() if n in nodes)
                    or kept_healthy
                )


def test_apply_records_one_failover_and_ends_it_with_either_instance() -> None:
    cluster, deployment_id, (old,) = serving()
    move = InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id="n")
    recorded = FailoverReplacementPlaced(deployment_id=deployment_id, move=move, at=5.0)
    before = cluster.state
    cluster.apply(FailoverReplacementPlaced(deployment_id="nobody", move=move, at=5.0))
    assert cluster.state is before
    cluster.apply(recorded)
    assert cluster.deployment(deployment_id).failover == move
    other = InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id="o")
    kept = cluster.state
    cluster.apply(FailoverReplacementPlaced(deployment_id=deployment_id, move=other, at=6.0))
    assert cluster.state is kept  # one at a time
    cluster.apply(InstanceDeleted(instance_id="n"))  # the replacement lost
    deployment = cluster.deployment(deployment_id)
    assert (deployment.failover, deployment.failover_since) == (None, None)
    cluster.apply(recorded)
    cluster.apply(InstanceDeleted(instance_id=old))  # the old one gone (its node dead)
    assert cluster.deployment(deployment_id).failover is None


def test_no_failover_ever_stuck_has_no_note() -> None:
    cluster, deployment_id, _ = serving()
    cluster.step(T + 10)
    assert cluster.keeper.failover_note(deployment_id) is None
