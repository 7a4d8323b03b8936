"""The header's clock under each dialog: the app's own one-second timer (``TICK_S``) draws the
dashboard under a dialog as it does when the dashboard is on top (design §9.3).

The app runs its real tick here (the other tests tick by hand); the clock it reads is a variable
the test moves a minute on, and the test waits, with a deadline, for the screen as the terminal
would get it (``export_screenshot``, composed with the dashboard behind the dialog) to show it.
"""

from __future__ import annotations

import pytest
from test_tui_app import Clock, Faults, cluster, press_to, running, until
from textual.command import CommandPalette
from textual.pilot import Pilot
from textual.screen import Screen

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.model.format import clock_time
from exo_deploy_tui.model.updates import ConnectionUpdate
from exo_deploy_tui.screens.confirm import ConfirmDeleteScreen
from exo_deploy_tui.screens.help import HelpScreen
from exo_deploy_tui.screens.node_picker import NodePickerScreen
from exo_deploy_tui.screens.scale import ScaleScreen
from exo_deploy_tui.testing import ScriptedClient

# How far the test moves the clock each time: a minute, so the time shown changes in its
# minutes too and no time shown before can be taken for it.
_MINUTE = 60.0


async def until_shown(pilot: Pilot[None], text: str) -> None:
    """Until the screen as the terminal gets it shows ``text``; one tick at most, and a margin
    for a loaded machine."""
    await until(pilot, lambda: text in pilot.app.export_screenshot(), timeout_s=5)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("keys", "dialog"),
    [
        (("s",), ScaleScreen),
        (("ctrl+d",), ConfirmDeleteScreen),
        (("k",), NodePickerScreen),
        (("question_mark",), HelpScreen),
        (("ctrl+p",), CommandPalette),
    ],
    ids=["scale", "confirm", "picker", "help", "palette"],
)
async def test_the_header_clock_keeps_ticking_under_a_dialog(
    keys: tuple[str, ...], dialog: type[Screen[object]]
) -> None:
    clock = Clock()
    client = ScriptedClient(initial=[cluster().snapshot(), ConnectionUpdate("live")])
    app = DashboardApp(client, clock=clock, faults=Faults())  # ticking, as when run
    # Wide enough that the help, the largest dialog, leaves the header in sight.
    async with running(app, size=(120, 40)) as pilot:
        await until_shown(pilot, clock_time(clock.now))
        await press_to(pilot, *keys, screen=dialog)
        for _ in range(2):  # and again: not one last frame drawn as the dialog opened
            clock.now += _MINUTE
            await until_shown(pilot, clock_time(clock.now))
            assert isinstance(app.screen, dialog)
