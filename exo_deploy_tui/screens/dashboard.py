"""The main screen: deployments first, with nodes, instances and the timeline beside them.

At 80x24 one panel shows at a time (tabs 1-4, the deployments table by default) with the
selected deployment's details under it; from 120x36 all four show at once. The keys, and which
actions read-only and demo mode allow, are made from the table in ``exo_deploy_tui.view.commands``,
which the help, ``:`` and the command palette read too.
The screen keeps its own view state (tab, sort, filter, selection); the data is the app's
model, read through the ``ClusterSource`` it was given, and the app's view state (paused,
read-only, demo) arrives in ``view``, bound to the app's. Whatever changes the cluster or the
app is asked for with a message (``screens.contract``); the screen never imports the app.

About 520 lines because it is the one screen with the four panels, their actions and their
shared view state (tab, sort, filter, selection); the panels' drawing is in ``widgets``.
"""

from __future__ import annotations

from typing import ClassVar, cast

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Vertical
from textual.reactive import var
from textual.widgets import Footer, Input

from exo_deploy_tui.model.cluster import DeploymentRow, SortKey, sort_rows
from exo_deploy_tui.screens.confirm import (
    ConfirmDeleteScreen,
    ConfirmDrainScreen,
    DrainChoice,
    delete_instance_question,
    delete_question,
    drain_question,
)
from exo_deploy_tui.screens.contract import (
    ClusterSource,
    CordonRequested,
    DashboardView,
    DeleteRequested,
    DrainRequested,
    FaultRequested,
    InstanceDeleteRequested,
    ModelScreen,
    PauseToggled,
    WhatIfRequested,
)
from exo_deploy_tui.screens.create import CreateScreen
from exo_deploy_tui.screens.describe import DescribeScreen
from exo_deploy_tui.screens.edit import EditScreen
from exo_deploy_tui.screens.help import HelpScreen
from exo_deploy_tui.screens.scale import ScaleScreen
from exo_deploy_tui.view.cells import no_deployments_api
from exo_deploy_tui.view.commands import (
    ACTIONS,
    ParseError,
    allowed,
    parse_command,
    visible_actions,
)
from exo_deploy_tui.widgets.panels import (
    DeploymentsTable,
    DetailStrip,
    HeaderBar,
    InstancesTable,
    NodesTable,
    SizedTable,
    TabBar,
    TimelineView,
)
from exo_deploy_tui.widgets.table import KeyedTable

# From this size every panel fits on screen at once with a useful number of rows each.
WIDE_MIN_WIDTH = 120
WIDE_MIN_HEIGHT = 36


