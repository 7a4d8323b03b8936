"""When a deployment's chats are announced failing and answered again
(``keeper.core.request_alerts``, docs/design.md §6.9): a run, not one flaky chat; the client's
cancellations and the front door's rejections are nobody's failure; once per run, with
hysteresis; silence is not recovery; ids that stay the same; the words an operator reads."""

from __future__ import annotations

import pytest
from keeper_harness import card

from keeper.core.request_alerts import (
    FAILING_WINDOW_S,
    MIN_FAILED,
    MIN_FAILED_SHARE,
    RECOVERED_SHARE,
    RECOVERY_WINDOW_S,
    ChatAlertMemory,
    Tally,
    answered_since_failed,
    chat_notices,
    has_recovered,
    is_failing,
    status_words,
    tally,
)
from keeper.model.notices import (
    NOTICE_ADAPTER,
    AnyNotice,
    RequestsFailing,
    RequestsRecovered,
    iso_utc_of,
)
from keeper.model.request_rule import Outcome
from keeper.model.request_window import WINDOW_S, EndedRequest
from keeper.model.state import Deployment, State

MODEL = card("m")
DEPLOYMENT = Deployment(deployment_id="d1", model_card=MODEL)
STATE = State(deployments={"d1": DEPLOYMENT})
# The records' clock (monotonic) and the wall clock at the same moment: 2026-12-01 12:03:04 UTC
# at monotonic 1,000, so the texts' times can be checked.
NOW = 1_000.0
WALL = 1_796_126_584.0


def ended(at: float, outcome: Outcome) -> EndedRequest:
    return EndedRequest(at, outcome, None)


def chats(*pairs: tuple[float, Outcome]) -> list[EndedRequest]:
    return [ended(at, outcome) for at, outcome in sorted(pairs)]


class Door:
    """One deployment's chats as the front door keeps them, looked at as a service does."""

    def __init__(self, state: State = STATE, memory: ChatAlertMemory | None = None) -> None:
        self.state = state
        self.records: list[EndedRequest] = []
        self.memory = memory if memory is not None else ChatAlertMemory()

    def chat(self, at: float, outcome: Outcome, times: int = 1) -> Door:
        self.records.extend(ended(at, outcome) for _ in range(times))
        return self

    def look(self, now: float) -> list[AnyNotice]:
        found, self.memory = chat_notices(
            {"d1": self.records}, self.state, now, WALL + now - NOW, self.memory
        )
        return found


def kinds(found: list[AnyNotice]) -> list[str]:
    return [notice.kind for notice in found]


# --- a run of failures --------------------------------------------------------------------


@pytest.mark.parametrize("failed", range(MIN_FAILED))
def test_fewer_failures_than_a_run_say_nothing(failed: int) -> None:
    door = Door()
    for i in range(failed):
        door.chat(NOW - i, "failed")
    assert door.look(NOW) == []
    assert door.memory == ChatAlertMemory()


def test_a_run_of_failures_in_a_minute_is_announced_with_its_words() -> None:
    door = Door().chat(NOW - 50, "ok").chat(NOW - 40, "failed").chat(NOW - 20, "failed")
    door.chat(NOW - 10, "failed")
    (notice,) = door.look(NOW)
    assert isinstance(notice, RequestsFailing)
    since = WALL - 40
    assert notice.id == f"requests_failing:d1:{iso_utc_of(since)}"
    assert (notice.deployment_id, notice.model_id) == ("d1", "m")
    assert (notice.failed, notice.chats, notice.window_s) == (3, 4, FAILING_WINDOW_S)
    assert (notice.since, notice.at, notice.status) == (
        iso_utc_of(since),
        iso_utc_of(WALL),
        "placing",
    )
    assert notice.text == (
        "exo-deploy: chats to m (deployment d1) are failing: 3 of 4 failed in the last 1 min, "
        "the first at 12:02:24 UTC; its status: placing"
    )
    assert door.memory == ChatAlertMemory({"d1": since})


