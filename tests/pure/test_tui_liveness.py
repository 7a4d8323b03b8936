"""The dashboard's node liveness (``exo_deploy_tui.model.liveness``) and the master's clock on ours
(``exo_deploy_tui.model.master_clock``): judged apart from the model that composes them."""

from __future__ import annotations

from exo_deploy_tui.model.liveness import GONE_NODES_KEPT, NodeLiveness, judge
from exo_deploy_tui.model.master_clock import (
    CLOCK_SKEW_IGNORED_S,
    MasterClock,
    offset_taken,
    parse_iso,
)
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from keeper.model.events import NodeGatheredInfo, NodeTimedOut
from keeper.model.liveness import SILENT_AFTER_S
from keeper.model.state import NodeId, State

STUDIO, MINI = node_id_for("studio"), node_id_for("mini")
IN_STEP = MasterClock()


def two_nodes(studio_seen_ago_s: float = 1.0) -> State:
    return (
        ClusterBuilder()
        .node("studio", seen_ago_s=studio_seen_ago_s)
        .node("mini", seen_ago_s=2.0)
        .state
    )


def without(state: State, node: NodeId) -> State:
    """``state`` after ``node`` timed out: out of the topology, its identity dropped."""
    nodes = [n for n in state.topology.nodes if n != node]
    identities = {n: i for n, i in state.node_identities.items() if n != node}
    memory = {n: m for n, m in state.node_memory.items() if n != node}
    backends = {n: b for n, b in state.node_backends.items() if n != node}
    return state.model_copy(
        update={
            "topology": state.topology.model_copy(update={"nodes": nodes}),
            "node_identities": identities,
            "node_memory": memory,
            "node_backends": backends,
        }
    )


# -- the master's clock -------------------------------------------------------------------


def test_parse_iso_reads_zoned_dates_and_refuses_the_rest() -> None:
    assert parse_iso(iso(FROZEN_NOW)) == FROZEN_NOW
    assert parse_iso("2026-11-30T12:00:00+01:00") == FROZEN_NOW - 3600
    assert parse_iso("2026-11-30T12:00:00") is None  # no zone: cannot be placed
    assert parse_iso("yesterday") is None
    assert parse_iso("") is None
    assert parse_iso(None) is None


def test_an_offset_under_the_headers_resolution_is_no_offset() -> None:
    assert offset_taken(CLOCK_SKEW_IGNORED_S - 0.1) == 0.0
    assert offset_taken(-(CLOCK_SKEW_IGNORED_S - 0.1)) == 0.0
    assert offset_taken(CLOCK_SKEW_IGNORED_S) == CLOCK_SKEW_IGNORED_S
    assert offset_taken(-30.0) == -30.0


def test_the_masters_dates_come_onto_our_clock() -> None:
    clock = MasterClock(offset_s=30.0)  # the master is 30 s ahead
    assert clock.ours(iso(FROZEN_NOW + 30)) == FROZEN_NOW
    assert clock.ours("not a date") is None
    # Heard of 35 s ago by the master's clock is 5 s ago by ours.
    assert clock.quiet_for(iso(FROZEN_NOW - 5), FROZEN_NOW - 30) == 5.0


def test_quiet_for_stops_at_the_moment_the_master_was_lost_and_is_never_negative() -> None:
    seen = iso(FROZEN_NOW)
    assert MasterClock().quiet_for(seen, FROZEN_NOW + 20) == 20.0
    lost = MasterClock(stale_since=FROZEN_NOW + 3)
    assert lost.quiet_for(seen, FROZEN_NOW + 20) == 3.0
    assert lost.quiet_for(seen, FROZEN_NOW + 1) == 1.0  # before the loss: our clock
    assert MasterClock().quiet_for(seen, FROZEN_NOW - 4) == 0.0  # a report "from the future"
    assert MasterClock().quiet_for(None, FROZEN_NOW) is None


# -- judging ------------------------------------------------------------------------------


def test_judge_calls_a_node_silent_from_silent_after_s() -> None:
    assert judge(None) == "alive"
    assert judge(0.0) == "alive"
    assert judge(SILENT_AFTER_S - 0.01) == "alive"
    assert judge(SILENT_AFTER_S) == "silent"


def test_heard_judges_every_node_of_the_topology() -> None:
    heard = NodeLiveness().heard(two_nodes(studio_seen_ago_s=12.0), IN_STEP, FROZEN_NOW)
    assert set(heard) == {STUDIO, MINI}
    assert (heard[STUDIO].liveness, heard[STUDIO].quiet_for_s) == ("silent", 12.0)
    assert (heard[MINI].liveness, heard[MINI].quiet_for_s) == ("alive", 2.0)


def test_silence_is_told_once_and_so_is_its_end() -> None:
    liveness = NodeLiveness()
    state = two_nodes()
    assert liveness.check(state, IN_STEP, FROZEN_NOW) == []
    later = FROZEN_NOW + SILENT_AFTER_S  # studio quiet 9 s, mini 10 s
    entries = liveness.check(state, IN_STEP, later)
    assert [(e.level, e.text, e.node_id) for e in entries] == [
        ("warn", "node studio went silent (nothing for 9 s)", STUDIO),
        ("warn", "node mini went silent (nothing for 10 s)", MINI),
    ]
    assert liveness.check(state, IN_STEP, later + 5) == []  # still silent: told already
    studio_back = state.model_copy(
        update={"last_seen": {**state.last_seen, STUDIO: iso(later + 5)}}
    )
    entries = liveness.check(studio_back, IN_STEP, later + 6)
    assert [(e.level, e.text) for e in entries] == [("good", "node studio is reporting again")]


