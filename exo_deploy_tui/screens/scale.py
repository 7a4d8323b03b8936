"""The scale form (``s``, as in k9s): how many instances of the selected deployment to keep.

One number, checked before sending by the request's own rule (``forms.check_replicas``, in the
master's words), then sent with ``ScaleRequested``; like the create form it stays open until the
master accepts, showing the master's refusal verbatim if it says no. Scaling down removes only
the keeper's own instances, newest first (docs/design.md §5.11), which the form says, so the
operator knows which replicas go.
"""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widgets import Button, Footer, Input, Label, Static

from exo_deploy_tui.model.cluster import DeploymentRow
from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.screens.contract import ScaleRequested
from exo_deploy_tui.screens.master_form import MasterForm
from exo_deploy_tui.view.forms import check_replicas
from keeper.model.state import MAX_REPLICAS


def scale_summary(row: DeploymentRow) -> Text:
    text = Text()
    text.append(short_model(row.model_id), style="bold")
    text.append(f"  ({row.deployment_id})\n", style="dim")
    style = "bold yellow" if row.short else "green"
    text.append(f"{row.ready_replicas} of {row.replicas} ready", style=style)
    text.append(
        ". Each replica runs on nodes apart; scaling down removes the keeper's newest first.",
        style="dim",
    )
    return text


class ScaleScreen(MasterForm):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "submit", "Scale"),
    ]

    def __init__(self, row: DeploymentRow, replicas: int | None = None) -> None:
        super().__init__()
        self.row = row
        self.initial = row.replicas if replicas is None else replicas

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="scale") as dialog:
            dialog.border_title = "Scale deployment"
            dialog.border_subtitle = "esc cancel · enter scale"
            yield Static(scale_summary(self.row), id="scale-summary")
            with Horizontal(id="replicas-line"):
                yield Label(f"Replicas (1-{MAX_REPLICAS}) ")
                yield Input(
                    str(self.initial), id="replicas", type="integer", compact=True, max_length=3
                )
            yield Static("", id="form-error", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Scale", id="scale", variant="primary", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        box = self.query_one("#replicas", Input)
        box.focus()
        box.select_all()

    @on(Input.Submitted, "#replicas")
    @on(Button.Pressed, "#scale")
    def _on_scale(self) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        if self.sending:
            return
        replicas = check_replicas(self.query_one("#replicas", Input).value)
        if isinstance(replicas, str):
            self._refuse(replicas)
            return
        if replicas == self.row.replicas:
            self._show_error(
                Text(f"It keeps {replicas} already: nothing to change.", style="yellow")
            )
            return
        self._sending(f"scale to {replicas}")
        row = self.row
        self.post_message(ScaleRequested(row.deployment_id, row.model_id, replicas, self._answered))