def test_failures_spread_over_more_than_a_minute_are_no_run() -> None:
    # The oldest ended exactly a window ago: it is out of the window.
    door = Door().chat(NOW - FAILING_WINDOW_S, "failed").chat(NOW - 30, "failed")
    door.chat(NOW, "failed")
    assert door.look(NOW) == []
    door.chat(NOW + 1, "failed")
    assert kinds(door.look(NOW + 1)) == ["requests_failing"]


def test_a_busy_deployment_with_a_few_failures_is_serving() -> None:
    # A quarter of the chats failing is a run; a little less is not.
    under = Door().chat(NOW - 1, "failed", MIN_FAILED).chat(NOW - 2, "ok", 10)
    assert MIN_FAILED / (MIN_FAILED + 10) < MIN_FAILED_SHARE
    assert under.look(NOW) == []
    at_share = Door().chat(NOW - 1, "failed", MIN_FAILED).chat(NOW - 2, "ok", 9)
    assert MIN_FAILED / (MIN_FAILED + 9) == MIN_FAILED_SHARE
    assert kinds(at_share.look(NOW)) == ["requests_failing"]


@pytest.mark.parametrize("answered", ["held", "retried", "migrated"])
def test_a_held_retried_or_migrated_chat_was_answered(answered: Outcome) -> None:
    door = Door().chat(NOW - 1, "failed", MIN_FAILED).chat(NOW - 2, answered, 10)
    assert door.look(NOW) == []


def test_cancelled_and_rejected_chats_are_nobodys_failure_nor_dilute_one() -> None:
    door = Door().chat(NOW - 5, "rejected", 30).chat(NOW - 5, "cancelled", 30)
    door.chat(NOW - 4, "failed", MIN_FAILED - 1)
    assert door.look(NOW) == []
    door.chat(NOW - 1, "failed")
    (notice,) = door.look(NOW)
    assert isinstance(notice, RequestsFailing)
    assert (notice.failed, notice.chats) == (MIN_FAILED, MIN_FAILED)


def test_a_run_is_announced_once_however_long_it_lasts() -> None:
    door = Door()
    sent: list[AnyNotice] = []
    for second in range(600):
        door.chat(NOW + second, "failed")
        sent += door.look(NOW + second)
    assert kinds(sent) == ["requests_failing"]


def test_a_chat_that_ended_while_the_service_looked_counts() -> None:
    # The step's ``now`` is read before the step; chats end meanwhile.
    door = Door().chat(NOW + 0.5, "failed", MIN_FAILED)
    assert kinds(door.look(NOW)) == ["requests_failing"]


# --- recovery, with hysteresis ------------------------------------------------------------


def failing_door() -> Door:
    door = Door().chat(NOW - 3, "failed").chat(NOW - 2, "failed").chat(NOW - 1, "failed")
    assert kinds(door.look(NOW)) == ["requests_failing"]
    return door


def test_chats_answered_again_are_announced_once_the_failures_thinned() -> None:
    door = failing_door()
    door.chat(NOW + 5, "ok")
    # While the three failures are in the recovery window, still failing; once the first
    # leaves it, fewer than a run are left.
    assert door.look(NOW - 3 + RECOVERY_WINDOW_S - 0.5) == []
    (notice,) = door.look(NOW - 3 + RECOVERY_WINDOW_S)
    assert isinstance(notice, RequestsRecovered)
    since = iso_utc_of(WALL - 3)
    assert notice.id == f"requests_recovered:d1:{since}"
    assert (notice.since, notice.last_failed) == (since, iso_utc_of(WALL - 1))
    assert (notice.answered, notice.failed, notice.window_s) == (1, 2, RECOVERY_WINDOW_S)
    assert notice.at == iso_utc_of(WALL - 3 + RECOVERY_WINDOW_S)
    assert notice.text == (
        "exo-deploy: chats to m (deployment d1) are answered again: 1 answered since the last "
        "failed one at 12:03:03 UTC (failing since 12:03:01 UTC, 2 failed in the last 3 min)"
    )
    assert door.memory == ChatAlertMemory()
    assert door.look(NOW + 400) == []  # once


