"""The dashboard application: wires a client to the model and the model to the screens.

One worker follows the master (``client.run``) and only posts messages; the app's message
handler folds them into the model in batches, at most one frame per ``MIN_FRAME_INTERVAL_S``
(a lone change draws at once, a storm of events draws 20 times a second), and a one-second
timer moves the countdowns and ages. Widgets are touched only from the app's
own handlers, never from the worker. Mutations run in their own workers and report through
notifications, so a slow master never blocks a key press.

While a drain is under way another worker reads ``GET /nodes`` (``_poll_nodes``): the State
says at once which nodes are cordoned and draining and the moves under way, but what a drain has
left and why a move is stuck only the keeper's answer there says, and the stuck reason changes
with no event. It asks again every ``DRAIN_POLL_S`` and at once whenever the State's drains or
cordons change, and stops when the last drain ends.

A third worker reads ``GET /healthz`` at start and every ``HEALTH_POLL_S`` for what the
service says of itself (a bridge's name and role when bridges share a store) and puts it in the
view state, which the header shows.

Attributes down, messages up: the app hands its screens itself as their ``ClusterSource`` and
its view state (``view``, bound to the dashboard's with ``data_bind``); the screens ask for
mutations, what-ifs, faults and pausing with the messages of ``screens.contract``, handled
here. The app is the one place that owns the client, the demo's faults and the view state.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from functools import partial
from pathlib import Path

import anyio
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.driver import Driver
from textual.message import Message
from textual.reactive import var
from textual.screen import Screen

from exo_deploy_tui.failure_log import record_failure
from exo_deploy_tui.feed.client import ApiError, ClusterClient
from exo_deploy_tui.model.cluster import ClusterModel
from exo_deploy_tui.model.format import short_id, short_model
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    HeardUpdate,
    NodesUpdate,
    SnapshotUpdate,
    Update,
)
from exo_deploy_tui.screens.contract import (
    CordonRequested,
    CreateRequested,
    DashboardView,
    DeleteRequested,
    DrainRequested,
    EditRequested,
    FaultRequested,
    InstanceDeleteRequested,
    ModelScreen,
    PauseToggled,
    ScaleRequested,
    WhatIfRequested,
)
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.node_picker import NodePickerScreen
from exo_deploy_tui.screens.whatif import WhatIfScreen
from exo_deploy_tui.terminal import EndOfInputDriver, exit_on_hangup
from exo_deploy_tui.view.commands import visible_actions
from exo_deploy_tui.view.edits import Setting, changes_text
from exo_deploy_tui.view.faults import FaultInjector, inject
from keeper.model.api_models import CommandResponse, CreateDeploymentRequest, ModelListEntry
from keeper.model.state import NodeDrain

# The countdowns and "silent for" ages move once a second, as a clock does.
TICK_S = 1.0
# At most this many frames a second from updates: a stream of events (a cluster recovering
# emits hundreds) is applied and drawn in batches, leaving the loop free for keys between
# frames, while a lone change still shows at once.
MIN_FRAME_INTERVAL_S = 0.05
# How often a long-running dashboard settles its heap again (see _settle_heap), at a quiet
# moment: rarely enough that the one collection it costs is never noticed.
HEAP_SETTLE_EVERY_S = 600.0
# If following the master ever fails unexpectedly, try again after this long, not in a loop.
FEED_RESTART_S = 5.0
# While a drain is under way, GET /nodes is read again after this long even if the State did
# not change: a stuck move's reason changes with no event, and a model loads in seconds, so
# this shows a drain as it goes at one small request every two seconds.
DRAIN_POLL_S = 2.0
# How often /healthz is read for the service's role: a standby bridge takes over within seconds
# of the acting one going, and the header should say so about as soon; one small read each time.
HEALTH_POLL_S = 5.0


def _driver_class() -> type[Driver] | None:
    """Our end-of-input-aware driver on Linux and macOS; Textual's choice elsewhere."""
    if sys.platform == "win32" or os.environ.get("TEXTUAL_DRIVER"):
        return None
    return EndOfInputDriver


class ClusterUpdated(Message):
    """Posted by the feed worker for each update; handled on the app's own task."""

    def __init__(self, update: Update) -> None:
        super().__init__()
        self.update = update


