"""The rows derived from a State (``model.derive``, ``model.node_rows``), with
the memories they read handed in as plain values, and the small parts they read: the moves
under way (``moves``), the keeper's timers (``timers``) and each instance's last progress
(``health.InstanceProgress``)."""

from __future__ import annotations

from collections.abc import Callable

from model_ids import LLAMA, QWEN

from exo_deploy_tui.model.derive import deployment_rows, derive, instance_rows, load_progress
from exo_deploy_tui.model.gpu_readings import GpuReadings
from exo_deploy_tui.model.health import InstanceMarks
from exo_deploy_tui.model.liveness import NodeLiveness
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.moves import Moves
from exo_deploy_tui.model.node_rows import node_rows, summary
from exo_deploy_tui.model.rows import DeploymentRow
from exo_deploy_tui.model.timers import Timer, keeper_timers
from exo_deploy_tui.model.tracking import Tracked
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from keeper.model.events import NodeTimedOut
from keeper.model.instance_health import STALL_CEILING_S
from keeper.model.state import (
    DeploymentId,
    InstanceId,
    NodeId,
    RunnerFailed,
    RunnerIdle,
    RunnerLoading,
    RunnerReady,
    State,
)

T = FROZEN_NOW
QWEN_ID = "dep-qwen3-0.6b-4bit"
LLAMA_ID = "dep-llama-3.2-1b-instruct-4bit"


def nothing(_: str) -> None:
    return None


def cluster() -> ClusterBuilder:
    """studio and mini; Qwen serving on mini, Llama loading on studio and mini."""
    return (
        ClusterBuilder()
        .node("studio")
        .node("mini", seen_ago_s=20.0)
        .link_all()
        .deployment(QWEN, on=["mini"])
        .deployment(
            LLAMA,
            on=["studio", "mini"],
            runners=[RunnerLoading(layers_loaded=4, total_layers=8), RunnerIdle()],
        )
    )


def rows_of(
    state: State,
    *,
    tracked: Callable[[DeploymentId], Tracked | None] = nothing,
    timer: Callable[[DeploymentId], Timer | None] = nothing,
    availability: Callable[[DeploymentId], float | None] = nothing,
) -> dict[str, DeploymentRow]:
    rows = deployment_rows(
        state,
        derive(state, {}),
        T,
        tracked=tracked,
        timer=timer,
        availability=availability,
        moves=Moves(),
    )
    return {r.model_id: r for r in rows}


def test_derive_reads_statuses_ready_instances_and_names_once() -> None:
    state = cluster().state
    gone = node_id_for("mbp")
    derived = derive(state, {gone: "mbp", node_id_for("mini"): "old name"})
    assert derived.statuses == {QWEN_ID: "serving", LLAMA_ID: "starting"}
    assert derived.ready_nodes == {QWEN: (node_id_for("mini"),)}
    assert derived.ready_count == {QWEN: 1}
    assert {m: len(i) for m, i in derived.instances_of.items()} == {QWEN: 1, LLAMA: 1}
    assert derived.name_of(node_id_for("mini")) == "mini"  # the State's name wins
    assert derived.name_of(gone) == "mbp"
    assert derived.name_of("12345678-aaaa-bbbb") == "12345678"


def test_a_deployment_row_puts_the_state_and_the_memories_together() -> None:
    state = cluster().state
    tracked = {
        QWEN_ID: Tracked("serving", T - 60, True),
        LLAMA_ID: Tracked("starting", T - 5, False),
    }
    timers = {LLAMA_ID: Timer(2, T + 30, "backoff"), QWEN_ID: Timer(1, T + 9, None)}
    rows = rows_of(
        state,
        tracked=tracked.get,
        timer=timers.get,
        availability={QWEN_ID: 0.5}.get,
    )
    qwen, llama = rows[QWEN], rows[LLAMA]
    assert qwen.status == "serving" and qwen.nodes == ("mini",)
    assert (qwen.in_status_s, qwen.in_status_known) == (60.0, True)
    assert qwen.availability == 0.5
    # Serving: no countdown, whatever the keeper's timer says; the failures stay.
    assert (qwen.next_attempt_in_s, qwen.waiting, qwen.failures) == (None, None, 1)
    assert (llama.in_status_s, llama.in_status_known) == (5.0, False)
    assert (llama.next_attempt_in_s, llama.waiting, llama.failures) == (30.0, "backoff", 2)
    assert llama.replica_nodes == (("studio", "mini"),)
    # Four of the studio's half of the layers, none of the mini's: a quarter.
    assert llama.load_progress == 0.25
    assert llama.availability is None and llama.ready_replicas == 0


def test_a_countdown_past_due_reads_zero() -> None:
    timers = {LLAMA_ID: Timer(3, T - 4, "backoff")}
    assert rows_of(cluster().state, timer=timers.get)[LLAMA].next_attempt_in_s == 0.0


def test_load_progress_counts_loaded_runners_whole_and_nothing_without_layers() -> None:
    state = (
        ClusterBuilder()
        .node("a")
        .node("b")
        .deployment(
            QWEN,
            on=["a", "b"],
            runners=[RunnerReady(), RunnerLoading(layers_loaded=99, total_layers=99)],
        )
        .state
    )
    (instance,) = state.instances.values()
    assert load_progress(instance, state) == 1.0  # loading capped at its shard's layers
    assert load_progress(None, state) is None


