"""A master that stops speaking: ``MasterQuiet`` tells it once and its end, and ``MasterClock``
judges every silence only as far as the master's last word."""

from __future__ import annotations

from exo_deploy_tui.model.format import clock_time
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.master_quiet import (
    CATCH_UP_S,
    QUIET_AFTER_S,
    MasterQuiet,
    MasterWord,
    quiet_for,
)
from exo_deploy_tui.testing import FROZEN_NOW, iso

HEARD = FROZEN_NOW


def test_quiet_for_starts_at_the_bound() -> None:
    assert quiet_for(None, HEARD + 100) is None  # never spoke: nothing to be quiet since
    assert quiet_for(HEARD, HEARD + QUIET_AFTER_S - 0.1) is None
    assert quiet_for(HEARD, HEARD + QUIET_AFTER_S) == QUIET_AFTER_S
    assert quiet_for(HEARD, HEARD + 7) == 7


def test_the_quiet_is_told_once_then_its_end_once() -> None:
    quiet = MasterQuiet()
    assert quiet.check(HEARD, lost=False, now=HEARD + 1) == []
    (begun,) = quiet.check(HEARD, lost=False, now=HEARD + QUIET_AFTER_S)
    assert begun.at == HEARD + QUIET_AFTER_S and begun.level == "warn"
    assert begun.text == (
        f"no word from the master for {QUIET_AFTER_S:.1f} s: its nodes are judged as of "
        f"{clock_time(HEARD)}, its last word"
    )
    assert quiet.check(HEARD, lost=False, now=HEARD + 9) == []
    (ended,) = quiet.check(HEARD + 9.5, lost=False, now=HEARD + 9.5)
    assert (ended.at, ended.level) == (HEARD + 9.5, "good")
    assert ended.text == "the master spoke again after 9.5 s"
    assert quiet.check(HEARD + 10, lost=False, now=HEARD + 10) == []


def test_a_lost_connection_forgets_the_quiet_without_a_line() -> None:
    quiet = MasterQuiet()
    assert len(quiet.check(HEARD, lost=False, now=HEARD + QUIET_AFTER_S)) == 1
    assert quiet.check(HEARD, lost=True, now=HEARD + 12) == []
    assert quiet.check(HEARD + 13, lost=False, now=HEARD + 13) == []  # no "spoke again"


def test_known_until_is_the_earliest_of_now_the_last_word_and_the_loss() -> None:
    assert MasterClock().known_until(HEARD) == HEARD
    assert MasterClock(heard_at=HEARD).known_until(HEARD + 5) == HEARD
    assert MasterClock(heard_at=HEARD + 9).known_until(HEARD + 5) == HEARD + 5
    assert MasterClock(stale_since=HEARD + 2, heard_at=HEARD + 4).known_until(HEARD + 9) == (
        HEARD + 2
    )
    assert MasterClock(stale_since=HEARD + 4, heard_at=HEARD + 2).known_until(HEARD + 9) == (
        HEARD + 2
    )


def test_a_node_is_quiet_only_up_to_the_masters_last_word() -> None:
    clock = MasterClock(offset_s=0.0, heard_at=HEARD)
    assert clock.quiet_for(iso(HEARD - 2), HEARD + 30) == 2
    assert clock.silent_since(HEARD - 2, HEARD + 30) == 2
    speaking = MasterClock(offset_s=0.0, heard_at=HEARD + 30)
    assert speaking.quiet_for(iso(HEARD - 2), HEARD + 30) == 32


def test_after_a_quiet_the_nodes_are_judged_as_of_the_word_before_it_while_it_catches_up() -> None:
    word = MasterWord()
    last = word.last
    word.heard(HEARD)
    word.heard(HEARD + 1)  # a keepalive a second later: no quiet, no catching up
    assert (last.heard_at, last.catching_up_until) == (HEARD + 1, None)
    word.heard(HEARD + 1 + QUIET_AFTER_S)
    assert last.word_before_quiet == HEARD + 1
    assert last.catching_up_until == HEARD + 1 + QUIET_AFTER_S + CATCH_UP_S

    until = HEARD + 1 + QUIET_AFTER_S + CATCH_UP_S
    assert word.clock(0.0, None).known_until(until - 0.1) == HEARD + 1
    word.heard(until - 0.5)  # more words while catching up do not end it early
    assert word.clock(0.0, None).known_until(until - 0.1) == HEARD + 1
    assert word.clock(0.0, None).known_until(until) == until - 0.5


def test_the_masters_word_makes_the_clock_the_header_and_the_timeline_read() -> None:
    word = MasterWord()
    word.heard(HEARD)
    assert word.clock(30.0, None) == MasterClock(30.0, None, HEARD)
    assert word.quiet_s(HEARD + 5, lost=False) == 5
    assert word.quiet_s(HEARD + 5, lost=True) is None  # the header says the loss instead
    (told,) = word.check(lost=False, now=HEARD + 5)
    assert told.text.startswith("no word from the master for 5.0 s")
    word.heard(HEARD + 6)
    assert word.clock(30.0, HEARD + 9) == MasterClock(
        30.0, HEARD + 9, HEARD + 6, HEARD, HEARD + 6 + CATCH_UP_S
    )
    (ended,) = word.check(lost=False, now=HEARD + 6)
    assert ended.text == "the master spoke again after 6.0 s"
