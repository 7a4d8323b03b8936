"""The dashboard's reading of the master's serving records: the AVAIL column, describe's last
24 hours, and the timeline seeded with the incidents it did not see happen (once each)."""

from __future__ import annotations

import pytest
from model_ids import LLAMA, QWEN

from exo_deploy_tui.model.availability import AVAILABILITY_WINDOW_S
from exo_deploy_tui.model.cluster import HISTORY_SEEDED_MAX, ClusterModel, DeploymentRow
from exo_deploy_tui.model.format import percent_available
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate
from exo_deploy_tui.screens.describe import INCIDENTS_SHOWN, describe_text, history_text
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, node_id_for
from exo_deploy_tui.view.cells import (
    AVAIL_COLUMN_FROM,
    HISTORY_MARK,
    availability_cell,
    deployment_cells,
    deployment_columns,
    timeline_line,
)
from keeper.model.events import (
    AnyEvent,
    DeploymentServingChanged,
    IndexedEvent,
    InstanceDeleted,
    NodeTimedOut,
)
from keeper.model.state import ServingRecord

pytestmark = pytest.mark.usefixtures("utc")  # the TUI shows local times: UTC here

QWEN_ID = "dep-qwen3-0.6b-4bit"
H = 3600.0
NODE_LOST = "node mini-a timed out"
OOM = "runner failed on mini-a: Metal OOM while loading layer 14"
# Qwen's last day: created 26 h ago, then three incidents of 40.2 s, 95 s and 12.5 s.
A_DAY: tuple[tuple[float, bool, str | None], ...] = (
    (26 * H, True, None),
    (20 * H, False, NODE_LOST),
    (20 * H - 40.2, True, None),
    (3 * H, False, OOM),
    (3 * H - 95, True, None),
    (40 * 60, False, "instance deleted by a user"),
    (40 * 60 - 12.5, True, None),
)
DOWN_S = 40.2 + 95 + 12.5


def cluster(
    *records: tuple[float, bool, str | None],
    now: float = FROZEN_NOW,
    qwen_on: tuple[str, ...] = ("mini-a",),
) -> ClusterBuilder:
    """studio and mini-a; Qwen on ``qwen_on`` with ``records``, Llama on studio with none."""
    builder = ClusterBuilder(now=now).node("studio").node("mini-a").link_all()
    builder.deployment(QWEN, on=qwen_on).deployment(LLAMA, on=["studio"])
    return builder.served(QWEN, *records) if records else builder


def connected(builder: ClusterBuilder, now: float = FROZEN_NOW) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], now)
    return model


def availability(model: ClusterModel, model_id: str, now: float = FROZEN_NOW) -> float | None:
    (row,) = [r for r in model.deployment_rows(now) if r.model_id == model_id]
    return row.availability


def history_lines(model: ClusterModel) -> list[tuple[float, str]]:
    return [(e.at, e.text) for e in model.timeline if e.history]


def live_texts(model: ClusterModel) -> list[str]:
    return [e.text for e in model.timeline if not e.history]


# --- AVAIL --------------------------------------------------------------------------------


def test_availability_reads_to_a_tenth_rounded_down() -> None:
    assert [percent_available(v) for v in (1.0, 0.992, 0.9999, 0.5, 0.0, None)] == [
        "100%",
        "99.2%",
        "99.9%",  # not yet 100%: it did stop
        "50.0%",
        "0.0%",
        "—",
    ]


def test_avail_shows_from_100_columns_beside_ready() -> None:
    keys = [c.key for c in deployment_columns(AVAIL_COLUMN_FROM)]
    assert keys[:4] == ["status", "model", "ready", "avail"]
    assert "avail" in [c.key for c in deployment_columns(120)]
    assert "avail" not in [c.key for c in deployment_columns(AVAIL_COLUMN_FROM - 1)]
    assert "avail" not in [c.key for c in deployment_columns(80)]
    # A stock exo has no deployments to summarise.
    assert "avail" not in [c.key for c in deployment_columns(120, replicas=False)]