def test_silence_is_not_recovery() -> None:
    door = failing_door()
    assert door.look(NOW + 3600) == []
    assert "d1" in door.memory.failing
    door.chat(NOW + 3600, "ok")
    assert kinds(door.look(NOW + 3600)) == ["requests_recovered"]


def test_the_newest_chat_failing_is_not_recovery_however_few_failed() -> None:
    door = failing_door()
    door.chat(NOW + 300, "ok").chat(NOW + 301, "failed").chat(NOW + 302, "cancelled")
    assert door.look(NOW + 303) == []
    door.chat(NOW + 304, "held")
    assert kinds(door.look(NOW + 304)) == ["requests_recovered"]


def test_a_steady_rate_between_the_bars_neither_opens_nor_closes() -> None:
    """Two failures a minute among answered chats: under the bar to open (three a minute), over
    the bar to close (under three in three minutes): no storm either way."""
    door = Door()
    sent: list[AnyNotice] = []
    for minute in range(10):
        start = NOW + 60 * minute
        door.chat(start + 10, "failed").chat(start + 40, "failed").chat(start + 50, "ok")
        sent += door.look(start + 59)
    assert sent == []
    door.chat(NOW + 600, "failed")  # three in the last minute: a run
    for minute in range(10, 20):
        start = NOW + 60 * minute
        sent += door.look(start)
        door.chat(start + 10, "failed").chat(start + 40, "failed").chat(start + 50, "ok")
        sent += door.look(start + 59)
    assert kinds(sent) == ["requests_failing"]


def test_a_busy_deployment_recovers_under_a_tenth_failing() -> None:
    door = failing_door()
    later = NOW + 60
    door.chat(later, "failed", MIN_FAILED).chat(later + 1, "ok", 10 * MIN_FAILED)
    assert MIN_FAILED / (11 * MIN_FAILED) < RECOVERED_SHARE
    # The three failures of the run are in the window too: 6 of 36 is over a tenth.
    assert door.look(later + 2) == []
    door.chat(later + 3, "ok", 30)
    assert kinds(door.look(later + 4)) == ["requests_recovered"]


def test_the_recovery_bars_at_their_boundaries() -> None:
    records = chats((NOW, "ok"))
    assert has_recovered(Tally(chats=10, failed=MIN_FAILED - 1), records)
    assert not has_recovered(Tally(chats=10, failed=MIN_FAILED), records)
    assert not has_recovered(Tally(chats=30, failed=MIN_FAILED), records)  # exactly a tenth
    assert has_recovered(Tally(chats=31, failed=MIN_FAILED), records)
    assert not has_recovered(Tally(), [])  # nothing answered: not recovered
    assert is_failing(Tally(chats=12, failed=3)) and not is_failing(Tally(chats=13, failed=3))
    assert not is_failing(Tally(chats=2, failed=2))


def test_a_restart_keeps_the_run_and_its_ids() -> None:
    door = failing_door()
    kept = door.memory
    again = Door(memory=kept).chat(NOW + 500, "failed", 5)
    assert again.look(NOW + 500) == []  # announced before the restart
    again.chat(NOW + 501, "ok")
    (notice,) = again.look(NOW + 900)
    assert isinstance(notice, RequestsRecovered)
    assert notice.since == iso_utc_of(WALL - 3)  # the id of the notice before the restart


def test_a_restart_that_lost_the_failed_chats_says_so() -> None:
    door = Door(memory=ChatAlertMemory({"d1": WALL - 100})).chat(NOW, "ok")
    (notice,) = door.look(NOW + 1)
    assert isinstance(notice, RequestsRecovered)
    assert (notice.last_failed, notice.answered) == (None, 1)
    assert notice.text.endswith(
        "answered again: 1 answered with no failed chat on record (failing since 12:01:24 UTC, "
        "0 failed in the last 3 min)"
    )


# --- which deployments ----------------------------------------------------------------------


