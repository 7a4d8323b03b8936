"""What-if from the keyboard (Textual's Pilot) against a scripted master: ``w`` on the nodes tab
asks ``GET /whatif`` for the selected node and shows the answer, each deployment's outcome, in a
screen Escape closes; a read, so ``--readonly`` allows it. And the deployments table's PRIO
column, there from 100 columns, not at 80."""

from __future__ import annotations

import pytest
from model_ids import LLAMA, QWEN
from test_tui_app import make_app, press_to, until, until_notified
from test_tui_app_nodes import QWEN30, running, select_node, serving_on_mini_a
from textual.widgets import Static

from exo_deploy_tui.feed.client import ApiError
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.whatif import WHATIF_WIDTH, WhatIfScreen
from exo_deploy_tui.testing import ClusterBuilder, node_id_for
from exo_deploy_tui.widgets.panels import DeploymentsTable
from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfEstimate,
    WhatIfInstance,
    WhatIfNode,
    WhatIfPlacement,
    WhatIfResponse,
    WhatIfThresholds,
)

LLAMA70 = "mlx-community/Llama-3.3-70B-Instruct-4bit"
WHY_SHORT = (
    "no placement apart from the nodes serving mlx-community/Llama-3.2-1B-Instruct-4bit "
    "(mini-b): No cycles found with sufficient memory (cordoned, left out: studio)"
)

DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
# The service's fast failover thresholds, and Qwen's replacement on its staged copy: suspected
# after 3 s, loaded in about one.
FAST = WhatIfThresholds(suspect_after_s=3.0, dead_after_s=8.0, exo_timeout_s=30.0, exo_sweep_s=10.0)
STAGED = WhatIfEstimate(
    detection_s=3.0,
    download_s=0.0,
    load_s=1.0,
    total_s=4.0,
    load_rate=2 * 1024**3,
    load_rate_assumed=True,
)


def _node(name: str) -> WhatIfNode:
    return WhatIfNode(node_id=node_id_for(name), name=name)


def _lost(model: str, *names: str) -> list[WhatIfInstance]:
    slug = model.rsplit("/", 1)[-1].lower()
    return [WhatIfInstance(instance_id=f"inst-{slug}", nodes=[_node(n) for n in names])]


def whatif_mini_a() -> WhatIfResponse:
    """What the master answers for losing mini-a: one of each outcome, a long reason, and
    DeepSeek, which has no instance to lose: it still cannot be placed."""
    return WhatIfResponse(
        nodes=[_node("mini-a")],
        deployments=[
            WhatIfDeployment(
                deployment_id="dep-qwen3-0.6b-4bit",
                model_id=QWEN,
                outcome="moves",
                replicas=1,
                before=1,
                after=1,
                lost=_lost(QWEN, "mini-a"),
                placed=[
                    WhatIfPlacement(nodes=[_node("mini-b")], model_on_disk=True, estimate=STAGED)
                ],
            ),
            WhatIfDeployment(
                deployment_id="dep-llama-3.2-1b-instruct-4bit",
                model_id=LLAMA,
                outcome="loses_replica",
                replicas=2,
                before=2,
                after=1,
                lost=_lost(LLAMA, "mini-a"),
                placed=[],
                reason=WHY_SHORT,
            ),
            WhatIfDeployment(
                deployment_id="dep-qwen3-30b-a3b-4bit",
                model_id=QWEN30,
                outcome="cannot_place",
                replicas=1,
                before=1,
                after=0,
                lost=_lost(QWEN30, "mini-a", "studio"),
                placed=[],
                reason="No cycles found with sufficient memory",
            ),
            WhatIfDeployment(
                deployment_id="dep-llama-3.3-70b-instruct-4bit",
                model_id=LLAMA70,
                outcome="stays",
                replicas=1,
                before=1,
                after=1,
                lost=[],
                placed=[],
            ),
            WhatIfDeployment(
                deployment_id="dep-deepseek-v3.1-4bit",
                model_id=DEEPSEEK,
                outcome="stays",
                replicas=1,
                before=0,
                after=0,
                lost=[],
                placed=[],
                reason="No cycles found with sufficient memory",
            ),
        ],
        thresholds=FAST,
    )


def shown(screen: WhatIfScreen) -> list[str]:
    return str(screen.query_one("#whatif", Static).render()).splitlines()


