"""exo's master changing, recognised from two of its States (``keeper.model.master_change``): a
new master's State starts empty and its event index from 0, where a lagging copy of the same log
is only older."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from keeper_harness import build_instance, card

from keeper.model.master_change import (
    MASTER_CHANGED,
    MasterChange,
    master_change_words,
    master_changed,
)
from keeper.model.notices import iso_utc_of
from keeper.model.state import NodeIdentity, State, Topology

MODEL = card("m")
NODES = ("n-a", "n-b", "n-c")


def exo_state(
    idx: int, seen: dict[str, float], instances: tuple[tuple[str, str], ...] = ()
) -> State:
    """exo's State at event ``idx``: each node of ``seen`` last heard then, and the instances
    (id, node) on them."""
    built = {i: build_instance(MODEL, [node], i) for i, node in instances}
    return State(
        last_event_applied_idx=idx,
        topology=Topology(nodes=list(seen)),
        last_seen={node: iso_utc_of(at) for node, at in seen.items()},
        node_identities={
            node: NodeIdentity(friendly_name=node.removeprefix("n-")) for node in seen
        },
        instances=built,
    )


OLD = exo_state(5000, {"n-a": 100.0, "n-b": 100.4, "n-c": 99.8}, (("i1", "n-b"),))


def test_the_old_masters_node_gone_names_it_and_dates_from_its_last_report() -> None:
    new = exo_state(12, {"n-b": 104.0, "n-c": 104.2})
    assert master_changed(OLD, new) == MasterChange(
        left=("n-a",), old_master="n-a", last_heard=100.0
    )
    assert master_change_words(master_changed(OLD, new) or _never(), OLD) == (
        "exo's master changed (its State started empty; node a left)"
    )


def test_several_nodes_or_none_gone_date_from_the_newest_report_the_old_master_applied() -> None:
    only_one = exo_state(3, {"n-c": 104.2})
    assert master_changed(OLD, only_one) == MasterChange(
        left=("n-a", "n-b"), old_master=None, last_heard=100.4
    )
    # The new master's State before any node reported again: nothing shows, all left.
    empty = State()
    assert master_changed(OLD, empty) == MasterChange(left=NODES, old_master=None, last_heard=100.4)
    change = master_changed(OLD, empty)
    assert change is not None and master_change_words(change, OLD) == MASTER_CHANGED
    # A master that stepped down alive: every node reports to the new one.
    stepped_down = exo_state(7, {"n-a": 104.0, "n-b": 104.0, "n-c": 104.0})
    assert master_changed(OLD, stepped_down) == MasterChange(
        left=(), old_master=None, last_heard=100.4
    )


def test_the_same_masters_next_state_is_no_change() -> None:
    assert master_changed(None, OLD) is None  # a service that just started: nothing to compare
    assert master_changed(OLD, OLD) is None
    later = exo_state(5001, {"n-b": 104.0, "n-c": 104.2})  # the index moves on
    assert master_changed(OLD, later) is None


def test_a_lagging_copy_of_the_same_log_is_no_change() -> None:
    # An older State: a lower index, the same reports or older ones.
    lagging = exo_state(4990, {"n-a": 99.0, "n-b": 100.4, "n-c": 99.8})
    assert master_changed(OLD, lagging) is None
    # Older still, from before the instance was placed: no instance shared, yet nothing newer.
    before_placing = exo_state(4000, {"n-a": 90.0, "n-b": 90.0, "n-c": 90.0})
    assert master_changed(OLD, before_placing) is None
    # A lower index still holding an instance of the old State: the same log.
    newer_report = exo_state(4990, {"n-a": 104.0}, (("i1", "n-b"),))
    assert master_changed(OLD, newer_report) is None


def test_a_report_that_cannot_be_dated_says_nothing_either_way() -> None:
    undated = exo_state(12, {"n-b": 104.0}).model_copy(update={"last_seen": {"n-b": "soon"}})
    assert master_changed(OLD, undated) is None
    old_undated = OLD.model_copy(update={"last_seen": {"n-a": "yesterday"}})
    new = exo_state(12, {"n-b": 104.0, "n-c": 104.2})
    # n-b's report cannot be compared with one the old State cannot date: no proof of a reset.
    assert master_changed(old_undated, new) is None
    # Dated on n-c's only: the old master's report cannot be dated, so the change is not.
    old_partly = OLD.model_copy(update={"last_seen": {"n-a": "yesterday", "n-c": iso_utc_of(99.8)}})
    assert master_changed(old_partly, new) == MasterChange(
        left=("n-a",), old_master="n-a", last_heard=None
    )
    nothing_dated = OLD.model_copy(update={"last_seen": {}})
    assert master_changed(nothing_dated, State()) == MasterChange(
        left=NODES, old_master=None, last_heard=None
    )


def _never() -> MasterChange:
    raise AssertionError("a master change was expected")


# --- properties -------------------------------------------------------------------------------

# Whole milliseconds: exo's lastSeen is written here to the millisecond (``iso_utc_of``).
times = st.integers(1_000_000_000_000, 2_000_000_000_000).map(lambda ms: ms / 1000)
seen_maps = st.dictionaries(st.sampled_from(NODES), times, min_size=1)


@given(seen=seen_maps, idx=st.integers(0, 10_000), behind=st.integers(1, 10_000), aged=times)
def test_an_older_copy_of_the_same_log_is_never_a_master_change(
    seen: dict[str, float], idx: int, behind: int, aged: float
) -> None:
    """A State read from a lagging node holds no report newer than the old State's: whatever
    the index, however many nodes and instances, it is no change."""
    old = exo_state(idx + behind, seen, (("i1", next(iter(seen))),))
    older = {node: min(at, aged) for node, at in seen.items()}
    assert master_changed(old, exo_state(idx, older)) is None
    assert master_changed(old, exo_state(idx, older, (("i1", next(iter(seen))),))) is None


@given(seen=seen_maps, idx=st.integers(0, 10_000), ahead=st.integers(0, 10_000))
def test_an_index_that_does_not_go_back_is_never_a_master_change(
    seen: dict[str, float], idx: int, ahead: int
) -> None:
    old = exo_state(idx, seen)
    assert (
        master_changed(old, exo_state(idx + ahead, {n: at + 5 for n, at in seen.items()})) is None
    )
    assert master_changed(old, State(last_event_applied_idx=idx + ahead)) is None


@given(
    seen=seen_maps,
    survivors=st.sets(st.sampled_from(NODES)),
    idx=st.integers(1, 10_000),
    restart=st.integers(-1, 10_000),
    later=st.integers(1, 60_000).map(lambda ms: ms / 1000),
)
def test_a_new_masters_state_is_a_change_dated_no_later_than_the_old_states_last_report(
    seen: dict[str, float], survivors: set[str], idx: int, restart: int, later: float
) -> None:
    """The new master's State (a lower index, no old instance, its reports newer, or no node
    yet): a change; the node that left, when one did, is the old master; the outage is dated
    from a report the old State holds."""
    old = exo_state(idx + restart + 1, seen, (("i1", next(iter(seen))),))
    new_seen = {node: max(seen.values()) + later for node in survivors}
    new = exo_state(restart, new_seen)
    if survivors and not survivors & seen.keys():
        return  # no node of the old State heard again: nothing proves the log is new
    change = master_changed(old, new)
    assert change is not None
    assert change.left == tuple(sorted(seen.keys() - survivors))
    assert change.old_master == (change.left[0] if len(change.left) == 1 else None)
    assert change.last_heard is not None
    assert change.last_heard <= max(seen.values()) + 1e-6
    if change.old_master is not None:
        assert abs(change.last_heard - seen[change.old_master]) < 1e-6
