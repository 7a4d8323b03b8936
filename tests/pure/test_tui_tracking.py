"""The dashboard's memory of what changed, part by part: since when each deployment is in its
status (``tracking``), what the serving records seed the timeline with (``seeding``), and each
outage with the moments of its recovery (``outages``)."""

from __future__ import annotations

from model_ids import LLAMA, QWEN

from exo_deploy_tui.model.outages import MOMENTS_KEPT, Outages, outage_start
from exo_deploy_tui.model.recovery import NodeDownload
from exo_deploy_tui.model.seeding import HISTORY_SEEDED_MAX, ServingHistory
from exo_deploy_tui.model.tracking import StatusChange, StatusTracking
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, node_id_for
from keeper.model.events import InstanceCreated, InstanceDeleted
from keeper.model.state import State

T = FROZEN_NOW
QWEN_ID = "dep-qwen3-0.6b-4bit"
LLAMA_ID = "dep-llama-3.2-1b-instruct-4bit"
H = 3600.0


# -- statuses -----------------------------------------------------------------------------


def test_statuses_seen_on_the_first_look_are_not_known_and_later_ones_are() -> None:
    tracking = StatusTracking()
    assert tracking.settle({QWEN_ID: "serving"}, T) == []
    first = tracking.get(QWEN_ID)
    assert first is not None and (first.status, first.since, first.known) == ("serving", T, False)
    tracking.watch()
    assert tracking.settle({QWEN_ID: "serving", LLAMA_ID: "starting"}, T + 1) == []
    new = tracking.get(LLAMA_ID)
    assert new is not None and (new.since, new.known) == (T + 1, True)  # just created
    old = tracking.get(QWEN_ID)
    assert old is not None and (old.since, old.known) == (T, False)  # unchanged: not redated


def test_every_change_is_dated_and_returned_in_order() -> None:
    tracking = StatusTracking()
    tracking.settle({QWEN_ID: "serving", LLAMA_ID: "serving"}, T)
    changes = tracking.settle({QWEN_ID: "placing", LLAMA_ID: "starting"}, T + 5)
    assert changes == [
        StatusChange(QWEN_ID, "serving", "placing"),
        StatusChange(LLAMA_ID, "serving", "starting"),
    ]
    qwen = tracking.get(QWEN_ID)
    assert qwen is not None and (qwen.status, qwen.since, qwen.known) == ("placing", T + 5, True)


def test_a_deployment_that_went_is_forgotten_and_new_again_if_it_comes_back() -> None:
    tracking = StatusTracking()
    tracking.settle({QWEN_ID: "serving"}, T)
    tracking.settle({}, T + 1)
    assert tracking.get(QWEN_ID) is None
    assert tracking.settle({QWEN_ID: "placing"}, T + 2) == []  # not a change: a newcomer
    back = tracking.get(QWEN_ID)
    assert back is not None and back.since == T + 2


# -- serving records ----------------------------------------------------------------------

A_DAY: tuple[tuple[float, bool, str | None], ...] = (
    (26 * H, True, None),
    (3 * H, False, "node mini timed out"),
    (3 * H - 95, True, None),
)


def recorded(
    *changes: tuple[float, bool, str | None], now: float = T, on: tuple[str, ...] = ("mini",)
) -> State:
    builder = ClusterBuilder(now=now).node("mini").deployment(QWEN, on=on)
    return builder.served(QWEN, *changes).state


def texts(entries: list[object]) -> list[tuple[float, str]]:
    return [(e.at, e.text) for e in entries]  # type: ignore[attr-defined]


def test_the_first_snapshot_seeds_every_incident_of_the_day_on_our_clock() -> None:
    history = ServingHistory()
    entries = history.seed(None, recorded(*A_DAY), T, 0.0, StatusTracking())
    assert [(e.at, e.text, e.history) for e in entries] == [
        (T - 3 * H, "Qwen3-0.6B-4bit stopped serving: node mini timed out", True),
        (T - 3 * H + 95, "Qwen3-0.6B-4bit serving again after 1m35s", True),
    ]
    # The master's clock 30 s ahead: the same moments, on ours.
    shifted = ServingHistory().seed(None, recorded(*A_DAY, now=T + 30), T, 30.0, StatusTracking())
    assert [e.at for e in shifted] == [e.at for e in entries]


def test_a_later_snapshot_seeds_only_what_came_after_what_was_told() -> None:
    history = ServingHistory()
    statuses = StatusTracking()
    first = recorded(*A_DAY)
    history.seed(None, first, T, 0.0, statuses)
    statuses.settle({QWEN_ID: "serving"}, T)
    assert history.seed(first, first, T + 1, 0.0, statuses) == []  # nothing new
    # While we were away it failed and came back: history, as both ends are in between.
    later = recorded(*A_DAY, (-40, False, "runner failed"), (-70, True, None))
    entries = history.seed(first, later, T + 100, 0.0, statuses)
    assert [e.text for e in entries] == [
        "Qwen3-0.6B-4bit stopped serving: runner failed",
        "Qwen3-0.6B-4bit serving again after 30.0 s",
    ]


def test_the_change_the_live_view_tells_is_not_seeded() -> None:
    """Serving across the two States before, not serving now: the live view says "stopped
    serving" as it settles, so the newest record is left to it."""
    history = ServingHistory()
    statuses = StatusTracking()
    first = recorded(*A_DAY)
    history.seed(None, first, T, 0.0, statuses)
    statuses.settle({QWEN_ID: "serving"}, T)
    failing = recorded(*A_DAY, (-4, False, "runner failed"), on=())
    assert history.seed(first, failing, T + 5, 0.0, statuses) == []


