"""Fast failover on the dashboard (docs/design.md §5.18): nodes suspect and dead, from the
service's verdicts or (against a stock exo) the dashboard's own by the same rule; deployments
at risk; the timeline's lines, each told once."""

from __future__ import annotations

import pytest

from exo_deploy_tui.model.cluster import ClusterModel, DeploymentRow
from exo_deploy_tui.model.failover import failover_facts
from exo_deploy_tui.model.liveness import NodeLiveness, judge
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate
from exo_deploy_tui.model.verdicts import OwnVerdicts
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from exo_deploy_tui.view.cells import (
    failover_next,
    failover_words,
    liveness_text,
    next_text,
    status_style,
    status_text,
    summary_text,
)
from keeper.core.failover import failover_picture
from keeper.model.api_models import FailoverView
from keeper.model.events import (
    IndexedEvent,
    NodeConfirmedDead,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
)
from keeper.model.liveness import SILENT_AFTER_S, LivenessConfig
from keeper.model.state import NodeWatch, RunnerLoading, RunnerReady, State

LLAMA = "mlx-community/Llama-3.2-1B-Instruct-4bit"
STUDIO, MINI, MBP = node_id_for("studio"), node_id_for("mini-a"), node_id_for("mbp")
IN_STEP = MasterClock()


def three_nodes(now: float = FROZEN_NOW) -> ClusterBuilder:
    return ClusterBuilder(now=now).node("studio").node("mini-a").node("mbp")


def serving_on_studio() -> ClusterBuilder:
    return three_nodes().deployment(LLAMA, on=["studio"], by_keeper=True)


def row_of(model: ClusterModel, now: float = FROZEN_NOW) -> DeploymentRow:
    (row,) = model.deployment_rows(now)
    return row


# -- a node's liveness ----------------------------------------------------------------------


def test_a_verdict_wins_over_the_coarse_rule() -> None:
    suspect = NodeWatch(phase="suspect", last_heard=0.0, since=3.0)
    dead = NodeWatch(phase="dead", last_heard=0.0, since=8.0, why="x")
    assert judge(1.0, suspect) == "suspect"  # a closed connection: suspect before 8 s
    assert judge(SILENT_AFTER_S + 5, suspect) == "suspect"  # not merely silent
    assert judge(1.0, dead) == "dead"
    assert judge(SILENT_AFTER_S, None) == "silent"
    assert judge(1.0, None) == "alive"


def test_a_suspect_node_is_quiet_since_the_report_the_service_last_saw() -> None:
    state = three_nodes().suspect("studio", heard_ago_s=4.0).state
    heard = NodeLiveness().heard(state, IN_STEP, FROZEN_NOW)
    assert (heard[STUDIO].liveness, heard[STUDIO].quiet_for_s) == ("suspect", 4.0)
    assert heard[MINI].liveness == "alive"
    # The master's clock 10 s behind ours: the verdict is dated on its clock, and the silence
    # is the same 4 s once the offset is taken into account.
    ahead = MasterClock(offset_s=10.0)
    shifted = three_nodes().suspect("studio", heard_ago_s=4.0 - 10.0).state
    assert NodeLiveness().heard(shifted, ahead, FROZEN_NOW)[STUDIO].quiet_for_s == 4.0


def test_the_nodes_tab_and_header_say_suspect_then_dead() -> None:
    model = ClusterModel()
    model.handle(three_nodes().suspect("studio", heard_ago_s=4.0).snapshot(), FROZEN_NOW)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW)}
    assert liveness_text(rows["studio"]) == ("◌ suspect 4s", "bold yellow")
    assert liveness_text(rows["mbp"]) == ("● alive", "green")
    summary = model.summary(FROZEN_NOW)
    assert (summary.nodes_alive, summary.nodes_suspect, summary.nodes_dead) == (2, 1, 0)
    assert summary.nodes_silent == 0
    assert summary_text(summary, wide=True).plain.startswith("2 nodes ◌1 suspect ·")
    dead = three_nodes().suspect("studio", heard_ago_s=9.0, phase="dead", since_ago_s=1.0)
    model.handle(dead.snapshot(), FROZEN_NOW + 1)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW + 1)}
    assert liveness_text(rows["studio"]) == ("✖ dead", "bold red")
    summary = model.summary(FROZEN_NOW + 1)
    assert (summary.nodes_alive, summary.nodes_suspect, summary.nodes_dead) == (2, 0, 1)
    assert " ✖1 dead" in summary_text(summary, wide=False).plain


