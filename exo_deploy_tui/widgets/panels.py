"""The dashboard's panels: each takes rows from the model and shows them, nothing more.

Every ``show`` is cheap when nothing changed (the tables compare cells, the texts compare
before refreshing), so the dashboard can call them after every batch of updates and once a
second for the countdowns without redrawing the screen.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import Static

from exo_deploy_tui.model.cluster import Connection, DeploymentRow, InstanceRow, NodeRow, Summary
from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.model.timeline import Timeline
from exo_deploy_tui.view.cells import (
    deployment_cells,
    deployment_columns,
    detail_text,
    header_text,
    instance_columns,
    instance_table_rows,
    next_text,
    node_columns,
    node_key,
    node_table_rows,
    nodes_text,
    timeline_line,
)
from exo_deploy_tui.view.columns import Column
from exo_deploy_tui.widgets.table import KeyedTable
from exo_deploy_tui.widgets.wrapped_log import WrappedLog
from keeper.model.api_models import ServiceHealthView


class TextLine(Static):
    """A Static that refreshes only when its text really changed."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__("", id=id, classes=classes, markup=False)
        self._shown: Text | None = None

    def show_text(self, text: Text) -> None:
        if text != self._shown:
            self._shown = text
            self.update(text)


class HeaderBar(TextLine):
    def show(
        self,
        connection: Connection,
        summary: Summary,
        now: float,
        url: str,
        *,
        paused: bool,
        readonly: bool,
        service: ServiceHealthView | None = None,
    ) -> None:
        width = self.size.width or self.app.size.width
        self.show_text(
            header_text(
                connection,
                summary,
                now,
                url,
                width=width,
                paused=paused,
                readonly=readonly,
                service=service,
            )
        )


TABS: tuple[tuple[str, str], ...] = (
    ("deployments", "Deployments"),
    ("nodes", "Nodes"),
    ("instances", "Instances"),
    ("timeline", "Timeline"),
)


class TabBar(TextLine):
    """One line of tabs with their number keys; the counts say what is behind each."""

    def show(self, active: str, counts: dict[str, str]) -> None:
        text = Text()
        for number, (key, label) in enumerate(TABS, start=1):
            count = counts.get(key, "")
            body = f" {number} {label}{' ' + count if count else ''} "
            if key == active:
                text.append(body, style="bold reverse")
            else:
                text.append(body, style="dim")
            text.append(" ")
        self.show_text(text)


class SizedTable(KeyedTable):
    """A KeyedTable whose columns follow its width (and, for some, its content)."""

    class ColumnsChanged(Message):
        """The column layout changed; the owner should show its rows again."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns_now: tuple[Column, ...] = self.columns_for(80)
        self.set_columns(self.columns_now)

    def columns_for(self, width: int) -> tuple[Column, ...]:
        raise NotImplementedError

    def relayout(self, width: int | None = None) -> None:
        columns = self.columns_for(self.size.width if width is None else width)
        if columns != self.columns_now:
            self.columns_now = columns
            self.set_columns(columns)
            self.post_message(self.ColumnsChanged())

    def on_resize(self, event: events.Resize) -> None:
        # The content's width, not the event's: that is the widget's outer size, two columns
        # wider than the rows have in the wide layout's bordered panels.
        self.relayout()


class DeploymentsTable(SizedTable):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("enter", "select", "Describe", key_display="⏎"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        self._model_len = 26
        self._nodes_len = 14
        self._replicas = True
        self._next_len = 0
        super().__init__(id=id)

    def columns_for(self, width: int) -> tuple[Column, ...]:
        return deployment_columns(
            width,
            self._model_len,
            self._nodes_len,
            replicas=self._replicas,
            next_len=self._next_len,
        )

    def show(self, rows: Sequence[DeploymentRow], *, has_deployments_api: bool = True) -> None:
        model_len = max((len(short_model(r.model_id)) for r in rows), default=20)
        nodes_len = max((len(nodes_text(r)) for r in rows), default=8)
        next_len = max((len(next_text(r)) for r in rows), default=0)
        layout = (model_len, nodes_len, has_deployments_api, next_len)
        if layout != (self._model_len, self._nodes_len, self._replicas, self._next_len):
            self._model_len, self._nodes_len, self._replicas, self._next_len = layout
            if self.size.width:
                self.relayout()
        columns = self.columns_now
        self.sync([(r.deployment_id, deployment_cells(r, columns)) for r in rows])


class SecondaryTable(SizedTable):
    """A panel beside the deployments: its cursor shows only while it has focus."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cursor_when_blurred = False


