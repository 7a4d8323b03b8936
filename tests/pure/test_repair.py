"""Repair as a kind of move (docs/design.md §5.19), through the keeper's step: a broken instance
gets a replacement on other nodes and is deleted only once the replacement is ready (or at once
when its node reports the runner gone); never more than replicas + 1; a hand-placed instance is
only reported unless the operator asks; `repair: report` only says; a node suspect is the
failover's; a drain under way is not doubled; the backoff's words and bounds."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import AFTER_GRACE, Cluster, build_instance, card, node_info, simple_place

from keeper.core.moves import MOVE_SETTLE, Candidate
from keeper.core.repair import (
    AVOID_AFTER,
    AVOID_FOR_S,
    INCIDENT_WINDOW_S,
    RepairMoves,
    Repairs,
    avoiding,
    problem_words,
)
from keeper.model.apply import apply
from keeper.model.constants import PLACEMENT_TIMEOUT
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentRepairChanged,
    DeploymentRepairPlaced,
    DrainReplacementPlaced,
    FailoverReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    InstanceFoundBroken,
    NodeSuspected,
    RepairIncidentsExpired,
    RunnerStatusUpdated,
)
from keeper.model.instance_health import (
    FAILING_CHATS,
    GONE_GRACE_S,
    NO_MARKS,
    WARM_UP_BOUND_S,
    Problem,
    Verdict,
)
from keeper.model.state import (
    AnyRunnerStatus,
    Deployment,
    InstanceMove,
    RepairIncident,
    RunnerReady,
    RunnerShutdown,
    RunnerShuttingDown,
    RunnerWarmingUp,
    State,
)

T = AFTER_GRACE


def serving_on_a(*, replicas: int = 1) -> tuple[Cluster, str, str]:
    """``m`` (1 GB) placed by the keeper on node-a (the freest), nodes b, c, d free."""
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-b", "node-c", "node-d")
    cluster.add_node("node-a", available_gb=32.0)
    for other in ("node-b", "node-c", "node-d"):
        cluster.link("node-a", other)
    deployment_id = cluster.deploy("m", replicas=replicas)
    cluster.step(T)
    old = cluster.instance_of(deployment_id).instance_id
    cluster.step(T + 0.5)  # the placement arrives
    return cluster, deployment_id, old


def set_status(cluster: Cluster, instance_id: str, status: AnyRunnerStatus) -> None:
    for runner_id in cluster.state.instances[instance_id].shard_assignments.node_to_runner.values():
        cluster.apply(RunnerStatusUpdated(runner_id=runner_id, runner_status=status))


def of_type(events: list[AnyEvent], kind: type) -> list[AnyEvent]:
    return [e for e in events if isinstance(e, kind)]


def stalled_on_a(*, replicas: int = 1) -> tuple[Cluster, str, str, float]:
    """The instance on node-a warms up at T+1 and stays so: stalled at the warm-up's bound."""
    cluster, deployment_id, old = serving_on_a(replicas=replicas)
    set_status(cluster, old, RunnerWarmingUp())
    cluster.step(T + 1)
    return cluster, deployment_id, old, T + 1 + WARM_UP_BOUND_S


def test_a_stalled_start_is_replaced_before_it_is_deleted() -> None:
    cluster, deployment_id, old, stalled_at = stalled_on_a()
    assert cluster.step(stalled_at - 1) == []
    assert dict(cluster.keeper.health(cluster.state)) == {}
    events = cluster.step(stalled_at)
    created = of_type(events, InstanceCreated)
    assert [type(e) for e in events] == [
        DeploymentRepairPlaced,
        InstanceCreated,
        DeploymentPlaced,
        InstanceFoundBroken,  # the backoff's record, last
    ]
    record = events[0]
    assert isinstance(record, DeploymentRepairPlaced) and record.problem == "stalled"
    assert record.why.startswith("runner on node-a silent in RunnerWarmingUp for 2m00s")
    new = created[0].instance.instance_id  # pyright: ignore[reportAttributeAccessIssue]
    assert cluster.nodes_of(new) != ["node-a"]
    assert cluster.deployment(deployment_id).repairing is not None
    health = cluster.keeper.health(cluster.state)[deployment_id]
    assert (health.instance_id, health.problem) == (old, "stalled")
    # Not deleted while the replacement is not ready, however long.
    for t in (stalled_at + 1, stalled_at + 120):
        assert of_type(cluster.step(t), InstanceDeleted) == []
    cluster.make_ready(new)
    cluster.step(stalled_at + 200)
    assert cluster.step(stalled_at + 200 + MOVE_SETTLE - 0.1) == []
    assert cluster.step(stalled_at + 200 + MOVE_SETTLE) == [InstanceDeleted(instance_id=old)]
    assert set(cluster.state.instances) == {new}
    assert cluster.deployment(deployment_id).repairing is None
    assert dict(cluster.keeper.health(cluster.state)) == {}


