"""Fast failover's liveness rule (``keeper.model.liveness``, docs/design.md §5.18): a node
alive, suspect, dead or gone from what the service observed on its own running clock — with
the properties that keep it from failing over for nothing: off means off, never dead without a
second sign, a stale view suspects nobody, a paused observer blames itself."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from keeper_harness import build_instance, card, node_info

from keeper.model import liveness
from keeper.model.apply import apply
from keeper.model.events import NodeConfirmedDead, NodeHeardAgain, NodeSuspected
from keeper.model.liveness import (
    FLAP_CAP_S,
    FLAP_MEMORY_S,
    MAX_OBSERVER_GAP_S,
    OFF,
    PAUSE_SETTLE_S,
    RHYTHM_SAMPLES,
    SILENT_AFTER_S,
    STALE_WINDOW_S,
    Judgement,
    LivenessConfig,
    NodeHeard,
    dead_after,
    flaps_within,
    heard,
    judge,
    liveness_flags_refusal,
    next_threshold,
    node_liveness,
    nodes_by_state,
    paused,
    probe_sign,
    report_time,
    rhythm_s,
    running_at,
    started_clock,
    suspect_after,
    ticked,
    wants_probe,
    watch_events,
    watched_liveness,
)
from keeper.model.state import NodeIdentity, State

ON = LivenessConfig()  # 3 / 8


def steady(last: float, n: int = 8) -> NodeHeard:
    """A node heard every second, lastly at ``last``."""
    return NodeHeard(last_heard=last, gaps=(1.0,) * n)


# --- the flags ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suspect", "dead", "flag"),
    [
        (-1.0, 8.0, "--suspect-after-s"),
        (math.nan, 8.0, "--suspect-after-s"),
        (3.0, -0.5, "--dead-after-s"),
        (3.0, math.inf, "--dead-after-s"),
        (1.0, 1.9, "--dead-after-s must be at least 2"),
        (9.0, 8.0, "--suspect-after-s (9) must not be above --dead-after-s (8)"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(suspect: float, dead: float, flag: str) -> None:
    refusal = liveness_flags_refusal(suspect, dead)
    assert refusal is not None and flag in refusal


@pytest.mark.parametrize(
    ("suspect", "dead"), [(3.0, 8.0), (0.0, 0.0), (0.0, 8.0), (2.0, 2.0), (8.0, 8.0), (5.0, 0.0)]
)
def test_good_flags_pass(suspect: float, dead: float) -> None:
    assert liveness_flags_refusal(suspect, dead) is None


def test_enabled_only_with_a_suspicion_threshold() -> None:
    assert ON.enabled and not OFF.enabled
    assert not LivenessConfig(0.0, 8.0).enabled
    assert LivenessConfig(0.5, 8.0).enabled


# --- the observer's own running clock -------------------------------------------------------


def test_running_time_counts_a_normal_gap_and_cuts_a_pause_short() -> None:
    clock = started_clock(100.0)
    assert running_at(clock, 101.5) == 1.5
    assert running_at(clock, 100.0 + MAX_OBSERVER_GAP_S) == MAX_OBSERVER_GAP_S
    assert running_at(clock, 130.0) == MAX_OBSERVER_GAP_S
    assert running_at(clock, 99.0) == 0.0  # never backwards
    one = ticked(clock, 101.0)
    assert (one.at, one.running, paused(one)) == (101.0, 1.0, None)
    woke = ticked(one, 131.0)
    assert (woke.at, woke.running, woke.pause_s) == (131.0, 1.0 + MAX_OBSERVER_GAP_S, 30.0)
    why = paused(woke)
    assert why is not None and "paused for 30.0 s" in why


def test_a_pause_is_remembered_for_the_settling_time_only() -> None:
    clock = ticked(started_clock(0.0), 10.0)
    at = 10.0
    while at + 1.0 < 10.0 + PAUSE_SETTLE_S:
        at += 1.0
        clock = ticked(clock, at)
        assert paused(clock) is not None
    clock = ticked(clock, 10.0 + PAUSE_SETTLE_S - 0.01)
    assert paused(clock) is not None
    clock = ticked(clock, 10.0 + PAUSE_SETTLE_S)
    assert paused(clock) is None
    assert clock.pause_s == 10.0  # how long it was, kept for the message


def test_a_gap_of_exactly_the_bound_is_not_a_pause() -> None:
    assert paused(ticked(started_clock(0.0), MAX_OBSERVER_GAP_S)) is None
    assert paused(ticked(started_clock(0.0), MAX_OBSERVER_GAP_S + 0.01)) is not None


# --- a node's record ----------------------------------------------------------------------


def test_heard_records_the_gap_reopens_and_forgets_the_probe() -> None:
    first = heard(None, 5.0)
    assert first == NodeHeard(last_heard=5.0)
    node = NodeHeard(last_heard=5.0, gaps=(1.0,), closed=True, probe="unanswered", flaps=2)
    again = heard(node, 6.5)
    assert again == NodeHeard(last_heard=6.5, gaps=(1.0, 1.5), flaps=2)
    assert heard(again, 6.5).gaps == (1.0, 1.5)  # no gap, none recorded
    # A silence as long as the threshold it was judged on is a fault, not the node's rhythm.
    assert heard(again, 9.5, fault_s=3.0) == NodeHeard(last_heard=9.5, gaps=(1.0, 1.5), flaps=2)
    assert heard(again, 9.4, fault_s=3.0).gaps == (1.0, 1.5, pytest.approx(2.9))


def test_only_the_recent_gaps_are_kept() -> None:
    node = heard(None, 0.0)
    for at in range(1, RHYTHM_SAMPLES + 5):
        node = heard(node, float(at) * 1.0 + (0.5 if at == RHYTHM_SAMPLES + 4 else 0.0))
    assert len(node.gaps) == RHYTHM_SAMPLES
    assert node.gaps[-1] == 1.5 and node.gaps[0] == 1.0


def test_flaps_are_remembered_for_ten_minutes() -> None:
    assert flaps_within([0.0, 100.0, 500.0], 600.0) == 2
    assert flaps_within([0.0], FLAP_MEMORY_S - 0.1) == 1
    assert flaps_within([0.0], FLAP_MEMORY_S) == 0
    assert flaps_within([], 0.0) == 0


def test_rhythm_needs_four_gaps_and_is_mean_plus_four_deviations() -> None:
    assert rhythm_s((1.0, 1.0, 1.0)) == 0.0
    assert rhythm_s((1.0,) * 4) == 1.0
    # mean 2, deviation 1 (population): 2 + 4 * 1
    assert rhythm_s((1.0, 3.0, 1.0, 3.0)) == pytest.approx(6.0)


def test_suspicion_threshold_flag_flaps_rhythm_and_cap() -> None:
    assert suspect_after(ON, NodeHeard(0.0)) == 3.0
    assert suspect_after(ON, NodeHeard(0.0, flaps=1)) == 6.0
    assert suspect_after(ON, NodeHeard(0.0, flaps=3)) == 24.0
    assert suspect_after(ON, NodeHeard(0.0, flaps=4)) == FLAP_CAP_S
    assert suspect_after(ON, NodeHeard(0.0, flaps=1000)) == FLAP_CAP_S
    assert suspect_after(ON, NodeHeard(0.0, gaps=(1.0, 3.0, 1.0, 3.0))) == pytest.approx(6.0)
    assert suspect_after(ON, NodeHeard(0.0, gaps=(10.0, 30.0) * 2)) == FLAP_CAP_S
    # a flag above the cap is the flag
    assert suspect_after(LivenessConfig(40.0, 50.0), NodeHeard(0.0, flaps=2)) == 40.0


def test_death_threshold_moves_with_the_suspicion_and_off_is_never() -> None:
    assert dead_after(ON, NodeHeard(0.0)) == 8.0
    assert dead_after(ON, NodeHeard(0.0, flaps=1)) == 11.0
    assert dead_after(LivenessConfig(3.0, 0.0), NodeHeard(0.0)) == math.inf


# --- the judgement ------------------------------------------------------------------------


def test_a_node_goes_suspect_then_dead_while_the_others_are_heard() -> None:
    nodes = {"a": steady(100.0), "b": steady(110.0), "c": steady(110.0)}
    assert judge(nodes, 102.9, ON).phases["a"] == "alive"
    at_three = judge(nodes, 103.0, ON)
    assert at_three.phases == {"a": "suspect", "b": "alive", "c": "alive"}
    assert at_three.stale is None and at_three.why_dead == {}
    assert judge(nodes, 107.9, ON).phases["a"] == "suspect"
    dead = judge(nodes, 108.0, ON)
    assert dead.phases["a"] == "dead"
    assert dead.why_dead == {"a": "silent for 8.0 s while the other nodes were heard"}


def test_silence_alone_never_confirms_when_nobody_else_is_heard() -> None:
    # b and c fell silent long before a: not within the stale window of each other's or a's
    nodes = {"a": steady(100.0), "b": steady(50.0), "c": steady(20.0)}
    judgement = judge(nodes, 200.0, ON)
    assert judgement.stale is None
    assert set(judgement.phases.values()) == {"suspect"}


def test_a_closed_connection_is_suspect_at_once_and_dead_after_the_suspicion() -> None:
    closed = NodeHeard(last_heard=100.0, gaps=(1.0,) * 8, closed=True)
    nodes = {"a": closed, "b": steady(100.5), "c": steady(100.5)}
    assert judge(nodes, 100.5, ON).phases["a"] == "suspect"
    dead = judge(nodes, 103.0, ON)
    assert dead.phases["a"] == "dead"
    assert dead.why_dead["a"] == "its connection closed and it was silent for 3.0 s"


def test_an_unanswered_probe_confirms_a_suspect_node() -> None:
    probed = NodeHeard(last_heard=100.0, gaps=(1.0,) * 8, probe="unanswered")
    nodes = {"a": probed, "b": steady(103.0), "c": steady(103.0)}
    dead = judge(nodes, 103.0, ON)
    assert dead.phases["a"] == "dead"
    assert dead.why_dead["a"] == "its own API did not answer GET /node_id"
    answered = {**nodes, "a": NodeHeard(100.0, gaps=(1.0,) * 8, probe="answered")}
    assert judge(answered, 103.0, ON).phases["a"] == "suspect"
    # a probe is no first sign: a node still reporting stays alive whatever it said
    assert judge({**nodes, "a": probed}, 101.0, ON).phases["a"] == "alive"


def test_a_refused_probe_confirms_a_node_dead_at_once_without_suspecting_it() -> None:
    refused = NodeHeard(last_heard=100.0, gaps=(1.0,) * 8, probe="refused")
    nodes = {"a": refused, "b": steady(100.5), "c": steady(100.5)}
    # half a second after its last report: not even a report late, but its port is closed
    dead = judge(nodes, 100.5, ON)
    assert dead.phases == {"a": "dead", "b": "alive", "c": "alive"}
    assert dead.why_dead["a"] == (
        "its own API refused the connection (its exo process is gone) after 0.5 s of silence"
    )
    # heard again, it speaks for itself: the refusal is forgotten
    assert judge({**nodes, "a": heard(refused, 100.5)}, 100.5, ON).phases["a"] == "alive"
    # a suspect node refused is dead too, the silence its own
    later = {**nodes, "b": steady(104.0), "c": steady(104.0)}
    assert judge(later, 104.0, ON).why_dead["a"].endswith("after 4.0 s of silence")
    # and a timeout is no such sign before the suspicion
    unanswered = {**nodes, "a": NodeHeard(100.0, gaps=(1.0,) * 8, probe="unanswered")}
    assert judge(unanswered, 102.0, ON).phases["a"] == "alive"


def test_refusals_together_are_a_stale_view_and_a_paused_observer_ignores_them() -> None:
    refused = NodeHeard(last_heard=100.0, gaps=(1.0,) * 8, probe="refused")
    nodes = {"a": refused, "b": refused, "c": steady(102.0)}
    judgement = judge(nodes, 102.0, ON)
    assert judgement.phases == {"c": "alive"} and judgement.stale is not None
    one = {**nodes, "b": steady(102.0)}
    assert judge(one, 102.0, ON, observer_paused="paused").phases == {"b": "alive", "c": "alive"}


def test_which_nodes_are_probed() -> None:
    assert wants_probe("suspect", None) and wants_probe("suspect", 0.0)
    # every node heard, whatever its silence: a refusal is looked for at each round
    assert wants_probe("alive", 0.0) and wants_probe("alive", 60.0)
    assert not wants_probe("alive", None)  # never heard: no silence to speak of
    assert not wants_probe("dead", 60.0) and not wants_probe("gone", 60.0)


def test_what_a_probe_tells() -> None:
    for answer in ("answered", "unanswered", "refused"):
        assert probe_sign(True, answer) == answer
    assert probe_sign(False, "refused") == "refused"
    assert probe_sign(False, "unanswered") is None  # a short freeze gives that too
    assert probe_sign(False, "answered") is None


def test_more_than_half_silent_together_is_a_stale_view() -> None:
    nodes = {"a": steady(100.0), "b": steady(101.9), "c": steady(110.0)}
    judgement = judge(nodes, 110.0, ON)
    assert judgement.phases == {"c": "alive"}
    assert judgement.stale is not None and "2 of 3 nodes" in judgement.stale
    apart = {**nodes, "b": steady(100.0 + STALE_WINDOW_S + 0.1)}
    assert judge(apart, 110.0, ON).stale is None


def test_a_node_silent_since_long_before_is_no_part_of_the_view_that_went_quiet() -> None:
    # exo keeps a killed node in its topology for 30 s; meanwhile an election stops every
    # report the others make: two of the three still heard fall silent together.
    killed = NodeHeard(last_heard=50.0, gaps=(1.0,) * 8, probe="refused")
    nodes = {"x": killed, "a": steady(100.0), "b": steady(101.0), "c": steady(110.0)}
    judgement = judge(nodes, 110.0, ON)
    assert judgement.phases == {"c": "alive"}
    assert judgement.stale is not None and judgement.stale.startswith("2 of 3 nodes")
    # Silent as long but never refused, it counts (it may be the view's): two of four.
    assert judge({**nodes, "x": steady(50.0)}, 110.0, ON).stale is None
    # Refused within the window, it is one of those that went quiet together: three of four.
    within = {**nodes, "x": NodeHeard(last_heard=100.5, gaps=(1.0,) * 8, probe="refused")}
    assert (judge(within, 110.0, ON).stale or "").startswith("3 of 4 nodes")


def test_exactly_half_silent_is_not_stale() -> None:
    nodes = {"a": steady(100.0), "b": steady(100.0), "c": steady(110.0), "d": steady(110.0)}
    assert judge(nodes, 110.0, ON).stale is None
    one_of_two = {"a": steady(100.0), "b": steady(110.0)}
    assert judge(one_of_two, 110.0, ON).phases["a"] == "dead"


def test_a_single_silent_node_alone_is_a_stale_view() -> None:
    judgement = judge({"a": steady(100.0)}, 200.0, ON)
    assert judgement.phases == {} and judgement.stale is not None


def test_a_paused_observer_judges_only_those_it_heard() -> None:
    nodes = {"a": steady(100.0), "b": steady(110.0), "c": steady(110.0)}
    judgement = judge(nodes, 110.0, ON, observer_paused="paused for 30 s")
    assert judgement == type(judgement)({"b": "alive", "c": "alive"}, {}, "paused for 30 s")


def test_off_is_everyone_alive() -> None:
    nodes = {"a": NodeHeard(0.0, closed=True, probe="unanswered"), "b": steady(1000.0)}
    assert judge(nodes, 1000.0, OFF).phases == {"a": "alive", "b": "alive"}
    assert judge(nodes, 1000.0, OFF).stale is None


# --- properties ---------------------------------------------------------------------------

node_records = st.builds(
    NodeHeard,
    last_heard=st.floats(0.0, 100.0),
    gaps=st.lists(st.floats(0.1, 5.0), max_size=8).map(tuple),
    closed=st.booleans(),
    probe=st.sampled_from([None, "answered", "unanswered", "refused"]),
    flaps=st.integers(0, 6),
)
clusters = st.dictionaries(st.sampled_from("abcdefg"), node_records, min_size=1, max_size=7)
configs = st.builds(
    LivenessConfig, suspect_after_s=st.floats(0.5, 10.0), dead_after_s=st.floats(2.0, 20.0)
).filter(lambda c: c.suspect_after_s <= c.dead_after_s)
nows = st.floats(0.0, 200.0)


@given(clusters, nows, configs)
def test_never_dead_without_a_second_sign(
    nodes: dict[str, NodeHeard], now: float, config: LivenessConfig
) -> None:
    judgement = judge(nodes, now, config)
    alive = [n for n, phase in judgement.phases.items() if phase == "alive"]
    for node_id, phase in judgement.phases.items():
        if phase != "dead":
            continue
        node = nodes[node_id]
        silent = now - node.last_heard
        assert (
            node.probe in ("unanswered", "refused")
            or (node.closed and silent >= suspect_after(config, node))
            or (alive and silent >= dead_after(config, node))
        )
        refused = node.probe == "refused"  # a sign of its own: nothing listens on its port
        assert node.closed or refused or silent >= suspect_after(config, node)  # a first sign
        assert node_id in judgement.why_dead


@given(clusters, nows, configs)
def test_a_stale_view_suspects_nobody(
    nodes: dict[str, NodeHeard], now: float, config: LivenessConfig
) -> None:
    judgement = judge(nodes, now, config)
    if judgement.stale is not None:
        assert set(judgement.phases.values()) <= {"alive"}
    else:
        # no verdict reached on more than half of the nodes falling quiet together
        quiet = sorted(nodes[n].last_heard for n, p in judgement.phases.items() if p != "alive")
        for i, first in enumerate(quiet):
            together = [t for t in quiet[i:] if t - first <= STALE_WINDOW_S]
            assert 2 * len(together) <= len(nodes)


@given(clusters, nows, st.floats(0.0, 20.0))
def test_off_means_off(nodes: dict[str, NodeHeard], now: float, dead: float) -> None:
    judgement = judge(nodes, now, LivenessConfig(0.0, dead), observer_paused="paused")
    assert judgement.phases == dict.fromkeys(nodes, "alive")
    assert judgement.stale is None and judgement.why_dead == {}


@given(clusters, nows, configs)
def test_a_paused_observer_reaches_no_verdict(
    nodes: dict[str, NodeHeard], now: float, config: LivenessConfig
) -> None:
    judgement = judge(nodes, now, config, observer_paused="paused")
    assert set(judgement.phases.values()) <= {"alive"} and judgement.stale == "paused"


@given(st.lists(st.floats(0.0, 60.0), min_size=1, max_size=40))
def test_running_time_never_runs_ahead_of_the_clock(gaps: list[float]) -> None:
    clock = started_clock(0.0)
    now = 0.0
    for gap in gaps:
        now += gap
        before = clock.running
        clock = ticked(clock, now)
        assert 0.0 <= clock.running - before <= min(gap, MAX_OBSERVER_GAP_S) + 1e-9
    assert clock.running <= now + 1e-9


@given(st.integers(0, 40), configs)
def test_flapping_only_ever_delays_suspicion_up_to_the_cap(
    flaps: int, config: LivenessConfig
) -> None:
    later = suspect_after(config, NodeHeard(0.0, flaps=flaps + 1))
    now = suspect_after(config, NodeHeard(0.0, flaps=flaps))
    assert config.suspect_after_s <= now <= later <= max(FLAP_CAP_S, config.suspect_after_s)


# --- into the State -------------------------------------------------------------------------


def three_nodes() -> State:
    state = State()
    for node_id in ("a", "b", "c"):
        state = apply(state, node_info(node_id))
    return state


def test_verdicts_become_events_once() -> None:
    state = three_nodes()
    judgement = judge({"a": steady(0.0), "b": steady(5.0), "c": steady(5.0)}, 5.0, ON)
    events = watch_events(state, judgement, {"a": 1000.0}, 1005.0)
    assert events == [NodeSuspected(node_id="a", last_heard=1000.0, at=1005.0)]
    state = apply(state, events[0])
    assert watch_events(state, judgement, {"a": 1000.0}, 1006.0) == []
    dead = judge({"a": steady(0.0), "b": steady(9.0), "c": steady(9.0)}, 9.0, ON)
    confirmed = watch_events(state, dead, {"a": 1003.0}, 1009.0)
    why = "silent for 9.0 s while the other nodes were heard"
    assert confirmed == [NodeConfirmedDead(node_id="a", last_heard=1000.0, at=1009.0, why=why)]
    state = apply(state, confirmed[0])
    assert watch_events(state, dead, {}, 1010.0) == []
    # dead stays dead on a later suspicion; alive again clears it
    assert watch_events(state, judgement, {}, 1011.0) == []
    back = judge({"a": steady(11.0), "b": steady(11.0), "c": steady(11.0)}, 11.0, ON)
    assert watch_events(state, back, {}, 1011.0) == [NodeHeardAgain(node_id="a", at=1011.0)]


def test_dead_at_once_uses_its_last_report_and_unknown_times_are_now() -> None:
    state = three_nodes()
    closed = NodeHeard(0.0, closed=True)
    judgement = judge({"a": closed, "b": steady(5.0), "c": steady(5.0)}, 5.0, ON)
    events = watch_events(state, judgement, {"a": 995.0}, 1000.0)
    assert events == [
        NodeConfirmedDead(
            node_id="a",
            last_heard=995.0,
            at=1000.0,
            why="its connection closed and it was silent for 5.0 s",
        )
    ]
    suspect = judge({"a": steady(0.0), "b": steady(5.0), "c": steady(5.0)}, 5.0, ON)
    assert watch_events(state, suspect, {}, 1000.0) == [
        NodeSuspected(node_id="a", last_heard=1000.0, at=1000.0)
    ]


def test_a_stale_view_neither_reaches_nor_takes_back_a_verdict() -> None:
    state = apply(three_nodes(), NodeSuspected(node_id="a", last_heard=1.0, at=4.0))
    stale = judge({"a": steady(0.0), "b": steady(0.5), "c": steady(9.0)}, 9.0, ON)
    assert stale.stale is not None
    assert watch_events(state, stale, {}, 1009.0) == []


def test_watched_liveness_reads_the_state() -> None:
    state = apply(three_nodes(), NodeSuspected(node_id="a", last_heard=1.0, at=4.0))
    state = apply(state, NodeConfirmedDead(node_id="b", last_heard=1.0, at=9.0, why="x"))
    assert [watched_liveness(state, n) for n in "abcz"] == ["suspect", "dead", "alive", "gone"]


def test_the_coarse_rule_counts_a_node_with_a_verdict_as_silent() -> None:
    state = apply(three_nodes(), NodeSuspected(node_id="a", last_heard=1.0, at=4.0))
    heard_at = {"a": 100.0, "b": 100.0, "c": 100.0 - SILENT_AFTER_S}
    assert node_liveness(state, heard_at, 100.0) == {"a": "silent", "b": "alive", "c": "silent"}
    assert node_liveness(state, {"c": 100.0 - SILENT_AFTER_S + 0.1}, 100.0)["c"] == "alive"
    counts = nodes_by_state(state, heard_at, 100.0)
    assert counts == {"alive": 1, "silent": 2, "gone": 0, "cordoned": 0}


# --- boundaries each rule draws (docs/design.md §5.18) ----------------------------------------


def test_a_node_out_of_the_topology_is_gone_whether_described_or_only_running_instances() -> None:
    state = three_nodes().model_copy(
        update={
            "node_identities": {"b-left": NodeIdentity(friendly_name="left")},
            "instances": {"i1": build_instance(card("m"), ["a", "z-unknown"], "i1")},
        }
    )
    heard_at = {"a": 100.0, "b": 100.0, "c": 100.0}
    assert node_liveness(state, heard_at, 100.0) == {
        "a": "alive",
        "b": "alive",
        "c": "alive",
        "b-left": "gone",
        "z-unknown": "gone",
    }
    assert nodes_by_state(state, heard_at, 100.0)["gone"] == 2


def test_a_node_never_dated_is_alive_however_short_the_silence_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(liveness, "SILENT_AFTER_S", 0.5)
    assert node_liveness(three_nodes(), {"a": 99.0}, 100.0) == {
        "a": "silent",
        "b": "alive",
        "c": "alive",
    }


@pytest.mark.parametrize(
    ("suspect", "dead", "refusal"),
    [
        (-1.0, 8.0, "--suspect-after-s must be a number of seconds, 0 or more (got -1)"),
        (3.0, -0.5, "--dead-after-s must be a number of seconds, 0 or more (got -0.5)"),
    ],
)
def test_a_flag_out_of_range_is_refused_in_these_words(
    suspect: float, dead: float, refusal: str
) -> None:
    assert liveness_flags_refusal(suspect, dead) == refusal


def test_flaps_stop_doubling_the_threshold_after_sixteen() -> None:
    # A tiny flag shows the doubling before the cap does: 2**16 times, and never more (an
    # unbounded power of two would overflow a float).
    tiny = LivenessConfig(1e-4, 8.0)
    assert suspect_after(tiny, NodeHeard(0.0, flaps=16)) == pytest.approx(1e-4 * 2**16)
    assert suspect_after(tiny, NodeHeard(0.0, flaps=17)) == pytest.approx(1e-4 * 2**16)
    assert suspect_after(tiny, NodeHeard(0.0, flaps=5000)) == pytest.approx(1e-4 * 2**16)


def test_nodes_all_heard_are_no_stale_view_however_few() -> None:
    assert judge({"a": steady(100.0)}, 100.5, ON) == Judgement({"a": "alive"}, {}, None)
    assert judge({}, 100.0, ON).stale is None


def test_silent_exactly_the_window_apart_is_together_and_the_message_says_so() -> None:
    nodes = {"a": steady(100.0), "b": steady(100.0 + STALE_WINDOW_S), "c": steady(110.0)}
    assert judge(nodes, 110.0, ON).stale == (
        "2 of 3 nodes fell silent within 2 s of each other (a, b): the view is stale (this "
        "service or the cluster's master is the one missing), so nobody is suspected"
    )


def test_of_windows_equally_full_the_earliest_is_named() -> None:
    # a and b fell silent 1.5 s apart, b and c too: two windows of two, a and c 3 s apart.
    nodes = {"a": steady(100.0), "b": steady(101.5), "c": steady(103.0)}
    stale = judge(nodes, 120.0, ON).stale
    assert stale is not None and stale.startswith(
        "2 of 3 nodes fell silent within 2 s of each other (a, b):"
    )


def test_the_nodes_named_are_those_of_the_window_not_the_first_silent() -> None:
    # a fell silent long before; b, c and d together: those three are named, not a.
    nodes = {"a": steady(0.0), "b": steady(10.0), "c": steady(11.0), "d": steady(11.5)}
    stale = judge({**nodes, "e": steady(30.0)}, 30.0, ON).stale
    assert stale is not None and "3 of 5 nodes" in stale and "(b, c, d):" in stale


def test_the_stale_window_slides_over_the_silent_nodes_in_time_order() -> None:
    # Silent at 0, 10, 20, then at 30, 30.5 and 31 (one node heard): 3 of 7 fall within the
    # window, not more than half; two more at 31.5 and 32 make it 5 of 9, a stale view.
    apart = {f"s{k}": steady(float(t)) for k, t in enumerate((0, 10, 20, 30, 30.5, 31))}
    nodes = {"h": steady(60.0), **apart}
    assert judge(nodes, 60.0, ON).stale is None
    more = {**nodes, "s6": steady(31.5), "s7": steady(32.0)}
    stale = judge(more, 60.0, ON).stale
    assert stale is not None and stale.startswith("5 of 9 nodes")


# --- when a report read late was made, and when the next verdict is due --------------------


def test_a_report_read_late_is_dated_from_the_one_before_it() -> None:
    # The previous report arrived at 10.0; the next one, made 1.0 s later by the node's own
    # clock, was read only at 12.4 (the observer could not read meanwhile): made at 11.0.
    assert report_time(12.4, 10.0, 1.0) == 11.0
    # read at once: its arrival, however long the node's step (a clock run fast is capped)
    assert report_time(11.2, 10.0, 5.0) == 11.2
    # nothing to date it from, or a step back (a clock set back): its arrival
    assert report_time(12.4, None, 1.0) == 12.4
    assert report_time(12.4, 10.0, None) == 12.4
    assert report_time(12.4, 10.0, -3.0) == 12.4
    # a step of zero: no later than the one before
    assert report_time(12.4, 10.0, 0.0) == 10.0


@given(
    arrived=st.floats(0, 1e6),
    before=st.floats(0, 1e6),
    step=st.one_of(st.none(), st.floats(-1e3, 1e3)),
)
def test_a_report_is_never_dated_after_its_arrival_nor_before_the_one_before(
    arrived: float, before: float, step: float | None
) -> None:
    previous = min(before, arrived)  # arrivals come in order
    made = report_time(arrived, previous, step)
    assert previous <= made <= arrived


def test_the_next_threshold_is_the_nearest_one_ahead() -> None:
    nodes = {"a": steady(10.0), "b": steady(9.0), "c": steady(2.0), "d": steady(0.0)}
    phases: dict[str, liveness.Phase] = {"a": "alive", "b": "alive", "c": "suspect", "d": "dead"}
    # a at 13, b at 12 (suspicion), c at 10 (death), d none (dead): the nearest after 11.0
    assert next_threshold(nodes, phases, 11.0, ON) == 12.0
    assert next_threshold(nodes, phases, 9.5, ON) == 10.0
    # thresholds already crossed are not ahead (the check made then reached its verdict)
    assert next_threshold(nodes, phases, 13.0, ON) is None
    # a node the judgement left out (a stale view) has none; off: none at all
    assert next_threshold(nodes, {"a": "alive"}, 11.0, ON) == 13.0
    assert next_threshold(nodes, phases, 11.0, OFF) is None
    # never by silence alone: no death threshold
    never = LivenessConfig(suspect_after_s=3.0, dead_after_s=0.0)
    assert next_threshold({"c": steady(2.0)}, {"c": "suspect"}, 3.0, never) is None
