"""Chats through the front door on the dashboard (docs/design.md §8.6, §9.1): REQ/S and ERR on
the deployments table, describe's ``chats`` lines, and the held, continued and failed chats
told on the timeline as ``GET /deployments`` brings new counts, whichever tab shows meanwhile.

Screenshots at 80x24 and 120x40 as in ``test_tui_snapshots.py`` (frozen clock, scripted
master); update them with ``--snapshot-update`` and look at the new SVGs.
"""

from __future__ import annotations

import pytest
from model_ids import QWEN
from test_tui_app import until
from test_tui_snapshots import SIZES, Clock, Compare, nodes, pressing, scenario, settled
from textual.pilot import Pilot

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.model.updates import DeploymentsUpdate
from exo_deploy_tui.screens.describe import DescribeScreen
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, ScriptedClient
from exo_deploy_tui.widgets.panels import DeploymentsTable, TimelineView

QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"
QWEN8 = "mlx-community/Qwen3-8B-4bit"
QWEN30_ID = "dep-qwen3-30b-a3b-4bit"


def chatting(
    qwen30: dict[str, int] | None = None, *, qwen: dict[str, int] | None = None
) -> ClusterBuilder:
    """Three Qwen3 deployments (names short enough for REQ/S at 80 columns): Qwen3-0.6B busy
    and well, Qwen3-30B through a failover (held, continued, failed chats), Qwen3-8B with no
    chat in the window."""
    return (
        nodes(ClusterBuilder())
        .deployment(QWEN, on=["mini-a"])
        .chats(QWEN, **(qwen or {"ok": 112, "held": 3, "migrated": 1}))
        .deployment(QWEN30, on=["studio", "mini-b"])
        .chats(QWEN30, p95_ttft_s=6.8, **(qwen30 or {"ok": 40, "held": 2, "failed": 4}))
        .deployment(QWEN8, on=["mini-b"])
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chats_on_the_table(snap_compare: Compare, size: tuple[int, int]) -> None:
    """REQ/S and ERR beside READY: 0.4/s and no failure, 0.2/s with 4 failed in red, and a
    dim dash where no chat ended in the window."""
    assert snap_compare(scenario(chatting()), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chats_described(snap_compare: Compare, size: tuple[int, int]) -> None:
    """Describe on Qwen3-30B: its chats over the last 5 min, the p95 to the first token, each
    outcome's count and what the ones that happened mean, under the keeper's line."""
    assert snap_compare(
        scenario(chatting()), terminal_size=size, run_before=pressing("down", "enter")
    )


class Failover:
    """The app on ``chatting()``, then one more reading of ``GET /deployments`` a second later
    with 2 more held chats, 1 continued and 1 more failed for Qwen3-30B."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.app = scenario(chatting(), self.clock)

    async def tell(self, pilot: Pilot[None]) -> None:
        client = self.app.client
        assert isinstance(client, ScriptedClient)
        self.clock.now = FROZEN_NOW + 1
        later = chatting({"ok": 41, "held": 4, "migrated": 1, "failed": 5}).snapshot()
        assert later.deployments is not None
        client.push(DeploymentsUpdate(later.deployments))
        app = self.app
        await until(pilot, lambda: sum(" chat" in e.text for e in app.model.timeline) == 3)
        await settled(pilot)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chats_told_on_the_timeline(snap_compare: Compare, size: tuple[int, int]) -> None:
    """The new reading told while the deployments tab shows, then the timeline: held, then
    continued, then failed, each once; nothing of the counts the dashboard connected to."""
    failover = Failover()

    async def tell(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await failover.tell(pilot)
        if size[0] < 120:
            await pilot.press("4")
            await settled(pilot)

    assert snap_compare(failover.app, terminal_size=size, run_before=tell)


def cells(app: DashboardApp, key: str) -> dict[str, str]:
    table = app.dashboard.query_one(DeploymentsTable)
    columns = [c.key for c in table.columns]
    return {k: text.strip() for k, (text, _) in zip(columns, table.row(key), strict=True)}


@pytest.mark.anyio
async def test_counts_that_arrive_behind_another_tab_show_when_it_comes_back() -> None:
    """Tabs switched while readings arrive: on the timeline tab the table's cells follow, so
    the deployments tab shows the new rate and failures at once; on the deployments tab the
    timeline's lines wait, and read whole when it is shown."""
    failover = Failover()
    app = failover.app
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.dashboard.visible_rows) == 3)
        assert (cells(app, QWEN30_ID)["rate"], cells(app, QWEN30_ID)["err"]) == ("0.2", "4")
        await pilot.press("4")
        await failover.tell(pilot)
        await pilot.press("1")
        await until(pilot, lambda: cells(app, QWEN30_ID)["err"] == "5")
        log = app.dashboard.query_one(TimelineView)
        await pilot.press("4")
        await settled(pilot)
        # Wrapped at the panel's width when shown, every line whole.
        assert all(strip.cell_length <= log.size.width for strip in log.lines)
        shown = " ".join(" ".join(strip.text.split()) for strip in log.lines)
        assert "1 chat to Qwen3-30B-A3B-4bit failed: its client got an error" in shown
        assert "2 chats to Qwen3-30B-A3B-4bit held until it could serve, then answered" in shown


@pytest.mark.anyio
async def test_describe_follows_new_counts_while_open() -> None:
    failover = Failover()
    app = failover.app
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: len(app.dashboard.visible_rows) == 3)
        await pilot.press("down", "enter")
        await until(pilot, lambda: isinstance(app.screen, DescribeScreen))

        def body() -> str:
            screen = app.screen
            assert isinstance(screen, DescribeScreen)
            return str(screen.query_one("#describe-body").render())

        await until(pilot, lambda: "40 ok · 2 held · 0 migrated · 4 failed" in body())
        await failover.tell(pilot)
        await until(pilot, lambda: "41 ok · 4 held · 1 migrated · 5 failed" in body())