def test_every_state_along_a_repairs_batch_owns_its_extra_instance() -> None:
    # A master's log is replayed (and a stream followed) event by event, not batch by batch:
    # the replacement appearing before its move was recorded was, for one event, a second
    # instance of a replicas-1 model that no move owned (the soak's duplicate check).
    cluster, deployment_id, _, stalled_at = stalled_on_a()
    before = cluster.state
    events = cluster.step(stalled_at)
    assert of_type(events, DeploymentRepairPlaced)
    model_id = before.deployments[deployment_id].model_card.model_id
    state = before
    seen: list[tuple[int, int]] = []  # per event: the model's instances, and those a move owns
    for event in events:
        state = apply(state, event)
        count = sum(i.shard_assignments.model_id == model_id for i in state.instances.values())
        owned = 1 if state.deployments[deployment_id].repairing is not None else 0
        assert count <= 1 + owned, type(event).__name__
        seen.append((count, owned))
    assert seen[-1] == (2, 1)


def test_a_hollow_instance_whose_node_reports_it_gone_goes_at_once() -> None:
    cluster, deployment_id, old = serving_on_a()
    cluster.make_ready(old)
    cluster.step(T + 1)
    set_status(cluster, old, RunnerShutdown())
    cluster.step(T + 2)
    assert cluster.step(T + 2 + GONE_GRACE_S - 0.1) == []
    events = cluster.step(T + 2 + GONE_GRACE_S)
    record = of_type(events, DeploymentRepairPlaced)
    assert len(record) == 1 and record[0].problem == "hollow"  # pyright: ignore[reportAttributeAccessIssue]
    new = cluster.deployment(deployment_id).repairing.new_instance_id  # pyright: ignore[reportOptionalMemberAccess]
    assert cluster.step(T + 8) == [InstanceDeleted(instance_id=old)]  # the replacement not ready
    assert set(cluster.state.instances) == {new}


def test_report_mode_only_says() -> None:
    cluster, deployment_id, old, stalled_at = stalled_on_a()
    cluster.apply(DeploymentRepairChanged(deployment_id=deployment_id, repair="report"))
    assert [type(e) for e in cluster.step(stalled_at)] == [InstanceFoundBroken]  # said only
    assert cluster.keeper.health(cluster.state)[deployment_id].instance_id == old
    cluster.apply(DeploymentRepairChanged(deployment_id=deployment_id, repair="auto"))
    assert len(of_type(cluster.step(stalled_at + 1), DeploymentRepairPlaced)) == 1