def test_the_timeline_tells_suspect_dead_and_heard_again_each_once() -> None:
    liveness = NodeLiveness()
    state = three_nodes().state
    assert liveness.check(state, IN_STEP, FROZEN_NOW) == []
    suspect = three_nodes().suspect("studio", heard_ago_s=3.0).state
    told = liveness.check(suspect, IN_STEP, FROZEN_NOW)
    assert [(e.level, e.text, e.node_id) for e in told] == [
        ("warn", "node studio is suspect (nothing heard for 3 s)", STUDIO)
    ]
    assert liveness.check(suspect, IN_STEP, FROZEN_NOW + 1) == []  # told already
    why = "silent for 8.0 s while the other nodes were heard"
    dead = three_nodes().suspect("studio", 8.0, phase="dead", since_ago_s=0.0, why=why).state
    told = liveness.check(dead, IN_STEP, FROZEN_NOW + 5)
    assert [(e.level, e.text) for e in told] == [("error", f"node studio confirmed dead: {why}")]
    assert liveness.check(dead, IN_STEP, FROZEN_NOW + 6) == []
    assert liveness.last_heard(STUDIO, dead, IN_STEP) == FROZEN_NOW - 8.0
    back = three_nodes(now=FROZEN_NOW + 7.5).state
    told = liveness.check(back, IN_STEP, FROZEN_NOW + 7.5)
    assert [(e.level, e.text) for e in told] == [
        ("good", "node studio heard again (dead for 2.5 s)")
    ]
    assert liveness.check(back, IN_STEP, FROZEN_NOW + 8) == []
    assert liveness.last_heard(STUDIO, back, IN_STEP) is None


def test_a_dead_node_that_times_out_is_gone_dated_by_its_last_report() -> None:
    liveness = NodeLiveness()
    dead = three_nodes().suspect("studio", 9.0, phase="dead").state
    liveness.check(dead, IN_STEP, FROZEN_NOW)
    liveness.note(NodeTimedOut(node_id=STUDIO), dead, FROZEN_NOW + 1, IN_STEP)
    gone = liveness.gone(ClusterBuilder().node("mini-a").node("mbp").state)
    assert gone[STUDIO].last_seen == FROZEN_NOW - 9.0


# -- a deployment at risk -------------------------------------------------------------------


def test_a_deployment_on_a_suspect_node_is_at_risk_and_confirming() -> None:
    model = ClusterModel()
    builder = serving_on_studio().suspect("studio", heard_ago_s=5.0, since_ago_s=2.0)
    model.handle(builder.snapshot(), FROZEN_NOW)
    row = row_of(model)
    assert row.status == "serving"  # underneath: its instance may yet answer
    assert status_text(row) == "⚠ at risk"
    assert status_style(row) == "bold yellow"
    assert next_text(row) == "confirming 2s"
    assert failover_words(row) == (
        "studio suspect 2s: placing a replacement (nothing is deleted until it is confirmed dead)"
    )


