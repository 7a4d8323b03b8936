"""The real dashboard against real masters: the embedded demo cluster behind ``--demo``, and
``exo-deploy cluster --exo-compat`` (a stand-in for a stock exo) as processes.

Everything is real here (the master's HTTP API and event stream, the keeper, simulated nodes,
the TUI's HTTP client), so these are the tests that prove the parts speak the same language.
The keeper waits its 15 s startup grace before placing, so the first test takes ~20 s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from model_ids import QWEN as QWEN_06B  # the demo keeps it at two replicas
from process_helpers import START_DEADLINE_S, free_port, get_json, start_cli, stop, wait_for
from textual.pilot import Pilot

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import MasterClient
from exo_deploy_tui.screens.confirm import ConfirmDeleteScreen
from exo_deploy_tui.screens.create import CreateScreen
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.widgets.panels import DeploymentsTable, HeaderBar
from keeper.sim.cluster.demo import EmbeddedCluster

# The keeper's startup grace (15 s), the nodes' loading, and slack for a loaded CI machine.
SERVING_DEADLINE_S = 90.0
STEP_DEADLINE_S = 15.0
LLAMA_3B = "mlx-community/Llama-3.2-3B-Instruct-4bit"
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"

pytestmark = pytest.mark.e2e


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster() as running:
        yield running


async def until(
    pilot: Pilot[None], condition: Callable[[], object], timeout_s: float = STEP_DEADLINE_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("the dashboard did not get there in time")
        await pilot.pause(0.05)


def statuses(app: DashboardApp) -> dict[str, str]:
    return {r.model_id: r.status for r in app.dashboard.visible_rows}


@pytest.mark.anyio
async def test_the_dashboard_follows_and_steers_a_real_master(cluster: EmbeddedCluster) -> None:
    app = DashboardApp(MasterClient(cluster.url), faults=cluster, tick=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(statuses(app)) == 4)
        assert "● live" in str(app.dashboard.query_one(HeaderBar).render())

        # Create through the form, over HTTP, and see the master's answer arrive as an event.
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, CreateScreen) and app.screen.shown)
        await pilot.press(*"llama 3b", "ctrl+s")
        await until(pilot, lambda: LLAMA_3B in statuses(app))
        await until(pilot, lambda: isinstance(app.screen, DashboardScreen))

        # Delete it again, through the confirmation.
        app.dashboard.query_one(DeploymentsTable).select_key(
            next(r.deployment_id for r in app.dashboard.visible_rows if r.model_id == LLAMA_3B)
        )
        await pilot.press("ctrl+d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmDeleteScreen))
        await pilot.press("right", "enter")
        await until(pilot, lambda: LLAMA_3B not in statuses(app))

        # After the keeper's grace: three models served, one that fits nowhere, with why.
        await until(
            pilot,
            lambda: (
                sorted(statuses(app).values()) == ["cant_place", "serving", "serving", "serving"]
            ),
            SERVING_DEADLINE_S,
        )
        deepseek = next(r for r in app.dashboard.visible_rows if r.model_id == DEEPSEEK)
        assert deepseek.placement_error == "No cycles found with sufficient memory"
        assert deepseek.waiting == "unplaceable_retry"
        texts = [e.text for e in app.model.timeline]
        assert any(t.startswith("runner ready: ") for t in texts)
        # The demo's replicated model: two instances, on two different nodes, both serving.
        await until(pilot, lambda: _replicas(cluster.url, QWEN_06B) == (2, 2), STEP_DEADLINE_S)
        qwen_nodes = [
            node
            for instance in app.model.state.instances.values()
            if instance.shard_assignments.model_id == QWEN_06B
            for node in instance.shard_assignments.node_to_runner
        ]
        assert len(qwen_nodes) == len(set(qwen_nodes)) == 2


def _replicas(url: str, model_id: str) -> tuple[int, int] | None:
    """A model's (replicas, readyReplicas) as the master's ``GET /deployments`` says."""
    listing = get_json(f"{url}/deployments") or {}
    for item in listing.get("deployments", []):
        if item["deployment"]["modelCard"]["modelId"] == model_id:
            return item["replicas"], item["readyReplicas"]
    return None


@pytest.fixture
def stock_exo(tmp_path: Path) -> Iterator[str]:
    """``exo-deploy cluster --exo-compat`` with two nodes, as processes; its URL once both
    nodes are in its State."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with (tmp_path / "cluster.log").open("wb") as output:
        argv = ["cluster", "--exo-compat", "--nodes", "2", "--port", str(port)]
        process = start_cli([*argv, "--data-dir", str(tmp_path / "data")], output)
        try:
            wait_for(
                "the stand-in's nodes",
                START_DEADLINE_S,
                lambda: (get_json(f"{url}/state") or {}).get("nodeIdentities") or None,
            )
            yield url
        finally:
            stop(process)


@pytest.mark.anyio
async def test_the_dashboard_shows_a_stock_exo_it_can_only_poll(stock_exo: str) -> None:
    app = DashboardApp(MasterClient(stock_exo), tick=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: len(app.model.node_rows(time.time())) == 2)
        header = str(app.dashboard.query_one(HeaderBar).render())
        assert "polling 1s · stock exo" in header
        assert all(r.liveness == "alive" for r in app.model.node_rows(time.time()))
        assert not app.model.has_timers
        assert app.model.connection.mode == "polling"