def test_a_hand_placed_instance_is_reported_and_replaced_only_when_asked() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    by_hand = build_instance(card("m"), ["node-a"], "by-hand")
    cluster.apply(InstanceCreated(instance=by_hand))
    deployment_id = cluster.deploy("m")
    set_status(cluster, "by-hand", RunnerWarmingUp())
    cluster.step(T)
    stalled_at = T + WARM_UP_BOUND_S
    # Said (an incident, which expires), never replaced.
    assert [type(e) for e in cluster.step(stalled_at)] == [InstanceFoundBroken]
    assert [type(e) for e in cluster.step(stalled_at + 3600)] == [RepairIncidentsExpired]
    assert cluster.keeper.health(cluster.state)[deployment_id].instance_id == "by-hand"
    assert cluster.keeper.repair("nope", cluster.state) == "no instance nope"
    assert cluster.keeper.repair("by-hand", cluster.state) is None
    events = cluster.step(stalled_at + 3601)
    assert len(of_type(events, DeploymentRepairPlaced)) == 1
    new = of_type(events, InstanceCreated)[0].instance.instance_id  # pyright: ignore[reportAttributeAccessIssue]
    cluster.make_ready(new)
    cluster.step(stalled_at + 3602)
    assert cluster.step(stalled_at + 3602 + MOVE_SETTLE) == [InstanceDeleted(instance_id="by-hand")]


def test_the_operator_may_not_ask_for_a_model_no_deployment_keeps() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a")
    cluster.apply(InstanceCreated(instance=build_instance(card("x"), ["node-a"], "x1")))
    assert (
        cluster.keeper.repair("x1", cluster.state)
        == "instance x1 is of x, which no deployment keeps"
    )


def test_a_healthy_instance_the_operator_asks_about_is_replaced() -> None:
    cluster, _deployment_id, old = serving_on_a()
    cluster.make_ready(old)
    cluster.step(T + 1)
    assert cluster.keeper.repair(old, cluster.state) is None
    record = of_type(cluster.step(T + 2), DeploymentRepairPlaced)
    assert [(r.problem, r.why) for r in record] == [("asked", "the operator asked")]  # pyright: ignore[reportAttributeAccessIssue]


def test_a_stalled_start_on_a_suspect_node_is_the_failovers() -> None:
    cluster, _deployment_id, _old, stalled_at = stalled_on_a()
    cluster.apply(NodeSuspected(node_id="node-a", last_heard=T, at=T + 2))
    events = cluster.step(stalled_at)
    # Not repaired: the failover replaces it, once, as the instance of a suspect node.
    assert of_type(events, DeploymentRepairPlaced) == []
    assert len(of_type(events, FailoverReplacementPlaced)) == 1
    assert dict(cluster.keeper.health(cluster.state)) == {}


def test_a_drain_under_way_is_not_doubled() -> None:
    cluster, _deployment_id, _old, stalled_at = stalled_on_a()
    cluster.step(stalled_at - 10)
    cluster.drain("node-a")
    events = cluster.step(stalled_at - 5)
    assert len(of_type(events, DrainReplacementPlaced)) == 1
    for t in (stalled_at, stalled_at + 60):
        assert of_type(cluster.step(t), InstanceCreated) == []
    assert len(cluster.instances_of_model("m")) == 2


def test_a_replacement_broken_itself_is_deleted_and_the_old_one_kept() -> None:
    cluster, _deployment_id, old, stalled_at = stalled_on_a()
    events = cluster.step(stalled_at)
    new = of_type(events, InstanceCreated)[0].instance.instance_id  # pyright: ignore[reportAttributeAccessIssue]
    cluster.make_ready(new)
    cluster.step(stalled_at + 1)
    set_status(cluster, new, RunnerShutdown())
    cluster.step(stalled_at + 2)
    deleted = of_type(cluster.step(stalled_at + 2 + GONE_GRACE_S), InstanceDeleted)
    assert deleted == [InstanceDeleted(instance_id=new)]
    assert old in cluster.state.instances


def test_the_unfulfilled_placement_is_said() -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    deployment_id = cluster.deploy("m")
    events = cluster.step_keep(T)  # accepted, never applied: it never appears
    lost = of_type(events, InstanceCreated)[0].instance.instance_id  # pyright: ignore[reportAttributeAccessIssue]
    cluster.step(T + PLACEMENT_TIMEOUT - 1)
    assert dict(cluster.keeper.health(cluster.state)) == {}
    cluster.step(T + PLACEMENT_TIMEOUT)
    said = cluster.keeper.health(cluster.state)[deployment_id]
    assert (said.instance_id, said.problem, said.since) == (lost, "unfulfilled", T)
    assert said.why == (
        f"placement of instance {lost} accepted but never appeared in 30s; placing again"
    )
    cluster.step(T + PLACEMENT_TIMEOUT + 1)  # placed again, and this one appears
    cluster.step(T + PLACEMENT_TIMEOUT + 2)
    assert dict(cluster.keeper.health(cluster.state)) == {}