def test_a_replacement_loading_then_ready() -> None:
    loading = RunnerLoading(layers_loaded=4, total_layers=16)
    builder = serving_on_studio().suspect("studio", 5.0, since_ago_s=2.0)
    builder.replacement(LLAMA, on=["mini-a"], runners=[loading])
    model = ClusterModel()
    model.handle(builder.snapshot(), FROZEN_NOW)
    row = row_of(model)
    assert status_text(row) == "⚠ at risk"
    assert next_text(row) == "replacing on mini-a"
    ready = serving_on_studio().suspect("studio", 5.0, since_ago_s=2.0)
    ready.replacement(LLAMA, on=["mini-a"], runners=[RunnerReady()])
    model.handle(ready.snapshot(), FROZEN_NOW + 1)
    row = row_of(model, FROZEN_NOW + 1)
    assert (status_text(row), next_text(row)) == ("⚠ at risk", "confirming 3s")
    assert failover_words(row) == "studio suspect 3s · replacement on mini-a ready"


def test_a_replacement_that_does_not_fit_says_why() -> None:
    builder = serving_on_studio().suspect("studio", 5.0)
    model = ClusterModel()
    snapshot = builder.snapshot()
    why = "cannot place a replacement for instance inst-x on suspect node studio: no room"
    failover = FailoverView(phase="suspect", nodes=["studio"], since=iso(FROZEN_NOW), why=why)
    views = tuple(v.model_copy(update={"failover": failover}) for v in snapshot.deployments or ())
    model.handle(SnapshotUpdate(snapshot.state, views), FROZEN_NOW)
    row = row_of(model)
    assert next_text(row) == "can't replace"
    assert failover_words(row).endswith(why)


def test_a_dead_node_s_instance_is_not_ready() -> None:
    builder = serving_on_studio().suspect("studio", 9.0, phase="dead", since_ago_s=1.0)
    model = ClusterModel()
    model.handle(builder.snapshot(), FROZEN_NOW)
    row = row_of(model)
    assert (row.status, row.ready_replicas) == ("starting", 0)
    assert status_text(row) == "◐ starting"  # the status underneath: no longer at risk
    assert row.failover is not None and row.failover.phase == "confirmed"
    assert failover_next(row) is None
    (instance,) = model.instance_rows(FROZEN_NOW)
    assert not instance.ready
    # Its replacement loading elsewhere: NEXT says where.
    builder.replacement(LLAMA, on=["mini-a"], runners=[RunnerLoading(layers_loaded=1)])
    model.handle(builder.snapshot(), FROZEN_NOW + 1)
    assert next_text(row_of(model, FROZEN_NOW + 1)) == "replacing on mini-a"


def test_an_outage_caused_by_a_dead_node_starts_at_its_last_report() -> None:
    model = ClusterModel()
    model.handle(serving_on_studio().snapshot(), FROZEN_NOW)
    dead = serving_on_studio().suspect("studio", 8.0, phase="dead", since_ago_s=0.0)
    model.handle(dead.snapshot(), FROZEN_NOW)
    assert [e.text for e in model.timeline][-2:] == [
        "node studio confirmed dead",
        "Llama-3.2-1B-Instruct-4bit stopped serving",
    ]
    moved = three_nodes(now=FROZEN_NOW + 2).deployment(LLAMA, on=["mini-a"], by_keeper=True)
    model.handle(moved.snapshot(), FROZEN_NOW + 2)
    again = [e.text for e in model.timeline if "serving again" in e.text]
    assert len(again) == 1 and again[0].startswith(
        "Llama-3.2-1B-Instruct-4bit serving again after 10.0 s"
    ), again


@pytest.mark.parametrize(
    "builder",
    [
        serving_on_studio().suspect("studio"),
        serving_on_studio().suspect("studio").replacement(LLAMA, on=["mini-a"]),
        serving_on_studio().suspect("studio", 9.0, phase="dead"),
        serving_on_studio().suspect("mbp"),  # a verdict on a node it does not use
        serving_on_studio(),
    ],
)
def test_the_rows_failover_is_the_services_picture(builder: ClusterBuilder) -> None:
    """The row's rule, written again in the dashboard (it may import nothing above the data
    model), answers as the service's (``keeper.core.failover.failover_picture``)."""
    state = builder.state
    deployment = state.deployments["dep-llama-3.2-1b-instruct-4bit"]
    names = {n: i.friendly_name for n, i in state.node_identities.items()}
    ours = failover_facts(deployment, state, names, IN_STEP, FROZEN_NOW)
    theirs = failover_picture(deployment, state)
    if theirs is None:
        assert ours is None
        return
    assert ours is not None
    assert ours.phase == theirs.phase
    assert ours.nodes == tuple(names[n] for n in theirs.nodes)