def test_a_deleted_deployment_is_forgotten_and_a_model_with_none_is_nobodys() -> None:
    failing = {"gone": 5.0}
    records = {"": [ended(NOW, "failed")] * 5}
    found, memory = chat_notices(records, STATE, NOW, WALL, ChatAlertMemory(failing))
    assert found == [] and memory == ChatAlertMemory()


def test_chats_of_no_deployment_hide_no_deployments_run() -> None:
    records = {"": [ended(NOW, "failed")] * 5, "d1": [ended(NOW, "failed")] * 3}
    found, _ = chat_notices(records, STATE, NOW, WALL, ChatAlertMemory())
    assert [(n.kind, getattr(n, "deployment_id", None)) for n in found] == [
        ("requests_failing", "d1")
    ]


def test_a_deployment_not_looked_at_keeps_its_memory() -> None:
    other = Deployment(deployment_id="d2", model_card=card("m2"))
    state = State(deployments={"d1": DEPLOYMENT, "d2": other})
    memory = ChatAlertMemory({"d2": 5.0})
    found, after = chat_notices({"d1": chats((NOW, "ok"))}, state, NOW, WALL, memory)
    assert found == [] and after is memory
    failed = [ended(NOW, "failed")] * 3
    found, after = chat_notices({"d1": failed}, state, NOW, WALL, memory)
    assert kinds(found) == ["requests_failing"]
    assert after == ChatAlertMemory({"d2": 5.0, "d1": WALL})


def test_each_deployment_is_judged_on_its_own_chats() -> None:
    other = Deployment(deployment_id="d2", model_card=card("m2"))
    state = State(deployments={"d1": DEPLOYMENT, "d2": other})
    failed = [ended(NOW, "failed")] * 3
    found, _ = chat_notices(
        {"d1": chats((NOW, "ok")), "d2": failed}, state, NOW, WALL, ChatAlertMemory()
    )
    assert [(n.kind, getattr(n, "deployment_id", None)) for n in found] == [
        ("requests_failing", "d2")
    ]


def test_the_status_is_in_words_with_placements_reason() -> None:
    stuck = DEPLOYMENT.model_copy(update={"placement_error": "needs 378 GB"})
    state = State(deployments={"d1": stuck})
    assert status_words(stuck, state) == "cant_place: needs 378 GB"
    door = Door(state).chat(NOW, "failed", 3)
    (notice,) = door.look(NOW)
    assert isinstance(notice, RequestsFailing)
    assert notice.status == "cant_place: needs 378 GB"
    assert notice.text.endswith("its status: cant_place: needs 378 GB")


def test_tally_counts_judged_chats_of_the_window_only() -> None:
    records = chats(
        (NOW - 61, "failed"),
        (NOW - 60, "failed"),
        (NOW - 59, "failed"),
        (NOW - 30, "rejected"),
        (NOW - 20, "ok"),
        (NOW - 10, "failed"),
    )
    assert tally(records, NOW, 60.0) == Tally(chats=3, failed=2, first_failed=NOW - 59)
    assert tally([], NOW, 60.0) == Tally()


def test_the_windows_fit_in_what_the_front_door_keeps() -> None:
    assert FAILING_WINDOW_S < RECOVERY_WINDOW_S <= WINDOW_S


def test_the_notices_read_back_as_their_kinds() -> None:
    door = failing_door()
    door.chat(NOW + 1, "ok")
    recovered = door.look(NOW + 400)
    for notice in [*Door().chat(NOW, "failed", 3).look(NOW), *recovered]:
        read = NOTICE_ADAPTER.validate_json(notice.model_dump_json())
        assert read == notice and type(read) is type(notice)


def test_answered_since_the_newest_failure_counts_judged_chats_only() -> None:
    records = chats(
        (1.0, "ok"),
        (2.0, "failed"),
        (3.0, "ok"),
        (4.0, "cancelled"),
        (5.0, "rejected"),
        (6.0, "held"),
    )
    assert answered_since_failed(records) == (2, 2.0)
    assert answered_since_failed(chats((1.0, "ok"), (2.0, "retried"))) == (2, None)
    assert answered_since_failed([]) == (0, None)