class NodesTable(SecondaryTable):
    """The nodes, each with its cordon's or drain's lines under it; its columns follow what the
    nodes report (disk, vitals, models on disk)."""

    def __init__(self, *, id: str | None = None) -> None:
        self._reports = (False, False, False)  # disk, vitals, models beyond the runners
        self._node_rows: dict[str, NodeRow] = {}
        super().__init__(id=id)

    def columns_for(self, width: int) -> tuple[Column, ...]:
        disk, vitals, models = self._reports
        return node_columns(width, disk=disk, vitals=vitals, models=models)

    def show(self, rows: Sequence[NodeRow]) -> None:
        reports = (
            any(r.disk_total is not None for r in rows),
            any(r.vitals is not None for r in rows),
            any(r.models != r.runners for r in rows),
        )
        if reports != self._reports:
            self._reports = reports
            if self.size.width:
                self.relayout()
        self._node_rows = {node_key(r): r for r in rows}
        self.sync(node_table_rows(rows, self.columns_now))

    def selected_node(self) -> NodeRow | None:
        """The node the cursor is on: its row or one of the lines under it."""
        keys = self.keys
        for index in range(min(self.cursor_row, len(keys) - 1), -1, -1):
            node = self._node_rows.get(keys[index])
            if node is not None:
                return node
        return None


class InstancesTable(SecondaryTable):
    # Shown in the footer while the instances have focus; the screen's check_action (read-only)
    # decides for it, and the screen's own ctrl+k says where to go from anywhere else.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+k", "screen.delete_instance", "Del inst"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._instances: dict[str, InstanceRow] = {}

    def columns_for(self, width: int) -> tuple[Column, ...]:
        return instance_columns(width)

    def show(self, rows: list[InstanceRow]) -> None:
        self._instances = {r.instance_id: r for r in rows}
        self.sync(instance_table_rows(rows, self.columns_now))

    def selected_instance(self) -> InstanceRow | None:
        """The instance the cursor is in: its head row, its reason line or one of its runners."""
        keys = self.keys
        for index in range(min(self.cursor_row, len(keys) - 1), -1, -1):
            instance = self._instances.get(keys[index])
            if instance is not None:
                return instance
        return None


class DetailStrip(TextLine):
    """The selected deployment in full, under the table."""

    LINES = 3

    def show(self, row: DeploymentRow | None, *, has_deployments_api: bool = True) -> None:
        width = self.size.width or self.app.size.width
        self.show_text(detail_text(row, width, self.LINES, has_deployments_api=has_deployments_api))


# Entries the timeline panel keeps: hours of a busy cluster's story; each is kept with its
# wrapped rows, so keeping the whole model timeline (1 000 entries) here would only weigh on
# memory and GC.
TIMELINE_LINES_SHOWN = 500


class TimelineView(WrappedLog):
    """The timeline, appended to as it grows; each entry wrapped at the width it is drawn with
    (``WrappedLog``), so what arrived while the tab was hidden reads whole when shown."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=TIMELINE_LINES_SHOWN)
        self._appended = 0

    def show(self, timeline: Timeline) -> None:
        new = timeline.since(self._appended)
        self._appended = timeline.appended
        self.append(timeline_line(entry) for entry in new)
