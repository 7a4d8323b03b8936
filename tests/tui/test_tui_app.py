"""The dashboard driven by keys (Textual's Pilot) against a scripted master.

The clock is a variable the tests move; updates are pushed into the scripted client and the
tests wait, with a deadline, for the screen to show them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from model_ids import LLAMA, QWEN
from recorded_exo import recorded_state
from textual.pilot import Pilot
from textual.screen import Screen
from textual.widgets import Button, Input, OptionList, Static

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, SnapshotUpdate, Update
from exo_deploy_tui.screens.confirm import ConfirmDeleteScreen
from exo_deploy_tui.screens.create import CreateScreen
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.describe import DescribeScreen
from exo_deploy_tui.screens.help import KEY_COLUMN, KEY_WIDTH, HelpScreen
from exo_deploy_tui.screens.node_picker import NodePickerScreen
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, ScriptedClient
from exo_deploy_tui.view.commands import ACTIONS, visible_actions
from exo_deploy_tui.widgets.panels import DeploymentsTable, HeaderBar, TimelineView
from keeper.model.api_models import CreateDeploymentRequest
from keeper.model.events import DeploymentDeleted, IndexedEvent
from keeper.model.state import InstanceMeta, RunnerLoading, Sharding

QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
LLAMA70 = "mlx-community/Llama-3.3-70B-Instruct-4bit"
NO_FIT = "No cycles found with sufficient memory"

ScreenT = TypeVar("ScreenT", bound=Screen[Any])


class Clock:
    def __init__(self, now: float = FROZEN_NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cluster(now: float = FROZEN_NOW) -> ClusterBuilder:
    return (
        ClusterBuilder(now=now)
        .node("studio", ram_gb=96, free_gb=80)
        .node("mini-a", ram_gb=24, free_gb=18)
        .node("mini-b", ram_gb=24, free_gb=18)
        .link_all()
        .deployment(QWEN, on=["mini-a"])
        .deployment(
            QWEN30,
            on=["studio", "mini-b"],
            runners=[RunnerLoading(layers_loaded=2, total_layers=24)] * 2,
        )
        .deployment(LLAMA, failures=2, next_attempt_in_s=40, waiting="backoff")
        .deployment(
            DEEPSEEK,
            error=NO_FIT,
            next_attempt_in_s=25,
            waiting="unplaceable_retry",
        )
    )


@dataclass
class Faults:
    calls: list[tuple[str, ...]] = field(default_factory=list)

    def node_names(self) -> list[str]:
        return ["mini-a", "mini-b", "studio"]

    def kill_node(self, name: str) -> None:
        self.calls.append(("kill", name))

    def freeze_node(self, name: str, seconds: float) -> None:
        self.calls.append(("freeze", name, str(seconds)))

    def partition_node(self, name: str, seconds: float) -> None:
        self.calls.append(("partition", name, str(seconds)))

    def kill_runner(self, name: str) -> None:
        self.calls.append(("kill_runner", name))

    def restart_master(self) -> None:
        self.calls.append(("restart_master",))


def make_app(
    builder: ClusterBuilder | None = None,
    *,
    clock: Clock | None = None,
    readonly: bool = False,
    faults: Faults | None = None,
    client: ScriptedClient | None = None,
) -> tuple[DashboardApp, ScriptedClient]:
    snapshot = (builder or cluster()).snapshot()
    client = client or ScriptedClient(initial=[snapshot, ConnectionUpdate("live")])
    app = DashboardApp(client, clock=clock or Clock(), readonly=readonly, faults=faults, tick=False)
    return app, client


async def until(pilot: Pilot[None], condition: Callable[[], object], timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the dashboard did not get there in time")
        await pilot.pause(0.02)


def dashboard(app: DashboardApp) -> DashboardScreen:
    return app.dashboard


def shown_models(app: DashboardApp) -> list[str]:
    return [r.model_id for r in dashboard(app).visible_rows]


def selected(app: DashboardApp) -> str | None:
    return app.dashboard.query_one(DeploymentsTable).selected_key


def sort_name_ran_or_a_screen_opened(app: DashboardApp) -> bool:
    """After keys and then N: whether N sorted by name on the dashboard (so the keys before it
    were handled), or a screen opened that took N instead."""
    return app.dashboard.sort_key == "name" or not isinstance(app.screen, DashboardScreen)


async def until_notified(pilot: Pilot[None], *words: str) -> None:
    """Wait until, for each of ``words``, a notification holds them."""
    app = pilot.app
    await until(pilot, lambda: all(any(w in n.message for n in app._notifications) for w in words))


@asynccontextmanager
async def running(
    app: DashboardApp, size: tuple[int, int] = (80, 24), deployments: int = 4
) -> AsyncIterator[Pilot[None]]:
    """The app on a terminal of ``size``, once the dashboard lists its ``deployments``."""
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: len(app.dashboard.visible_rows) == deployments)
        yield pilot


async def press_to(pilot: Pilot[None], *keys: str, screen: type[ScreenT]) -> ScreenT:
    """Press ``keys`` and wait until a ``screen`` is on top; that screen."""
    await pilot.press(*keys)
    await until(pilot, lambda: isinstance(pilot.app.screen, screen))
    shown = pilot.app.screen
    assert isinstance(shown, screen)
    return shown


async def open_create_form(pilot: Pilot[None]) -> CreateScreen:
    """``n`` on the dashboard, until the form lists the catalog's models."""
    form = await press_to(pilot, "n", screen=CreateScreen)
    await until(pilot, lambda: form.shown)
    return form


