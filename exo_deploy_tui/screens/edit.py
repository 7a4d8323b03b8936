"""The edit form (``e``): a deployment's settings, changed in place with one ``PATCH``.

Filled with the deployment's settings as the State holds them when the form opens; Save sends
only what differs (``edits.edit_changes``, which also judges the fields as the service would,
each problem beside its field), and with nothing changed says so and sends nothing. Like the
create and scale forms it stays open until the service accepts; a refusal is shown beside each
field it names (``edits.refusal_notes``) and in full under the fields. A change of sharding,
instance_meta or min_nodes places the deployment anew, one instance at a time, which a line
under the fields says while one of them differs.

The screen gets the ``Deployment`` it edits and asks the app to send with ``EditRequested``;
it reads nothing else of the app.
"""

from __future__ import annotations

from typing import ClassVar, Final

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import Button, Checkbox, Footer, Input, Label, Select, Static

from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.screens.contract import EditRequested
from exo_deploy_tui.screens.master_form import MasterForm
from exo_deploy_tui.view.edits import (
    EDIT_FIELDS,
    ROLLING_NOTE,
    EditValues,
    current_values,
    edit_changes,
    refusal_notes,
    rolling,
)
from keeper.model.api_models import MAX_MIN_NODES
from keeper.model.state import (
    MAX_PRIORITY,
    MAX_REPLICAS,
    MAX_STANDBY,
    MIN_PRIORITY,
    Deployment,
    InstanceMeta,
    Sharding,
)

# Each field's words on its line: its label, and the hint beside it until a refusal names it.
_LABELS: Final = {
    "replicas": "Replicas",
    "standby": "Standby",
    "priority": "Priority",
    "preempt": "Preempt",
    "sharding": "Sharding",
    "instance_meta": "Instance",
    "min_nodes": "Min nodes",
}


def _hints(deployment: Deployment) -> dict[str, str]:
    layers = deployment.model_card.n_layers
    return {
        "replicas": f"1-{MAX_REPLICAS}, each on nodes apart",
        "standby": f"0-{MAX_STANDBY} node sets kept downloaded for a failover",
        "priority": f"{MIN_PRIORITY}-{MAX_PRIORITY}, higher placed first",
        "preempt": "may displace lower priorities to place",
        "sharding": "" if deployment.model_card.supports_tensor else "this model: Pipeline only",
        "instance_meta": "",
        "min_nodes": f"1-{min(layers, MAX_MIN_NODES) if layers else MAX_MIN_NODES}",
    }


def _on_off(value: bool) -> str:
    """The checkbox's own word: its mark alone reads the same either way in 16 colours."""
    return "on" if value else "off"


def edit_summary(deployment: Deployment) -> Text:
    text = Text()
    text.append(short_model(deployment.model_card.model_id), style="bold")
    text.append(f"  ({deployment.deployment_id})", style="dim")
    return text


