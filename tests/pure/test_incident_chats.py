"""How many chats each incident touched (``keeper.model.incident_chats``, docs/design.md §3.5),
and what the front door's counts keep for it (``keeper.runtime.request_counts``): chats held
through an incident end after it and still count for it, each second goes to one incident,
an incident from before the counts began is unknown, never zero; the counts keep the notable
outcomes by second, bounded, on the wall clock when read, and tell a watcher of each chat."""

from __future__ import annotations

import pytest

from keeper.model.api_models import IncidentChats, IncidentView
from keeper.model.history import Incident
from keeper.model.incident_chats import (
    CHAT_TAIL_S,
    ChatSecond,
    KeptChats,
    chats_words,
    incident_chats,
    one_more,
)
from keeper.model.request_rule import Outcome
from keeper.runtime.request_counts import MAX_NOTABLE_SECONDS, RequestCounts

T0 = 1_796_126_584.0


def incident(start: float, end: float | None) -> Incident:
    return Incident(start=start, end=end, downtime_s=0.0, cause="c")


def counts(held: int = 0, retried: int = 0, migrated: int = 0, failed: int = 0) -> IncidentChats:
    return IncidentChats(held=held, retried=retried, migrated=migrated, failed=failed)


def test_chats_held_through_an_incident_count_for_it_until_its_tail_ends() -> None:
    down = incident(T0, T0 + 10)
    seconds = [
        ChatSecond(T0 - 5, failed=7),  # before it: not its
        ChatSecond(T0 + 2, failed=2, migrated=1),
        ChatSecond(T0 + 3, failed=1, migrated=2, retried=2),
        ChatSecond(T0 + 12, held=3),  # sent when it served again, ended after
        ChatSecond(T0 + 10 + CHAT_TAIL_S, held=1, retried=1),  # the tail's last second
        ChatSecond(T0 + 10 + CHAT_TAIL_S + 1, held=9),  # past the tail
    ]
    assert incident_chats([down], KeptChats(T0 - 100, seconds)) == [
        counts(held=4, retried=3, migrated=3, failed=3)
    ]


def test_the_second_an_incident_begins_in_is_its() -> None:
    down = incident(T0 + 0.5, T0 + 10)
    kept = KeptChats(0.0, [ChatSecond(T0 - 0.5, migrated=1), ChatSecond(T0, migrated=2)])
    # The second from T0 - 0.5 ends at T0 + 0.5: it ended as the incident began, not in it.
    assert incident_chats([down], kept) == [counts(migrated=2)]


def test_each_second_goes_to_the_last_incident_begun() -> None:
    first, second = incident(T0, T0 + 10), incident(T0 + 30, None)
    kept = KeptChats(
        0.0,
        [ChatSecond(T0 + 20, held=1), ChatSecond(T0 + 35, held=2), ChatSecond(T0 + 9999, failed=1)],
    )
    assert incident_chats([first, second], kept) == [counts(held=1), counts(held=2, failed=1)]


def test_an_incident_from_before_the_counts_began_is_unknown() -> None:
    before, after = incident(T0, T0 + 10), incident(T0 + 100, T0 + 110)
    kept = KeptChats(T0 + 50, [ChatSecond(T0 + 5, failed=1), ChatSecond(T0 + 105, failed=1)])
    assert incident_chats([before, after], kept) == [None, counts(failed=1)]
    assert incident_chats([incident(T0 + 50, None)], kept) == [counts(failed=1)]
    assert incident_chats([], kept) == []


@pytest.mark.parametrize("outcome", ["held", "retried", "migrated", "failed"])
def test_one_more_counts_each_notable_outcome(outcome: Outcome) -> None:
    once = one_more(ChatSecond(T0), outcome)
    assert getattr(once, outcome) == 1
    assert sum((once.held, once.retried, once.migrated, once.failed)) == 1
    assert getattr(one_more(once, outcome), outcome) == 2


