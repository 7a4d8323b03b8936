"""Cordons and drains from the keyboard (Textual's Pilot) against a scripted master: on the nodes
tab ``c`` cordons the selected node and uncordons it once the State says it is cordoned, ``D``
drains it after a confirm whose Cancel has focus, ``--readonly`` refuses both; the nodes tab
shows each cordon and drain (with what GET /nodes adds: what is left and why a move is stuck),
and a deployment a drain is moving shows ``draining``."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import pytest
from model_ids import LLAMA, QWEN
from test_tui_app import (
    cancel_then_confirm,
    make_app,
    press_to,
    sort_name_ran_or_a_screen_opened,
    until,
    until_notified,
)
from test_tui_app import running as running_app
from textual.pilot import Pilot
from textual.widgets import Button
from tui_clusters import three_nodes

from exo_deploy_tui import app as app_module
from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.model.updates import ConnectionUpdate
from exo_deploy_tui.screens.confirm import ConfirmDrainScreen
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.testing import ClusterBuilder, ScriptedClient
from exo_deploy_tui.widgets.panels import DeploymentsTable, NodesTable
from keeper.model.state import RunnerLoading

QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"
STUCK = (
    "cannot move mlx-community/Qwen3-30B-A3B-4bit off mini-a (cordoned: mini-a, studio): "
    "No cycles found with sufficient memory"
)


def serving_on_mini_a() -> ClusterBuilder:
    """mini-a holds two instances the keeper placed (Qwen3-0.6B, Qwen3-30B) and one it did not
    (Llama, started through exo's own API)."""
    return (
        three_nodes()
        .deployment(QWEN, on=["mini-a"], by_keeper=True)
        .deployment(QWEN30, on=["mini-a"], by_keeper=True)
        .instance(LLAMA, on=["mini-a"])
    )


def draining() -> ClusterBuilder:
    """mini-a drains: Qwen3-0.6B moves to mini-b (its replacement loading), Qwen3-30B waits
    for room, Llama is left alone. studio is cordoned, and so is mini-c, away."""
    return (
        serving_on_mini_a()
        .instance(
            QWEN,
            on=["mini-b"],
            runners=[RunnerLoading(layers_loaded=10, total_layers=28)],
            suffix="-new",
        )
        .drain("mini-a", (QWEN, "-new"))
        .cordon("studio")
        .cordon("mini-c")
    )


def draining_client(stuck: str = STUCK) -> ScriptedClient:
    """A master holding ``draining()``, whose GET /nodes says the drain is stuck on ``stuck``."""
    builder = draining()
    client = ScriptedClient(initial=[builder.snapshot(), ConnectionUpdate("live")])
    client.nodes_answer = builder.nodes_answer(stuck={"mini-a": stuck})
    return client


def running(
    app: DashboardApp, size: tuple[int, int] = (80, 24)
) -> AbstractAsyncContextManager[Pilot[None]]:
    """The app on a terminal of ``size``, once the dashboard lists both deployments."""
    return running_app(app, size, deployments=2)


def nodes_text(app: DashboardApp) -> str:
    """Every line of the nodes table as shown: a node's cells each in its column's width, the
    lines under it spanning them."""
    table = app.dashboard.query_one(NodesTable)
    widths = [c.width for c in table.columns_now]
    lines = []
    for key in table.keys:
        cells = table.row(key)
        if len(cells) == len(widths):
            lines.append("".join(t.ljust(w) for (t, _), w in zip(cells, widths, strict=True)))
        else:
            lines.append("".join(text for text, _ in cells))
    return "\n".join(line.rstrip() for line in lines)


async def select_node(pilot: Pilot[None], app: DashboardApp, name: str) -> None:
    """On the nodes tab (``2``), move the cursor until the node called ``name`` is selected."""
    await pilot.press("2")
    table = app.dashboard.query_one(NodesTable)
    await until(pilot, lambda: table.has_focus and table.keys)
    for _ in range(len(table.keys)):
        chosen = table.selected_node()
        if chosen is not None and chosen.handle == name:
            return
        await pilot.press("down")
        await pilot.pause()
    raise AssertionError(f"no node {name} in the nodes view")


@pytest.mark.anyio
async def test_c_cordons_the_selected_node_and_uncordons_it_once_it_is_cordoned() -> None:
    builder = serving_on_mini_a()
    app, client = make_app(builder)
    async with running(app) as pilot:
        await pilot.press("c")  # on the deployments table: says where nodes are chosen
        await until_notified(pilot, "c cordons or uncordons the node selected", "press 2")
        assert client.node_commands == []

        await select_node(pilot, app, "mini-b")
        await pilot.press("c")
        await until(pilot, lambda: client.node_commands)
        assert client.node_commands == [("cordon", "mini-b")]
        await until_notified(pilot, "Node mini-b cordoned")  # the master's answer

        client.push(builder.cordon("mini-b").snapshot())  # as the master's State then says
        await until(pilot, lambda: "cordoned: nothing new is placed here" in nodes_text(app))
        chosen = app.dashboard.query_one(NodesTable).selected_node()
        assert chosen is not None and chosen.handle == "mini-b"  # the cursor stayed on it
        await pilot.press("c")
        await until(pilot, lambda: len(client.node_commands) == 2)
        assert client.node_commands[1] == ("uncordon", "mini-b")
        await until_notified(pilot, "Node mini-b uncordoned")


@pytest.mark.anyio
async def test_a_refused_cordon_is_the_masters_message() -> None:
    app, client = make_app(serving_on_mini_a())
    client.refuse_with = ApiError("No node 'mini-a' in the cluster (known: studio)", 404)
    async with running(app) as pilot:
        await select_node(pilot, app, "mini-a")
        await pilot.press("c")
        await until_notified(pilot, "No node 'mini-a' in the cluster (known: studio)")
        assert any(n.title == "Cordon refused" for n in app._notifications)


@pytest.mark.anyio
async def test_shift_d_asks_first_saying_what_moves_and_what_stays_then_drains() -> None:
    app, client = make_app(serving_on_mini_a())
    async with running(app) as pilot:
        await select_node(pilot, app, "mini-a")
        confirm = await press_to(pilot, "D", screen=ConfirmDrainScreen)
        question = str(confirm.query_one("#question").render())
        moved, _, stays = question.partition("Left alone")
        assert "Drain node mini-a" in moved
        assert "Qwen3-0.6B-4bit inst-qwe on mini-a" in moved
        assert "Qwen3-30B-A3B-4bit inst-qwe on mini-a" in moved
        assert "Llama-3.2-1B-Instruct-4bit inst-lla on mini-a" in stays
        assert str(confirm.query_one("#drain", Button).label) == "Drain"
        await cancel_then_confirm(pilot, "D", lambda: client.node_commands)
        assert client.node_commands == [("drain", "mini-a")]
        assert client.drained_forced == [False]
        await until_notified(pilot, "Node mini-a draining")


@pytest.mark.anyio
async def test_readonly_refuses_cordon_and_drain_by_key_command_and_palette() -> None:
    app, client = make_app(serving_on_mini_a(), readonly=True)
    async with running(app) as pilot:
        await select_node(pilot, app, "mini-a")
        await pilot.press("c", "D", "N")
        # N ran, so c and D were handled before it (or one opened a screen N went to).
        await until(pilot, lambda: sort_name_ran_or_a_screen_opened(app))
        assert isinstance(app.screen, DashboardScreen)
        keys = {b.binding.key for b in app.active_bindings.values()}
        assert "c" not in keys and "D" not in keys  # check_action hides them
        for command in ("cordon", "drain"):
            await pilot.press("colon", *f"{command} mini-a", "enter")
            await until_notified(pilot, f"'{command}' is not available: the dashboard is read-only")
            assert await app.run_action(command, app.dashboard) is False
        assert isinstance(app.screen, DashboardScreen)
        assert client.node_commands == []


@pytest.mark.anyio
async def test_the_nodes_tab_shows_cordons_drains_and_why_a_move_is_stuck() -> None:
    client = draining_client()
    app, _ = make_app(client=client)
    async with running(app) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: "stuck:" in nodes_text(app))
        shown = nodes_text(app)
        lines = shown.splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("mini-a "))
        assert lines[at + 1].startswith(
            " └ ⇢ draining · 1 moving, 1 to move, 1 not the keeper's (left alone)"
        )
        # The keeper's reason, wrapped under the node rather than cut at 80 columns.
        said = " ".join(line.strip() for line in lines[at + 2 :] if line.startswith("   "))
        assert f"stuck: {STUCK}" in said
        studio = next(i for i, line in enumerate(lines) if line.startswith("studio "))
        assert "⊘ cordoned" in lines[studio + 1]
        away = next(i for i, line in enumerate(lines) if line.startswith("mini-c "))
        assert "○ away" in lines[away] and "⊘ cordoned" in lines[away + 1]
        assert "Nodes 4" in str(app.dashboard.query_one("#tabs").render())
        assert max(len(line) for line in lines) <= 80

        # The stuck reason changes with no event: the next read of GET /nodes shows it.
        asked = client.nodes_asked
        client.nodes_answer = draining().nodes_answer(stuck={"mini-a": "waiting for mini-b"})
        await until(pilot, lambda: "stuck: waiting for mini-b" in nodes_text(app))
        assert client.nodes_asked > asked