# --- the backoff ------------------------------------------------------------------------------


def incidents_on(node: str, *at: float, problem: str = "stalled") -> list[RepairIncident]:
    return [
        RepairIncident(model_id="m", node_id=node, instance_id=f"i{t}", problem=problem, at=t)
        for t in at
    ]


def broken_on(node: str, *at: float, problem: str = "stalled") -> list[InstanceFoundBroken]:
    """What the keeper says of an instance of ``m`` found broken on ``node`` at each ``at``."""
    return [
        InstanceFoundBroken(
            instance_id=f"{node}-{t}", model_id="m", node_ids=(node,), problem=problem, at=t
        )
        for t in at
    ]


def test_three_incidents_avoid_the_node_for_ten_minutes_in_words() -> None:
    cluster, _, _ = serving_on_a()
    state = cluster.state
    three = incidents_on("node-a", 0.0, 10.0, 20.0)
    assert avoiding(three, state, "m", 20.0) == {
        "avoiding node-a for m for 10 min: 3 stalled starts": frozenset({"node-a"})
    }
    assert avoiding(three, state, "other", 20.0) == {}
    assert avoiding(three, state, "m", 20.0 + AVOID_FOR_S - 0.1) != {}
    assert avoiding(three, state, "m", 20.0 + AVOID_FOR_S) == {}  # never for ever
    assert avoiding(incidents_on("node-a", 10.0, 20.0), state, "m", 20.0) == {}
    old = incidents_on("node-a", 0.0, 10.0, INCIDENT_WINDOW_S + 0.1)
    assert avoiding(old, state, "m", INCIDENT_WINDOW_S + 0.1) == {}  # the first aged out
    at_edge = incidents_on("node-a", 0.0, 10.0, INCIDENT_WINDOW_S)
    assert avoiding(at_edge, state, "m", INCIDENT_WINDOW_S) != {}  # the first still counts
    # The time left is counted from the last of them, whatever their order.
    unordered = incidents_on("node-a", 600.0, 0.0, 300.0)
    assert list(avoiding(unordered, state, "m", 600.0 + 270)) == [
        "avoiding node-a for m for 6 min: 3 stalled starts"  # 5.5 min left, said whole
    ]
    # The problem said is the most frequent one.
    mixed = [*incidents_on("node-a", 0.0), *incidents_on("node-a", 1.0, 2.0, problem="hollow")]
    assert list(avoiding(mixed, state, "m", 2.0)) == [
        "avoiding node-a for m for 10 min: 3 hollow instances"
    ]
    assert AVOID_AFTER == 3


def test_problem_words_count() -> None:
    assert problem_words("stalled", 1) == "1 stalled start"
    assert problem_words("hollow", 3) == "3 hollow instances"
    assert problem_words("failing", 2) == "2 instances failing chats"
    assert problem_words("unfulfilled", 1) == "1 placement never fulfilled"
    assert problem_words("odd", 2) == "2 odd"


def test_a_replacement_avoids_the_nodes_the_model_broke_on_and_says_so_when_nothing_else_fits() -> (
    None
):
    cluster, deployment_id, old, stalled_at = stalled_on_a()
    cluster.apply(
        *broken_on("node-b", stalled_at - 3, stalled_at - 2, stalled_at - 1),
        *broken_on("node-c", stalled_at - 3, stalled_at - 2, stalled_at - 1),
        *broken_on("node-d", stalled_at - 3, stalled_at - 2, stalled_at - 1, problem="hollow"),
    )
    events = cluster.step(stalled_at)
    assert of_type(events, InstanceCreated) == []  # b, c, d avoided; a is the broken one's
    notes = cluster.keeper._moves.notes("repair", deployment_id)  # pyright: ignore[reportPrivateUsage]
    assert len(notes) == 1 and notes[0].startswith(f"cannot replace broken instance {old} (")
    assert "avoiding node-b for m for 10 min: 3 stalled starts" in notes[0]
    assert "avoiding node-d for m for 10 min: 3 hollow instances" in notes[0]
    # node-a's one incident (this instance) is not yet a pattern.
    assert cluster.keeper.avoiding(cluster.state, "m", stalled_at) == [
        "avoiding node-b for m for 10 min: 3 stalled starts",
        "avoiding node-c for m for 10 min: 3 stalled starts",
        "avoiding node-d for m for 10 min: 3 hollow instances",
    ]
    assert old in cluster.state.instances  # kept: the model has nowhere else to go