def test_a_silent_node_is_dated_by_its_last_report_and_a_heard_one_not_at_all() -> None:
    liveness = NodeLiveness()
    state = two_nodes(studio_seen_ago_s=12.0)
    assert liveness.last_heard(STUDIO, state, IN_STEP) is None  # not told silent yet
    liveness.check(state, IN_STEP, FROZEN_NOW)
    assert liveness.last_heard(STUDIO, state, IN_STEP) == FROZEN_NOW - 12.0
    assert liveness.last_heard(STUDIO, state, MasterClock(offset_s=4.0)) == FROZEN_NOW - 16.0
    assert liveness.last_heard(MINI, state, IN_STEP) is None


# -- what left ------------------------------------------------------------------------------


def test_a_node_that_timed_out_is_remembered_with_its_name_and_last_report() -> None:
    liveness = NodeLiveness()
    before = two_nodes(studio_seen_ago_s=3.0)
    liveness.check(before, IN_STEP, FROZEN_NOW)
    liveness.note(NodeTimedOut(node_id=STUDIO), before, FROZEN_NOW + 10, IN_STEP)
    after = without(before, STUDIO)
    assert liveness.remembered_names() == {STUDIO: "studio"}
    gone = liveness.gone(after)
    assert list(gone) == [STUDIO]
    assert (gone[STUDIO].name, gone[STUDIO].at, gone[STUDIO].last_seen) == (
        "studio",
        FROZEN_NOW + 10,
        FROZEN_NOW - 3.0,
    )
    assert liveness.last_heard(STUDIO, after, IN_STEP) == FROZEN_NOW - 3.0
    assert liveness.gone_count(after) == 1
    # Back: no longer gone, though its name stays known until it reports.
    assert liveness.gone(before) == {}
    liveness.note(
        NodeGatheredInfo(node_id=STUDIO, when=iso(FROZEN_NOW)), after, FROZEN_NOW, IN_STEP
    )
    assert liveness.remembered_names() == {}


def test_a_timeout_for_a_node_not_in_the_topology_is_not_remembered() -> None:
    liveness = NodeLiveness()
    state = without(two_nodes(), STUDIO)
    liveness.note(NodeTimedOut(node_id=STUDIO), state, FROZEN_NOW, IN_STEP)
    assert liveness.remembered_names() == {}


def test_a_silent_node_that_left_is_no_longer_silent() -> None:
    liveness = NodeLiveness()
    state = two_nodes(studio_seen_ago_s=12.0)
    liveness.check(state, IN_STEP, FROZEN_NOW)
    liveness.note(NodeTimedOut(node_id=STUDIO), state, FROZEN_NOW, IN_STEP)
    liveness.note(
        NodeGatheredInfo(node_id=STUDIO, when=iso(FROZEN_NOW)), state, FROZEN_NOW, IN_STEP
    )
    # Neither gone nor silent any more: it is judged afresh.
    assert liveness.last_heard(STUDIO, state, IN_STEP) is None


def test_only_the_last_gone_nodes_kept_are_remembered() -> None:
    builder = ClusterBuilder()
    for i in range(GONE_NODES_KEPT + 2):
        builder.node(f"n{i}")
    state = builder.state
    liveness = NodeLiveness()
    for i in range(GONE_NODES_KEPT + 2):
        liveness.note(NodeTimedOut(node_id=node_id_for(f"n{i}")), state, FROZEN_NOW, IN_STEP)
    names = liveness.remembered_names()
    assert len(names) == GONE_NODES_KEPT
    assert node_id_for("n0") not in names and node_id_for("n1") not in names
    assert node_id_for(f"n{GONE_NODES_KEPT + 1}") in names


def test_departed_nodes_we_did_not_see_leave_are_counted_gone() -> None:
    """A stock exo keeps a timed-out node's identity: it left before we connected."""
    state = two_nodes()
    departed = state.model_copy(
        update={"topology": state.topology.model_copy(update={"nodes": [MINI]})}
    )
    liveness = NodeLiveness()
    assert liveness.departed_unseen(departed) == [STUDIO]
    assert liveness.gone_count(departed) == 1
    liveness.note(NodeTimedOut(node_id=STUDIO), state, FROZEN_NOW, IN_STEP)
    assert liveness.departed_unseen(departed) == []  # seen leaving now: counted once
    assert liveness.gone_count(departed) == 1


def test_away_names_are_the_cordoned_names_no_node_goes_by() -> None:
    state = ClusterBuilder().node("studio").node("mini").cordon("studio").cordon("mbp").state
    liveness = NodeLiveness()
    assert liveness.away_names(state, str) == ["mbp"]
    assert liveness.away_names(two_nodes(), str) == []  # nothing cordoned
    # A cordoned node seen leaving still has its row (gone): it is not away.
    liveness.note(NodeTimedOut(node_id=STUDIO), state, FROZEN_NOW, IN_STEP)
    assert liveness.away_names(without(state, STUDIO), str) == ["mbp"]