class DashboardApp(App[None]):
    CSS_PATH = Path(__file__).with_name("app.tcss")
    TITLE = "exo-deploy"
    BINDINGS = [
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]
    # The one place for view state: the dashboard's ``view`` is bound to this one.
    view: var[DashboardView] = var(DashboardView())

    def __init__(
        self,
        client: ClusterClient,
        *,
        clock: Callable[[], float] = time.time,
        readonly: bool = False,
        faults: FaultInjector | None = None,
        tick: bool = True,
        ansi_colors: bool = False,
    ) -> None:
        super().__init__(driver_class=_driver_class(), ansi_color=ansi_colors or None)
        # On a 16-colour terminal, the terminal's own palette reads truer than RGB squeezed
        # into it (which turns yellow into red), so the dashboard uses ANSI colours as they are.
        self._ansi_colors = ansi_colors
        self.client = client
        self.faults = faults
        self.model = ClusterModel()
        self.set_reactive(
            DashboardApp.view,
            DashboardView(url=client.url, readonly=readonly, demo=faults is not None),
        )
        self._clock = clock
        self._ticking = tick
        self._pending_updates: list[Update] = []
        self._frame_scheduled = False
        self._last_frame = 0.0  # time.monotonic() of the last frame drawn from updates
        self._heap_settled = time.monotonic()
        # The hole in the events (its first index) the client was last asked to resync for.
        self._resync_asked_for: int | None = None
        # While GET /nodes is being polled: set to ask again at once. And the State's drains
        # and cordons the last read was made for (an uncordon can unstick a move).
        self._nodes_wanted: anyio.Event | None = None
        self._drains_read: tuple[dict[str, NodeDrain], tuple[str, ...]] | None = None
        self.dashboard = DashboardScreen(self, self.view)

    def now(self) -> float:
        return self._clock()

    async def models(self) -> list[ModelListEntry]:
        return await self.client.models()

    def on_mount(self) -> None:
        if not self.is_headless:
            exit_on_hangup(self)
        if self._ansi_colors:
            self.theme = "ansi-dark"
        self.dashboard.data_bind(DashboardApp.view)
        self.push_screen(self.dashboard)
        self.run_worker(self._follow_master(), name="feed", group="feed", exit_on_error=False)
        self.run_worker(self._follow_health(), name="health", group="health", exit_on_error=False)
        if self._ticking:
            self.set_interval(TICK_S, self.tick)

    async def _follow_master(self) -> None:
        while True:
            try:
                await self.client.run(self._emit)
                return
            except Exception as exc:  # a bug must not take the dashboard down
                self._emit(ConnectionUpdate("down", f"internal error: {exc}", FEED_RESTART_S))
                # The status line has room for the message only: the traceback goes to a file.
                await anyio.to_thread.run_sync(
                    record_failure, exc, "the feed from the master failed unexpectedly"
                )
                await anyio.sleep(FEED_RESTART_S)

    async def _follow_health(self) -> None:
        """Read what the service says of itself (a bridge's name and role) now and every
        ``HEALTH_POLL_S``; the header shows it. Never raises: an unreadable answer is None."""
        while True:
            service = await self.client.service_health()
            if service != self.view.service:
                self.view = replace(self.view, service=service)
            await anyio.sleep(HEALTH_POLL_S)

    def _emit(self, update: Update) -> None:
        self.post_message(ClusterUpdated(update))

    def on_cluster_updated(self, message: ClusterUpdated) -> None:
        self._pending_updates.append(message.update)
        if self._frame_scheduled:
            return
        self._frame_scheduled = True
        wait = self._last_frame + MIN_FRAME_INTERVAL_S - time.monotonic()
        if wait <= 0:
            self.call_later(self._apply_pending)
        else:
            self.set_timer(wait, self._apply_pending)

    def _apply_pending(self) -> None:
        self._frame_scheduled = False
        pending, self._pending_updates = self._pending_updates, []
        if pending and all(isinstance(u, HeardUpdate) for u in pending):
            # Only the master's keepalive (once a second): dated, and drawn at once only if it
            # ended a quiet the timeline told; otherwise the next tick draws it. Not a frame, so
            # an idle dashboard still counts as quiet for _settle_heap.
            appended = self.model.timeline.appended
            self.model.handle(pending, self.now())
            if self.model.timeline.appended != appended:
                self.render_model()
            return
        self._last_frame = time.monotonic()
        if pending:
            self.model.handle(pending, self.now())
            missing = self.model.missing_from
            if missing is not None and missing != self._resync_asked_for:
                self.client.resync()  # a hole in the events: start again from a snapshot
            self._resync_asked_for = missing
            self._follow_drains()
            self.render_model()
            if any(isinstance(u, SnapshotUpdate) for u in pending):
                self._settle_heap()

    def _follow_drains(self) -> None:
        """Read GET /nodes now if the State's drains or cordons changed since the last read,
        polling it from here on while a drain is under way."""
        state = self.model.state
        if not state.drains or (state.drains, state.cordoned) == self._drains_read:
            return
        if self._nodes_wanted is not None:
            self._nodes_wanted.set()
            return
        self._nodes_wanted = anyio.Event()
        self.run_worker(self._poll_nodes(), name="nodes", group="nodes", exit_on_error=False)

    async def _poll_nodes(self) -> None:
        try:
            while self.model.state.drains and self._nodes_wanted is not None:
                self._drains_read = (self.model.state.drains, self.model.state.cordoned)
                try:
                    answer = await self.client.nodes()
                except ApiError as exc:
                    self._emit(NodesUpdate(None, exc.message))
                else:
                    self._emit(NodesUpdate(tuple(answer.nodes)))
                with anyio.move_on_after(DRAIN_POLL_S):
                    await self._nodes_wanted.wait()
                self._nodes_wanted = anyio.Event()
        finally:
            self._nodes_wanted = None
            self._drains_read = None

    def _settle_heap(self) -> None:
        """Collect once, then move everything alive out of the garbage collector's reach.

        A snapshot of a big cluster (500 deployments, each with its model card) plus what is
        drawn from it is hundreds of thousands of objects that live until they are replaced;
        every automatic full collection walks them all, 80-110 ms at 500 deployments, a visible
        stall each time. Frozen, they cost nothing (measured: full collections of 5-25 ms).
        Frozen objects are still freed by reference counting when dropped; the collection just
        before keeps garbage cycles from being frozen with them. Done after each snapshot and,
        as events replace what was frozen, again every ``HEAP_SETTLE_EVERY_S`` while idle.
        """
        gc.collect()
        gc.freeze()
        self._heap_settled = time.monotonic()

    def tick(self) -> None:
        self.model.tick(self.now())
        self.render_model()
        quiet = time.monotonic() - self._last_frame > 1.0
        if quiet and time.monotonic() - self._heap_settled > HEAP_SETTLE_EVERY_S:
            self._settle_heap()

    def render_model(self) -> None:
        if not self.screen_stack:
            # The app is closing: a frame or tick that came due while its screens were being
            # taken down has nothing left to draw on.
            return
        # Every screen drawn from the model, not only the top one: a dialog shows the screen
        # under it (describe under its delete confirm), and that screen, left as it was when
        # the dialog opened, would show a stale cluster there and after the dialog closes.
        for screen in self.screen_stack:
            if isinstance(screen, ModelScreen):
                screen.render_model()

    # -- what the screens ask for -------------------------------------------------------------

    def on_pause_toggled(self, message: PauseToggled) -> None:
        self.view = replace(self.view, paused=not self.view.paused)

    def on_create_requested(self, message: CreateRequested) -> None:
        async def create() -> None:
            message.answer(await self.create_deployment(message.request))

        self.run_worker(create(), group="mutations", exit_on_error=False)

    def on_delete_requested(self, message: DeleteRequested) -> None:
        self.delete_deployment(message.deployment_id, message.model_id)

    def on_scale_requested(self, message: ScaleRequested) -> None:
        async def scale() -> None:
            message.answer(
                await self.scale_deployment(
                    message.deployment_id, message.model_id, message.replicas
                )
            )

        self.run_worker(scale(), group="mutations", exit_on_error=False)

    def on_edit_requested(self, message: EditRequested) -> None:
        async def edit() -> None:
            message.answer(
                await self.edit_deployment(message.deployment_id, message.model_id, message.changes)
            )

        self.run_worker(edit(), group="mutations", exit_on_error=False)

    def on_instance_delete_requested(self, message: InstanceDeleteRequested) -> None:
        self.delete_instance(message.instance_id, message.model_id)

    def on_cordon_requested(self, message: CordonRequested) -> None:
        if message.cordon:
            send, title = partial(self.client.cordon, message.node), "Cordon"
        else:
            send, title = partial(self.client.uncordon, message.node), "Uncordon"
        self._node_command(send, title)

    def on_drain_requested(self, message: DrainRequested) -> None:
        title = "Force drain" if message.force else "Drain"
        self._node_command(partial(self.client.drain, message.node, message.force), title)

    def on_what_if_requested(self, message: WhatIfRequested) -> None:
        """Ask in the background and show the answer; a read, so read-only asks too. A second
        ``w`` before the answer replaces the first question."""
        node = message.node

        async def ask() -> None:
            try:
                answer = await self.client.what_if(node)
            except ApiError as exc:
                self.notify(exc.message, title="What-if failed", severity="error", timeout=8)
                return
            self.push_screen(WhatIfScreen(node, answer))

        self.run_worker(ask(), group="whatif", exclusive=True, exit_on_error=False)

    def on_fault_requested(self, message: FaultRequested) -> None:
        faults = self.faults
        if faults is None:
            self.notify("Faults can be injected only with --demo.", severity="warning")
            return
        kind, seconds = message.kind, message.seconds
        if message.node is not None or not message.needs_node:
            self.inject_fault(kind, message.node, seconds)
            return

        def chosen(name: str | None) -> None:
            if name:
                self.inject_fault(kind, name, seconds)

        picker = NodePickerScreen(kind, faults.node_names(), message.preferred)
        self.push_screen(picker, chosen)

    # -- mutations ----------------------------------------------------------------------------

    async def create_deployment(self, request: CreateDeploymentRequest) -> str | None:
        """Ask the master; returns None on success, else the reason it was refused."""
        if self.view.readonly:
            return "read-only: cannot create deployments"
        try:
            answer = await self.client.create_deployment(request)
        except ApiError as exc:
            return exc.message
        self.notify(f"Deployment of {short_model(request.model_id)} created.", title="Created")
        if answer.deployment_id:
            self.dashboard.select_deployment(answer.deployment_id)
        return None

    def delete_deployment(self, deployment_id: str, model_id: str) -> None:
        self._delete(
            "deployments",
            partial(self.client.delete_deployment, deployment_id),
            f"Deployment of {short_model(model_id)} deleted.",
        )

    async def scale_deployment(
        self, deployment_id: str, model_id: str, replicas: int
    ) -> str | None:
        """Ask the master; returns None on success, else the reason it was refused."""
        if self.view.readonly:
            return "read-only: cannot scale deployments"
        try:
            await self.client.scale_deployment(deployment_id, replicas)
        except ApiError as exc:
            return exc.message
        self.notify(f"{short_model(model_id)} scaled to {replicas}.", title="Scaled")
        return None

    async def edit_deployment(
        self, deployment_id: str, model_id: str, changes: dict[str, Setting]
    ) -> str | None:
        """Ask the service to change ``changes`` only; None on success, else its refusal."""
        if self.view.readonly:
            return "read-only: cannot edit deployments"
        try:
            await self.client.update_deployment(deployment_id, changes)
        except ApiError as exc:
            return exc.message
        self.notify(f"{short_model(model_id)}: {changes_text(changes)}.", title="Changed")
        return None

    def delete_instance(self, instance_id: str, model_id: str) -> None:
        self._delete(
            "instances",
            partial(self.client.delete_instance, instance_id),
            f"Instance {short_id(instance_id)} of {short_model(model_id)} deleted.",
        )

    def _delete(self, things: str, send: Callable[[], Awaitable[object]], deleted: str) -> None:
        """Send a delete in the background; the refusal, or ``deleted``, is notified."""
        if self.view.readonly:
            self.notify(f"Read-only: cannot delete {things}.", severity="warning")
            return

        async def delete() -> None:
            try:
                await send()
            except ApiError as exc:
                self.notify(exc.message, title="Delete refused", severity="error", timeout=8)
                return
            self.notify(deleted, title="Deleted")

        self.run_worker(delete(), group="mutations", exit_on_error=False)

    def _node_command(self, send: Callable[[], Awaitable[CommandResponse]], title: str) -> None:
        """Send a cordon, uncordon or drain in the background; the master's answer (what it
        did, or that it already was so) or its refusal is notified."""
        if self.view.readonly:
            self.notify("Read-only: cannot cordon or drain nodes.", severity="warning")
            return

        async def run() -> None:
            try:
                answer = await send()
            except ApiError as exc:
                self.notify(exc.message, title=f"{title} refused", severity="error", timeout=8)
                return
            self.notify(answer.message, title=title)

        self.run_worker(run(), group="mutations", exit_on_error=False)

    def inject_fault(self, kind: str, node: str | None, seconds: float | None) -> None:
        faults = self.faults
        if faults is None:
            return

        async def run() -> None:
            try:
                done = await anyio.to_thread.run_sync(inject, faults, kind, node, seconds)
            except Exception as exc:
                self.notify(str(exc), title="Fault not injected", severity="error")
                return
            self.notify(done, title="Demo fault")

        self.run_worker(run(), group="faults", exit_on_error=False)

    # -- command palette ------------------------------------------------------------------------

    def get_system_commands(self, screen: Screen[object]) -> Iterable[SystemCommand]:
        dashboard = self.dashboard
        for spec in visible_actions(readonly=self.view.readonly, demo=self.view.demo):
            if not spec.command:
                continue  # a key only (the command line itself, back)
            title = spec.command.capitalize() if spec.command else spec.help
            yield SystemCommand(
                f"{title} ({spec.key})",
                spec.help,
                partial(self.run_action, spec.action, dashboard),
            )

    async def on_unmount(self) -> None:
        await self.client.aclose()
