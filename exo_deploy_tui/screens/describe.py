"""Describe (enter): one deployment in full, live.

Everything the table had to cut: the whole placement error, the keeper's timers in words, its
last 24 hours from the master's serving records (availability, MTTR, the incidents with their
cause), the instance's runners, the deployment's own lines of the timeline, and the raw JSON the
master holds, so an operator can paste it into an issue. It reads the model through the
``ClusterSource`` it is given and asks the app to delete with a message.

At 80x24 about 20 lines show before scrolling: what it is and what the keeper does now come
first, then the day's history (newest incidents first, a few of them), then the rest.
"""

from __future__ import annotations

import json
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import Footer, Static

from exo_deploy_tui.model.cluster import ClusterModel, DeploymentRow
from exo_deploy_tui.model.format import (
    STATUS_COLOR,
    clock_minute,
    clock_time,
    duration,
    gigabytes,
    percent_available,
    precise_duration,
    short_model,
    status_label,
)
from exo_deploy_tui.screens.confirm import ConfirmDeleteScreen, delete_question
from exo_deploy_tui.screens.contract import ClusterSource, DeleteRequested, ModelScreen
from exo_deploy_tui.view.cells import runner_status_text, timeline_line, timer_words
from exo_deploy_tui.view.requests import chats_lines
from keeper.model.api_models import RequestsView
from keeper.model.history import History, Incident

# The fields' names take this many columns; their values, and their further lines, start after.
FIELD_WIDTH = 11
# The body's width before it is laid out: an 80-column screen less the border and padding.
DEFAULT_WIDTH = 75
# Incidents listed, newest first: with the lines above them they fit an 80x24 screen; the
# rest are counted ("and 3 more").
INCIDENTS_SHOWN = 5


def describe_text(
    model: ClusterModel, deployment_id: str, model_id: str, now: float, width: int | None = None
) -> Text:
    """The deployment in full, as of ``now``; ``width``: the lines' room, which a runner's
    download fits its line to (the keeper's line above says it whole)."""
    rows = {r.deployment_id: r for r in model.deployment_rows(now)}
    row = rows.get(deployment_id)
    deployment = model.deployment(deployment_id)
    text = Text()
    if row is None or deployment is None:
        text.append(f"The deployment of {model_id} is gone (deleted).\n\n", style="bold yellow")
        for entry in model.timeline.about_model(model_id):
            text.append("  ")
            text.append_text(timeline_line(entry))
            text.append("\n")
        return text
    card = deployment.model_card
    text.append(short_model(row.model_id), style="bold")
    text.append("  ")
    text.append(status_label(row.status), style=f"bold {STATUS_COLOR[row.status]}")
    known = "" if row.in_status_known else " at least"
    text.append(f"  for{known} {duration(row.in_status_s)}\n\n", style="dim")
    fields = [
        ("deployment", deployment.deployment_id),
        (
            "model",
            f"{card.model_id} ({gigabytes(card.storage_size.in_bytes)}, {card.n_layers} layers)",
        ),
        (
            "options",
            f"{deployment.sharding} / {deployment.instance_meta}, "
            f"min {deployment.min_nodes} node{'s' if deployment.min_nodes != 1 else ''}",
        ),
        ("replicas", f"{row.ready_replicas} of {row.replicas} ready"),
        ("instance", f"{row.instance_id} on {', '.join(row.nodes)}" if row.instance_id else "none"),
    ]
    for name, value in fields:
        text.append(f"{name:<{FIELD_WIDTH}}", style="bold")
        text.append(f"{value}\n")
    text.append(f"{'keeper':<{FIELD_WIDTH}}", style="bold")
    text.append_text(_keeper_words(row, model.has_timers))
    text.append("\n")
    if model.has_timers:
        text.append_text(chats_text(row.requests, width))
    if row.placement_error:
        text.append("\nPlacement error\n", style="bold red")
        text.append(f"{row.placement_error}\n", style="red")
        if row.placement_why:
            text.append(f"why: {row.placement_why}\n")
    text.append_text(history_text(model.day_history(deployment_id, now)))
    instance = next((i for i in model.instance_rows(now) if i.instance_id == row.instance_id), None)
    if instance is not None:
        text.append("\nRunners\n", style="bold")
        for runner in instance.runners:
            gone = "" if runner.node_present else " (node gone)"
            line = (
                f"  rank {runner.rank}  {runner.node_name + gone:<18} "
                f"layers {runner.start_layer}-{runner.end_layer - 1:<6} "
            )
            room = None if width is None else max(1, width - len(line))
            words, style = runner_status_text(runner, room)
            text.append(line)
            text.append(f"{words}\n", style=style)
    text.append("\nTimeline", style="bold")
    text.append(" (its lines, seen by this dashboard or from the master's records)\n", style="dim")
    lines = model.history(deployment_id)
    if not lines:
        text.append("  nothing yet\n", style="dim")
    for entry in lines:
        text.append("  ")
        text.append_text(timeline_line(entry))
        text.append("\n")
    text.append("\nRaw JSON", style="bold")
    text.append(" (the deployment as the master holds it)\n", style="dim")
    raw = deployment.model_dump(mode="json", by_alias=True)
    text.append(json.dumps(raw, indent=2) + "\n", style="dim")
    view = model.view(deployment_id)
    if view is not None:
        text.append("\nThe keeper's view", style="bold")
        text.append(" (from GET /deployments, as last received)\n", style="dim")
        keeper = view.model_dump(mode="json", exclude={"deployment"})
        text.append(json.dumps(keeper, indent=2) + "\n", style="dim")
    return text