async def select_llama(pilot: Pilot[None], app: DashboardApp) -> None:
    """``down`` from the top, until Llama's deployment is selected."""
    await pilot.press("down")  # Llama
    await until(pilot, lambda: selected(app) == "dep-llama-3.2-1b-instruct-4bit")


async def cancel_then_confirm(
    pilot: Pilot[None], key: str, deleted: Callable[[], Sequence[object]]
) -> None:
    """On a confirm (a delete's, a drain's): Cancel has focus and ``enter`` keeps everything
    (back on the dashboard, ``deleted()`` still empty); then ``key`` again and the button that
    goes ahead, until ``deleted()`` holds what was sent."""
    app = pilot.app
    confirm = type(app.screen)
    focused = app.focused
    assert isinstance(focused, Button) and focused.id == "cancel"
    await pilot.press("enter")  # the default answer keeps it
    await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
    assert list(deleted()) == []

    await press_to(pilot, key, screen=confirm)
    await pilot.press("right", "enter")
    await until(pilot, deleted)


@pytest.mark.anyio
async def test_the_main_view_lists_deployments_broken_first() -> None:
    app, _ = make_app()
    async with running(app):
        assert shown_models(app) == [DEEPSEEK, LLAMA, QWEN30, QWEN]
        table = app.dashboard.query_one(DeploymentsTable)
        first = [text.strip() for text, _ in table.row_at(0)]
        assert first[:2] == ["✖ cant_place", "DeepSeek-V3.1-4bit"]
        assert "retry 25s" in first


@pytest.mark.anyio
async def test_create_sends_what_the_form_says() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        form = await open_create_form(pilot)
        await until(pilot, lambda: len(form.shown) == 7)
        await pilot.press(*"llama 70")
        await until(pilot, lambda: [e.id for e in form.shown] == [LLAMA70])
        await pilot.press("enter", "enter")  # into the list, choose it
        form.query_one("#min-nodes", Input).value = "2"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: client.created)
        assert client.created == [
            CreateDeploymentRequest(
                model_id=LLAMA70,
                sharding=Sharding.PIPELINE,
                instance_meta=InstanceMeta.MLX_RING,
                min_nodes=2,
            )
        ]
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))


@pytest.mark.anyio
async def test_the_fit_hint_follows_the_highlight_and_an_empty_search_says_so() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        form = await open_create_form(pilot)
        await until(pilot, lambda: len(form.shown) == 7)
        note = form.query_one("#catalog-note")
        catalog = form.query_one("#catalog", OptionList)
        await pilot.press("enter")  # from the search into the list
        first = form.chosen()
        await until(pilot, lambda: first is not None and "GB" in str(note.render()))
        hint = str(note.render())
        await pilot.press("down")  # highlighted, not chosen
        await until(pilot, lambda: form.chosen() is not first)
        await until(pilot, lambda: str(note.render()) != hint)
        assert catalog.highlighted is not None
        await pilot.press("shift+tab")  # back to the search
        await pilot.press(*"gemma")
        await until(pilot, lambda: not form.shown)
        await until(pilot, lambda: "no model matches 'gemma'" in str(note.render()))


