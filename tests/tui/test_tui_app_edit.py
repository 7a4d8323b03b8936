"""Editing a deployment and forcing a drain from the keyboard (Textual's Pilot) against a
scripted service: ``e`` opens the selection's settings filled in and sends only what changed,
a refusal is shown beside the field it names with the form still open; the drain's confirm
forces only by a deliberate move; the header names the bridge and its role."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
from model_ids import LLAMA, QWEN
from test_tui_app import make_app, press_to, until, until_notified
from test_tui_app import running as running_app
from test_tui_app_nodes import serving_on_mini_a
from textual.pilot import Pilot
from textual.widgets import Button, Checkbox, Input, Select, Static
from tui_clusters import three_nodes

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.updates import ConnectionUpdate
from exo_deploy_tui.screens.confirm import ConfirmDrainScreen
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.edit import EditScreen
from exo_deploy_tui.testing import ClusterBuilder, ScriptedClient
from exo_deploy_tui.widgets.panels import DeploymentsTable, HeaderBar
from keeper.model.api_models import ServiceHealthView

LLAMA_ID = "dep-llama-3.2-1b-instruct-4bit"
QWEN_ID = "dep-qwen3-0.6b-4bit"


def two_deployments() -> ClusterBuilder:
    """Llama (tensor-capable, 16 layers) keeps 2 on studio and mini-a; Qwen (no tensor) 1."""
    return (
        three_nodes()
        .deployment(LLAMA, on=["studio"], replicas=2)
        .instance(LLAMA, on=["mini-a"], suffix="-b")
        .deployment(QWEN, on=["mini-b"])
    )


def running(app: DashboardApp) -> AbstractAsyncContextManager[Pilot[None]]:
    return running_app(app, (80, 24), deployments=2)


async def open_edit_form(pilot: Pilot[None], app: DashboardApp, deployment_id: str) -> EditScreen:
    table = app.dashboard.query_one(DeploymentsTable)
    while table.selected_key != deployment_id:
        await pilot.press("down")
        await pilot.pause()
    return await press_to(pilot, "e", screen=EditScreen)


def note(form: EditScreen, field: str) -> str:
    return str(form.query_one(f"#note-{field}", Static).render())


def error(form: EditScreen) -> str:
    return str(form.query_one("#form-error", Static).render())


@pytest.mark.anyio
async def test_e_opens_the_settings_filled_in_and_sends_only_what_changed() -> None:
    app, client = make_app(two_deployments())
    async with running(app) as pilot:
        form = await open_edit_form(pilot, app, LLAMA_ID)
        replicas = form.query_one("#edit-replicas", Input)
        assert app.focused is replicas
        assert (replicas.value, form.query_one("#edit-standby", Input).value) == ("2", "1")
        assert form.query_one("#edit-priority", Input).value == "500"
        assert form.query_one("#edit-preempt", Checkbox).value is False
        assert form.query_one("#edit-sharding", Select).value == "Pipeline"
        assert form.query_one("#edit-instance_meta", Select).value == "MlxRing"
        assert form.query_one("#edit-min_nodes", Input).value == "1"
        rolling = form.query_one("#edit-rolling", Static)
        assert str(rolling.render()).strip() == ""

        replicas.value = "3"
        await pilot.press("tab", "tab", "tab", "space")  # standby, priority, preempt: on
        await until(pilot, lambda: form.query_one("#edit-preempt", Checkbox).value)
        form.query_one("#edit-sharding", Select).value = "Tensor"
        await until(pilot, lambda: "replaces each instance, one at a time" in str(rolling.render()))
        await pilot.press("ctrl+s")
        await until(pilot, lambda: client.updated)
        assert client.updated == [
            (LLAMA_ID, {"replicas": 3, "preempt": True, "sharding": "Tensor"})
        ]
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        await until_notified(pilot, "replicas 3, preempt on, sharding Tensor")


@pytest.mark.anyio
async def test_nothing_changed_says_so_and_sends_nothing() -> None:
    app, client = make_app(two_deployments())
    async with running(app) as pilot:
        form = await open_edit_form(pilot, app, LLAMA_ID)
        form.query_one("#edit-replicas", Input).value = "3"
        form.query_one("#edit-replicas", Input).value = "2"  # back to what it keeps
        await pilot.press("enter")
        await until(pilot, lambda: "Nothing changed: nothing to send" in error(form))
        assert client.updated == [] and app.screen is form


@pytest.mark.anyio
async def test_a_bad_field_is_named_beside_it_and_nothing_is_sent() -> None:
    app, client = make_app(two_deployments())
    async with running(app) as pilot:
        form = await open_edit_form(pilot, app, QWEN_ID)
        form.query_one("#edit-standby", Input).value = "9"
        form.query_one("#edit-sharding", Select).value = "Tensor"  # Qwen3-0.6B has no tensor
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "less than or equal to 4" in note(form, "standby"))
        assert "does not support tensor sharding" in note(form, "sharding")
        assert "standby: Input should be less than or equal to 4" in error(form)
        assert client.updated == [] and app.screen is form


@pytest.mark.anyio
async def test_an_older_services_refusal_of_a_placement_setting_is_shown_beside_it() -> None:
    """Today's service answers a PATCH with sharding 422 "Extra inputs are not permitted": the
    form says so beside the field, in full under the fields, and stays open."""
    app, client = make_app(two_deployments())
    client.refuse_with = ApiError("min_nodes: Extra inputs are not permitted", 422)
    async with running(app) as pilot:
        form = await open_edit_form(pilot, app, LLAMA_ID)
        form.query_one("#edit-min_nodes", Input).value = "2"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: "The master refused: min_nodes: Extra" in error(form))
        assert "this service cannot change it in place" in note(form, "min_nodes")
        assert "✖" not in note(form, "replicas")  # only the field it names
        assert app.screen is form and client.updated == []
        # Put back, another field goes through and the note is cleared.
        client.refuse_with = None
        form.query_one("#edit-min_nodes", Input).value = "1"
        form.query_one("#edit-priority", Input).value = "700"
        await pilot.press("ctrl+s")
        await until(pilot, lambda: client.updated == [(LLAMA_ID, {"priority": 700})])
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))


@pytest.mark.anyio
async def test_readonly_refuses_edit_by_key_and_command() -> None:
    app, client = make_app(two_deployments(), readonly=True)
    async with running(app) as pilot:
        await pilot.press("e", "colon", *"edit", "enter")
        await until_notified(pilot, "'edit' is not available: the dashboard is read-only")
        assert isinstance(app.screen, DashboardScreen)
        assert await app.run_action("edit", app.dashboard) is False
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert not [t for t in titles if t.startswith("Edit")]
        assert client.updated == []


@pytest.mark.anyio
async def test_the_edit_command_and_the_palette_open_the_form() -> None:
    app, _ = make_app(two_deployments())
    async with running(app) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert "Edit (e)" in titles
        await press_to(pilot, "colon", *"edit", "enter", screen=EditScreen)


@pytest.mark.anyio
async def test_force_drain_takes_a_deliberate_move_and_sends_force() -> None:
    app, client = make_app(serving_on_mini_a())
    async with running_app(app, (80, 24), deployments=2) as pilot:
        await pilot.press("2")
        confirm = await press_to(pilot, "D", screen=ConfirmDrainScreen)
        assert app.focused is confirm.query_one("#cancel", Button)
        question = str(confirm.query_one("#question", Static).render())
        assert "Force drain deletes at once what cannot be moved" in question
        assert "what the keeper did not place" in question
        await pilot.press("enter")  # Cancel
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))
        assert client.node_commands == []

        await press_to(pilot, "D", screen=ConfirmDrainScreen)
        await pilot.press("right", "enter")  # Drain
        await until(pilot, lambda: client.node_commands == [("drain", "mini-a")])
        assert client.drained_forced == [False]

        confirm = await press_to(pilot, "D", screen=ConfirmDrainScreen)
        await pilot.press("right", "right")
        assert app.focused is confirm.query_one("#force", Button)
        await pilot.press("enter")
        await until(pilot, lambda: len(client.node_commands) == 2)
        assert client.drained_forced == [False, True]
        await until_notified(pilot, "Node mini-a draining")


def header(app: DashboardApp) -> str:
    return str(app.dashboard.query_one(HeaderBar).render())


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("health", "shown"),
    [
        (ServiceHealthView(name="b1", role="acting", leader="b1"), "bridge b1 · acting"),
        (
            ServiceHealthView(name="b2", role="standby", leader="b1"),
            "bridge b2 · standby (acting: b1)",
        ),
    ],
)
async def test_the_header_names_the_bridge_and_its_role(
    health: ServiceHealthView, shown: str
) -> None:
    client = ScriptedClient(
        initial=[two_deployments().snapshot(), ConnectionUpdate("polling")], health_answer=health
    )
    app, _ = make_app(client=client)
    async with running(app) as pilot:
        await until(pilot, lambda: shown in header(app))


@pytest.mark.anyio
async def test_no_role_in_the_health_answer_shows_nothing_new() -> None:
    app, _ = make_app(two_deployments())  # health_answer None: a master, today's bridges
    async with running(app) as pilot:
        await pilot.pause(0.1)
        assert "bridge" not in header(app)