def test_a_serving_record_told_live_is_not_seeded_again() -> None:
    history = ServingHistory()
    history.told_live(QWEN_ID, T - 3 * H + 95)
    state = recorded(*A_DAY)
    assert history.seed(state, state, T, 0.0, StatusTracking()) == []


def test_at_most_history_seeded_max_entries_the_newest() -> None:
    flaps = [(26 * H, True, None)]
    for i in range(HISTORY_SEEDED_MAX):
        flaps += [(20 * H - 60 * i, False, "flap"), (20 * H - 60 * i - 10, True, None)]
    entries = ServingHistory().seed(None, recorded(*flaps), T, 0.0, StatusTracking())
    assert len(entries) == HISTORY_SEEDED_MAX
    assert entries[-1].text == "Qwen3-0.6B-4bit serving again after 10.0 s"
    assert entries[0].at == T - (20 * H - 60 * (HISTORY_SEEDED_MAX // 2))


def test_the_day_is_kept_while_its_records_and_window_are_the_same_and_forgotten_with_it() -> None:
    history = ServingHistory()
    state = recorded(*A_DAY)
    records = state.serving_history[QWEN_ID]
    day = history.day(QWEN_ID, records, T)
    assert history.day(QWEN_ID, records, T) is day
    assert history.day(QWEN_ID, records, T + 1) is not day
    assert day.availability is not None and 0.99 < day.availability < 1.0
    ours = history.day_on_our_clock(QWEN_ID, state, T - 30, 30.0)
    assert [i.start for i in ours.incidents] == [T - 3 * H - 30]
    history.told_live(QWEN_ID, T)
    history.keep(())
    assert history.seed(state, state, T, 0.0, StatusTracking()) != []  # told forgotten too


# -- outages ------------------------------------------------------------------------------


def test_an_outage_starts_at_the_earliest_last_report_of_its_nodes_or_now() -> None:
    assert outage_start(T, []) == T
    assert outage_start(T, [None, None]) == T
    assert outage_start(T, [T - 4, None, T - 9]) == T - 9
    assert outage_start(T, [T + 3]) == T  # never after it was seen


def qwen_on(*names: str) -> State:
    builder = ClusterBuilder()
    for name in names:
        builder.node(name)
    return builder.deployment(QWEN, on=list(names)).state


def test_serving_again_says_how_long_and_where_the_time_went() -> None:
    outages = Outages()
    serving = qwen_on("mini")
    instance_id = next(iter(serving.instances))
    outages.serving(QWEN_ID, (node_id_for("mini"),))
    assert outages.serving_on(QWEN_ID) == (node_id_for("mini"),)
    stopped = outages.stopped(QWEN_ID, QWEN, T - 30, T, blind=False)
    assert (stopped.level, stopped.text, stopped.model_id) == (
        "warn",
        "Qwen3-0.6B-4bit stopped serving",
        QWEN,
    )
    outages.note(InstanceDeleted(instance_id=instance_id), serving, T + 1)
    replacement = qwen_on("studio")
    outages.note(
        InstanceCreated(instance=next(iter(replacement.instances.values()))), State(), T + 2
    )
    downloads = [NodeDownload(T + 2, T + 10)]
    again = outages.serving_again(QWEN_ID, QWEN, T + 14, downloads, blind=False)
    assert (again.level, again.at) == ("good", T + 14)
    assert again.text == (
        "Qwen3-0.6B-4bit serving again after 44.0 s: "
        "detected 31 s, placed 1.0 s, downloaded 8.0 s, loaded 4.0 s"
    )
    # Told once: serving after that is no recovery.
    assert outages.serving_again(QWEN_ID, QWEN, T + 20, [], False).text == "Qwen3-0.6B-4bit serving"


def test_an_outage_not_seen_stopping_has_no_parts() -> None:
    outages = Outages()
    outages.stopped(QWEN_ID, QWEN, T, T, blind=True)
    again = outages.serving_again(QWEN_ID, QWEN, T + 12.5, [], blind=False)
    assert again.text == "Qwen3-0.6B-4bit serving again after 12.5 s"


def test_moments_are_kept_per_model_bounded_and_forgotten_with_it() -> None:
    outages = Outages()
    serving = qwen_on("mini")
    instance_id = next(iter(serving.instances))
    outages.serving(QWEN_ID, (node_id_for("mini"),))
    outages.stopped(QWEN_ID, QWEN, T, T, blind=False)
    for i in range(MOMENTS_KEPT + 3):
        outages.note(InstanceDeleted(instance_id=instance_id), serving, T + i)
    # Only the last MOMENTS_KEPT deletions are kept: the first kept is the detection.
    again = outages.serving_again(QWEN_ID, QWEN, T + 20, [], blind=False)
    assert again.text.endswith(": detected 3.0 s")
    # A deletion of an instance the State did not hold, and a creation it held, are no moments.
    outages.stopped(QWEN_ID, QWEN, T + 30, T + 30, blind=False)
    outages.note(InstanceDeleted(instance_id=instance_id), State(), T + 31)
    created = InstanceCreated(instance=serving.instances[instance_id])
    outages.note(created, serving, T + 32)
    assert outages.serving_again(QWEN_ID, QWEN, T + 40, [], False).text == (
        "Qwen3-0.6B-4bit serving again after 10.0 s"
    )
    outages.keep((QWEN_ID,), ())
    assert outages.serving_on(QWEN_ID) == (node_id_for("mini"),)
    outages.keep((LLAMA_ID,), (LLAMA,))
    assert outages.serving_on(QWEN_ID) == ()