def test_a_new_keeper_reads_the_backoff_from_the_state_and_says_the_same() -> None:
    cluster, _, _, stalled_at = stalled_on_a()
    cluster.apply(*broken_on("node-b", stalled_at - 3, stalled_at - 2, stalled_at - 1))
    before = cluster.keeper.avoiding(cluster.state, "m", stalled_at)
    assert before == ["avoiding node-b for m for 10 min: 3 stalled starts"]
    cluster.restart_keeper(stalled_at)  # a new master, or a bridge taking over
    assert cluster.keeper.avoiding(cluster.state, "m", stalled_at) == before
    # On another clock: the same moment in Unix time is the same words.
    cluster.keeper.wall_offset = 1000.0
    assert cluster.keeper.avoiding(cluster.state, "m", stalled_at - 1000.0) == before
    assert cluster.keeper.avoiding(cluster.state, "m", stalled_at - 1000.0 + AVOID_FOR_S) == []


def test_a_newly_broken_instance_is_an_incident_on_its_nodes_once() -> None:
    cluster, deployment_id, old, stalled_at = stalled_on_a()
    cluster.apply(DeploymentRepairChanged(deployment_id=deployment_id, repair="report"))
    said: list[AnyEvent] = []
    for t in (stalled_at, stalled_at + 1, stalled_at + 2):
        said += of_type(cluster.step(t), InstanceFoundBroken)
    assert said == [
        InstanceFoundBroken(
            instance_id=old, model_id="m", node_ids=("node-a",), problem="stalled", at=stalled_at
        )
    ]
    incident = RepairIncident(
        model_id="m", node_id="node-a", instance_id=old, problem="stalled", at=stalled_at
    )
    assert cluster.state.repair_incidents == (incident,)
    # A new keeper (a restarted master) finds the same instance broken again: not a second one.
    cluster.restart_keeper(stalled_at + 3)
    for t in (stalled_at + 3, stalled_at + 3 + WARM_UP_BOUND_S + 1):
        assert of_type(cluster.step(t), InstanceFoundBroken) == []
    assert cluster.state.repair_incidents == (incident,)
    # Past the window it leaves the State, said once.
    cluster.step(stalled_at + INCIDENT_WINDOW_S)
    assert cluster.state.repair_incidents == (incident,)
    expired = of_type(cluster.step(stalled_at + INCIDENT_WINDOW_S + 1), RepairIncidentsExpired)
    assert expired == [RepairIncidentsExpired(before=stalled_at + 1)]
    assert cluster.state.repair_incidents == ()
    assert of_type(cluster.step(stalled_at + INCIDENT_WINDOW_S + 2), RepairIncidentsExpired) == []


def test_an_instance_broken_with_no_deployment_of_its_model_is_no_incident() -> None:
    cluster, deployment_id, _, stalled_at = stalled_on_a()
    cluster.apply(DeploymentRepairChanged(deployment_id=deployment_id, repair="report"))
    cluster.step(stalled_at - 1)
    deployment = cluster.state.deployments[deployment_id]
    other = deployment.model_copy(update={"model_card": card("other")})
    elsewhere = cluster.state.model_copy(update={"deployments": {deployment_id: other}})
    assert of_type(cluster.keeper.step(elsewhere, stalled_at), InstanceFoundBroken) == []


