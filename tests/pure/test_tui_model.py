"""The dashboard's pure model: rows, statuses, timers, liveness and the recovery timeline."""

from __future__ import annotations

from model_ids import LLAMA, QWEN

from exo_deploy_tui.model.cluster import (
    GONE_NODES_KEPT,
    SILENT_AFTER_S,
    ClusterModel,
    sort_rows,
)
from exo_deploy_tui.model.master_quiet import CATCH_UP_S, QUIET_AFTER_S
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    DeploymentsUpdate,
    EventUpdate,
    HeardUpdate,
    SnapshotUpdate,
)
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from keeper.model.api_models import DeploymentView
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DrainReplacementPlaced,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeTimedOut,
    NodeUncordoned,
    RunnerStatusUpdated,
)
from keeper.model.readiness import deployment_statuses
from keeper.model.state import InstanceMove, RunnerLoading, RunnerReady

DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
NO_FIT = "No cycles found with sufficient memory"


def healthy(now: float = FROZEN_NOW) -> ClusterBuilder:
    return (
        ClusterBuilder(now=now)
        .node("studio", ram_gb=96, free_gb=80)
        .node("mini-a")
        .node("mini-b")
        .link_all()
        .deployment(QWEN, on=["mini-a"])
        .deployment(LLAMA, on=["studio", "mini-b"])
        .deployment(
            DEEPSEEK,
            error=NO_FIT,
            next_attempt_in_s=30,
            waiting="unplaceable_retry",
        )
    )


def connected(builder: ClusterBuilder, now: float = FROZEN_NOW) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], now)
    return model


class Feed:
    """Feeds events to a model with consecutive indexes, as the master's stream does."""

    def __init__(self, model: ClusterModel) -> None:
        self.model = model
        self.idx = model.state.last_event_applied_idx

    def __call__(self, now: float, *events: AnyEvent) -> None:
        updates = []
        for event in events:
            self.idx += 1
            updates.append(EventUpdate(IndexedEvent(idx=self.idx, event=event)))
        self.model.handle(updates, now)


def row(model: ClusterModel, model_id: str, now: float = FROZEN_NOW):
    (found,) = [r for r in model.deployment_rows(now) if r.model_id == model_id]
    return found


def texts(model: ClusterModel) -> list[str]:
    return [e.text for e in model.timeline]


def test_a_healthy_snapshot_reads_as_rows() -> None:
    model = connected(healthy())
    llama = row(model, LLAMA)
    assert llama.status == "serving"
    assert llama.instance_id == "inst-llama-3.2-1b-instruct-4bit"
    assert llama.nodes == ("studio", "mini-b")
    assert not llama.in_status_known  # it was serving before we looked
    deepseek = row(model, DEEPSEEK)
    assert deepseek.status == "cant_place"
    assert deepseek.placement_error == NO_FIT
    assert deepseek.waiting == "unplaceable_retry"
    assert deepseek.next_attempt_in_s == 30
    assert texts(model) == ["connected: 3 nodes, 3 deployments"]
    assert model.connection.mode == "live" and not model.connection.stale


def test_status_follows_the_state_not_the_reported_word() -> None:
    builder = (
        ClusterBuilder()
        .node("a")
        .deployment(
            QWEN,
            on=["a"],
            runners=[RunnerLoading(layers_loaded=7, total_layers=28)],
        )
    )
    # The master's word disagrees with its State (it was computed a moment earlier).
    qwen_view = builder.views["dep-qwen3-0.6b-4bit"]
    builder.views["dep-qwen3-0.6b-4bit"] = qwen_view.model_copy(update={"status": "serving"})
    model = connected(builder)
    qwen = row(model, QWEN)
    assert qwen.status == "starting"
    assert qwen.load_progress == 0.25