def test_the_event_stream_moves_the_row_as_the_verdicts_arrive() -> None:
    model = ClusterModel()
    model.handle(serving_on_studio().snapshot(), FROZEN_NOW)
    idx = model.state.last_event_applied_idx

    def event(n: int, e: NodeSuspected | NodeConfirmedDead | NodeHeardAgain) -> EventUpdate:
        return EventUpdate(IndexedEvent(idx=idx + n, event=e))

    model.handle(
        event(1, NodeSuspected(node_id=STUDIO, last_heard=FROZEN_NOW - 3, at=FROZEN_NOW)),
        FROZEN_NOW,
    )
    assert status_text(row_of(model)) == "⚠ at risk"
    model.handle(event(2, NodeHeardAgain(node_id=STUDIO, at=FROZEN_NOW + 1)), FROZEN_NOW + 1)
    row = row_of(model, FROZEN_NOW + 1)
    assert (status_text(row), row.failover) == ("● serving", None)
    texts = [e.text for e in model.timeline]
    assert texts.count("node studio is suspect (nothing heard for 3 s)") == 1
    assert texts.count("node studio heard again (suspect for 1.0 s)") == 1


# -- against a stock exo: the dashboard's own verdicts ---------------------------------------


def stock(studio_ago_s: float, others_ago_s: float = 0.5, now: float = FROZEN_NOW) -> State:
    builder = ClusterBuilder(now=now).node("studio", seen_ago_s=studio_ago_s)
    builder.node("mini-a", seen_ago_s=others_ago_s).node("mbp", seen_ago_s=others_ago_s)
    return builder.instance(LLAMA, on=["studio"]).state


def watch_after(verdicts: OwnVerdicts, steps: list[tuple[float, State]]) -> State:
    """Each State as polled at its time, judged with the verdicts carried as the model does."""
    held = State()
    for at, polled in steps:
        held = verdicts.judged(OwnVerdicts.carried(held, polled), IN_STEP, at)
    return held


def test_a_stock_exo_node_is_suspect_then_dead_by_lastseen_alone() -> None:
    verdicts = OwnVerdicts()
    last = FROZEN_NOW  # studio's last report
    steps = [(last + t, stock(studio_ago_s=t, now=last + t)) for t in (0.0, 1.0, 2.0)]
    assert watch_after(verdicts, steps).node_watch == {}
    at3 = watch_after(verdicts, [(last + 3.0, stock(3.0, now=last + 3.0))])
    assert {n: w.phase for n, w in at3.node_watch.items()} == {STUDIO: "suspect"}
    assert at3.node_watch[STUDIO].last_heard == last
    held = at3
    for t in (4.0, 5.0, 6.0, 7.0):
        held = verdicts.judged(OwnVerdicts.carried(held, stock(t, now=last + t)), IN_STEP, last + t)
        assert held.node_watch[STUDIO].phase == "suspect"
    held = verdicts.judged(OwnVerdicts.carried(held, stock(8.0, now=last + 8)), IN_STEP, last + 8)
    watch = held.node_watch[STUDIO]
    assert watch.phase == "dead"
    assert watch.why == "silent for 8.0 s while the other nodes were heard"
    # Heard again: the verdict is cleared.
    back = verdicts.judged(OwnVerdicts.carried(held, stock(0.2, now=last + 9)), IN_STEP, last + 9)
    assert back.node_watch == {}


def test_a_stock_exo_whose_every_node_stops_is_a_stale_view_not_a_failover() -> None:
    verdicts = OwnVerdicts()
    steps = [(FROZEN_NOW + t, stock(t, others_ago_s=t, now=FROZEN_NOW + t)) for t in range(12)]
    assert watch_after(verdicts, steps).node_watch == {}