def test_the_kind_is_quiet_with_nothing_broken() -> None:
    cluster, _, old = serving_on_a()
    cluster.make_ready(old)
    cluster.step(T + 1)
    assert cluster.keeper._repairs.kind(cluster.state, T + 1) is None  # pyright: ignore[reportPrivateUsage]
    kind = RepairMoves({})
    assert list(kind.candidates(cluster.state)) == [] and list(kind.under_way(cluster.state)) == []


# --- never more than replicas + 1, never a hand-placed one unasked ------------------------------


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 2),
    st.lists(
        st.tuples(st.sampled_from(["step", "stall", "shutdown", "ready"]), st.floats(0.5, 400.0)),
        max_size=25,
    ),
)
def test_repairs_never_exceed_replicas_plus_one_nor_touch_a_hand_placed_instance(
    replicas: int, script: list[tuple[str, float]]
) -> None:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b", "node-c", "node-d")
    by_hand = build_instance(card("m"), ["node-d"], "by-hand")
    cluster.apply(InstanceCreated(instance=by_hand))
    set_status(cluster, "by-hand", RunnerWarmingUp())  # stalled, for ever
    cluster.deploy("m", replicas=replicas + 1)
    now = T
    for action, dt in script:
        now += dt
        instances = sorted(i for i in cluster.state.instances if i != "by-hand")
        if action != "step" and instances:
            target = instances[int(dt) % len(instances)]
            status = {
                "stall": RunnerWarmingUp(),
                "shutdown": RunnerShutdown(),
                "ready": RunnerReady(),
            }[action]
            set_status(cluster, target, status)
        events = cluster.step(now)
        assert InstanceDeleted(instance_id="by-hand") not in events
        # The deployment keeps replicas + 1 (the hand-placed one among them): one more at most.
        assert len(cluster.instances_of_model("m")) <= replicas + 1 + 1
    assert "by-hand" in cluster.state.instances


# --- failing chats --------------------------------------------------------------------------


def test_an_instance_whose_last_chats_all_failed_is_replaced() -> None:
    cluster, deployment_id, old = serving_on_a()
    cluster.make_ready(old)
    cluster.step(T + 1)
    for k in range(4):
        cluster.keeper.note_chat(old, "timeout", T + 2 + k)
    assert cluster.step(T + 10) == []  # four: not yet
    cluster.keeper.note_chat(old, "ended before its end", T + 11)
    events = cluster.step(T + 12)
    record = of_type(events, DeploymentRepairPlaced)
    assert [r.problem for r in record] == ["failing"]  # pyright: ignore[reportAttributeAccessIssue]
    said = cluster.keeper.health(cluster.state)[deployment_id]
    assert said.since == T + 2  # the first of the last five
    assert said.why == (
        f"last 5 chats to instance {old} all failed (ended before its end: 1, timeout: 4) "
        "while its runners read Ready"
    )
    assert of_type(events, InstanceDeleted) == []  # replaced before deleted


def test_one_answered_chat_among_the_last_five_is_not_failing() -> None:
    cluster, _, old = serving_on_a()
    cluster.make_ready(old)
    for k, outcome in enumerate(["timeout", "timeout", None, "timeout", "timeout"]):
        cluster.keeper.note_chat(old, outcome, T + 1 + k)
    assert cluster.step(T + 10) == []
    cluster.keeper.note_chat("gone-instance", "timeout", T + 11)
    cluster.step(T + 12)
    assert "gone-instance" not in cluster.keeper._repairs.chats  # pyright: ignore[reportPrivateUsage]


# --- the kind and the memory, piece by piece ---------------------------------------------------


def verdict_of(instance_id: str, problem: Problem = "hollow") -> Verdict:
    return Verdict(instance_id, problem, f"{instance_id} is broken", 0.0)


def keeping(*placed: tuple[str, str, str]) -> State:
    """Deployments (id, model) each with one instance it placed (id), on its own node, ready."""
    state = State()
    for n, (deployment_id, model, instance_id) in enumerate(placed):
        node = f"node-{n}"
        state = apply(state, node_info(node))
        deployment = Deployment(deployment_id=deployment_id, model_card=card(model))
        instance = build_instance(card(model), [node], instance_id)
        state = apply(state, DeploymentCreated(deployment=deployment))
        state = apply(state, InstanceCreated(instance=instance))
        state = apply(state, DeploymentPlaced(deployment_id=deployment_id, instance_id=instance_id))
    return state