def test_countdown_ticks_from_the_time_it_was_received() -> None:
    model = connected(healthy())
    assert row(model, DEEPSEEK, FROZEN_NOW + 3).next_attempt_in_s == 27
    assert row(model, DEEPSEEK, FROZEN_NOW + 45).next_attempt_in_s == 0
    # A serving deployment shows no countdown even if a stale timer is around.
    assert row(model, QWEN, FROZEN_NOW + 3).next_attempt_in_s is None


def test_countdown_from_next_attempt_at_alone_uses_the_master_clock() -> None:
    builder = healthy()
    model = connected(builder)
    view = DeploymentView(
        deployment=builder.state.deployments["dep-deepseek-v3.1-4bit"],
        status="cant_place",
        next_attempt_at=iso(FROZEN_NOW + 20),
        waiting="backoff",
        failures=2,
    )
    model.handle(DeploymentsUpdate((view,)), FROZEN_NOW)
    deepseek = row(model, DEEPSEEK, FROZEN_NOW + 5)
    assert deepseek.next_attempt_in_s == 15
    assert deepseek.failures == 2
    assert deepseek.waiting == "backoff"


def test_losing_and_regaining_an_instance_tells_the_story() -> None:
    builder = healthy()
    model = connected(builder)
    feed = Feed(model)
    instance = builder.state.instances["inst-qwen3-0.6b-4bit"]
    feed(FROZEN_NOW + 1, NodeTimedOut(node_id=node_id_for("mini-a")))
    feed(FROZEN_NOW + 2, InstanceDeleted(instance_id=instance.instance_id))
    assert row(model, QWEN, FROZEN_NOW + 2).status == "placing"
    feed(
        FROZEN_NOW + 10,
        DeploymentPlaced(deployment_id="dep-qwen3-0.6b-4bit", instance_id="inst-qwen3-0.6b-4bit"),
        InstanceCreated(instance=instance),
    )
    assert row(model, QWEN, FROZEN_NOW + 10).status == "starting"
    feed(
        FROZEN_NOW + 39.2,
        RunnerStatusUpdated(runner_id="run-qwen3-0.6b-4bit-0", runner_status=RunnerReady()),
    )
    qwen = row(model, QWEN, FROZEN_NOW + 40)
    assert qwen.status == "serving"
    assert qwen.in_status_known
    assert abs(qwen.in_status_s - 0.8) < 1e-6
    assert [t for t in texts(model)[1:] if "silent" not in t] == [
        "node mini-a timed out and left the cluster",
        "instance inst-qwe of Qwen3-0.6B-4bit deleted (was on mini-a)",
        "Qwen3-0.6B-4bit stopped serving",
        "Qwen3-0.6B-4bit placed: instance inst-qwe",
        "instance inst-qwe of Qwen3-0.6B-4bit created on mini-a",
        "runner ready: Qwen3-0.6B-4bit on mini-a (layers 0-27)",
        # Dated from when mini-a was last heard of (1 s before we looked), not from when the
        # master noticed it was gone; then where the time went: 3 s until the instance was
        # deleted, 8 s to place the new one, 29.2 s for its runner to load.
        "Qwen3-0.6B-4bit serving again after 40.2 s: detected 3.0 s, placed 8.0 s, loaded 29 s",
    ]
    assert [e.text for e in model.history("dep-qwen3-0.6b-4bit")][-1].endswith("loaded 29 s")


def test_an_instance_deleted_on_healthy_nodes_is_an_outage_from_the_deletion() -> None:
    builder = healthy()
    model = connected(builder)
    feed = Feed(model)
    instance = builder.state.instances["inst-qwen3-0.6b-4bit"]
    feed(FROZEN_NOW + 2, InstanceDeleted(instance_id=instance.instance_id))
    feed(FROZEN_NOW + 3, InstanceCreated(instance=instance))
    feed(
        FROZEN_NOW + 39.2,
        RunnerStatusUpdated(runner_id="run-qwen3-0.6b-4bit-0", runner_status=RunnerReady()),
    )
    # Nothing to detect (the deletion was the outage's start): placed 1 s later, loaded in 36.2.
    assert "Qwen3-0.6B-4bit serving again after 37.2 s: placed 1.0 s, loaded 36 s" in texts(model)