def test_a_stock_exo_without_readable_lastseen_gets_no_verdicts() -> None:
    state = stock(20.0)
    unreadable = state.model_copy(update={"last_seen": {**state.last_seen, MBP: "yesterday"}})
    verdicts = OwnVerdicts()
    assert verdicts.judged(unreadable, IN_STEP, FROZEN_NOW).node_watch == {}
    judged = verdicts.judged(stock(4.0), IN_STEP, FROZEN_NOW)
    assert STUDIO in judged.node_watch
    # One that had verdicts and then cannot be read: they go (fast failover off for it).
    carried = OwnVerdicts.carried(judged, unreadable)
    assert verdicts.judged(carried, IN_STEP, FROZEN_NOW + 1).node_watch == {}


def test_a_lost_master_makes_nobody_suspect() -> None:
    verdicts = OwnVerdicts()
    lost = MasterClock(stale_since=FROZEN_NOW)
    held = stock(1.0)
    for t in range(1, 20):
        held = verdicts.judged(held, lost, FROZEN_NOW + t)
    assert held.node_watch == {}


def test_off_judges_nobody() -> None:
    verdicts = OwnVerdicts(LivenessConfig(suspect_after_s=0.0, dead_after_s=0.0))
    assert verdicts.judged(stock(20.0), IN_STEP, FROZEN_NOW).node_watch == {}


def test_the_model_judges_a_stock_exo_itself_and_only_a_stock_exo() -> None:
    model = ClusterModel()
    model.handle(SnapshotUpdate(stock(0.5), None), FROZEN_NOW)
    assert model.judges_own
    for t in (1, 2, 3):  # polls and the 1 s timer: the dashboard keeps watching
        model.handle(SnapshotUpdate(stock(t + 0.5, now=FROZEN_NOW + t), None), FROZEN_NOW + t)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW + 3)}
    assert rows["studio"].liveness == "suspect"
    for t in (4, 5, 6, 7, 8):
        model.handle(SnapshotUpdate(stock(t + 0.5, now=FROZEN_NOW + t), None), FROZEN_NOW + t)
        model.tick(FROZEN_NOW + t + 0.5)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW + 8)}
    assert rows["studio"].liveness == "dead"
    (instance,) = model.instance_rows(FROZEN_NOW + 8)
    assert not instance.ready
    texts = [e.text for e in model.timeline]
    assert sum("studio is suspect" in t for t in texts) == 1
    assert sum("studio confirmed dead" in t for t in texts) == 1
    # Against our master (deployments answered), the service's verdicts alone count.
    ours = ClusterModel()
    ours.handle(SnapshotUpdate(stock(0.5), ()), FROZEN_NOW)
    ours.handle(SnapshotUpdate(stock(7.5, now=FROZEN_NOW + 7), ()), FROZEN_NOW + 7)
    ours.tick(FROZEN_NOW + 7)
    assert not ours.judges_own
    assert {r.name: r.liveness for r in ours.node_rows(FROZEN_NOW + 7)}["studio"] == "alive"


def test_a_stock_exo_s_verdicts_survive_the_next_poll_and_a_lost_connection() -> None:
    model = ClusterModel()
    model.handle(SnapshotUpdate(stock(0.5), None), FROZEN_NOW)
    for t in (1, 2, 3, 4):
        model.handle(SnapshotUpdate(stock(t, now=FROZEN_NOW + t), None), FROZEN_NOW + t)
    assert model.state.node_watch[STUDIO].phase == "suspect"
    model.handle(ConnectionUpdate("down", "refused", 1.0), FROZEN_NOW + 4.5)
    for t in range(5, 31):  # silence is not counted past the loss: never dead
        model.tick(FROZEN_NOW + t)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW + 30)}
    assert rows["studio"].liveness == "suspect"
    assert model.state.node_watch[STUDIO].phase == "suspect"
