"""The confirmation of what takes something away: deleting a deployment (``ctrl+d``) or an
instance (``ctrl+k``), and draining a node (``D``). It says exactly what will go (or move, and
what stays), with Cancel focused.

As in k9s, a destructive key never acts alone: enter on the default button cancels, and going
ahead takes a deliberate move to "Delete" or "Drain" (tab, or the arrow keys) first. The drain's
confirm has a third button, "Force drain", after "Drain", so it is two moves away from Cancel
and never the one focused; the question says what forcing deletes.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Footer, Static

from exo_deploy_tui.model.cluster import DeploymentRow, InstanceRow
from exo_deploy_tui.model.draining import DrainPlan, PlannedInstance
from exo_deploy_tui.model.format import short_id, short_model


def delete_question(row: DeploymentRow) -> Text:
    text = Text()
    text.append("Delete the deployment of\n")
    text.append(f"  {row.model_id}", style="bold")
    text.append(f"  ({row.deployment_id})\n\n", style="dim")
    if row.instance_id:
        text.append(
            f"The keeper stops keeping it running and deletes the instance it placed "
            f"({short_id(row.instance_id)} on {', '.join(row.nodes) or 'no nodes'}).\n"
            "An instance of this model placed some other way is left running."
        )
    else:
        text.append("The keeper stops trying to place it. No instance is running.")
    return text


def delete_instance_question(instance: InstanceRow, replicas: int | None) -> Text:
    """What deleting ``instance`` does; ``replicas``: what the deployment of its model keeps,
    None when no deployment keeps the model."""
    text = Text()
    text.append("Delete the instance of\n")
    nodes = ", ".join(r.node_name for r in instance.runners) or "no nodes"
    text.append(f"  {short_model(instance.model_id)} on {nodes}\n", style="bold")
    text.append(f"  ({instance.instance_id})\n", style="dim")
    if instance.unhealthy:
        text.append(f"  ✖ unhealthy: {instance.unhealthy}\n", style="red")
    text.append("\n")
    if replicas is None:
        text.append("No deployment keeps this model: nothing places it again.")
    else:
        count = f"{replicas} replica{'s' if replicas != 1 else ''}"
        text.append(
            f"Its deployment keeps {count}: the keeper places a new one by its rules, on nodes "
            "apart from the other replicas."
        )
    return text


def drain_question(node: str, plan: DrainPlan) -> Text:
    """What draining ``node`` does with the instances on it (``plan``)."""
    text = Text()
    text.append("Drain node ")
    text.append(node, style="bold")
    text.append("\n\nNothing new is placed on it (it stays cordoned until uncordoned, c).\n")
    if plan.moved:
        text.append(
            "The keeper moves its instances off it, one per deployment at a time, each "
            "replacement ready before the old one goes:\n"
        )
        for instance in plan.moved:
            _planned(text, instance)
    else:
        text.append("No instance of the keeper's runs there: nothing moves.\n")
    if plan.left_alone:
        text.append("Left alone, running there (not placed by the keeper):\n")
        for instance in plan.left_alone:
            _planned(text, instance)
    text.append(
        "\nA move that fits nowhere waits (the nodes tab says why it is stuck) and its "
        "instance keeps serving here.",
        style="dim",
    )
    text.append("\nForce drain", style="bold red")
    text.append(
        " deletes at once what cannot be moved and what the keeper did not place.", style="dim"
    )
    return text


def _planned(text: Text, instance: PlannedInstance) -> None:
    text.append(f"  {short_model(instance.model_id)}", style="bold")
    text.append(f" {short_id(instance.instance_id)} on {', '.join(instance.nodes)}\n")


class ConfirmDeleteScreen(ModalScreen[bool]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Cancel"),
        Binding("left", "app.focus_previous", "Previous", show=False),
        Binding("right", "app.focus_next", "Next", show=False),
    ]

    def __init__(
        self, question: Text, title: str = "Delete deployment?", going_ahead: str = "Delete"
    ) -> None:
        super().__init__()
        self.question = question
        self.title_text = title
        self.going_ahead = going_ahead  # the label of the button that does it

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="confirm") as dialog:
            dialog.border_title = self.title_text
            yield Static(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary", compact=True)
                yield Button(self.going_ahead, id="delete", variant="error", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(False)

    @on(Button.Pressed, "#delete")
    def _delete(self) -> None:
        self.dismiss(True)


# What the drain's confirm answers: drain, drain by force, or None for cancel.
DrainChoice = Literal["drain", "force"]


class ConfirmDrainScreen(ModalScreen[DrainChoice | None]):
    """The drain's confirm: Cancel (focused), Drain, Force drain; escape cancels."""

    BINDINGS: ClassVar[list[BindingType]] = ConfirmDeleteScreen.BINDINGS

    def __init__(self, question: Text) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical(id="dialog", classes="confirm drain") as dialog:
            dialog.border_title = "Drain node?"
            yield Static(self.question, id="question")
            with Horizontal(id="buttons"):
                yield Button("Cancel", id="cancel", variant="primary", compact=True)
                yield Button("Drain", id="drain", variant="warning", compact=True)
                yield Button("Force drain", id="force", variant="error", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#cancel", Button).focus()

    @on(Button.Pressed, "#cancel")
    def action_cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#drain")
    def _drain(self) -> None:
        self.dismiss("drain")

    @on(Button.Pressed, "#force")
    def _force(self) -> None:
        self.dismiss("force")