def chats_text(requests: RequestsView | None, width: int | None) -> Text:
    """The ``chats`` field: the deployment's chats through the service's front door over the
    last five minutes, each line under the field's column (``view/requests.py`` words them)."""
    text = Text()
    room = max(FIELD_WIDTH, (width or DEFAULT_WIDTH) - FIELD_WIDTH)
    for index, line in enumerate(chats_lines(requests, room)):
        text.append(f"{'chats' if index == 0 else '':<{FIELD_WIDTH}}", style="bold")
        text.append_text(line)
        text.append("\n")
    return text


def history_text(history: History) -> Text:
    """The last 24 h (times on the dashboard's clock): availability, MTTR and the incidents,
    newest first, each with its cause and how long it lasted."""
    text = Text()
    text.append("\nHistory (24 h)", style="bold")
    text.append(" from the master's serving records\n", style="dim")
    if history.availability is None:
        text.append("  availability — (the master keeps no serving records of it)\n", style="dim")
        return text
    incidents = history.incidents
    mttr = "—" if history.mttr_s is None else precise_duration(history.mttr_s)
    count = f"{len(incidents)} incident{'s' if len(incidents) != 1 else ''}"
    text.append(f"  {percent_available(history.availability)} available", style="bold")
    text.append(f" · MTTR {mttr} · {count}\n")
    if history.complete_from is not None:
        text.append(
            f"  complete from {clock_minute(history.complete_from)} "
            "(the master has no records before)\n",
            style="dim",
        )
    newest = sorted(incidents, key=lambda i: i.start, reverse=True)
    for incident in newest[:INCIDENTS_SHOWN]:
        text.append_text(_incident_line(incident))
    if len(newest) > INCIDENTS_SHOWN:
        text.append(f"  and {len(newest) - INCIDENTS_SHOWN} more, older\n", style="dim")
    return text


def _incident_line(incident: Incident) -> Text:
    line = Text(f"  {clock_time(incident.start)} ")
    if incident.end is None:
        line.append("✖ ", style="bold red")
        line.append(incident.cause, style="red")
        line.append(f"; ongoing, down {precise_duration(incident.downtime_s)}\n", style="bold red")
    else:
        line.append("✔ ", style="bold green")
        line.append(incident.cause)
        line.append(f"; recovered after {precise_duration(incident.downtime_s)}\n", style="green")
    return line


def _keeper_words(row: DeploymentRow, has_timers: bool) -> Text:
    if not has_timers:
        return Text("no timers (this master has no deployments API)", style="dim")
    words = timer_words(row)
    if not words:
        return Text("nothing pending" if row.status == "serving" else "placing at its next step")
    return Text(words, style="yellow")


class DescribeScreen(ModelScreen):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+d", "delete", "Delete"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(
        self, source: ClusterSource, deployment_id: str, model_id: str, *, readonly: bool
    ) -> None:
        super().__init__(source)
        self.deployment_id = deployment_id
        self.model_id = model_id
        self.readonly = readonly
        self._shown: Text | None = None

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="describe") as scroll:
            scroll.border_title = "Describe"
            scroll.border_subtitle = "esc back"
            yield Static("", id="describe-body", markup=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.render_model()
        self.query_one("#describe").focus()

    def render_model(self) -> None:
        source = self.source
        body = self.query_one("#describe-body", Static)
        # The body's width once laid out; before, the screen's less the border and padding.
        width = body.size.width or max(20, self.app.size.width - 5)
        text = describe_text(source.model, self.deployment_id, self.model_id, source.now(), width)
        if text != self._shown:
            self._shown = text
            body.update(text)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action == "delete" and self.readonly)

    def action_back(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        rows = {r.deployment_id: r for r in self.source.model.deployment_rows(self.source.now())}
        row = rows.get(self.deployment_id)
        if row is None:
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.post_message(DeleteRequested(row.deployment_id, row.model_id))
                self.dismiss(None)

        self.app.push_screen(ConfirmDeleteScreen(delete_question(row)), confirmed)