@pytest.mark.anyio
@pytest.mark.parametrize("readonly", [False, True])
async def test_w_shows_the_masters_what_if_for_the_selected_node(readonly: bool) -> None:
    app, client = make_app(serving_on_mini_a(), readonly=readonly)
    client.whatif_answer = whatif_mini_a()
    async with running(app) as pilot:
        await select_node(pilot, app, "mini-a")
        screen = await press_to(pilot, "w", screen=WhatIfScreen)
        assert client.whatif_asked == ["mini-a"]  # the selected node, as the master names it
        lines = [line.replace("\u00a0", " ") for line in shown(screen)]
        assert lines[:2] == [  # a count and its word kept together
            "If mini-a went now: 1 moving, 1 short, 1 not placed, 1 still not placed,",
            "1 unaffected",
        ]
        at = lines.index("⇢ Qwen3-0.6B-4bit  moves from mini-a to mini-b (on disk)")
        assert lines[at + 1 : at + 3] == [  # when it serves again, by the service's thresholds
            "    mini-b: serving again in ~4 s (suspect 3 s, load ~1 s at an assumed",
            "        2 GB/s)",  # a number kept with its unit
        ]
        at = lines.index("! Llama-3.2-1B-Instruct-4bit  loses a replica: 1 of 2 left")
        assert lines[at + 1] == "    was on: mini-a"
        reason = " ".join(line.strip() for line in lines[at + 2 : at + 5])
        assert reason == f"why: {WHY_SHORT}"  # whole, wrapped
        at = lines.index("✖ Qwen3-30B-A3B-4bit  cannot be placed: 0 of 1 left")
        assert lines[at + 1 : at + 3] == [
            "    was on: mini-a+studio",
            "    why: No cycles found with sufficient memory",
        ]
        at = lines.index("● Llama-3.3-70B-Instruct-4bit  unaffected")
        # No instance to lose, none placed: its reason on its line, not again under it.
        assert lines[at + 1 :] == [
            "✖ DeepSeek-V3.1-4bit  still cannot be placed: No cycles found with",
            "    sufficient memory",
        ]
        assert max(len(line) for line in lines) <= WHATIF_WIDTH  # inside the 80-column dialog
        await press_to(pilot, "escape", screen=DashboardScreen)
        assert app.dashboard.active_tab == "nodes"


@pytest.mark.anyio
async def test_whatif_names_a_node_and_w_elsewhere_says_where_to_choose_one() -> None:
    app, client = make_app(serving_on_mini_a(), readonly=True)
    client.whatif_answer = WhatIfResponse(nodes=[_node("studio")], deployments=[])
    async with running(app) as pilot:
        await pilot.press("w")  # on the deployments table
        await until_notified(pilot, "w asks what if we lost the node selected", "press 2")
        assert client.whatif_asked == []
        screen = await press_to(pilot, "colon", *"whatif studio", "enter", screen=WhatIfScreen)
        assert client.whatif_asked == ["studio"]
        assert shown(screen)[0] == "If studio went now: no deployments, nothing moves"


@pytest.mark.anyio
async def test_a_refused_whatif_is_the_masters_message() -> None:
    app, client = make_app(serving_on_mini_a())
    client.refuse_with = ApiError("No node 'mini-b' in the cluster (known: studio)", 404)
    async with running(app) as pilot:
        await select_node(pilot, app, "mini-b")
        await pilot.press("w")
        await until_notified(pilot, "No node 'mini-b' in the cluster (known: studio)")
        assert any(n.title == "What-if failed" for n in app._notifications)
        assert isinstance(app.screen, DashboardScreen)


def with_priority(builder: ClusterBuilder, deployment_id: str, priority: int) -> ClusterBuilder:
    state = builder.state
    deployment = state.deployments[deployment_id].model_copy(update={"priority": priority})
    builder.state = state.model_copy(
        update={"deployments": {**state.deployments, deployment_id: deployment}}
    )
    return builder


@pytest.mark.anyio
@pytest.mark.parametrize(("width", "shows"), [(120, True), (100, True), (80, False)])
async def test_prio_shows_from_100_columns(width: int, shows: bool) -> None:
    builder = with_priority(serving_on_mini_a(), "dep-qwen3-30b-a3b-4bit", 900)
    app, _ = make_app(builder)
    async with running(app, size=(width, 40)) as pilot:
        table = app.dashboard.query_one(DeploymentsTable)
        await until(pilot, lambda: table.size.width > 0)
        labels = [c.label for c in table.columns_now]
        assert ("PRIO" in labels) is shows, labels
        if not shows:
            return
        at = labels.index("PRIO")
        priorities = {key: table.row(key)[at] for key in table.keys}
        assert priorities == {
            "dep-qwen3-30b-a3b-4bit": ("900", "bold"),  # set apart
            "dep-qwen3-0.6b-4bit": ("500", "dim"),  # the default, dim
        }