def test_avail_turns_amber_then_red_as_it_falls() -> None:
    model = connected(cluster(*A_DAY))
    (qwen,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN]

    def cell(value: float | None) -> tuple[str, str]:
        return availability_cell(DeploymentRow(**{**qwen.__dict__, "availability": value}))

    assert cell(0.998) == ("99.8%", "")
    assert cell(0.985) == ("98.5%", "bold yellow")
    assert cell(0.5) == ("50.0%", "bold red")
    assert cell(None) == ("—", "dim")
    cells = deployment_cells(qwen, deployment_columns(120))
    assert cells[3][0].strip() == percent_available(1 - DOWN_S / AVAILABILITY_WINDOW_S)


def test_availability_is_the_last_day_of_the_records_as_now_moves() -> None:
    model = connected(cluster(*A_DAY))
    assert availability(model, QWEN) == pytest.approx(1 - DOWN_S / AVAILABILITY_WINDOW_S)
    assert availability(model, LLAMA) is None  # no records: nothing known, not 100 %
    # Six hours on, the first incident (20 h ago) has left the window.
    later = FROZEN_NOW + 6 * H
    assert availability(model, QWEN, later) == pytest.approx(
        1 - (95 + 12.5) / AVAILABILITY_WINDOW_S
    )


def test_availability_is_read_on_the_masters_clock() -> None:
    skew = 3600.0  # the master's clock is an hour ahead: its records carry its times
    builder = cluster((2 * H, True, None), (H, False, NODE_LOST), now=FROZEN_NOW + skew)
    model = ClusterModel()
    snapshot = builder.snapshot()
    model.handle(SnapshotUpdate(snapshot.state, snapshot.deployments, skew), FROZEN_NOW)
    assert availability(model, QWEN) == pytest.approx(0.5)
    (incident,) = model.day_history(QWEN_ID, FROZEN_NOW).incidents
    assert incident.start == FROZEN_NOW - H  # on our clock, as every time on screen
    assert incident.end is None


# --- describe -----------------------------------------------------------------------------


def test_describe_lists_the_days_incidents_newest_first_with_cause_and_recovery() -> None:
    model = connected(cluster(*A_DAY))
    text = describe_text(model, QWEN_ID, QWEN, FROZEN_NOW).plain
    history = text[text.index("History (24 h)") : text.index("Runners")]
    assert history.splitlines()[1:] == [
        "  99.8% available · MTTR 49.2 s · 3 incidents",
        "  11:20:00 ✔ instance deleted by a user; recovered after 12.5 s",
        f"  09:00:00 ✔ {OOM}; recovered after 1m35s",
        f"  16:00:00 ✔ {NODE_LOST}; recovered after 40.2 s",
        "",
    ]
    # The day's summary comes before the runners and the timeline: it shows at 80x24.
    assert text.index("History (24 h)") < text.index("Runners") < text.index("Timeline")


def test_describe_says_an_incident_is_ongoing_and_from_when_it_knows() -> None:
    builder = cluster(*A_DAY[:3], (60, False, NODE_LOST), qwen_on=())
    # Observed (the master met the deployment) 10 h ago, not created: earlier is unknown.
    first = builder.state.serving_history[QWEN_ID][0]
    records = (first.model_copy(update={"at": FROZEN_NOW - 10 * H, "begins": "observed"}),)
    observed = records + builder.state.serving_history[QWEN_ID][3:]
    builder.state = builder.state.model_copy(update={"serving_history": {QWEN_ID: observed}})
    model = connected(builder)
    text = history_text(model.day_history(QWEN_ID, FROZEN_NOW)).plain
    assert "MTTR — · 1 incident\n" in text
    assert "complete from 02:00 (" in text
    assert f"  11:59:00 ✖ {NODE_LOST}; ongoing, down 1m00s" in text