@pytest.mark.parametrize("outcome", ["ok", "cancelled", "rejected"])
def test_an_outcome_that_met_no_incident_is_not_counted(outcome: Outcome) -> None:
    assert one_more(ChatSecond(T0, held=1), outcome) == ChatSecond(T0, held=1)


def test_an_old_client_reads_an_incident_without_chats() -> None:
    old = IncidentView.model_validate({"start": "s", "end": None, "downtimeS": 1.0, "cause": "c"})
    assert old.chats is None
    new = IncidentView(start="s", end=None, downtime_s=1.0, cause="c", chats=counts(held=2))
    assert new.model_dump(mode="json")["chats"] == {
        "held": 2,
        "retried": 0,
        "migrated": 0,
        "failed": 0,
    }
    assert IncidentChats.model_validate({"failed": 1}) == counts(failed=1)


# --- what the front door's counts keep --------------------------------------------------------


def test_the_counts_keep_notable_chats_by_second_on_the_wall_clock() -> None:
    door = RequestCounts(None)
    for at, outcome in [
        (100.2, "held"),
        (100.7, "held"),
        (100.9, "failed"),
        (101.0, "ok"),
        (101.1, "cancelled"),
        (101.5, "rejected"),
        (102.3, "migrated"),
        (102.4, "retried"),
    ]:
        door.count("d1", outcome, None, at)  # type: ignore[arg-type]
    kept = door.kept("d1", now=200.0, wall=T0 + 200.0, started_at=T0 + 50)
    assert kept.complete_from == T0 + 50
    assert list(kept.seconds) == [
        ChatSecond(T0 + 100, held=2, failed=1),
        ChatSecond(T0 + 102, retried=1, migrated=1),
    ]
    assert door.kept("other", now=0.0, wall=T0, started_at=T0) == KeptChats(T0, [])
    # Asked before the service started (no start yet): whole from now on.
    assert door.kept("other", now=1.0, wall=T0 + 1, started_at=None).complete_from == T0 + 1


def test_the_counts_keep_a_bounded_number_of_seconds_and_say_from_when() -> None:
    door = RequestCounts(None)
    for second in range(MAX_NOTABLE_SECONDS + 2):
        door.count("d1", "failed", None, float(second))
    kept = door.kept("d1", now=0.0, wall=1000.0, started_at=1000.0)
    assert len(kept.seconds) == MAX_NOTABLE_SECONDS
    assert kept.seconds[0].at == 1002.0
    assert kept.complete_from == 1002.0  # the two oldest seconds were dropped
    # Counting that began later than the drop still says from when it began.
    assert door.kept("d1", now=0.0, wall=1000.0, started_at=5000.0).complete_from == 5000.0


def test_the_counts_tell_their_watchers_and_a_watcher_that_fails_breaks_no_chat() -> None:
    door = RequestCounts(None)
    told: list[tuple[str, str, float]] = []

    def broken(deployment: str, outcome: Outcome, at: float) -> None:
        raise RuntimeError("a bug in a reader")

    door.watch(broken)
    door.watch(lambda deployment, outcome, at: told.append((deployment, outcome, at)))
    door.count("d1", "failed", None, 5.0)
    assert told == [("d1", "failed", 5.0)]
    assert door.total("d1", "failed") == 1.0
    assert [r.outcome for r in door.recent()["d1"]] == ["failed"]


def test_an_incident_s_chats_in_words() -> None:
    assert chats_words(None) == "-"  # the service cannot say
    assert chats_words(IncidentChats()) == "none"  # it can: no chat met it
    assert chats_words(IncidentChats(held=1)) == "1 held"
    assert chats_words(IncidentChats(held=12, retried=2, migrated=3, failed=1)) == (
        "12 held, 2 retried, 3 migrated, 1 failed"
    )
    assert chats_words(IncidentChats(failed=4, retried=1)) == "1 retried, 4 failed"
