"""The in-flight rules for instances POSTed to exo, as pure functions of a creation and ``now``."""

from __future__ import annotations

from keeper.bridge.in_flight import (
    APPLY_S,
    RESEND_S,
    Creation,
    answered,
    detail,
    first_send,
    given_up,
    master_changed,
    resend_due,
    resent,
    unanswered,
)
from keeper.model.constants import PLACEMENT_TIMEOUT

BODY = {"instance": {"MlxRingInstance": {"instanceId": "i-1"}}}


def sent_at(now: float) -> Creation:
    return first_send("d-1", BODY, now)


def test_an_answered_creation_is_resent_every_few_seconds_until_the_keeper_s_wait_ends() -> None:
    creation = answered(sent_at(0.0), 0.1)
    assert not resend_due(creation, RESEND_S - 0.1)
    assert resend_due(creation, RESEND_S)
    late = answered(resent(creation, PLACEMENT_TIMEOUT - RESEND_S), PLACEMENT_TIMEOUT - RESEND_S)
    # The last resend must be answered and settled by the time the keeper stops waiting.
    assert not resend_due(late, PLACEMENT_TIMEOUT - APPLY_S + 0.1)
    assert not resend_due(late, PLACEMENT_TIMEOUT + 100)


def test_an_answered_creation_is_given_up_when_the_keeper_s_wait_ends() -> None:
    creation = answered(resent(answered(sent_at(0.0), 0.1), 25.0), 25.1)
    assert not given_up(creation, PLACEMENT_TIMEOUT - 0.1)
    assert given_up(creation, PLACEMENT_TIMEOUT)


def test_a_fresh_answer_delays_giving_up_until_it_had_time_to_apply() -> None:
    creation = answered(resent(sent_at(0.0), 29.0), 29.5)
    assert not given_up(creation, 30.0)
    assert given_up(creation, 29.5 + APPLY_S)


def test_an_unanswered_creation_is_never_given_up_and_keeps_being_resent() -> None:
    creation = unanswered(sent_at(0.0))
    assert creation.unanswered_since == 0.0
    for now in (PLACEMENT_TIMEOUT, 10 * PLACEMENT_TIMEOUT, 1000 * PLACEMENT_TIMEOUT):
        assert not given_up(creation, now)
        assert resend_due(creation, now)
    again = unanswered(resent(creation, 40.0))
    assert again.unanswered_since == 0.0  # since the first POST without an answer
    assert again.sends == 2
    assert not resend_due(again, 40.0 + RESEND_S - 0.1)


def test_one_answer_ends_the_silence_and_the_ordinary_rules_apply_again() -> None:
    creation = answered(unanswered(resent(unanswered(sent_at(0.0)), 12.0)), 50.0)
    assert creation.unanswered_since is None
    assert not given_up(creation, 50.0 + APPLY_S - 0.1)
    assert given_up(creation, 50.0 + APPLY_S)
    assert not resend_due(creation, 60.0)


def test_a_creation_never_answered_yet_is_not_given_up() -> None:
    assert not given_up(sent_at(0.0), 10 * PLACEMENT_TIMEOUT)


def test_the_detail_says_whether_exo_answers() -> None:
    assert detail("0123456789", answered(sent_at(0.0), 0.1), 3.0) == (
        "instance 01234567 sent to exo; waiting for exo's State to show it"
    )
    silent = detail("0123456789", unanswered(sent_at(0.0)), 14.2)
    assert silent.startswith("instance 01234567: exo has not answered POST /instance for 14 s")


def test_a_master_change_makes_a_resend_due_at_once_and_the_resend_ends_it() -> None:
    creation = master_changed(answered(sent_at(0.0), 0.1))
    assert resend_due(creation, 0.2)
    again = resent(creation, 0.2)
    assert not again.master_changed and not resend_due(again, 0.3)