@pytest.mark.anyio
async def test_a_deployment_a_drain_is_moving_shows_draining() -> None:
    app, _ = make_app(client=draining_client())
    async with running(app) as pilot:
        table = app.dashboard.query_one(DeploymentsTable)
        await until(pilot, lambda: table.keys)
        assert table.row("dep-qwen3-0.6b-4bit")[0][0].strip() == "⇢ draining"
        assert table.row("dep-qwen3-30b-a3b-4bit")[0][0].strip() == "● serving"


@pytest.mark.anyio
async def test_a_change_to_the_drains_or_cordons_reads_get_nodes_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No waiting for the next poll (set far off here): a move placed, or an uncordon that may
    unstick one, asks GET /nodes again as the State shows it."""
    monkeypatch.setattr(app_module, "DRAIN_POLL_S", 600.0)
    client = draining_client()
    app, _ = make_app(client=client)
    async with running(app) as pilot:
        await pilot.press("2")
        await until(pilot, lambda: "stuck:" in nodes_text(app))
        assert client.nodes_asked == 1
        uncordoned = draining()
        uncordoned.state = uncordoned.state.model_copy(update={"cordoned": ("mini-a", "mini-c")})
        client.nodes_answer = uncordoned.nodes_answer(stuck={"mini-a": "waiting for studio"})
        client.push(uncordoned.snapshot())
        await until(pilot, lambda: "stuck: waiting for studio" in nodes_text(app))
        assert client.nodes_asked == 2
        lines = nodes_text(app).splitlines()
        studio = next(i for i, line in enumerate(lines) if line.startswith("studio "))
        assert not lines[studio + 1].startswith(" └")  # uncordoned: no line under it