def test_the_candidates_are_one_per_deployment_of_its_own_model_past_one_under_way() -> None:
    state = keeping(("d1", "m1", "i1-m1"), ("d2", "m2", "i3-m2"), ("d3", "m3", "i2-m3"))
    move = InstanceMove(deployment_id="d1", old_instance_id="i1-m1", new_instance_id="x")
    state = apply(state, DeploymentRepairPlaced(deployment_id="d1", move=move))
    found = {i: verdict_of(i) for i in ("i1-m1", "i2-m3", "i3-m2")}
    assert list(RepairMoves(found).candidates(state)) == [
        Candidate("d2", "i3-m2", scope="d2"),
        Candidate("d3", "i2-m3", scope="d3"),
    ]


def test_the_kinds_words_and_the_nodes_it_avoids() -> None:
    state = keeping(("d1", "m1", "i1"))
    kind = RepairMoves({})
    candidate = Candidate("d1", "i1", scope="d1")
    assert (
        kind.words(state, candidate, [], "no room") == "cannot replace broken instance i1: no room"
    )
    assert kind.words(state, candidate, ["x", "y"], "no room") == (
        "cannot replace broken instance i1 (x; y): no room"
    )
    assert kind.avoids(state, candidate) == {"the broken instance's": frozenset({"node-0"})}
    backoff = RepairMoves({}, avoided={"m1": {"w": frozenset({"node-9"})}})
    assert backoff.avoids(state, candidate) == {
        "the broken instance's": frozenset({"node-0"}),
        "w": frozenset({"node-9"}),
    }


def shut_down(state: State, *instance_ids: str) -> State:
    for instance_id in instance_ids:
        for runner_id in state.instances[instance_id].shard_assignments.node_to_runner.values():
            status = RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerShuttingDown())
            state = apply(state, status)
    return state


def test_observe_says_each_new_incident_once_past_those_it_must_not_say() -> None:
    state = keeping(("d", "m", "a"), ("e", "other", "b"), ("f", "m3", "c"), ("g", "m4", "d"))
    state = apply(state, DeploymentDeleted(deployment_id="e"))  # b: no deployment keeps it
    known = RepairIncident(model_id="m3", node_id="node-2", instance_id="c", problem="x", at=1.0)
    state = shut_down(state, "a", "b", "c", "d").model_copy(update={"repair_incidents": (known,)})
    repairs = Repairs()
    repairs.observe(state, 0.0, 1000.0)
    repairs.found = {"a": verdict_of("a")}  # a was found at the step before
    found = repairs.observe(state, GONE_GRACE_S, 1000.0 + GONE_GRACE_S)
    assert list(found) == ["a", "b", "c", "d"]
    assert repairs.incidents == [
        InstanceFoundBroken(
            instance_id="d",
            model_id="m4",
            node_ids=("node-3",),
            problem="hollow",
            at=1000.0 + GONE_GRACE_S,
        )
    ]


def test_observe_reads_the_chats_of_every_instance_the_state_does_not_find_broken() -> None:
    state = shut_down(keeping(("d", "m", "a"), ("e", "m2", "b")), "a")
    for runner_id in state.instances["b"].shard_assignments.node_to_runner.values():
        state = apply(state, RunnerStatusUpdated(runner_id=runner_id, runner_status=RunnerReady()))
    repairs = Repairs()
    for t in range(FAILING_CHATS):
        repairs.note_chat("a", "timeout", float(t))
        repairs.note_chat("b", "timeout", float(t))
    repairs.observe(state, 0.0, 0.0)
    found = repairs.observe(state, GONE_GRACE_S, GONE_GRACE_S)
    assert (found["a"].problem, found["b"].problem) == ("hollow", "failing")


