"""The log that keeps its lines and wraps them at the width it is drawn with (WrappedLog).

Each test hosts one log in a bare app and does to it what the dashboard does: hides it while
lines arrive, shows it again, resizes the terminal, scrolls up. Rows are read back as text.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.pilot import Pilot

from exo_deploy_tui.widgets.wrapped_log import WrappedLog

pytestmark = pytest.mark.anyio

# 59 characters, words of 9 and a space: at 38 columns (40, less the scrollbar's 2) it wraps to
# two rows, at 78 it fits on one.
LONG = " ".join(["abcdefghi"] * 6)


class LogApp(App[None]):
    def __init__(self, max_lines: int = 100) -> None:
        super().__init__()
        self.max_lines = max_lines

    def compose(self) -> ComposeResult:
        yield WrappedLog(max_lines=self.max_lines, id="log")

    @property
    def log_view(self) -> WrappedLog:
        return self.query_one(WrappedLog)


def rows(log: WrappedLog) -> list[str]:
    return ["".join(segment.text for segment in strip).rstrip() for strip in log.lines]


def shown(log: WrappedLog) -> list[str]:
    """The rows on screen, top to bottom."""
    return ["".join(s.text for s in log.render_line(y)).rstrip() for y in range(log.size.height)]


async def until(pilot: Pilot[None], condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + 5
    while not condition():
        log = pilot.app.query_one(WrappedLog)
        assert time.monotonic() < deadline, f"never: {what} {log.scroll_offset} {shown(log)[:1]}"
        await pilot.pause(0.02)


async def test_lines_written_while_hidden_wrap_at_the_width_shown() -> None:
    app = LogApp()
    async with app.run_test(size=(40, 10)) as pilot:
        log = app.log_view
        log.append([Text("first")])
        await until(pilot, lambda: rows(log) == ["first"], "the first line drawn")
        log.display = False
        await until(pilot, lambda: log.scrollable_content_region.width == 0, "hidden")
        log.append([Text(LONG)])
        log.display = True
        await until(pilot, lambda: len(rows(log)) == 3, "the hidden line wrapped when shown")
        width = log.scrollable_content_region.width
        assert width == 38
        assert rows(log) == ["first", " ".join(["abcdefghi"] * 3), " ".join(["abcdefghi"] * 3)]
        assert [t.plain for t in log.texts] == ["first", LONG]


async def test_lines_wrap_again_when_the_width_changes() -> None:
    app = LogApp()
    async with app.run_test(size=(40, 10)) as pilot:
        log = app.log_view
        log.append([Text(LONG)])
        await until(pilot, lambda: len(rows(log)) == 2, "wrapped at 38 columns")
        await pilot.resize_terminal(80, 10)
        await until(pilot, lambda: rows(log) == [LONG], "one row at 78 columns")
        await pilot.resize_terminal(40, 10)
        await until(pilot, lambda: len(rows(log)) == 2, "two rows again at 38")


async def test_keeps_the_last_max_lines() -> None:
    app = LogApp(max_lines=3)
    async with app.run_test(size=(40, 10)) as pilot:
        log = app.log_view
        log.append(Text(f"line {n}") for n in range(2))
        log.append(Text(f"line {n}") for n in range(2, 5))
        await until(pilot, lambda: rows(log) == ["line 2", "line 3", "line 4"], "the last three")
        assert [t.plain for t in log.texts] == ["line 2", "line 3", "line 4"]
        # More at once than it keeps: only the newest of them.
        log.append(Text(f"new {n}") for n in range(5))
        await until(pilot, lambda: rows(log) == ["new 2", "new 3", "new 4"], "the newest three")


async def test_follows_the_end_as_lines_arrive() -> None:
    app = LogApp()
    async with app.run_test(size=(40, 5)) as pilot:
        log = app.log_view
        log.append(Text(f"line {n}") for n in range(20))
        await until(pilot, lambda: shown(log)[-1] == "line 19", "the end shown")
        log.append([Text("line 20")])
        await until(pilot, lambda: shown(log)[-1] == "line 20", "still at the end")


async def test_stays_where_the_operator_scrolled_up_to() -> None:
    app = LogApp(max_lines=30)
    async with app.run_test(size=(40, 5)) as pilot:
        log = app.log_view
        log.append(Text(f"line {n}") for n in range(30))
        await until(pilot, lambda: shown(log)[-1] == "line 29", "the end shown")
        log.scroll_to(y=10, animate=False)
        await until(pilot, lambda: shown(log)[0] == "line 10", "scrolled up")
        # Two more: the two oldest fall off the front, and line 10 stays at the top.
        log.append([Text("line 30"), Text("line 31")])
        await until(pilot, lambda: rows(log)[-1] == "line 31", "the new lines kept")
        await pilot.pause()
        assert shown(log)[0] == "line 10"
        # Back at the end, it follows again.
        log.scroll_end(animate=False)
        await until(pilot, lambda: shown(log)[-1] == "line 31", "at the end")
        log.append([Text("line 32")])
        await until(pilot, lambda: shown(log)[-1] == "line 32", "following again")


async def test_a_rewrap_keeps_the_line_read_at_the_top() -> None:
    app = LogApp()
    async with app.run_test(size=(40, 5)) as pilot:
        log = app.log_view
        log.append(Text(f"{n:02d} {LONG}") for n in range(10))
        await until(pilot, lambda: len(rows(log)) == 20, "each line on two rows")
        log.scroll_to(y=8, animate=False)  # line 04's first row
        await until(pilot, lambda: shown(log)[0].startswith("04 "), "scrolled up to 04")
        await pilot.resize_terminal(80, 5)
        await until(pilot, lambda: len(rows(log)) == 10, "each line on one row")
        await until(pilot, lambda: shown(log)[0].startswith("04 "), "04 still at the top")
