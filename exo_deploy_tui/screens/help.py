"""The help screen (``?``): every key, from the same table the command line reads.

The opener says which actions to list (read-only and demo decide), so the screen needs nothing
from the app. It fits an 80x24 terminal without scrolling: the keys sit in two columns and the
``:`` commands (with their arguments) follow as one wrapped paragraph, so a key's line never has
to hold its command too; one line of legend (the statuses, AGE's "+") ends it.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from exo_deploy_tui.view.cells import DRAINING_STYLE, DRAINING_SYMBOL
from exo_deploy_tui.view.commands import ActionSpec

# The text's width: an 80-column terminal less the dialog's border and padding.
HELP_WIDTH = 76
# One key column: two of them side by side, a space between.
KEY_COLUMN = (HELP_WIDTH - 1) // 2
# Right-aligned key names ("ctrl+d", "ctrl+p") so the descriptions start in one column.
KEY_WIDTH = 6

# What "+" after an AGE means: it was so already when the dashboard connected.
LEGEND_AGE = "3m or more"
# Keys the table does not hold: Textual's own, the same on every screen.
_BUILTIN_KEYS = (("ctrl+p", "palette: every action by name"),)


def _entry(key: str, words: str) -> Text:
    text = Text()
    text.append(f"{key:>{KEY_WIDTH}} ", style="bold cyan")
    text.append(words)
    text.truncate(KEY_COLUMN, overflow="ellipsis", pad=True)
    return text


def help_text(actions: list[ActionSpec]) -> Text:
    entries = [_entry(spec.key, spec.help) for spec in actions]
    entries += [_entry(key, words) for key, words in _BUILTIN_KEYS]
    rows = (len(entries) + 1) // 2
    text = Text()
    for i in range(rows):
        text.append_text(entries[i])
        if i + rows < len(entries):
            text.append(" ")
            text.append_text(entries[i + rows])
        text.rstrip()
        text.append("\n")
    commands = [f":{spec.command} {spec.args}".rstrip() for spec in actions if spec.command]
    # Straight under the keys, no blank line between: with the demo's keys the help has no
    # line to spare at 80x24, and the bold heading sets the commands apart.
    text.append("Commands", style="bold")
    column = len("Commands")
    for command in commands:  # wrapped by hand: a command and its arguments stay on one line
        if column + 2 + len(command) > HELP_WIDTH:
            text.append("\n")
            column = -2
        text.append(f"  {command}" if column >= 0 else command, style="dim")
        column += 2 + len(command)
    # The statuses and what AGE's "+" means share one line: with the demo's keys the help has
    # no line to spare at 80x24.
    text.append("\n● serving", style="green")
    text.append(" ◐ starting", style="yellow")
    text.append(" ○ placing", style="cyan")
    text.append(" ✖ cant_place", style="red")
    text.append(f" {DRAINING_SYMBOL} draining", style=DRAINING_STYLE)
    text.append(" · ", style="dim")
    text.append("AGE", style="bold")
    text.append(f" 3m+: {LEGEND_AGE}")
    return text


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close"),
    ]

    def __init__(self, actions: list[ActionSpec]) -> None:
        super().__init__()
        self.actions = actions

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog", classes="help") as dialog:
            dialog.border_title = "Keys"
            dialog.border_subtitle = "esc close"
            yield Static(help_text(self.actions), markup=False)
        yield Footer(compact=True)

    def action_close(self) -> None:
        self.dismiss(None)
