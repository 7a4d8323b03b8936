"""What is new in a deployment's chats (``model/chat_news.py``): told from two readings of its
outcomes over the service's sliding window, only where a count grew; the first reading says
nothing; and the same through the model, from ``GET /deployments`` as the feed brings it."""

from __future__ import annotations

from model_ids import LLAMA, QWEN

from exo_deploy_tui.model.chat_news import (
    TOLD,
    ChatReadings,
    growth_entries,
    growth_words,
    outcome_growth,
)
from exo_deploy_tui.model.cluster import ClusterModel
from exo_deploy_tui.model.timeline import TimelineEntry
from exo_deploy_tui.model.updates import ConnectionUpdate, DeploymentsUpdate, SnapshotUpdate
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder
from keeper.model.api_models import DeploymentView

T = FROZEN_NOW


def builder() -> ClusterBuilder:
    return (
        ClusterBuilder()
        .node("mini-a")
        .node("mini-b")
        .link_all()
        .deployment(QWEN, on=["mini-a"])
        .deployment(LLAMA, on=["mini-b"])
    )


def views(**per_model: dict[str, int]) -> tuple[DeploymentView, ...]:
    """The /deployments answer with each model's outcomes (``qwen={"held": 2}``)."""
    built = builder()
    for key, model_id in (("qwen", QWEN), ("llama", LLAMA)):
        built.chats(model_id, **per_model.get(key, {}))
    snapshot = built.snapshot()
    assert snapshot.deployments is not None
    return snapshot.deployments


def texts(entries: list[TimelineEntry]) -> list[str]:
    return [e.text for e in entries]


# --- the rule ---------------------------------------------------------------------------------


def test_a_growth_is_news_and_a_drop_is_chats_aging_out() -> None:
    before = {"ok": 40, "held": 1, "migrated": 2, "failed": 3}
    after = {"ok": 41, "held": 3, "migrated": 1, "failed": 3}
    # held grew by 2; migrated dropped (one aged out of the window); failed the same; ok is
    # never told.
    assert outcome_growth(before, after) == {"held": 2}
    assert outcome_growth({}, {"failed": 1, "ok": 5}) == {"failed": 1}
    assert outcome_growth({"failed": 4}, {}) == {}


def test_only_held_migrated_and_failed_are_told() -> None:
    assert TOLD == ("held", "migrated", "failed")
    grown = {"retried": 5, "cancelled": 5, "rejected": 5, "ok": 5}
    assert outcome_growth({}, grown) == {}


def test_the_words_and_levels() -> None:
    assert growth_words("held", 2, QWEN) == (
        "2 chats to Qwen3-0.6B-4bit held until it could serve, then answered"
    )
    assert growth_words("migrated", 1, QWEN) == (
        "1 chat to Qwen3-0.6B-4bit cut mid-answer, continued from where it was cut"
    )
    assert (
        growth_words("failed", 1, QWEN)
        == "1 chat to Qwen3-0.6B-4bit failed: its client got an error"
    )
    assert growth_words("failed", 3, QWEN).endswith("failed: their clients got an error")
    entries = growth_entries({"failed": 3, "held": 2, "migrated": 1}, QWEN, T)
    # In TOLD's order whatever the mapping's, each about the model (describe lists them).
    assert [e.level for e in entries] == ["warn", "warn", "error"]
    assert [e.text.split(" ")[0] for e in entries] == ["2", "1", "3"]
    assert {e.model_id for e in entries} == {QWEN} and {e.at for e in entries} == {T}


def test_the_first_reading_says_nothing_then_growth_is_told() -> None:
    readings = ChatReadings()
    assert readings.took(views(qwen={"ok": 100, "held": 7, "failed": 2}), T) == []
    assert readings.took(views(qwen={"ok": 101, "held": 9, "failed": 2}), T + 1) == [
        growth_entries({"held": 2}, QWEN, T + 1)[0]
    ]


def test_after_a_drop_the_next_growth_counts_from_the_lower_count() -> None:
    readings = ChatReadings()
    readings.took(views(qwen={"held": 3}), T)
    assert readings.took(views(qwen={"held": 1}), T + 1) == []  # two aged out: no news
    # One new: from 1 to 2, told, though 2 is below the 3 seen before the drop.
    assert texts(readings.took(views(qwen={"held": 2}), T + 2)) == [
        "1 chat to Qwen3-0.6B-4bit held until it could serve, then answered"
    ]