@pytest.mark.anyio
async def test_create_names_what_is_wrong_before_sending() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        form = await open_create_form(pilot)
        await until(pilot, lambda: form.shown)
        form.query_one("#min-nodes", Input).value = "0"
        await pilot.press("ctrl+s")
        error = form.query_one("#form-error")
        await until(pilot, lambda: "between 1 and 1024" in str(error.render()))
        await pilot.press(*"qwen3-0.6")
        await until(pilot, lambda: [e.id for e in form.shown] == [QWEN])
        form.query_one("#min-nodes", Input).value = "1"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "already has a deployment" in str(error.render()))
        assert client.created == []
        assert app.screen is form


@pytest.mark.anyio
async def test_create_shows_the_masters_refusal_and_stays_open() -> None:
    app, client = make_app()
    client.refuse_with = ApiError("no such model: foo", 404)
    async with running(app) as pilot:
        form = await open_create_form(pilot)
        await until(pilot, lambda: form.shown)
        await pilot.press(*"llama 70", "ctrl+s")
        error = form.query_one("#form-error")
        await until(pilot, lambda: "The master refused: no such model: foo" in str(error.render()))
        assert app.screen is form


@pytest.mark.anyio
async def test_delete_asks_first_with_cancel_focused() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        await select_llama(pilot, app)
        await press_to(pilot, "ctrl+d", screen=ConfirmDeleteScreen)
        await cancel_then_confirm(pilot, "ctrl+d", lambda: client.deleted)
        assert client.deleted == ["dep-llama-3.2-1b-instruct-4bit"]


@pytest.mark.anyio
async def test_delete_from_describe_deletes_and_goes_back() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        await select_llama(pilot, app)
        await press_to(pilot, "enter", screen=DescribeScreen)
        await press_to(pilot, "ctrl+d", screen=ConfirmDeleteScreen)
        await pilot.press("right", "enter")
        await until(pilot, lambda: client.deleted)
        assert client.deleted == ["dep-llama-3.2-1b-instruct-4bit"]
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))


@pytest.mark.anyio
async def test_filter_narrows_the_table_and_escape_clears_it() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await pilot.press("slash", *"mini-b")
        await until(pilot, lambda: shown_models(app) == [QWEN30])
        await pilot.press("enter")  # keep the filter, back to the table
        assert isinstance(app.focused, DeploymentsTable)
        assert shown_models(app) == [QWEN30]
        await pilot.press("escape")
        await until(pilot, lambda: len(shown_models(app)) == 4)
        assert not app.dashboard.query_one("#filter", Input).display


@pytest.mark.anyio
async def test_sort_keys_and_reversal() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await pilot.press("N")
        await until(pilot, lambda: shown_models(app) == [DEEPSEEK, LLAMA, QWEN, QWEN30])
        await pilot.press("N")
        await until(pilot, lambda: shown_models(app) == [QWEN30, QWEN, LLAMA, DEEPSEEK])
        await pilot.press("S")
        await until(pilot, lambda: shown_models(app) == [DEEPSEEK, LLAMA, QWEN30, QWEN])


@pytest.mark.anyio
async def test_selection_stays_on_the_deployment_when_rows_come_go_and_resort() -> None:
    clock = Clock()
    app, client = make_app(clock=clock)
    async with running(app) as pilot:
        await pilot.press("down", "down")  # Qwen3-30B, third row by status
        await until(pilot, lambda: selected(app) == "dep-qwen3-30b-a3b-4bit")
        # DeepSeek goes, a new broken deployment arrives on top, Qwen3-0.6B breaks.
        changed = (
            ClusterBuilder(now=FROZEN_NOW)
            .node("studio", ram_gb=96, free_gb=80)
            .node("mini-a", ram_gb=24, free_gb=18)
            .node("mini-b", ram_gb=24, free_gb=18)
            .link_all()
            .deployment(QWEN)
            .deployment(
                QWEN30,
                on=["studio", "mini-b"],
                runners=[RunnerLoading(layers_loaded=2, total_layers=24)] * 2,
            )
            .deployment(LLAMA)
            .deployment(LLAMA70, error=NO_FIT)
        )
        client.push(changed.snapshot())
        await until(pilot, lambda: LLAMA70 in shown_models(app))
        assert shown_models(app) == [LLAMA70, LLAMA, QWEN, QWEN30]
        table = app.dashboard.query_one(DeploymentsTable)
        assert selected(app) == "dep-qwen3-30b-a3b-4bit"
        assert table.cursor_row == 3
        await pilot.press("N")  # re-sort: still on it
        await until(pilot, lambda: shown_models(app)[0] == LLAMA)
        assert selected(app) == "dep-qwen3-30b-a3b-4bit"
        assert table.cursor_row == shown_models(app).index(QWEN30)


