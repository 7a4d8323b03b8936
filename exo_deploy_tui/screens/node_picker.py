"""Which node a demo fault hits: a short list, the selected deployment's node first."""

from __future__ import annotations

from typing import ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, OptionList, Static

from exo_deploy_tui.view.faults import FAULT_WORDS


class NodePickerScreen(ModalScreen[str | None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, kind: str, names: list[str], preferred: str | None) -> None:
        super().__init__()
        self.kind = kind
        self.names = sorted(names)
        self.preferred = preferred

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="picker") as dialog:
            dialog.border_title = f"Demo: {FAULT_WORDS.get(self.kind, self.kind)}"
            dialog.border_subtitle = "enter choose · esc cancel"
            if self.names:
                yield OptionList(*self.names, id="picker")
            else:
                yield Static("No nodes are running.", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        if not self.names:
            return
        picker = self.query_one("#picker", OptionList)
        if self.preferred in self.names:
            picker.highlighted = self.names.index(self.preferred)
        picker.focus()

    @on(OptionList.OptionSelected, "#picker")
    def _chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self.names[event.option_index])

    def action_cancel(self) -> None:
        self.dismiss(None)