def test_instance_rows_say_why_one_looks_unhealthy() -> None:
    state = (
        ClusterBuilder()
        .node("studio")
        .node("mini")
        .deployment(QWEN, on=["mini"], runners=[RunnerFailed(error_message="Metal OOM")])
        .deployment(LLAMA, on=["studio"], runners=[RunnerLoading(layers_loaded=1, total_layers=8)])
        .state
    )
    quiet: dict[NodeId, float] = {node_id_for("studio"): 1.0, node_id_for("mini"): 1.0}
    broken: dict[InstanceId, str] = {"inst-llama-3.2-1b-instruct-4bit": "the data model's words"}
    rows = instance_rows(
        state, derive(state, {}), quiet_for=quiet.get, broken=lambda i: broken.get(i.instance_id)
    )
    assert [(r.model_id, r.unhealthy) for r in rows] == [
        (LLAMA, "the data model's words"),
        (QWEN, "runner failed on mini: Metal OOM"),
    ]
    (runner,) = rows[0].runners
    assert (runner.node_name, runner.status, runner.progress) == ("studio", "Loading", 0.125)
    assert rows[0].deployment_id == LLAMA_ID


def test_node_rows_list_the_present_then_the_gone_then_the_away() -> None:
    before = cluster().cordon("mbp").state
    liveness = NodeLiveness()
    liveness.note(NodeTimedOut(node_id=node_id_for("studio")), before, T - 12, MasterClock())
    after = before.model_copy(
        update={"topology": before.topology.model_copy(update={"nodes": [node_id_for("mini")]})}
    )
    after = after.model_copy(
        update={
            "node_identities": {
                n: i for n, i in after.node_identities.items() if n != node_id_for("studio")
            }
        }
    )
    readings = GpuReadings()
    derived = derive(after, liveness.remembered_names())
    rows = node_rows(
        after, derived, T, liveness=liveness, clock=MasterClock(), readings=readings, moves=Moves()
    )
    assert [(r.name, r.liveness, r.quiet_for_s) for r in rows] == [
        ("mini", "silent", 20.0),
        ("studio", "gone", 12.0),
        ("mbp", "away", None),
    ]
    assert rows[0].runners == ("Qwen3-0.6B-4bit Ready", "Llama-3.2-1B-Instruct-4bit Idle")
    assert rows[2].cordoned
    counts = summary(
        after, derived, T, liveness=liveness, clock=MasterClock(), deployments_api=True
    )
    assert (counts.nodes_alive, counts.nodes_silent, counts.nodes_gone, counts.nodes_away) == (
        0,
        1,
        1,
        1,
    )
    assert counts.by_status == {"serving": 1, "starting": 1}
    assert (counts.deployments, counts.instances) == (2, 2)


# -- moves, timers, progress ----------------------------------------------------------------


def test_a_drain_reads_get_nodes_only_while_it_answers_for_it() -> None:
    builder = cluster().instance(QWEN, on=["studio"], suffix="-b").drain("mini", (QWEN, "-b"))
    state = builder.state
    moves = Moves()
    assert moves.moving(state) == {QWEN_ID: "mini"}
    assert moves.moving(cluster().state) == {}
    alone = moves.drain_of(state, "mini")
    assert alone is not None and (alone.moving, alone.to_move) == (1, None)
    moves.answered(builder.nodes_answer(stuck={"mini": "no room"}).nodes)
    answered = moves.drain_of(state, "mini")
    # Neither instance is the keeper's: nothing to move, both left alone.
    assert answered is not None
    assert (answered.to_move, answered.left_alone, answered.stuck) == (0, 2, "no room")
    moves.answered(None)
    unread = moves.drain_of(state, "mini")
    assert unread is not None and unread.stuck is None
    assert moves.drain_of(state, "studio") is None


def test_the_keepers_timers_prefer_its_seconds_over_its_dates() -> None:
    builder = (
        ClusterBuilder()
        .node("mini")
        .deployment(QWEN, failures=2, next_attempt_in_s=12.0, waiting="backoff")
        .deployment(LLAMA, failures=1)
    )
    views = list(builder.snapshot().deployments or ())
    llama = next(v for v in views if v.deployment.deployment_id == LLAMA_ID)
    views = [
        v if v is not llama else v.model_copy(update={"next_attempt_at": iso(T + 40)})
        for v in views
    ]
    timers: dict[DeploymentId, Timer] = keeper_timers(views, T, MasterClock(offset_s=10.0))
    assert timers[QWEN_ID] == Timer(2, T + 12.0, "backoff")
    assert timers[LLAMA_ID] == Timer(1, T + 30.0, None)  # its date, on our clock


def test_the_marks_date_an_instance_when_it_moves_and_judge_it_as_the_data_model_does() -> None:
    def loading_at(layers: int) -> State:
        runners = [RunnerLoading(layers_loaded=layers, total_layers=8)]
        return ClusterBuilder().node("mini").deployment(QWEN, on=["mini"], runners=runners).state

    loading = loading_at(1)
    (instance,) = loading.instances.values()
    marks = InstanceMarks()
    marks.note(loading, T)
    marks.note(loading, T + 5)  # nothing moved
    assert marks.why(instance, loading, T + STALL_CEILING_S - 1) is None
    stalled = marks.why(instance, loading, T + STALL_CEILING_S)
    assert stalled is not None and stalled.startswith("runner on mini silent in RunnerLoading")
    more = loading_at(2)
    marks.note(more, T + 9)  # a layer more: dated again
    assert marks.why(instance, more, T + STALL_CEILING_S) is None
    assert marks.why(instance, more, T + 9 + STALL_CEILING_S) is not None
    ready = ClusterBuilder().node("mini").deployment(QWEN, on=["mini"]).state
    marks.note(ready, T + 10)
    assert marks.why(instance, ready, T + 10 + 3600) is None  # ready: nothing to say