def test_describe_keeps_to_the_newest_incidents_and_counts_the_rest() -> None:
    flaps = [(10 * H, True, None)]
    for n in range(INCIDENTS_SHOWN + 3):
        flaps += [(9 * H - n * 60, False, f"cause {n}"), (9 * H - n * 60 - 5, True, None)]
    model = connected(cluster(*flaps))
    lines = history_text(model.day_history(QWEN_ID, FROZEN_NOW)).plain.splitlines()
    listed = [line for line in lines if "cause" in line]
    assert len(listed) == INCIDENTS_SHOWN
    assert f"cause {INCIDENTS_SHOWN + 2};" in listed[0]  # the newest first
    assert lines[-1] == "  and 3 more, older"


def test_without_serving_records_describe_says_so_without_an_error() -> None:
    model = connected(cluster())
    text = history_text(model.day_history(QWEN_ID, FROZEN_NOW)).plain
    assert "availability — (the master keeps no serving records of it)" in text


# --- the timeline, seeded -----------------------------------------------------------------


def test_connecting_seeds_the_timeline_with_the_days_incidents_marked_as_history() -> None:
    model = connected(cluster(*A_DAY))
    assert history_lines(model) == [
        (FROZEN_NOW - 20 * H, f"Qwen3-0.6B-4bit stopped serving: {NODE_LOST}"),
        (FROZEN_NOW - 20 * H + 40.2, "Qwen3-0.6B-4bit serving again after 40.2 s"),
        (FROZEN_NOW - 3 * H, f"Qwen3-0.6B-4bit stopped serving: {OOM}"),
        (FROZEN_NOW - 3 * H + 95, "Qwen3-0.6B-4bit serving again after 1m35s"),
        (FROZEN_NOW - 40 * 60, "Qwen3-0.6B-4bit stopped serving: instance deleted by a user"),
        (FROZEN_NOW - 40 * 60 + 12.5, "Qwen3-0.6B-4bit serving again after 12.5 s"),
    ]
    entries = list(model.timeline)
    assert entries[-1].text.startswith("connected:") and not entries[-1].history
    assert HISTORY_MARK in timeline_line(entries[0]).plain
    assert HISTORY_MARK not in timeline_line(entries[-1]).plain
    assert next(e.text for e in model.history(QWEN_ID)).endswith(NODE_LOST)


def test_an_unplaceable_start_is_not_serving_rather_than_stopped() -> None:
    model = connected(
        cluster((H, False, "unplaceable: No cycles found"), (H - 30, True, None), qwen_on=())
    )
    assert [text for _, text in history_lines(model)] == [
        "Qwen3-0.6B-4bit not serving: unplaceable: No cycles found",
        "Qwen3-0.6B-4bit serving after 30.0 s",
    ]


def test_the_same_snapshot_again_seeds_nothing_more() -> None:
    builder = cluster(*A_DAY)
    model = connected(builder)
    before = list(model.timeline)
    model.handle([builder.snapshot(), ConnectionUpdate("live")], FROZEN_NOW + 5)
    assert list(model.timeline) == before


def test_what_was_seen_live_is_not_told_again_by_a_resync() -> None:
    model = connected(cluster(*A_DAY))
    idx = model.state.last_event_applied_idx

    def feed(now: float, *events: AnyEvent) -> None:
        nonlocal idx
        updates = []
        for event in events:
            idx += 1
            updates.append(EventUpdate(IndexedEvent(idx=idx, event=event)))
        model.handle(updates, now)

    lost = ServingRecord(at=FROZEN_NOW + 1, serving=False, cause=NODE_LOST)
    feed(
        FROZEN_NOW + 1,
        NodeTimedOut(node_id=node_id_for("mini-a")),
        InstanceDeleted(instance_id="inst-qwen3-0.6b-4bit"),
        DeploymentServingChanged(deployment_id=QWEN_ID, record=lost),
    )
    assert live_texts(model)[-1] == "Qwen3-0.6B-4bit stopped serving"
    seeded = history_lines(model)
    before = len(model.timeline)
    model.handle(SnapshotUpdate(model.state, None), FROZEN_NOW + 3)  # the resync
    assert len(model.timeline) == before
    assert history_lines(model) == seeded


