"""``keeper.model.request_rule``: the front door's one rule for a chat request (docs/design.md
§8.6), each boundary pinned down, then checked against a reference written apart from it over
every ``SoFar`` hypothesis builds (``so_fars``, shared with the properties of the rule's contract
in ``test_request_rule_properties.py``, which are not stated again here)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from test_request_rule_properties import so_fars

from keeper.model.request_rule import (
    STRANDED_AFTER_S,
    Action,
    Done,
    Fail,
    Happened,
    Hold,
    PassOn,
    Send,
    SoFar,
    next_action,
    outcome,
    stranded,
)

FRESH = SoFar(
    last=None,
    deployed=True,
    serving=True,
    first_token_sent=False,
    exact=True,
    cuts=0,
    held_s=0.0,
    hold_s=30.0,
    max_migrations=2,
)


def test_a_new_request_to_a_serving_deployment_is_sent() -> None:
    assert next_action(FRESH) == Send(continuation=False)


def test_a_new_request_waits_while_its_deployment_is_not_serving() -> None:
    assert next_action(replace(FRESH, serving=False)) == Hold()


def test_not_serving_past_the_hold_is_sent_once_anyway() -> None:
    # exo may have an instance the view does not count yet.
    assert next_action(replace(FRESH, serving=False, held_s=30.0)) == Send(continuation=False)
    assert next_action(replace(FRESH, serving=False, held_s=29.99)) == Hold()


def test_hold_zero_never_holds() -> None:
    assert next_action(replace(FRESH, serving=False, hold_s=0.0)) == Send(continuation=False)
    no_instance = replace(FRESH, last="no_instance", hold_s=0.0, sends=1)
    assert next_action(no_instance) == Fail("not_serving")


@pytest.mark.parametrize("last", ["no_instance", "upstream_error", "unreachable"])
def test_a_transient_trouble_is_waited_on_then_sent_again(last: Happened) -> None:
    so_far = replace(FRESH, last=last, sends=1)
    assert next_action(so_far) == Hold()
    assert next_action(replace(so_far, held_s=29.9)) == Hold()
    # Once it has waited a moment, and the deployment serves, it goes again.
    assert next_action(replace(so_far, paused=True)) == Send(continuation=False)
    # While the deployment does not serve, it waits on.
    assert next_action(replace(so_far, paused=True, serving=False)) == Hold()
    # With no deployment there is no view to wait on: a moment, then again (but exo's 404,
    # which is passed on: nothing is coming).
    no_deployment = next_action(replace(so_far, paused=True, deployed=False))
    assert no_deployment == (PassOn() if last == "no_instance" else Send(continuation=False))


@pytest.mark.parametrize("last", ["no_instance", "upstream_error", "unreachable"])
def test_a_transient_trouble_past_the_hold_is_refused(last: Happened) -> None:
    so_far = replace(FRESH, last=last, sends=1, held_s=30.0)
    assert next_action(so_far) == Fail("not_serving")
    assert next_action(replace(so_far, paused=True)) == Fail("not_serving")
    assert next_action(replace(so_far, held_s=29.99, paused=True)) == Send(continuation=False)


def test_a_model_with_no_deployment_gets_exos_404_at_once() -> None:
    assert next_action(replace(FRESH, last="no_instance", deployed=False)) == PassOn()
    # ... and is sent whatever the view says of it: there is no deployment to wait for.
    assert next_action(replace(FRESH, deployed=False, serving=False)) == Send(continuation=False)
    # A 5xx is still worth waiting out for it.
    assert next_action(replace(FRESH, last="upstream_error", deployed=False)) == Hold()


def test_a_continuations_404_for_a_model_no_longer_deployed_ends_the_stream() -> None:
    # Its deployment went while the client read the answer: nothing is coming to continue it,
    # and exo's 404 cannot be passed on as the answer's status (the client has a 200 and part
    # of the answer), so the stream ends with an error event.
    gone = replace(FRESH, last="no_instance", deployed=False, serving=False, cuts=1, sends=2)
    assert next_action(replace(gone, first_token_sent=True)) == Fail("refused_mid_stream")
    assert next_action(gone) == PassOn()


def test_answered_is_done_with_its_outcome() -> None:
    assert next_action(replace(FRESH, last="answered", sends=1)) == Done("ok")
    held = replace(FRESH, last="answered", sends=1, held=True)
    assert next_action(held) == Done("held")
    assert next_action(replace(held, sends=2)) == Done("retried")
    migrated = replace(held, sends=2, cuts=1, first_token_sent=True, continuations=1)
    assert next_action(migrated) == Done("migrated")


def test_outcome_names_the_most_that_happened() -> None:
    assert outcome(replace(FRESH, sends=1)) == "ok"
    assert outcome(replace(FRESH, sends=1, held=True)) == "held"
    assert outcome(replace(FRESH, sends=2)) == "retried"
    # A cut before the first token is answered by sending again: retried, not migrated,
    # though the answer sent again has reached the client since.
    assert outcome(replace(FRESH, sends=2, cuts=1, first_token_sent=True)) == "retried"
    assert outcome(replace(FRESH, sends=2, cuts=1, continuations=1)) == "migrated"
    assert outcome(replace(FRESH, sends=1, first_token_sent=True)) == "ok"


def test_a_client_gone_is_cancelled_whatever_else() -> None:
    assert next_action(replace(FRESH, last="client_gone")) == Done("cancelled")
    gone = replace(FRESH, last="client_gone", first_token_sent=True, exact=False, cuts=9)
    assert next_action(gone) == Done("cancelled")


def test_garbage_is_a_failure() -> None:
    assert next_action(replace(FRESH, last="garbage")) == Fail("garbage")
    assert next_action(replace(FRESH, last="garbage", first_token_sent=True)) == Fail("garbage")


def test_a_refusal_is_passed_on_before_the_first_token_only() -> None:
    assert next_action(replace(FRESH, last="refused")) == PassOn()
    mid = replace(FRESH, last="refused", first_token_sent=True)
    assert next_action(mid) == Fail("refused_mid_stream")


def test_a_cut_stream_is_continued_after_the_first_token() -> None:
    cut = replace(FRESH, last="cut", cuts=1, sends=1, first_token_sent=True)
    assert next_action(cut) == Send(continuation=True)


def test_a_cut_before_the_first_token_is_sent_again_from_scratch() -> None:
    cut = replace(FRESH, last="cut", cuts=1, sends=1)
    assert next_action(cut) == Send(continuation=False)
    # Not exact does not matter then: the client has nothing to continue.
    assert next_action(replace(cut, exact=False)) == Send(continuation=False)


def test_a_cut_continued_at_most_max_migrations_times() -> None:
    cut = replace(FRESH, last="cut", first_token_sent=True, sends=3)
    assert next_action(replace(cut, cuts=2)) == Send(continuation=True)
    assert next_action(replace(cut, cuts=3)) == Fail("cuts")
    assert next_action(replace(cut, cuts=1, max_migrations=0)) == Fail("cuts")
    # Before the first token the same bound holds.
    assert next_action(replace(cut, cuts=3, first_token_sent=False)) == Fail("cuts")


def test_a_cut_that_cannot_be_continued_exactly_ends_with_an_error() -> None:
    cut = replace(FRESH, last="cut", cuts=1, first_token_sent=True, exact=False)
    assert next_action(cut) == Fail("inexact")


def test_a_cut_while_the_deployment_fails_over_waits_for_it() -> None:
    cut = replace(FRESH, last="cut", cuts=1, first_token_sent=True, serving=False)
    assert next_action(cut) == Hold()
    assert next_action(replace(cut, held_s=30.0)) == Send(continuation=True)


def test_a_continuation_that_finds_no_instance_waits_then_fails() -> None:
    lost = replace(FRESH, last="no_instance", cuts=1, first_token_sent=True, serving=False)
    assert next_action(lost) == Hold()
    assert next_action(replace(lost, paused=True)) == Hold()
    assert next_action(replace(lost, paused=True, serving=True)) == Send(continuation=True)
    assert next_action(replace(lost, held_s=31.0)) == Fail("not_serving")


# --- against a reference ------------------------------------------------------------------------


def reference(s: SoFar) -> Action:
    """The rule as docs/design.md §8.6 states it, written as a table of cases."""
    ends = {"answered": None, "client_gone": Done("cancelled"), "garbage": Fail("garbage")}
    if s.last in ends:
        found = ends[s.last]
        return found if found is not None else Done(outcome(s))
    if s.last == "refused":
        return PassOn() if not s.first_token_sent else Fail("refused_mid_stream")
    if s.last == "cut" and s.first_token_sent and not s.exact:
        return Fail("inexact")
    if s.last == "cut" and s.cuts - 1 >= s.max_migrations:
        return Fail("cuts")
    if s.last == "no_instance" and not s.deployed:
        return PassOn() if not s.first_token_sent else Fail("refused_mid_stream")
    exos_trouble = s.last in ("no_instance", "upstream_error", "unreachable")
    may_wait = s.hold_s - s.held_s > 0
    if exos_trouble and not may_wait:
        return Fail("not_serving")
    if may_wait and ((s.deployed and not s.serving) or (exos_trouble and not s.paused)):
        return Hold()
    return Send(s.first_token_sent)


@given(so_fars())
def test_the_rule_agrees_with_its_reference(so_far: SoFar) -> None:
    assert next_action(so_far) == reference(so_far)


def test_an_attempt_is_stranded_once_none_of_its_instances_is_left_and_it_is_quiet() -> None:
    on = frozenset({"i1", "i2"})
    quiet = STRANDED_AFTER_S
    assert stranded(on, frozenset(), quiet) == (
        f"no token for {quiet:.0f} s and none of the instances it may be on is left "
        "(node dead or gone, or exo's master changed)"
    )
    assert stranded(on, frozenset({"i3"}), quiet + 60) is not None  # a new one is no home
    assert stranded(on, frozenset({"i2", "i3"}), quiet + 60) is None  # one of them is left
    assert stranded(on, frozenset(), quiet - 0.01) is None  # not quiet long enough
    # sent while the model had no instance in view: nothing to tell it by
    assert stranded(frozenset(), frozenset(), quiet + 60) is None