def test_gone_nodes_keep_their_names_in_the_story() -> None:
    builder = healthy()
    model = connected(builder)
    feed = Feed(model)
    feed(FROZEN_NOW + 1, NodeTimedOut(node_id=node_id_for("studio")))
    feed(FROZEN_NOW + 2, InstanceDeleted(instance_id="inst-llama-3.2-1b-instruct-4bit"))
    assert "(was on studio, mini-b)" in texts(model)[-2]


def test_polling_diffs_tell_the_same_story_as_events() -> None:
    builder = healthy()
    model = connected(builder)
    after = builder.state.model_copy(
        update={
            "instances": {
                k: v for k, v in builder.state.instances.items() if k != "inst-qwen3-0.6b-4bit"
            },
            "runners": {
                k: v for k, v in builder.state.runners.items() if k != "run-qwen3-0.6b-4bit-0"
            },
            "topology": builder.state.topology.model_copy(
                update={"nodes": [n for n in builder.state.topology.nodes if "mini-a" not in n]}
            ),
        }
    )
    model.handle(SnapshotUpdate(after, None), FROZEN_NOW + 5)
    assert texts(model)[1:] == [
        "node mini-a timed out and left the cluster",
        "instance inst-qwe of Qwen3-0.6B-4bit deleted (was on mini-a)",
        "Qwen3-0.6B-4bit stopped serving",
    ]
    assert not model.has_timers


def test_events_already_in_the_snapshot_are_skipped() -> None:
    builder = healthy()
    state = builder.state.model_copy(update={"last_event_applied_idx": 41})
    model = ClusterModel()
    model.handle(SnapshotUpdate(state, None), FROZEN_NOW)
    stale = IndexedEvent(idx=41, event=NodeTimedOut(node_id=node_id_for("studio")))
    model.handle(EventUpdate(stale), FROZEN_NOW)
    assert node_id_for("studio") in model.state.topology.nodes
    fresh = IndexedEvent(idx=42, event=NodeTimedOut(node_id=node_id_for("studio")))
    model.handle(EventUpdate(fresh), FROZEN_NOW)
    assert node_id_for("studio") not in model.state.topology.nodes
    assert model.state.last_event_applied_idx == 42


def test_a_hole_in_the_events_stops_applying_until_a_snapshot() -> None:
    builder = healthy()
    state = builder.state.model_copy(update={"last_event_applied_idx": 41})
    model = ClusterModel()
    model.handle(SnapshotUpdate(state, None), FROZEN_NOW)
    assert not model.needs_snapshot
    studio, mini_a = node_id_for("studio"), node_id_for("mini-a")
    # 42 never came: 43 would be applied on top of a hole.
    model.handle(EventUpdate(IndexedEvent(idx=43, event=NodeTimedOut(node_id=studio))), FROZEN_NOW)
    assert model.needs_snapshot and model.missing_from == 42
    assert studio in model.state.topology.nodes
    assert model.state.last_event_applied_idx == 41
    # Nor is anything after it, even the missing index arriving late.
    model.handle(EventUpdate(IndexedEvent(idx=42, event=NodeTimedOut(node_id=mini_a))), FROZEN_NOW)
    assert mini_a in model.state.topology.nodes and model.missing_from == 42
    # A snapshot fills the hole; events follow on from it again.
    model.handle(SnapshotUpdate(state.model_copy(update={"last_event_applied_idx": 43}), None), 0)
    assert not model.needs_snapshot
    model.handle(EventUpdate(IndexedEvent(idx=44, event=NodeTimedOut(node_id=studio))), FROZEN_NOW)
    assert studio not in model.state.topology.nodes
    assert model.state.last_event_applied_idx == 44