def test_a_reconnection_seeds_what_happened_while_away_once() -> None:
    model = connected(cluster(*A_DAY))
    model.handle(ConnectionUpdate("down", "cannot connect", 1.0), FROZEN_NOW + 10)
    # Away for two minutes: Qwen lost mini-a for 40 s and recovered meanwhile.
    back = FROZEN_NOW + 130
    gap = (*A_DAY, (-20, False, NODE_LOST), (-60, True, None))
    fresh = cluster(*gap, now=FROZEN_NOW).snapshot()
    model.handle([fresh, ConnectionUpdate("live")], back)
    assert history_lines(model)[-2:] == [
        (FROZEN_NOW + 20, f"Qwen3-0.6B-4bit stopped serving: {NODE_LOST}"),
        (FROZEN_NOW + 60, "Qwen3-0.6B-4bit serving again after 40.0 s"),
    ]
    assert "Qwen3-0.6B-4bit stopped serving" not in live_texts(model)  # it serves as before
    told = list(model.timeline)
    model.handle([fresh], back + 1)  # the snapshot again (a resync)
    assert list(model.timeline) == told


def test_a_change_the_live_view_tells_on_reconnection_is_not_seeded_too() -> None:
    model = connected(cluster(*A_DAY))
    model.handle(ConnectionUpdate("down", "cannot connect", 1.0), FROZEN_NOW + 10)
    # Back while Qwen is still down: the live view says it stopped serving, once.
    still_down = cluster(*A_DAY, (-20, False, NODE_LOST), qwen_on=())
    model.handle([still_down.snapshot(), ConnectionUpdate("live")], FROZEN_NOW + 130)
    assert live_texts(model).count("Qwen3-0.6B-4bit stopped serving") == 1
    assert all(at < FROZEN_NOW for at, _ in history_lines(model))


def test_polling_a_bridge_tells_each_change_once_as_it_is_seen() -> None:
    """A bridge's /state carries the records, and every poll is a snapshot: each change in
    them is the one the live view sees at that poll, so nothing is seeded after connecting."""
    model = connected(cluster(*A_DAY))
    seeded = history_lines(model)
    down = cluster(*A_DAY, (-1, False, NODE_LOST), qwen_on=())
    up = cluster(*A_DAY, (-1, False, NODE_LOST), (-30, True, None))
    for now, builder in ((FROZEN_NOW + 2, down), (FROZEN_NOW + 3, down), (FROZEN_NOW + 31, up)):
        model.handle(builder.snapshot(), now)
    assert history_lines(model) == seeded
    assert [t for t in live_texts(model) if "serving" in t] == [
        "Qwen3-0.6B-4bit stopped serving",
        "Qwen3-0.6B-4bit serving again after 29.0 s",
    ]


def test_a_day_of_flapping_seeds_only_the_newest_lines() -> None:
    flaps: list[tuple[float, bool, str | None]] = [(23 * H, True, None)]
    for n in range(HISTORY_SEEDED_MAX):
        flaps += [(22 * H - n * 120, False, NODE_LOST), (22 * H - n * 120 - 30, True, None)]
    model = connected(cluster(*flaps))
    seeded = history_lines(model)
    assert len(seeded) == HISTORY_SEEDED_MAX
    assert seeded[-1][0] == FROZEN_NOW - 22 * H + (HISTORY_SEEDED_MAX - 1) * 120 + 30


def test_a_stock_exo_has_no_history_and_no_avail() -> None:
    state = cluster().state
    model = ClusterModel()
    model.handle(SnapshotUpdate(state, None), FROZEN_NOW)
    assert history_lines(model) == []
    assert availability(model, QWEN) is None