@pytest.mark.anyio
async def test_when_the_selected_row_goes_the_cursor_stays_in_place() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        await pilot.press("down")
        await until(pilot, lambda: selected(app) == "dep-llama-3.2-1b-instruct-4bit")
        builder = cluster()
        state = builder.state.model_copy(
            update={
                "deployments": {
                    k: v
                    for k, v in builder.state.deployments.items()
                    if k != "dep-llama-3.2-1b-instruct-4bit"
                }
            }
        )
        client.push(SnapshotUpdate(state, None))
        await until(pilot, lambda: len(shown_models(app)) == 3)
        assert selected(app) == "dep-qwen3-30b-a3b-4bit"


@pytest.mark.anyio
async def test_a_lost_master_shows_stale_since_and_recovers() -> None:
    clock = Clock()
    app, client = make_app(clock=clock)
    async with running(app, size=(100, 24)) as pilot:
        header = app.dashboard.query_one(HeaderBar)
        assert "● live" in str(header.render())
        clock.now = FROZEN_NOW + 7
        client.push(ConnectionUpdate("down", "cannot connect", 4))
        await until(pilot, lambda: "stale since 12:00:07" in str(header.render()))
        assert "cannot connect, retrying in 4s" in str(header.render())
        # The last data stays on screen while stale.
        assert len(shown_models(app)) == 4
        clock.now = FROZEN_NOW + 20
        client.push(cluster(FROZEN_NOW + 20).snapshot(), ConnectionUpdate("live"))
        await until(pilot, lambda: "● live" in str(header.render()))
        assert "stale" not in str(header.render())


@pytest.mark.anyio
async def test_the_timeline_panel_wraps_long_lines_at_its_own_width() -> None:
    """At 120x40 the timeline sits beside the instances, narrower than 78 columns: a long line
    wraps there rather than running off the panel's edge."""
    app, client = make_app()
    async with running(app, size=(120, 40)) as pilot:
        timeline = app.dashboard.query_one(TimelineView)
        width = timeline.scrollable_content_region.width
        assert width < 78
        client.push(ConnectionUpdate("down", "connection refused by 192.0.2.10:52415 " * 3, 4))
        await until(pilot, lambda: len(timeline.lines) > 2)
        assert max(line.cell_length for line in timeline.lines) <= width


@pytest.mark.anyio
async def test_readonly_hides_and_blocks_create_and_delete() -> None:
    app, client = make_app(readonly=True)
    async with running(app) as pilot:
        await pilot.press("n", "ctrl+d", "N")
        # N ran, so n and ctrl+d were handled before it (or one opened a screen N went to).
        await until(pilot, lambda: sort_name_ran_or_a_screen_opened(app))
        assert isinstance(app.screen, DashboardScreen)
        shown_keys = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
        assert "n" not in shown_keys and "ctrl+d" not in shown_keys
        app.dashboard.run_command("new")
        app.dashboard.run_command("delete")
        await until_notified(
            pilot,
            "'new' is not available: the dashboard is read-only",
            "'delete' is not available: the dashboard is read-only",
        )
        assert isinstance(app.screen, DashboardScreen)
        assert client.created == [] and client.deleted == []
        assert "read-only" in str(app.dashboard.query_one(HeaderBar).render())


@pytest.mark.anyio
async def test_readonly_blocks_create_and_delete_typed_as_commands_and_from_the_palette() -> None:
    app, client = make_app(readonly=True)
    async with running(app) as pilot:
        for command in ("new", "delete"):
            await pilot.press("colon", *command, "enter")
            await until_notified(pilot, f"'{command}' is not available: the dashboard is read-only")
            assert isinstance(app.screen, DashboardScreen)
            # The palette's way in: App.run_action, refused by the screen's check_action (it
            # answers whether the action ran: a screen it opened would be on top already).
            assert await app.run_action(command, app.dashboard) is False
            assert isinstance(app.screen, DashboardScreen)
        assert client.created == [] and client.deleted == []