def test_no_sum_counts_as_none_so_the_first_chats_after_a_quiet_spell_are_told() -> None:
    readings = ChatReadings()
    readings.took(views(qwen={"ok": 5}), T)
    assert readings.took(views(), T + 300) == []  # all aged out: requests None
    told = texts(readings.took(views(qwen={"failed": 1}), T + 301))
    assert told == ["1 chat to Qwen3-0.6B-4bit failed: its client got an error"]


def test_each_deployment_is_read_apart() -> None:
    readings = ChatReadings()
    readings.took(views(qwen={"held": 1}, llama={"failed": 1}), T)
    told = texts(readings.took(views(qwen={"held": 1}, llama={"failed": 2, "migrated": 1}), T + 1))
    assert told == [
        growth_words("migrated", 1, LLAMA),
        "1 chat to Llama-3.2-1B-Instruct-4bit failed: its client got an error",
    ]


def test_a_deployment_that_left_is_forgotten_and_its_return_is_a_first_reading() -> None:
    readings = ChatReadings()
    readings.took(views(qwen={"held": 1}), T)
    readings.took((), T + 1)  # no deployments listed
    assert readings.took(views(qwen={"held": 5}), T + 2) == []


def test_forget_makes_the_next_reading_a_first_one() -> None:
    readings = ChatReadings()
    readings.took(views(qwen={"held": 1}), T)
    readings.forget()
    assert readings.took(views(qwen={"held": 4}), T + 60) == []


# --- through the model ------------------------------------------------------------------------


def chats_told(model: ClusterModel) -> list[str]:
    return [e.text for e in model.timeline if " chat" in e.text]


def test_the_model_tells_growth_from_the_stream_and_from_polls_not_on_connecting() -> None:
    model = ClusterModel()
    first = views(qwen={"ok": 50, "held": 4})
    model.handle([SnapshotUpdate(builder().state, first), ConnectionUpdate("live")], T)
    assert chats_told(model) == []  # five minutes' chats, not what just happened
    model.handle(DeploymentsUpdate(views(qwen={"ok": 52, "held": 6})), T + 1)  # the stream
    assert chats_told(model) == [
        "2 chats to Qwen3-0.6B-4bit held until it could serve, then answered"
    ]
    model.handle(
        SnapshotUpdate(builder().state, views(qwen={"ok": 52, "held": 6, "failed": 1})), T + 2
    )
    assert chats_told(model)[-1] == "1 chat to Qwen3-0.6B-4bit failed: its client got an error"
    assert [e.text for e in model.history("dep-qwen3-0.6b-4bit") if " chat" in e.text] == (
        chats_told(model)
    )


def test_the_model_says_nothing_of_what_ended_while_the_master_was_lost() -> None:
    model = ClusterModel()
    model.handle(
        [SnapshotUpdate(builder().state, views(qwen={"held": 1})), ConnectionUpdate("live")], T
    )
    model.handle(ConnectionUpdate("down", "connection refused"), T + 1)
    # Back: the snapshot before "live", as the feed sends it; its counts are a first reading.
    back = SnapshotUpdate(builder().state, views(qwen={"held": 9, "failed": 4}))
    model.handle([back, ConnectionUpdate("live")], T + 40)
    assert chats_told(model) == []
    model.handle(DeploymentsUpdate(views(qwen={"held": 9, "failed": 5})), T + 41)
    assert chats_told(model) == ["1 chat to Qwen3-0.6B-4bit failed: its client got an error"]


def test_the_row_carries_the_sum_as_received() -> None:
    model = ClusterModel()
    model.handle([SnapshotUpdate(builder().state, views(qwen={"ok": 3, "failed": 1}))], T)
    rows = {r.model_id: r for r in model.deployment_rows(T)}
    qwen = rows[QWEN].requests
    assert qwen is not None and (qwen.errors, qwen.outcomes) == (1, {"ok": 3, "failed": 1})
    assert rows[LLAMA].requests is None