class DashboardScreen(ModelScreen):
    # Made from the table in ``exo_deploy_tui.view.commands``, in its order (the footer's).
    # ``:`` and ``/`` with priority: see ``_focus_box``.
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding(
            spec.binding_keys,
            spec.action,
            spec.title,
            show=spec.footer,
            priority=spec.takes_typing,
        )
        for spec in ACTIONS
    ]

    # The app's view state, bound to the app's own (``data_bind``): read here, changed there.
    view: var[DashboardView] = var(DashboardView())

    def __init__(self, source: ClusterSource, view: DashboardView) -> None:
        super().__init__(source)
        self.set_reactive(DashboardScreen.view, view)
        self.active_tab = "deployments"
        self.sort_key: SortKey = "status"
        self.sort_reverse = False
        self.filter_text = ""
        self.broken_only = False
        self.visible_rows: list[DeploymentRow] = []

    def compose(self) -> ComposeResult:
        yield HeaderBar(id="header")
        yield TabBar(id="tabs")
        yield Input(placeholder="filter: model, status, node, error…", id="filter", compact=True)
        with Container(id="panels"):
            with Vertical(id="deployments-panel", classes="panel"):
                yield DeploymentsTable(id="deployments")
                yield DetailStrip(id="detail")
            yield NodesTable(id="nodes")
            yield InstancesTable(id="instances")
            yield TimelineView(id="timeline")
        yield Input(placeholder=":command  (help lists them)", id="command", compact=True)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        self.query_one("#nodes").add_class("panel")
        self.query_one("#instances").add_class("panel")
        self.query_one("#timeline").add_class("panel")
        self.query_one("#filter").display = False
        self.query_one("#command").display = False
        self._apply_layout()
        self.query_one(DeploymentsTable).focus()

    def on_resize(self) -> None:
        self._apply_layout()
        self.render_model()

    def _apply_layout(self) -> None:
        wide = self.size.width >= WIDE_MIN_WIDTH and self.size.height >= WIDE_MIN_HEIGHT
        self.set_class(wide, "wide")
        self.set_class(not wide, "compact")
        for panel in self.query(".panel"):
            panel.set_class(panel.id in (f"{self.active_tab}-panel", self.active_tab), "active")

    @property
    def wide(self) -> bool:
        return self.has_class("wide")

    # -- rendering ------------------------------------------------------------------------------

    def watch_view(self) -> None:
        self.render_model()

    def render_model(self) -> None:
        """Show the app's model as of the app's clock; cheap when nothing changed."""
        if not self.is_mounted or not self.query(HeaderBar):
            return  # not composed yet, or being torn down on exit
        model, now, view = self.source.model, self.source.now(), self.view
        summary = model.summary(now)
        self.query_one(HeaderBar).show(
            model.connection,
            summary,
            now,
            view.url,
            paused=view.paused,
            readonly=view.readonly,
            service=view.service,
        )
        if view.paused:
            return
        rows = model.deployment_rows(now)
        shown = [r for r in rows if (not self.broken_only or r.broken)]
        if self.filter_text:
            shown = [r for r in shown if r.matches(self.filter_text)]
        self.visible_rows = sort_rows(shown, self.sort_key, self.sort_reverse)
        table = self.query_one(DeploymentsTable)
        table.show(self.visible_rows, has_deployments_api=model.has_timers or not model.has_data)
        self._show_detail()
        # Hidden panels (compact layout) are not rendered at all: on a big cluster the instances
        # table alone is a thousand rows. Showing a tab renders it at once.
        if self._visible("nodes"):
            self.query_one(NodesTable).show(model.node_rows(now))
        if self._visible("instances"):
            self.query_one(InstancesTable).show(model.instance_rows(now))
        if self._visible("timeline"):
            self.query_one(TimelineView).show(model.timeline)
        nodes = summary.nodes_alive + summary.nodes_silent + summary.nodes_gone + summary.nodes_away
        self._show_titles(len(rows), len(shown), nodes, summary.instances)

    def _visible(self, panel: str) -> bool:
        return self.wide or self.active_tab == panel

    def _show_titles(self, total: int, shown: int, nodes: int, instances: int) -> None:
        arrow = "↓" if self.sort_reverse else "↑"
        view = [f"sort {self.sort_key}{arrow}"]
        if self.broken_only:
            view.append("broken only")
        if self.filter_text:
            view.append(f"/{self.filter_text}")
        count = f"{shown}/{total}" if shown != total else str(total)
        self.query_one(TabBar).show(
            self.active_tab,
            {
                "deployments": f"{count} ({', '.join(view)})",
                "nodes": str(nodes),
                "instances": str(instances),
            },
        )
        panel = self.query_one("#deployments-panel")
        panel.border_title = f"Deployments {count}"
        panel.border_subtitle = ", ".join(view)
        self.query_one("#nodes").border_title = f"Nodes {nodes}"
        self.query_one("#instances").border_title = f"Instances {instances}"
        self.query_one("#timeline").border_title = "Timeline"

    def selected_row(self) -> DeploymentRow | None:
        key = self.query_one(DeploymentsTable).selected_key
        for row in self.visible_rows:
            if row.deployment_id == key:
                return row
        return self.visible_rows[0] if self.visible_rows else None

    @on(KeyedTable.CursorMoved, "#deployments")
    def _on_highlight(self) -> None:
        self._show_detail()

    def _show_detail(self) -> None:
        model = self.source.model
        self.query_one(DetailStrip).show(
            self.selected_row(), has_deployments_api=model.has_timers or not model.has_data
        )

    @on(KeyedTable.RowSelected, "#deployments")
    def _on_select(self, event: KeyedTable.RowSelected) -> None:
        event.stop()
        self.action_describe()

    @on(SizedTable.ColumnsChanged)
    def _on_columns(self) -> None:
        self.render_model()

    # -- permissions ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return allowed(action, readonly=self.view.readonly, demo=self.view.demo)

    # -- actions ----------------------------------------------------------------------------------

    # What read-only and demo mode refuse, ``check_action`` refuses (the table says which):
    # Textual asks it for keys, and the command line and the palette go through
    # ``App.run_action``, which asks it too.

    def action_new(self) -> None:
        if self._refuse_without_api():
            return
        self.app.push_screen(CreateScreen(self.source))

    def action_delete(self) -> None:
        if self._refuse_without_api():
            return
        row = self._chosen_row()
        if row is None:
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.post_message(DeleteRequested(row.deployment_id, row.model_id))

        self.app.push_screen(ConfirmDeleteScreen(delete_question(row)), confirmed)

    def action_scale(self, replicas: int | None = None) -> None:
        if self._refuse_without_api():
            return
        row = self._chosen_row()
        if row is None:
            return
        self.app.push_screen(ScaleScreen(row, replicas))

    def action_edit(self) -> None:
        if self._refuse_without_api():
            return
        row = self._chosen_row()
        if row is None:
            return
        deployment = self.source.model.state.deployments.get(row.deployment_id)
        if deployment is None:
            self.notify("The selected deployment is gone.", severity="warning")
            return
        self.app.push_screen(EditScreen(deployment))

    def action_delete_instance(self) -> None:
        table = self.query_one(InstancesTable)
        chosen = table.has_focus or (not self.wide and self.active_tab == "instances")
        instance = table.selected_instance() if chosen else None
        if instance is None:
            self.notify(
                "ctrl+k deletes the instance selected in the instances view: "
                "press 3 and choose one.",
                severity="warning",
            )
            return
        deployment = next(
            (
                d
                for d in self.source.model.state.deployments.values()
                if d.model_card.model_id == instance.model_id
            ),
            None,
        )
        question = delete_instance_question(instance, deployment.replicas if deployment else None)

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.post_message(InstanceDeleteRequested(instance.instance_id, instance.model_id))

        self.app.push_screen(ConfirmDeleteScreen(question, "Delete instance?"), confirmed)

    def action_cordon(self, node: str | None = None) -> None:
        """Cordon the node (``node``, else the one selected in the nodes view), or uncordon it
        if the State says it is cordoned (or draining: uncordoning ends the drain)."""
        name = node or self._chosen_node("c cordons or uncordons")
        if name is None:
            return
        cordoned = name in self.source.model.state.cordoned
        self.post_message(CordonRequested(name, cordon=not cordoned))

    def action_drain(self, node: str | None = None) -> None:
        name = node or self._chosen_node("D drains")
        if name is None:
            return

        def confirmed(choice: DrainChoice | None) -> None:
            if choice is not None:
                self.post_message(DrainRequested(name, force=choice == "force"))

        question = drain_question(name, self.source.model.drain_plan(name))
        self.app.push_screen(ConfirmDrainScreen(question), confirmed)

    def action_whatif(self, node: str | None = None) -> None:
        """Ask what losing the node (``node``, else the one selected in the nodes view) now
        would do; the app shows the master's answer."""
        name = node or self._chosen_node("w asks what if we lost")
        if name is not None:
            self.post_message(WhatIfRequested(name))

    def action_describe(self) -> None:
        row = self._chosen_row()
        if row is None:
            return
        self.app.push_screen(
            DescribeScreen(
                self.source, row.deployment_id, row.model_id, readonly=self.view.readonly
            )
        )

    def action_filter(self, text: str | None = None) -> None:
        """Open the filter box (the key), or filter by ``text`` (``:filter``; "" clears)."""
        if text is not None:
            self.set_filter(text)
            return
        self.show_tab("deployments", focus=False)
        box = self.query_one("#filter", Input)
        box.value = self.filter_text
        self._focus_box(box)

    def set_filter(self, text: str) -> None:
        self.filter_text = text.strip()
        box = self.query_one("#filter", Input)
        box.display = bool(self.filter_text)
        box.value = self.filter_text
        self.show_tab("deployments")
        self.render_model()

    @on(Input.Changed, "#filter")
    def _on_filter_typed(self, event: Input.Changed) -> None:
        self.filter_text = event.value.strip()
        self.render_model()

    @on(Input.Submitted, "#filter")
    def _on_filter_done(self) -> None:
        self.query_one("#filter", Input).display = bool(self.filter_text)
        self.query_one(DeploymentsTable).focus()

    def action_sort(self, key: str) -> None:
        sort_key = cast("SortKey", key)
        if sort_key == self.sort_key:
            self.sort_reverse = not self.sort_reverse
        else:
            self.sort_key, self.sort_reverse = sort_key, False
        self.render_model()

    def action_broken(self) -> None:
        self.broken_only = not self.broken_only
        self.notify(
            "Showing only deployments that are not serving."
            if self.broken_only
            else "Showing every deployment.",
            timeout=2,
        )
        self.render_model()

    def action_pause(self) -> None:
        self.post_message(PauseToggled())

    def action_show_tab(self, name: str) -> None:
        self.show_tab(name)

    def show_tab(self, name: str, *, focus: bool = True) -> None:
        if name not in ("deployments", "nodes", "instances", "timeline"):
            return
        self.active_tab = name
        self._apply_layout()
        self.render_model()
        if focus:
            self.query_one(f"#{name}").focus()

    def action_command_line(self) -> None:
        box = self.query_one("#command", Input)
        box.value = ""
        self._focus_box(box)

    def _focus_box(self, box: Input) -> None:
        """Show ``box`` and give it focus now, for the keys typed after the one that opened it.

        Textual routes each key to the focused widget as it reads it, and only then do the
        focused widget's ancestors' bindings run, so a key's action runs after the keys typed
        just after it were routed: fast typing or a paste after ``:`` ran its letters as keys.
        The keys that open a box are bound with priority (``ActionSpec.takes_typing``), which
        runs them as the key is read, and focus moves here rather than in ``Widget.focus``'s
        later callback: every key after them is routed to the box (design §9.1). A printable
        key typed in a box is the box's (Textual leaves out bindings an ``Input`` consumes),
        so ``:`` and ``/`` typed in one are text.
        """
        box.display = True
        self.set_focus(box)

    @on(Input.Submitted, "#command")
    def _on_command(self, event: Input.Submitted) -> None:
        box = self.query_one("#command", Input)
        box.display = False
        self._focus_active()
        self.run_command(event.value)

    def run_command(self, line: str) -> None:
        """Run a ``:`` command as the key for it would: through ``App.run_action``, so
        ``check_action`` decides here as it does for keys and the palette."""
        parsed = parse_command(line, readonly=self.view.readonly, demo=self.view.demo)
        if isinstance(parsed, ParseError):
            self.notify(parsed.message, title="Command", severity="error")
            return
        self.call_later(self.app.run_action, ("", parsed.method, parsed.args), self)

    def action_help(self) -> None:
        actions = visible_actions(readonly=self.view.readonly, demo=self.view.demo)
        self.app.push_screen(HelpScreen(actions))

    def action_quit(self) -> None:
        self.app.exit()

    def action_back(self) -> None:
        command = self.query_one("#command", Input)
        filter_box = self.query_one("#filter", Input)
        if command.display:
            command.display = False
        elif filter_box.display or self.filter_text:
            self.set_filter("")
        elif self.broken_only:
            self.action_broken()
        elif self.active_tab != "deployments":
            self.show_tab("deployments")
            return
        self._focus_active()

    def action_fault(
        self, kind: str, node: str | None = None, seconds: float | None = None
    ) -> None:
        if not self.view.demo:
            self.notify("Faults can be injected only with --demo.", severity="warning")
            return
        row = self.selected_row()
        preferred = row.nodes[0] if row and row.nodes else None
        self.post_message(FaultRequested(kind, node, seconds, preferred=preferred))

    def action_restart_master(self) -> None:
        if not self.view.demo:
            self.notify("The master can be restarted only with --demo.", severity="warning")
            return
        self.post_message(FaultRequested("restart_master", needs_node=False))

    # -- helpers ----------------------------------------------------------------------------------

    def _refuse_without_api(self) -> bool:
        """Against a master known to lack the deployments API, say so at once rather than open
        a form whose answer can only be a refusal."""
        model = self.source.model
        if model.has_data and not model.has_timers:
            self.notify(
                no_deployments_api(self.view.url),
                title="No deployments here",
                severity="warning",
                timeout=10,
            )
            return True
        return False

    def _chosen_row(self) -> DeploymentRow | None:
        """The selected deployment for an action on it, or None after saying none is selected."""
        row = self.selected_row()
        if row is None:
            self.notify("No deployment selected.", severity="warning")
        return row

    def _chosen_node(self, what: str) -> str | None:
        """The name of the node selected in the nodes view, as the master calls it; or None
        after saying where to choose one (``what``: the key and what it does)."""
        table = self.query_one(NodesTable)
        chosen = table.has_focus or (not self.wide and self.active_tab == "nodes")
        row = table.selected_node() if chosen else None
        if row is None or not row.handle:
            self.notify(
                f"{what} the node selected in the nodes view: press 2 and choose one.",
                severity="warning",
            )
            return None
        return row.handle

    def _focus_active(self) -> None:
        self.query_one(f"#{self.active_tab}").focus()

    def select_deployment(self, deployment_id: str) -> None:
        self.query_one(DeploymentsTable).select_key(deployment_id)