def test_nodes_go_silent_then_gone_then_come_back() -> None:
    builder = ClusterBuilder().node("studio").node("mini-a", seen_ago_s=2).link_all()
    model = connected(builder)
    rows = {r.name: r for r in model.node_rows(FROZEN_NOW)}
    assert rows["mini-a"].liveness == "alive"
    assert rows["mini-a"].links == ("studio",)
    assert rows["mini-a"].ram_total == 64 * 1024**3
    assert rows["mini-a"].ram_used == 16 * 1024**3

    later = FROZEN_NOW + SILENT_AFTER_S
    before = model.timeline.appended
    for second in range(1, int(SILENT_AFTER_S) + 1):  # the master speaks every second...
        model.handle(HeardUpdate(), FROZEN_NOW + second)
    # ...so when nothing came from its nodes for SILENT_AFTER_S, they are quiet, not it.
    assert model.timeline.appended == before + 2
    rows = {r.name: r for r in model.node_rows(later)}
    assert rows["mini-a"].liveness == "silent"
    assert rows["mini-a"].quiet_for_s == SILENT_AFTER_S + 2
    assert texts(model)[-2:] == [  # each told as its silence began, mini-a a second earlier
        f"node mini-a went silent (nothing for {SILENT_AFTER_S:.0f} s)",
        f"node studio went silent (nothing for {SILENT_AFTER_S:.0f} s)",
    ]
    assert [e.at for e in model.timeline][-2:] == [later - 2, later - 1]
    model.handle(HeardUpdate(), later + 1)
    assert not model.tick(later + 1)  # said once per silence

    feed = Feed(model)
    feed(later + 20, NodeTimedOut(node_id=node_id_for("mini-a")))
    gone = [r for r in model.node_rows(later + 30) if r.liveness == "gone"]
    assert [(r.name, r.quiet_for_s) for r in gone] == [("mini-a", 10)]

    feed(later + 40, NodeGatheredInfo(node_id=node_id_for("mini-a"), when=iso(later + 40)))
    rows = {r.name: r for r in model.node_rows(later + 40)}
    assert rows["mini-a"].liveness == "alive"
    assert "node mini-a joined" in texts(model)


def test_a_quiet_master_is_told_once_and_its_nodes_are_judged_as_of_its_last_word() -> None:
    model = connected(ClusterBuilder().node("studio").node("mini-a", seen_ago_s=2).link_all())
    later = FROZEN_NOW + SILENT_AFTER_S + 5  # long past a node's silence, had the master spoken
    before = model.timeline.appended
    assert model.tick(FROZEN_NOW + QUIET_AFTER_S)
    assert model.timeline.appended == before + 1
    assert texts(model)[-1].startswith(f"no word from the master for {QUIET_AFTER_S:.1f} s")
    assert not model.tick(later)  # told once; no node told silent
    rows = {r.name: r for r in model.node_rows(later)}
    assert [rows[n].liveness for n in ("studio", "mini-a")] == ["alive", "alive"]
    assert rows["mini-a"].quiet_for_s == 2  # as of the master's last word
    assert model.summary(later).master_quiet_s == later - FROZEN_NOW

    # It speaks again, its keepalive first: the reports it held back have not come yet.
    model.handle(HeardUpdate(), later + 1)
    assert texts(model)[-1] == f"the master spoke again after {later + 1 - FROZEN_NOW:.1f} s"
    assert model.summary(later + 1).master_quiet_s is None
    studio = node_id_for("studio")
    Feed(model)(later + 1.5, NodeGatheredInfo(node_id=studio, when=iso(later + 1)))
    assert not model.tick(later + 1 + CATCH_UP_S - 0.1)  # still catching up: nobody silent
    # Caught up: studio reported meanwhile; mini-a did not, and is silent with its whole quiet.
    assert model.tick(later + 1 + CATCH_UP_S)
    quiet = later + 1.5 - (FROZEN_NOW - 2)  # to its last word, the report relayed at +1.5
    assert texts(model)[-1] == f"node mini-a went silent (nothing for {quiet:.0f} s)"
    rows = {r.name: r for r in model.node_rows(later + 1 + CATCH_UP_S)}
    assert [rows[n].liveness for n in ("studio", "mini-a")] == ["alive", "silent"]


