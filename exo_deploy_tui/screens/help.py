"""The help screen (``?``): every key, from the same table the command line reads.

The opener says which actions to list (read-only and demo decide), so the screen needs nothing
from the app.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from exo_deploy_tui.commands import ActionSpec

# Width of the command column: fits every command without arguments, so the descriptions line
# up and still fit an 80-column terminal. A command whose arguments make it longer gets a line
# of its own, with its description below, instead of pushing the description out of line.
COMMAND_COLUMN = 22


def help_text(actions: list[ActionSpec]) -> Text:
    text = Text()
    for spec in actions:
        text.append(f"{spec.key:>7}  ", style="bold cyan")
        command = f":{spec.command} {spec.args}".rstrip() if spec.command else ""
        if len(command) >= COMMAND_COLUMN:
            text.append(f"{command}\n", style="dim")
            text.append(" " * (9 + COMMAND_COLUMN))
        else:
            text.append(f"{command:<{COMMAND_COLUMN}}", style="dim")
        text.append(f"{spec.help}\n")
    text.append("\n")
    text.append("   esc   ", style="bold cyan")
    text.append("back: close a dialog, clear the filter, leave a tab\n")
    text.append("ctrl+p   ", style="bold cyan")
    text.append("command palette: search every action by name\n")
    text.append("\nStatus: ", style="bold")
    text.append("● serving", style="green")
    text.append("  ◐ starting", style="yellow")
    text.append("  ○ placing", style="cyan")
    text.append("  ✖ cant_place", style="red")
    text.append(
        "\nAGE is the time in the current status (+: at least, it was so when we connected)"
    )
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