@pytest.mark.anyio
async def test_the_command_line_is_refused_what_check_action_refuses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await press_to(pilot, "colon", *"describe", "enter", screen=DescribeScreen)
        await press_to(pilot, "escape", screen=DashboardScreen)

        def refuse_describe(action: str, parameters: tuple[object, ...]) -> bool:
            return action != "describe"

        monkeypatch.setattr(app.dashboard, "check_action", refuse_describe)
        await pilot.press("colon", *"describe", "enter", "colon", *"sort name", "enter")
        await until(pilot, lambda: app.dashboard.sort_key == "name")  # the next command ran
        assert isinstance(app.screen, DashboardScreen)


@pytest.mark.anyio
@pytest.mark.parametrize(("readonly", "demo"), [(False, True), (True, False), (True, True)])
async def test_every_key_of_the_table_runs_its_action_unless_the_mode_refuses_it(
    readonly: bool, demo: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each key of the table, pressed on the dashboard, calls the action the table gives it
    with the table's arguments; read-only refuses exactly the mutating ones, and without --demo
    the demo's. (The actions only record that they were called.)"""
    app, _ = make_app(readonly=readonly, faults=Faults() if demo else None)
    calls: list[tuple[str, tuple[object, ...]]] = []

    def recorder(method: str) -> Callable[[object, object, object], None]:
        # Textual passes an action as many of its arguments as the method takes: three at most.
        def record(a: object = None, b: object = None, c: object = None) -> None:
            calls.append((method, tuple(arg for arg in (a, b, c) if arg is not None)))

        return record

    keys = [(key, spec) for spec in ACTIONS for key in spec.binding_keys.split(",")]
    assert keys[-1][1].method == "back"  # never refused: once it ran, every key was handled
    async with running(app) as pilot:
        for method in {spec.method for spec in ACTIONS}:
            monkeypatch.setattr(app.dashboard, f"action_{method}", recorder(method))
        await pilot.press(*(key for key, _ in keys))
        await until(pilot, lambda: ("back", ()) in calls)
        expected = [
            (spec.method, spec.params)
            for _, spec in keys
            if not (readonly and spec.mutating) and not (spec.demo_only and not demo)
        ]
        assert sorted(calls) == sorted(expected)
        assert isinstance(app.screen, DashboardScreen)


@pytest.mark.anyio
async def test_a_hole_in_the_events_asks_the_client_for_a_snapshot() -> None:
    builder = cluster()
    app, client = make_app(builder)
    async with running(app) as pilot:
        last = app.model.state.last_event_applied_idx
        gone = IndexedEvent(
            idx=last + 2, event=DeploymentDeleted(deployment_id="dep-qwen3-0.6b-4bit")
        )
        client.push(EventUpdate(gone))
        await until(pilot, lambda: client.resyncs == 1)
        assert QWEN in shown_models(app)  # not applied on top of the hole
        # The same hole is asked about once. The connection's change after it shows when the
        # app has taken the event in (in order, with the resync decided for it).
        client.push(EventUpdate(gone), ConnectionUpdate("down", "cannot connect", 4))
        await until(pilot, lambda: app.model.connection.mode == "down")
        assert client.resyncs == 1
        client.push(
            cluster().snapshot(),
            ConnectionUpdate("live"),
            EventUpdate(gone.model_copy(update={"idx": last + 1})),
        )
        await until(pilot, lambda: QWEN not in shown_models(app))
        assert not app.model.needs_snapshot and client.resyncs == 1


@pytest.mark.anyio
async def test_a_frame_that_comes_due_while_the_app_closes_is_dropped() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await pilot.pause()
    # Closed: the screens are gone, as when an update's frame or a tick fires during shutdown.
    assert not app.screen_stack
    app.render_model()
    app._pending_updates.append(ConnectionUpdate("down", "cannot connect", 4))
    app._apply_pending()
    assert app.model.connection.mode == "down"


class FailingClient(ScriptedClient):
    async def run(self, emit: Callable[[Update], None]) -> None:
        raise RuntimeError("a bug in the feed")


@pytest.mark.anyio
async def test_a_bug_in_the_feed_is_a_status_line_and_a_traceback_in_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    log = tmp_path / "state" / "exo-deploy" / "tui.log"
    app, _ = make_app(client=FailingClient())
    async with app.run_test(size=(80, 24)) as pilot:
        header = app.dashboard.query_one(HeaderBar)
        await until(pilot, lambda: "internal error: a bug in the feed" in str(header.render()))
        # The file appears when it is opened, before the traceback is written (from a thread):
        # wait for the whole record, its last line included.
        await until(pilot, lambda: log.exists() and "a bug in the feed\n" in log.read_text())
    text = log.read_text()
    assert "the feed from the master failed unexpectedly" in text
    assert "Traceback (most recent call last)" in text
    assert "RuntimeError: a bug in the feed" in text
    assert 'in run\n    raise RuntimeError("a bug in the feed")' in text


@pytest.mark.anyio
async def test_broken_only_and_pause() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        await pilot.press("ctrl+z")
        await until(pilot, lambda: shown_models(app) == [DEEPSEEK, LLAMA, QWEN30])
        await pilot.press("ctrl+z", "p")
        await until(pilot, lambda: len(shown_models(app)) == 4)
        # Pausing is the app's view state, and the screen's is bound to it.
        await until(pilot, lambda: app.view.paused)
        assert app.dashboard.view is app.view
        client.push(SnapshotUpdate(ClusterBuilder().node("studio").state, None))
        await until(pilot, lambda: not app.model.state.deployments)
        assert len(shown_models(app)) == 4  # paused: the screen holds still
        assert "PAUSED" in str(app.dashboard.query_one(HeaderBar).render())
        await pilot.press("p")
        await until(pilot, lambda: shown_models(app) == [])


@pytest.mark.anyio
async def test_the_command_line_reaches_actions_and_names_mistakes() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await pilot.press("colon", *"sort name", "enter")
        await until(pilot, lambda: app.dashboard.sort_key == "name")
        await pilot.press("colon", *"nodes", "enter")
        await until(pilot, lambda: app.dashboard.active_tab == "nodes")
        await pilot.press("colon", *"frobnicate", "enter")
        await until(pilot, lambda: any("unknown command" in n.message for n in app._notifications))


@pytest.mark.anyio
async def test_describe_shows_the_whole_error_and_history() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await press_to(pilot, "enter", screen=DescribeScreen)
        body = str(app.screen.query_one("#describe-body").render())
        assert "Placement error" in body and NO_FIT in body
        assert "next attempt in 25s (waiting for retry of an unplaceable model)" in body
        assert '"deploymentId": "dep-deepseek-v3.1-4bit"' in body
        await press_to(pilot, "escape", screen=DashboardScreen)


@pytest.mark.anyio
async def test_describe_stays_live_and_says_when_the_deployment_is_gone() -> None:
    app, client = make_app()
    async with running(app) as pilot:
        await press_to(pilot, "enter", screen=DescribeScreen)
        body = app.screen.query_one("#describe-body")
        assert '"waiting": "unplaceable_retry"' in str(body.render())  # the keeper's own view
        client.push(SnapshotUpdate(ClusterBuilder().node("studio").state, None))
        await until(pilot, lambda: "DeepSeek-V3.1-4bit is gone" in str(body.render()))
        assert "deployment of DeepSeek-V3.1-4bit deleted" in str(body.render())


@pytest.mark.anyio
async def test_describe_under_a_dialog_stays_live() -> None:
    """Describe with its delete confirm over it (describe still shows behind it): what arrives
    meanwhile is drawn on describe, not left until the dialog closes and the clock ticks."""
    app, client = make_app()
    async with running(app) as pilot:
        describe = await press_to(pilot, "enter", screen=DescribeScreen)
        body = describe.query_one("#describe-body")
        await press_to(pilot, "ctrl+d", screen=ConfirmDeleteScreen)
        client.push(SnapshotUpdate(ClusterBuilder().node("studio").state, None))
        await until(pilot, lambda: "DeepSeek-V3.1-4bit is gone" in str(body.render()))
        assert isinstance(app.screen, ConfirmDeleteScreen)


@pytest.mark.anyio
async def test_countdowns_tick_without_refetching() -> None:
    clock = Clock()
    app, _ = make_app(clock=clock)
    async with running(app) as pilot:
        table = app.dashboard.query_one(DeploymentsTable)

        def next_cell() -> str:
            return " ".join(text for text, _ in table.row("dep-llama-3.2-1b-instruct-4bit"))

        assert "backoff 40s" in next_cell()
        clock.now += 3
        app.tick()
        await until(pilot, lambda: "backoff 37s" in next_cell())


@pytest.mark.anyio
@pytest.mark.parametrize(("readonly", "demo"), [(False, False), (True, False), (False, True)])
async def test_help_lists_keys(readonly: bool, demo: bool) -> None:
    """The help on screen lists the table's keys with their lines and the commands, those that
    read-only and demo mode allow, in the table's order (down the left column, then the right)."""
    app, _ = make_app(readonly=readonly, faults=Faults() if demo else None)
    async with running(app) as pilot:
        help_screen = await press_to(pilot, "question_mark", screen=HelpScreen)
        shown = str(help_screen.query_one("#dialog Static", Static).render())
        keys, commands = read_help(shown)
        offered = visible_actions(readonly=readonly, demo=demo)
        assert keys == [(spec.key, spec.help) for spec in offered] + [
            ("ctrl+p", "palette: every action by name")
        ]
        assert commands == [f":{s.command} {s.args}".rstrip() for s in offered if s.command]
        assert (("e", "edit the selection's settings") in keys) is not readonly
        assert (":edit" in commands) is not readonly
        refused = [spec for spec in ACTIONS if spec not in offered]
        assert bool(refused) == (readonly or not demo)
        assert not {spec.key for spec in refused} & {key for key, _ in keys}
        await press_to(pilot, "escape", screen=DashboardScreen)


def read_help(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The keys the help shows, each with its line, in order (its two columns one after the
    other), and its ``:`` commands."""
    key_block, _, rest = text.partition("\nCommands")
    rows = key_block.splitlines()
    columns = [[row[:KEY_COLUMN] for row in rows], [row[KEY_COLUMN + 1 :] for row in rows]]
    keys = [
        (entry[:KEY_WIDTH].strip(), entry[KEY_WIDTH + 1 :].strip())
        for column in columns
        for entry in column
        if entry.strip()
    ]
    commands = rest.partition("\n● serving")[0]  # the legend line ends the commands
    return keys, [
        c.strip() for line in commands.splitlines() for c in line.split("  ") if c.strip()
    ]


@pytest.mark.anyio
async def test_demo_fault_keys_pick_a_node_and_inject() -> None:
    faults = Faults()
    app, _ = make_app(faults=faults)
    async with running(app) as pilot:
        await pilot.press("down", "down")  # Qwen3-30B on studio, mini-b
        await until(pilot, lambda: selected(app) == "dep-qwen3-30b-a3b-4bit")
        await press_to(pilot, "k", screen=NodePickerScreen)
        picker = app.screen.query_one(OptionList)
        assert picker.highlighted == 2  # studio, the selected deployment's first node
        await pilot.press("enter")
        await until(pilot, lambda: faults.calls)
        assert faults.calls == [("kill", "studio")]
        app.dashboard.run_command("freeze mini-a 10")
        await until(pilot, lambda: len(faults.calls) == 2)
        assert faults.calls[1] == ("freeze", "mini-a", "10.0")


@pytest.mark.anyio
async def test_without_demo_fault_keys_do_nothing() -> None:
    app, _ = make_app()
    async with running(app) as pilot:
        await pilot.press("k", "f", "x", "r", "M", "N")
        # N ran, so the fault keys were handled before it: refused by check_action, not even
        # run to say "only with --demo".
        await until(pilot, lambda: sort_name_ran_or_a_screen_opened(app))
        assert isinstance(app.screen, DashboardScreen)
        assert not app._notifications


@pytest.mark.anyio
async def test_create_and_delete_on_a_stock_exo_name_the_bridge_instead_of_opening() -> None:
    exo_state = recorded_state("state-instance-ready")
    client = ScriptedClient(initial=[SnapshotUpdate(exo_state, None), ConnectionUpdate("polling")])
    app, _ = make_app(client=client)
    bridge = f"exo-deploy bridge --exo {client.url}"
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.has_data)
        await pilot.press("n")
        await until(pilot, lambda: any(bridge in n.message for n in app._notifications))
        await pilot.press("ctrl+d")
        await until(pilot, lambda: sum(bridge in n.message for n in app._notifications) == 2)
        assert isinstance(app.screen, DashboardScreen)
    assert client.created == [] and client.deleted == []
