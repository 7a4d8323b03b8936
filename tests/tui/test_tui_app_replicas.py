"""Scaling and repairing from the keyboard (Textual's Pilot) against a scripted master: ``s``
scales the selected deployment, ``ctrl+k`` deletes the selected instance after a confirm whose
Cancel has focus, and ``--readonly`` hides and refuses both, by key, by ``:`` and by palette."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
from model_ids import LLAMA, QWEN
from test_tui_app import (
    cancel_then_confirm,
    make_app,
    open_create_form,
    press_to,
    until,
    until_notified,
)
from test_tui_app import running as running_app
from textual.pilot import Pilot
from textual.widgets import Input
from tui_clusters import three_nodes

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.updates import ConnectionUpdate, SnapshotUpdate
from exo_deploy_tui.screens.confirm import ConfirmDeleteScreen
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.scale import ScaleScreen
from exo_deploy_tui.testing import ClusterBuilder, ScriptedClient
from exo_deploy_tui.widgets.panels import DeploymentsTable, InstancesTable
from keeper.model.state import RunnerFailed

QWEN_ID = "dep-qwen3-0.6b-4bit"
FAILED_REPLICA = "inst-qwen3-0.6b-4bit-b"


def replicated() -> ClusterBuilder:
    """Qwen3-0.6B keeps 2: ready on mini-a, failed on mini-b; Llama keeps 1 on studio."""
    return (
        three_nodes()
        .deployment(QWEN, on=["mini-a"], replicas=2)
        .instance(QWEN, on=["mini-b"], runners=[RunnerFailed(error_message="boom")], suffix="-b")
        .deployment(LLAMA, on=["studio"])
    )


def running(
    app: DashboardApp, size: tuple[int, int] = (80, 24)
) -> AbstractAsyncContextManager[Pilot[None]]:
    """The app on a terminal of ``size``, once the dashboard lists Qwen and Llama."""
    return running_app(app, size, deployments=2)


async def select_qwen(pilot: Pilot[None], app: DashboardApp) -> None:
    table = app.dashboard.query_one(DeploymentsTable)
    while table.selected_key != QWEN_ID:
        await pilot.press("down")
        await pilot.pause()


async def open_scale_form(pilot: Pilot[None], app: DashboardApp) -> ScaleScreen:
    """Select Qwen and press ``s``, until its scale form is on top."""
    await select_qwen(pilot, app)
    return await press_to(pilot, "s", screen=ScaleScreen)


async def select_failed_replica(pilot: Pilot[None], app: DashboardApp) -> None:
    await pilot.press("3")
    table = app.dashboard.query_one(InstancesTable)
    await until(pilot, lambda: table.has_focus and table.keys)
    for _ in range(len(table.keys)):
        chosen = table.selected_instance()
        if chosen is not None and chosen.instance_id == FAILED_REPLICA:
            return
        await pilot.press("down")
        await pilot.pause()
    raise AssertionError("the failed replica is not in the instances view")


@pytest.mark.anyio
async def test_s_scales_the_selected_deployment() -> None:
    app, client = make_app(replicated())
    async with running(app) as pilot:
        form = await open_scale_form(pilot, app)
        box = form.query_one("#replicas", Input)
        assert box.value == "2" and app.focused is box
        box.value = "3"
        await pilot.press("enter")
        await until(pilot, lambda: client.scaled)
        assert client.scaled == [(QWEN_ID, 3)]
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))


@pytest.mark.anyio
async def test_scale_names_a_bad_count_in_the_masters_words_and_sends_nothing() -> None:
    app, client = make_app(replicated())
    async with running(app) as pilot:
        form = await open_scale_form(pilot, app)
        form.query_one("#replicas", Input).value = "17"
        await pilot.press("ctrl+s")
        error = form.query_one("#form-error")
        await until(
            pilot,
            lambda: "replicas: Input should be less than or equal to 16" in str(error.render()),
        )
        assert client.scaled == [] and app.screen is form
        await press_to(pilot, "escape", screen=DashboardScreen)
        assert client.scaled == []


@pytest.mark.anyio
async def test_scale_shows_the_masters_refusal_and_stays_open() -> None:
    app, client = make_app(replicated())
    client.refuse_with = ApiError("no deployment dep-qwen3-0.6b-4bit", 404)
    async with running(app) as pilot:
        form = await open_scale_form(pilot, app)
        form.query_one("#replicas", Input).value = "1"
        await pilot.press("enter")
        error = form.query_one("#form-error")
        await until(pilot, lambda: "The master refused: no deployment" in str(error.render()))
        assert app.screen is form


@pytest.mark.anyio
async def test_the_create_form_sends_its_replicas() -> None:
    app, client = make_app(replicated())
    async with running(app) as pilot:
        form = await open_create_form(pilot)
        await pilot.press(*"llama 3b")
        await until(pilot, lambda: [e.id for e in form.shown] == [LLAMA.replace("1B", "3B")])
        form.query_one("#create-replicas", Input).value = "2"
        note = form.query_one("#catalog-note")
        await until(pilot, lambda: "on each of 2 nodes apart: fits" in str(note.render()))
        await pilot.press("ctrl+s")
        await until(pilot, lambda: client.created)
        assert client.created[0].replicas == 2


@pytest.mark.anyio
async def test_ctrl_k_deletes_the_selected_instance_after_a_confirm() -> None:
    app, client = make_app(replicated())
    async with running(app) as pilot:
        await pilot.press("ctrl+k")  # on the deployments table: says where instances are
        await until(pilot, lambda: any("press 3" in n.message for n in app._notifications))
        assert isinstance(app.screen, DashboardScreen)

        await select_failed_replica(pilot, app)
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
        assert "ctrl+k" in shown  # in the footer while the instances have focus
        confirm = await press_to(pilot, "ctrl+k", screen=ConfirmDeleteScreen)
        question = str(confirm.query_one("#question").render())
        assert FAILED_REPLICA in question and "runner failed on mini-b: boom" in question
        assert "keeps 2 replicas" in question
        await cancel_then_confirm(pilot, "ctrl+k", lambda: client.deleted_instances)
        assert client.deleted_instances == [FAILED_REPLICA]
        assert client.deleted == []  # the deployment stays


@pytest.mark.anyio
async def test_readonly_hides_and_refuses_scale_and_instance_deletion() -> None:
    app, client = make_app(replicated(), readonly=True)
    async with running(app) as pilot:
        shown = {b.binding.key for b in app.active_bindings.values() if b.binding.show}
        assert "s" not in shown
        await pilot.press("s")  # had it opened the form, the 3 below would not reach the tabs
        await select_failed_replica(pilot, app)
        await pilot.press("ctrl+k", "1")
        # 1 went back to the deployments, so ctrl+k was handled before it.
        await until(
            pilot,
            lambda: (
                app.dashboard.active_tab == "deployments"
                or not isinstance(app.screen, DashboardScreen)
            ),
        )
        assert isinstance(app.screen, DashboardScreen)
        keys = {b.binding.key for b in app.active_bindings.values()}
        assert "s" not in keys and "ctrl+k" not in keys  # check_action hides them
        for command, name in (("scale 3", "scale"), ("delete-instance", "delete-instance")):
            await pilot.press("colon", *command, "enter")
            await until_notified(pilot, f"'{name}' is not available: the dashboard is read-only")
            assert isinstance(app.screen, DashboardScreen)
        for action in ("scale", "delete_instance"):
            # The palette's way in: App.run_action, refused by the screen's check_action (it
            # answers whether the action ran: a screen it opened would be on top already).
            assert await app.run_action(action, app.dashboard) is False
        assert isinstance(app.screen, DashboardScreen)
        assert client.scaled == [] and client.deleted_instances == []
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not [t for t in titles if t.startswith(("Scale", "Delete-instance"))]
        assert "Describe (enter)" in titles  # the palette still lists what read-only allows


@pytest.mark.anyio
async def test_scale_and_delete_instance_on_a_stock_exo_name_the_bridge() -> None:
    builder = replicated()
    state = builder.state.model_copy(update={"deployments": {}})
    client = ScriptedClient(initial=[SnapshotUpdate(state, None), ConnectionUpdate("polling")])
    app, _ = make_app(client=client)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: app.model.has_data)
        await pilot.press("s")
        bridge = "exo-deploy bridge"
        await until(pilot, lambda: any(bridge in n.message for n in app._notifications))
        assert isinstance(app.screen, DashboardScreen)
        # Instances are exo's own: deleting one works without a deployments API.
        await select_failed_replica(pilot, app)
        await press_to(pilot, "ctrl+k", screen=ConfirmDeleteScreen)
        await pilot.press("right", "enter")
        await until(pilot, lambda: client.deleted_instances == [FAILED_REPLICA])


@pytest.mark.anyio
async def test_the_scale_command_opens_the_form_with_its_count() -> None:
    app, client = make_app(replicated())
    async with running(app) as pilot:
        await select_qwen(pilot, app)
        form = await press_to(pilot, "colon", *"scale 4", "enter", screen=ScaleScreen)
        assert form.query_one("#replicas", Input).value == "4"
        await pilot.press("enter")
        await until(pilot, lambda: client.scaled == [(QWEN_ID, 4)])
