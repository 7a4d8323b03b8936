"""Keys typed faster than the dashboard handles them: fast typing, or a paste into the terminal.

Pilot's ``press`` waits for the app to be idle after every key, which a person typing fast (or
a terminal pasting) does not. These tests post every key at once, as the terminal's input
thread would, and only then wait, with a deadline, for what the dashboard made of them.
"""

from __future__ import annotations

import pytest
from test_tui_app import Faults, make_app, running, until
from textual import events
from textual.app import App
from textual.widgets import Input

# Textual's names for the keys typed as characters here.
_KEY_FOR: dict[str, str] = {":": "colon", " ": "space", "/": "slash"}


def type_at_once(app: App[None], text: str) -> None:
    """Post a key event for every character of ``text`` with no pause between them: none is
    handled before the last is queued."""
    for char in text:
        app.post_message(events.Key(_KEY_FOR.get(char, char), char))


@pytest.mark.anyio
async def test_every_key_typed_fast_after_the_colon_goes_to_the_command_line() -> None:
    """``:kill studio`` typed at once: the command line gets ``kill studio``, and none of its
    letters runs as a key (``k`` would open the kill picker, ``s`` the scale form)."""
    faults = Faults()
    app, _ = make_app(faults=faults)
    async with running(app) as pilot:
        box = app.dashboard.query_one("#command", Input)
        type_at_once(app, ":kill studio")
        # Until the command line holds it all, or a key opened a screen over the dashboard.
        await until(pilot, lambda: box.value == "kill studio" or app.screen is not app.dashboard)
        await pilot.pause()  # every key handled (Textual waits for the screen's messages)
        opened = [type(screen).__name__ for screen in app.screen_stack[2:]]
        assert not opened, f"{', '.join(opened)} opened over the dashboard"
        assert app.focused is box
        assert faults.calls == []
        await pilot.press("enter")
        await until(pilot, lambda: faults.calls)
        assert faults.calls == [("kill", "studio")]
        assert app.screen is app.dashboard


@pytest.mark.anyio
async def test_every_key_typed_fast_after_the_slash_goes_to_the_filter() -> None:
    """``/`` then ``qwen:3`` at once: the filter gets it all (``q`` would quit, ``:`` open the
    command line); a ``:`` typed in a box is text."""
    app, _ = make_app()
    async with running(app) as pilot:
        box = app.dashboard.query_one("#filter", Input)
        type_at_once(app, "/qwen:3")
        await until(pilot, lambda: box.value == "qwen:3" or app.screen is not app.dashboard)
        await pilot.pause()  # every key handled (Textual waits for the screen's messages)
        assert app.is_running and app.screen is app.dashboard
        assert app.focused is box
        assert not app.dashboard.query_one("#command", Input).display
        assert app.dashboard.filter_text == "qwen:3"