def test_observe_forgets_asks_for_instances_gone_and_only_those() -> None:
    state = keeping(("d", "m", "a"), ("e", "m2", "b"))
    repairs = Repairs()
    repairs.asked = {"a", "gone"}
    repairs.observe(state, 0.0, 0.0)
    assert repairs.asked == {"a"}


def test_an_incident_expires_only_past_the_window() -> None:
    known = RepairIncident(model_id="m", node_id="n", instance_id="i", problem="x", at=100.0)
    state = State(repair_incidents=(known,))
    repairs = Repairs()
    assert repairs.recorded(state, 100.0 + INCIDENT_WINDOW_S) == []
    assert repairs.recorded(state, 100.5 + INCIDENT_WINDOW_S) == [
        RepairIncidentsExpired(before=100.5)
    ]


def test_a_repair_under_way_is_a_kind_with_nothing_found_or_asked() -> None:
    state = keeping(("d", "m", "a"))
    assert Repairs().kind(state, 0.0) is None
    move = InstanceMove(deployment_id="d", old_instance_id="a", new_instance_id="x")
    under_way = apply(state, DeploymentRepairPlaced(deployment_id="d", move=move))
    kind = Repairs().kind(under_way, 0.0)
    assert kind is not None and list(kind.under_way(under_way)) == [move]


def test_health_says_the_first_broken_instance_each_deployment_keeps() -> None:
    state = keeping(("d", "m", "b"), ("e", "other", "c-other"))
    state = apply(state, DeploymentDeleted(deployment_id="e"))
    repairs = Repairs()
    repairs.found = {i: verdict_of(i) for i in ("a-gone", "b", "c-other")}
    assert repairs.health(state) == {"d": verdict_of("b")}


def test_the_backoffs_records_are_stamped_on_the_hosts_wall_clock() -> None:
    """``wall_offset`` turns the step's clock into the host's Unix time for the records a new
    master or bridge reads (its own clock may differ)."""
    cluster, _, old, stalled_at = stalled_on_a()
    cluster.keeper.wall_offset = 1000.0
    found = of_type(cluster.step(stalled_at), InstanceFoundBroken)
    assert [(e.instance_id, e.at) for e in found] == [(old, stalled_at + 1000.0)]  # type: ignore[attr-defined]


def test_repair_kind_says_what_the_step_would_repair_judged_now_on_the_wall_clock() -> None:
    cluster, _, old, stalled_at = stalled_on_a()
    assert cluster.keeper.repair_kind(cluster.state, stalled_at - 1) is None
    cluster.keeper.wall_offset = 1000.0
    kind = cluster.keeper.repair_kind(cluster.state, stalled_at)
    assert kind is not None and set(kind.found) == {old}
    assert kind.found[old].problem == "stalled"
    # Judged as the step judges: the incident it noted is recorded at that wall-clock moment.
    found = of_type(cluster.step(stalled_at + 0.5), InstanceFoundBroken)
    assert [e.at for e in found] == [stalled_at + 1000.0]  # type: ignore[attr-defined]


def test_with_every_deployment_gone_the_repairs_memory_starts_over() -> None:
    """The instances' marks, with no chat noted, and the chats noted are forgotten with the
    last deployment, so the keeper's memory stays bounded by what it keeps."""
    cluster, deployment_id, old = serving_on_a()
    cluster.make_ready(old)
    cluster.step(T + 1)  # the instance's marks are noted
    repairs = cluster.keeper._repairs  # pyright: ignore[reportPrivateUsage]
    assert repairs.marks is not NO_MARKS and not repairs.chats
    cluster.delete(deployment_id)
    cluster.step(T + 2)
    assert cluster.keeper._repairs.marks is NO_MARKS  # pyright: ignore[reportPrivateUsage]
    # With a chat noted.
    cluster, deployment_id, old = serving_on_a()
    cluster.keeper.note_chat(old, "timeout", T + 1)
    cluster.delete(deployment_id)
    cluster.step(T + 2)
    assert not cluster.keeper._repairs.chats  # pyright: ignore[reportPrivateUsage]