def test_a_lost_connection_supersedes_the_masters_quiet() -> None:
    model = connected(healthy())
    assert model.tick(FROZEN_NOW + QUIET_AFTER_S)
    model.handle(ConnectionUpdate("down", "cannot connect", 0.5), FROZEN_NOW + 5)
    assert model.summary(FROZEN_NOW + 6).master_quiet_s is None
    model.handle(ConnectionUpdate("live"), FROZEN_NOW + 8)
    assert not model.tick(FROZEN_NOW + 9)  # connected again: it speaks, nothing more to tell
    assert not any(t.startswith("the master spoke again") for t in texts(model))
    assert sum(t.startswith("no word from the master") for t in texts(model)) == 1


def test_gone_nodes_are_remembered_within_a_bound() -> None:
    builder = ClusterBuilder()
    for i in range(GONE_NODES_KEPT + 5):
        builder.node(f"n{i:02d}")
    model = connected(builder)
    feed = Feed(model)
    for i in range(GONE_NODES_KEPT + 5):
        feed(FROZEN_NOW + i, NodeTimedOut(node_id=node_id_for(f"n{i:02d}")))
    gone = [r.name for r in model.node_rows(FROZEN_NOW + 60) if r.liveness == "gone"]
    assert len(gone) == GONE_NODES_KEPT
    assert gone[0] == "n05"


def test_a_skewed_master_clock_does_not_make_nodes_silent() -> None:
    skew = 3600.0  # the master's clock is an hour ahead of ours
    builder = ClusterBuilder(now=FROZEN_NOW + skew).node("studio")
    model = ClusterModel()
    snapshot = builder.snapshot()
    model.handle(SnapshotUpdate(snapshot.state, snapshot.deployments, skew), FROZEN_NOW)
    (studio,) = model.node_rows(FROZEN_NOW)
    assert studio.liveness == "alive"
    assert studio.quiet_for_s == 1


def test_connection_loss_is_stale_since_it_happened_and_recovery_is_told() -> None:
    model = connected(healthy())
    model.handle(ConnectionUpdate("down", "cannot connect", 0.5), FROZEN_NOW + 5)
    model.handle(ConnectionUpdate("down", "cannot connect", 1.0), FROZEN_NOW + 6)
    assert not model.tick(FROZEN_NOW + 14)
    assert model.connection.stale_since == FROZEN_NOW + 5
    assert model.connection.retry_in_s == 1.0
    fresh = healthy(now=FROZEN_NOW + 14).snapshot()
    model.handle([fresh, ConnectionUpdate("live")], FROZEN_NOW + 14.5)
    assert not model.connection.stale
    assert not any("silent" in t for t in texts(model))  # we lost the master, not the nodes
    assert texts(model)[-2:] == [
        "lost the master: cannot connect",
        "master reachable again after 9.5 s (live)",
    ]


def test_an_unreadable_master_keeps_the_data_stale_and_its_return_is_told() -> None:
    model = connected(healthy())
    model.handle(ConnectionUpdate("unreadable", "not JSON (text/html)", 0.5), FROZEN_NOW + 5)
    model.handle(ConnectionUpdate("unreadable", "not JSON (text/html)", 1.0), FROZEN_NOW + 6)
    assert model.connection.mode == "unreadable"
    assert model.connection.stale_since == FROZEN_NOW + 5
    assert model.state == healthy().state  # what was read last, not an empty cluster
    fresh = healthy(now=FROZEN_NOW + 8).snapshot()
    model.handle([fresh, ConnectionUpdate("polling")], FROZEN_NOW + 8)
    assert not model.connection.stale
    assert texts(model)[-2:] == [
        "cannot read the master: not JSON (text/html)",
        "master readable again after 3.0 s (polling)",
    ]