class EditScreen(MasterForm):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("ctrl+s", "submit", "Save"),
    ]

    def __init__(self, deployment: Deployment) -> None:
        super().__init__()
        self.deployment = deployment
        self.initial = current_values(deployment)
        self.hints = _hints(deployment)

    def compose(self) -> ComposeResult:
        values = self.initial
        with Vertical(id="dialog", classes="edit") as dialog:
            dialog.border_title = "Edit deployment"
            dialog.border_subtitle = "esc cancel · ctrl+s save"
            yield Static(edit_summary(self.deployment), id="edit-summary")
            fields: dict[str, Widget] = {
                "replicas": self._count("replicas", values.replicas, 3),
                "standby": self._count("standby", values.standby, 2),
                "priority": self._count("priority", values.priority, 5),
                "preempt": Checkbox(
                    _on_off(values.preempt), values.preempt, id="edit-preempt", compact=True
                ),
                "sharding": self._choice("sharding", Sharding, values.sharding),
                "instance_meta": self._choice("instance_meta", InstanceMeta, values.instance_meta),
                "min_nodes": self._count("min_nodes", values.min_nodes, 4),
            }
            for name in EDIT_FIELDS:
                with Horizontal(classes="edit-line"):
                    yield Label(_LABELS[name], classes="edit-label")
                    yield fields[name]
                    yield Static(
                        Text(self.hints[name], style="dim"), id=f"note-{name}", classes="edit-note"
                    )
            yield Static("", id="edit-rolling", markup=False)
            yield Static("", id="form-error", markup=False)
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", compact=True)
                yield Button("Save", id="save", variant="primary", compact=True)
        yield Footer(compact=True)

    @staticmethod
    def _count(name: str, value: str, digits: int) -> Input:
        return Input(value, id=f"edit-{name}", type="integer", compact=True, max_length=digits + 1)

    @staticmethod
    def _choice(name: str, options: type[Sharding] | type[InstanceMeta], value: str) -> Select[str]:
        return Select(
            [(o.value, o.value) for o in options],
            value=value,
            allow_blank=False,
            id=f"edit-{name}",
            compact=True,
        )

    def on_mount(self) -> None:
        box = self.query_one("#edit-replicas", Input)
        box.focus()
        box.select_all()

    def values(self) -> EditValues:
        def typed(name: str) -> str:
            return self.query_one(f"#edit-{name}", Input).value

        def chosen(name: str) -> str:
            return str(self.query_one(f"#edit-{name}", Select).value)

        return EditValues(
            replicas=typed("replicas"),
            standby=typed("standby"),
            priority=typed("priority"),
            preempt=self.query_one("#edit-preempt", Checkbox).value,
            sharding=chosen("sharding"),
            instance_meta=chosen("instance_meta"),
            min_nodes=typed("min_nodes"),
        )

    @on(Input.Changed)
    @on(Select.Changed)
    @on(Checkbox.Changed)
    def _on_changed(self) -> None:
        """Say while a placement setting differs that saving replaces each instance."""
        changes = edit_changes(self.deployment, self.values())
        line = self.query_one("#edit-rolling", Static)
        if isinstance(changes, dict) and rolling(changes):
            line.update(Text(f"↻ {ROLLING_NOTE}", style="bold yellow"))
        else:
            line.update("")

    @on(Checkbox.Changed, "#edit-preempt")
    def _on_preempt(self, event: Checkbox.Changed) -> None:
        event.checkbox.label = _on_off(event.value)

    @on(Input.Submitted)
    @on(Button.Pressed, "#save")
    def _on_save(self) -> None:
        self.action_submit()

    def action_submit(self) -> None:
        if self.sending:
            return
        self._show_notes({})
        changes = edit_changes(self.deployment, self.values())
        if isinstance(changes, list):
            self._show_notes({p.field: p.message.removeprefix(f"{p.field}: ") for p in changes})
            self._refuse(f"{changes[0].message}.")
            return
        if not changes:
            self._show_error(Text("Nothing changed: nothing to send.", style="yellow"))
            return
        words = ", ".join(f"{name} {value}" for name, value in changes.items())
        self._sending(f"change {words}")
        deployment = self.deployment
        self.post_message(
            EditRequested(
                deployment.deployment_id, deployment.model_card.model_id, changes, self._answered
            )
        )

    def _answered(self, refused: str | None) -> None:
        super()._answered(refused)
        if refused is not None and self.is_attached:
            self._show_notes(refusal_notes(refused))

    def _show_notes(self, notes: dict[str, str]) -> None:
        """Each field's note: what is wrong with it (``notes``), else its hint."""
        for name in EDIT_FIELDS:
            why = notes.get(name)
            if why:
                # One line beside the field, cut if it must be: the whole is under the fields.
                short = why.replace(self.deployment.model_card.model_id, "this model")
                text = Text(f"✖ {short}", "bold red", no_wrap=True, overflow="ellipsis")
            else:
                text = Text(self.hints[name], "dim")
            self.query_one(f"#note-{name}", Static).update(text)