def test_statuses_follow_spec_rule() -> None:
    state = healthy().state
    statuses = deployment_statuses(state)
    assert statuses == {
        "dep-qwen3-0.6b-4bit": "serving",
        "dep-llama-3.2-1b-instruct-4bit": "serving",
        "dep-deepseek-v3.1-4bit": "cant_place",
    }


def test_sorting_and_filtering() -> None:
    model = connected(healthy())
    rows = model.deployment_rows(FROZEN_NOW)
    by_status = [r.model_id for r in sort_rows(rows, "status")]
    assert by_status == [DEEPSEEK, LLAMA, QWEN]
    assert [r.model_id for r in sort_rows(rows, "name")] == [DEEPSEEK, LLAMA, QWEN]
    assert [r.model_id for r in sort_rows(rows, "name", reverse=True)] == [QWEN, LLAMA, DEEPSEEK]
    assert [r.model_id for r in rows if r.matches("MINI-B")] == [LLAMA]
    assert [r.model_id for r in rows if r.matches("sufficient")] == [DEEPSEEK]


def test_age_sort_puts_the_latest_change_first() -> None:
    builder = healthy()
    model = connected(builder)
    feed = Feed(model)
    feed(FROZEN_NOW + 5, InstanceDeleted(instance_id="inst-llama-3.2-1b-instruct-4bit"))
    rows = sort_rows(model.deployment_rows(FROZEN_NOW + 6), "age")
    assert rows[0].model_id == LLAMA


def test_instances_list_runners_with_progress() -> None:
    builder = (
        ClusterBuilder()
        .node("a")
        .node("b")
        .deployment(
            LLAMA,
            on=["a", "b"],
            runners=[RunnerReady(), RunnerLoading(layers_loaded=4, total_layers=8)],
        )
    )
    model = connected(builder)
    (instance,) = model.instance_rows(FROZEN_NOW)
    assert instance.deployment_id == "dep-llama-3.2-1b-instruct-4bit"
    assert not instance.ready
    assert [(r.node_name, r.status, r.progress) for r in instance.runners] == [
        ("a", "Ready", None),
        ("b", "Loading", 0.5),
    ]
    assert row(model, LLAMA).load_progress == 0.75
    assert {n.name: n.runners for n in model.node_rows(FROZEN_NOW)}["b"] == (
        "Llama-3.2-1B-Instruct-4bit Loading",
    )


def test_summary_counts() -> None:
    model = connected(healthy())
    summary = model.summary(FROZEN_NOW)
    assert summary.nodes_alive == 3
    assert summary.by_status == {"serving": 2, "cant_place": 1}
    assert summary.instances == 2


def test_cordons_and_drains_are_told_once_each() -> None:
    builder = healthy()
    model = connected(builder)
    feed = Feed(model)
    start = len(texts(model))
    move = InstanceMove(
        deployment_id="dep-qwen3-0.6b-4bit",
        old_instance_id="inst-qwen3-0.6b-4bit",
        new_instance_id="inst-new-0001",
    )
    feed(FROZEN_NOW + 1, NodeCordoned(name="mini-a"), NodeCordoned(name="mini-a"))
    feed(FROZEN_NOW + 2, NodeDrainStarted(name="mini-a", when="t"))
    feed(FROZEN_NOW + 3, DrainReplacementPlaced(name="mini-a", move=move))
    feed(FROZEN_NOW + 4, NodeDrainEnded(name="mini-a"), NodeDrainEnded(name="mini-a"))
    feed(FROZEN_NOW + 5, NodeUncordoned(name="mini-a"), NodeUncordoned(name="mini-a"))
    assert texts(model)[start:] == [
        "node mini-a cordoned: nothing new goes there",
        "node mini-a draining",
        "draining mini-a: moving Qwen3-0.6B-4bit (instance inst-qwe -> inst-new)",
        "node mini-a drained: nothing runs there",
        "node mini-a uncordoned",
    ]
