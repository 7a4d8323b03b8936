"""Screenshots of the key screens at 80x24 and 120x40, compared with accepted SVGs.

Every scenario freezes the clock (``FROZEN_NOW``, shown in UTC) and feeds a scripted master, so
an image changes only when the dashboard's rendering does. Update after a deliberate change
with ``pytest tests/tui/test_tui_snapshots.py --snapshot-update`` and look at the new SVGs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

import pytest
from model_ids import LLAMA, QWEN
from recorded_exo import before_the_timeout, recorded_state
from test_tui_app import until
from test_tui_app_nodes import draining_client, serving_on_mini_a
from test_tui_app_whatif import whatif_mini_a
from textual.app import App
from textual.pilot import Pilot
from textual.widgets import Input, Select

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import STOCK_EXO, ApiError
from exo_deploy_tui.model.cluster import parse_iso
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    EventUpdate,
    HeardUpdate,
    SnapshotUpdate,
    Update,
)
from exo_deploy_tui.screens.create import CreateScreen
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, ScriptedClient, iso, node_id_for
from exo_deploy_tui.widgets.panels import DeploymentsTable, NodesTable
from keeper.model.api_models import ServiceHealthView
from keeper.model.events import (
    AnyEvent,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.state import RunnerFailed, RunnerIdle, RunnerLoading, RunnerReady

pytestmark = pytest.mark.usefixtures("utc")  # the TUI shows local times: UTC here

QWEN30 = "mlx-community/Qwen3-30B-A3B-4bit"
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"
NO_FIT = "No cycles found with sufficient memory"
SIZES = [(80, 24), (120, 40)]

Compare = Callable[..., bool]


class Clock:
    def __init__(self) -> None:
        self.now = FROZEN_NOW

    def __call__(self) -> float:
        return self.now


def nodes(builder: ClusterBuilder, *, silent: str | None = None) -> ClusterBuilder:
    for name, ram, free in (("studio", 96, 60), ("mini-a", 24, 20), ("mini-b", 24, 14)):
        builder.node(name, ram_gb=ram, free_gb=free, seen_ago_s=20 if name == silent else 2)
    return builder.link_all()


def healthy() -> ClusterBuilder:
    return (
        nodes(ClusterBuilder())
        .deployment(QWEN, on=["mini-a"])
        .deployment(LLAMA, on=["mini-b"])
        .deployment(QWEN30, on=["studio", "mini-b"])
    )


def scenario(builder: ClusterBuilder, clock: Clock | None = None) -> DashboardApp:
    client = ScriptedClient(initial=[builder.snapshot(), ConnectionUpdate("live")])
    return DashboardApp(client, clock=clock or Clock(), tick=False)


def steady_cursors(app: App[None]) -> None:
    """The form's cursors drawn, not blinking: an Input's cursor blinks every 0.5 s, so a shot
    taken more than that after the last key (a loaded machine, a parallel suite) would find it
    off where an unloaded run finds it on. Held on, every shot is the same."""
    for box in app.screen.query(Input):
        if box.cursor_blink:  # once: a change refreshes the box, which a shot must not race
            box.cursor_blink = False


async def settled(pilot: Pilot[None]) -> None:
    """Wait until the screen is drawn whole, its text cursors held still (see steady_cursors)."""
    await pilot.pause()
    await pilot.wait_for_scheduled_animations()
    steady_cursors(pilot.app)
    await pilot.pause()


def pressing(*keys: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    async def run(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await pilot.press(*keys)
        await settled(pilot)

    return run


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_empty_cluster(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(nodes(ClusterBuilder())), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_healthy(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(healthy()), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cant_place_with_its_error(snap_compare: Compare, size: tuple[int, int]) -> None:
    builder = healthy().deployment(
        DEEPSEEK,
        error=NO_FIT,
        next_attempt_in_s=30,
        waiting="unplaceable_retry",
    )
    assert snap_compare(scenario(builder), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_cant_place_described(snap_compare: Compare, size: tuple[int, int]) -> None:
    """Describe under exo's error says why in numbers: what the model needs, what nodes offer."""
    builder = healthy().deployment(DEEPSEEK, error=NO_FIT, waiting="unplaceable_retry")
    assert snap_compare(scenario(builder), terminal_size=size, run_before=pressing("enter"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_backoff_counting_down(snap_compare: Compare, size: tuple[int, int]) -> None:
    clock = Clock()
    builder = (
        nodes(ClusterBuilder())
        .deployment(QWEN, on=["mini-a"])
        .deployment(LLAMA, failures=2, next_attempt_in_s=40, waiting="backoff")
    )
    client = ScriptedClient(initial=[builder.snapshot(), ConnectionUpdate("live")])
    app = DashboardApp(client, clock=clock, tick=False)

    async def three_seconds_later(pilot: Pilot[None]) -> None:
        await settled(pilot)
        clock.now += 3
        client.push(HeardUpdate())  # the master's keepalive: it is alive, nothing new
        await settled(pilot)
        app.tick()
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=three_seconds_later)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_master_gone_quiet(snap_compare: Compare, size: tuple[int, int]) -> None:
    """Connected, then 12 s without a word from the master (frozen, or its link cut before the
    socket noticed): the header and the timeline say the master is quiet, and its nodes, judged
    as of its last word, still read alive rather than silent one by one."""
    clock = Clock()
    app = scenario(healthy(), clock)

    async def twelve_quiet_seconds(pilot: Pilot[None]) -> None:
        await settled(pilot)
        clock.now += 12
        app.tick()
        await settled(pilot)
        if size[0] < 120:
            await pilot.press("4")  # the timeline tab when compact
            await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=twelve_quiet_seconds)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_node_silent(snap_compare: Compare, size: tuple[int, int]) -> None:
    builder = (
        nodes(ClusterBuilder(), silent="mini-b")
        .deployment(QWEN, on=["mini-a"])
        .deployment(
            QWEN30,
            on=["studio", "mini-b"],
            runners=[RunnerReady(), RunnerLoading(layers_loaded=9, total_layers=24)],
        )
    )
    run = pressing() if size[0] >= 120 else pressing("2")  # the nodes tab when compact
    assert snap_compare(scenario(builder), terminal_size=size, run_before=run)


async def open_create_form(pilot: Pilot[None], app: DashboardApp) -> None:
    """Settle, press ``n`` and wait until the create form shows the loaded catalog."""
    await settled(pilot)
    await pilot.press("n")
    deadline = time.monotonic() + 5
    while not (isinstance(app.screen, CreateScreen) and app.screen.shown):
        assert time.monotonic() < deadline, "the catalog did not load"
        await pilot.pause(0.02)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_create_form(snap_compare: Compare, size: tuple[int, int]) -> None:
    app = scenario(healthy())

    async def open_form(pilot: Pilot[None]) -> None:
        await open_create_form(pilot, app)
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=open_form)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_create_form_with_no_match(snap_compare: Compare, size: tuple[int, int]) -> None:
    app = scenario(healthy())

    async def search_gemma(pilot: Pilot[None]) -> None:
        await open_create_form(pilot, app)
        await pilot.press(*"gemma")
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=search_gemma)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_delete_confirm(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(
        scenario(healthy()), terminal_size=size, run_before=pressing("down", "ctrl+d")
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_help(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(healthy()), terminal_size=size, run_before=pressing("?"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_stock_exo_after_a_node_timed_out(snap_compare: Compare, size: tuple[int, int]) -> None:
    """exo's own States, polled: node1 reporting, then (two seconds later) exo's State after it
    timed out, its instance still listed with a runner on the node that left; shown 3 s on."""
    before = before_the_timeout()
    clock = Clock()
    clock.now = max(parse_iso(t) or 0.0 for t in before.last_seen.values()) + 1
    client = ScriptedClient(
        initial=[SnapshotUpdate(before, None), ConnectionUpdate("polling", STOCK_EXO)]
    )
    app = DashboardApp(client, clock=clock, tick=False)

    async def node1_times_out(pilot: Pilot[None]) -> None:
        await settled(pilot)
        clock.now += 2
        client.push(SnapshotUpdate(recorded_state("state-node-timed-out"), None))
        await settled(pilot)
        clock.now += 3  # node1 gone for 3 s; the others last reported 6 s ago: still alive
        client.push(HeardUpdate())  # the poll's unchanged answer: exo is alive, nothing new
        await settled(pilot)
        app.tick()
        await settled(pilot)
        if size[0] < 120:
            await pilot.press("2")  # the nodes tab when compact
            await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=node1_times_out)


def test_stock_exo_answering_html_after_its_state(snap_compare: Compare) -> None:
    """exo's State polled, then 3 s later an HTML page where the State was: the header says
    unreadable and why, the nodes read before stay on screen marked stale since then."""
    state = recorded_state("state-instance-ready")
    clock = Clock()
    clock.now = max(parse_iso(t) or 0.0 for t in state.last_seen.values()) + 1
    client = ScriptedClient(
        initial=[SnapshotUpdate(state, None), ConnectionUpdate("polling", STOCK_EXO)]
    )
    app = DashboardApp(client, clock=clock, tick=False)

    async def html_instead(pilot: Pilot[None]) -> None:
        await settled(pilot)
        clock.now += 3  # the nodes last reported 4 s before: alive when the data went stale
        client.push(ConnectionUpdate("unreadable", "not JSON (text/html)", 0.5))
        await settled(pilot)
        await pilot.press("2")  # the nodes tab, which 80 columns show alone
        await settled(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=html_instead)


def replicated() -> ClusterBuilder:
    """Qwen3-0.6B keeps 2: one ready on mini-a, the other failed on mini-b (short, 1/2); Llama
    keeps 2, both ready."""
    return (
        nodes(ClusterBuilder())
        .deployment(QWEN, on=["mini-a"], replicas=2)
        .instance(
            QWEN,
            on=["mini-b"],
            runners=[RunnerFailed(error_message="Metal OOM while loading layer 14")],
            suffix="-b",
        )
        .deployment(LLAMA, on=["studio"], replicas=2)
        .instance(LLAMA, on=["mini-a"], suffix="-b")
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_replicas_short(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(replicated()), terminal_size=size, run_before=settled)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_scale_form(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(replicated()), terminal_size=size, run_before=pressing("s"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_create_form_with_replicas(snap_compare: Compare, size: tuple[int, int]) -> None:
    app = scenario(healthy())

    async def open_form(pilot: Pilot[None]) -> None:
        await open_create_form(pilot, app)
        await pilot.press(*"llama 70")
        await settled(pilot)
        replicas = app.screen.query_one("#create-replicas", Input)
        replicas.value = "2"
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=open_form)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_instances_with_an_unhealthy_one(snap_compare: Compare, size: tuple[int, int]) -> None:
    assert snap_compare(scenario(replicated()), terminal_size=size, run_before=pressing("3"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_delete_instance_confirm(snap_compare: Compare, size: tuple[int, int]) -> None:
    # Llama's two instances (two rows each) and Qwen's ready one come first: the seventh row
    # is the failed replica's head.
    run = pressing("3", *["down"] * 6, "ctrl+k")
    assert snap_compare(scenario(replicated()), terminal_size=size, run_before=run)


H = 3600.0
NODE_LOST = "node studio timed out"


def with_history() -> ClusterBuilder:
    """The healthy cluster with the master's serving records: Qwen3-0.6B recovered six times in
    the last day (99.8 %, plain), Qwen3-30B lost mini-b for half an hour (97.9 %, amber),
    DeepSeek unplaceable since it was created (0.0 %, red); Llama has no records (—)."""
    flaps: list[tuple[float, bool, str | None]] = [(26 * H, True, None)]
    causes = [
        (20 * H, NODE_LOST, 40.2),
        (9 * H, "runner failed on mini-a: Metal OOM while loading layer 14", 95.0),
        (5 * H, "node mini-a timed out", 37.9),
        (3 * H, "instance deleted by a user", 12.5),
        (2 * H, "runner on mini-a went RunnerShutdown", 41.0),
        (40 * 60, NODE_LOST, 38.4),
    ]
    for ago, cause, lasted in causes:
        flaps += [(ago, False, cause), (ago - lasted, True, None)]
    return (
        healthy()
        .deployment(DEEPSEEK, error=NO_FIT, waiting="unplaceable_retry")
        .served(QWEN, *flaps)
        .served(
            QWEN30,
            (30 * H, True, None),
            (2 * H, False, "node mini-b timed out"),
            (1.5 * H, True, None),
        )
        .served(DEEPSEEK, (5 * H, False, f"unplaceable: {NO_FIT}"))
    )


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_history_on_the_dashboard(snap_compare: Compare, size: tuple[int, int]) -> None:
    """AVAIL from 100 columns (not at 80x24), the timeline seeded with the day's incidents."""
    app = scenario(with_history())

    async def run(pilot: Pilot[None]) -> None:
        await settled(pilot)
        avail = "avail" in [c.key for c in app.dashboard.query_one(DeploymentsTable).columns]
        assert avail == (size[0] >= 100)

    assert snap_compare(app, terminal_size=size, run_before=run)


def test_seeded_timeline_compact(snap_compare: Compare) -> None:
    """At 80x24 the timeline tab: the day's incidents marked as history, then the connection."""
    assert snap_compare(scenario(with_history()), terminal_size=(80, 24), run_before=pressing("4"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_incidents_described(snap_compare: Compare, size: tuple[int, int]) -> None:
    """Describe on Qwen3-0.6B (DeepSeek, then Llama, come first): its day's availability, MTTR
    and the newest five incidents with their cause and recovery, above the fold at 80x24."""
    run = pressing("down", "down", "enter")
    assert snap_compare(scenario(with_history()), terminal_size=size, run_before=run)


# --- downloads, disks and vitals ------------------------------------------------------------

# Each node's GPU over its last eight reports: studio serving steadily, mini-a idle, mini-b
# idle while it downloads.
GPU_READINGS = {
    "studio": (0.35, 0.52, 0.61, 0.74, 0.88, 0.93, 0.71, 0.62),
    "mini-a": (0.05, 0.12, 0.30, 0.08, 0.04, 0.15, 0.06, 0.03),
    "mini-b": (0.02, 0.02, 0.03, 0.02, 0.04, 0.02, 0.03, 0.03),
}


def downloading() -> ClusterBuilder:
    """Qwen3-30B placed on studio (ready) and mini-b, whose runner waits for mini-b's download
    of the model (43 %, 210 MB/s); Qwen3-0.6B serving on mini-a, whose disk queues Qwen3-30B.
    Every node reports its disk and vitals."""
    builder = nodes(ClusterBuilder())
    for name, free in (("studio", 320), ("mini-a", 410), ("mini-b", 12)):
        temp, power = (61, 95) if name == "studio" else (41, 12)
        builder.disk(name, 500, free).vitals(name, GPU_READINGS[name][-1], temp, power)
    return (
        builder.deployment(QWEN, on=["mini-a"])
        .deployment(QWEN30, on=["studio", "mini-b"], runners=[RunnerReady(), RunnerIdle()])
        .download("studio", QWEN30)
        .download("mini-a", QWEN)
        .download("mini-a", QWEN30, queued=True)
        .download("mini-b", QWEN30, done_gb=7.1, speed_mb=210, eta_s=46)
    )


def reporting(builder: ClusterBuilder) -> DashboardApp:
    """The scenario, its nodes then reporting their vitals eight times (the sparklines)."""
    state = builder.state
    updates: list[Update] = [builder.snapshot(), ConnectionUpdate("live")]
    idx = state.last_event_applied_idx
    for reading in range(8):
        for name, readings in GPU_READINGS.items():
            idx += 1
            node = node_id_for(name)
            vitals = state.node_system[node].model_copy(update={"gpu_usage": readings[reading]})
            info = NodeGatheredInfo(node_id=node, when=state.last_seen[node], system=vitals)
            updates.append(EventUpdate(IndexedEvent(idx=idx, event=info)))
    return DashboardApp(ScriptedClient(initial=updates), clock=Clock(), tick=False)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_downloading(snap_compare: Compare, size: tuple[int, int]) -> None:
    """NEXT and the detail strip say what Qwen3-30B waits for; at 120x40 the nodes show their
    disks, models, GPU history and heat, and mini-b's runner its download."""
    assert snap_compare(reporting(downloading()), terminal_size=size, run_before=settled)


def test_downloading_nodes_compact(snap_compare: Compare) -> None:
    """At 80x24 the nodes tab: disk free and models (the vitals need more room)."""
    app = reporting(downloading())
    assert snap_compare(app, terminal_size=(80, 24), run_before=pressing("2"))


def test_downloading_instances_compact(snap_compare: Compare) -> None:
    assert snap_compare(reporting(downloading()), terminal_size=(80, 24), run_before=pressing("3"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_downloading_described(snap_compare: Compare, size: tuple[int, int]) -> None:
    app = reporting(downloading())
    assert snap_compare(app, terminal_size=size, run_before=pressing("enter"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_stock_exo_downloading(snap_compare: Compare, size: tuple[int, int]) -> None:
    """exo's own States, polled: node2 not yet downloading, then a second later 61 % into its
    download of Qwen3-0.6B (exo's recording), every node with its disk and vitals."""
    recording = recorded_state("state-downloading")
    before = recording.model_copy(
        update={"downloads": {n: e for n, e in recording.downloads.items() if n.startswith("5763")}}
    )
    clock = Clock()
    clock.now = max(parse_iso(t) or 0.0 for t in recording.last_seen.values()) + 1
    client = ScriptedClient(
        initial=[SnapshotUpdate(before, None), ConnectionUpdate("polling", STOCK_EXO)]
    )
    app = DashboardApp(client, clock=clock, tick=False)

    async def node2_downloads(pilot: Pilot[None]) -> None:
        await settled(pilot)
        clock.now += 1
        client.push(SnapshotUpdate(recording, None))
        await settled(pilot)
        if size[0] < 120:
            await pilot.press("2")  # the nodes tab when compact
            await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=node2_downloads)


async def applied(pilot: Pilot[None], idx: int) -> None:
    """Wait until the app's model has applied event ``idx``: a batch of updates is applied at the
    next frame, up to MIN_FRAME_INTERVAL_S later, with the clock as it is then, so the scripted
    clock must not move before."""
    app = pilot.app
    assert isinstance(app, DashboardApp)
    await until(pilot, lambda: app.model.state.last_event_applied_idx >= idx, timeout_s=10)


# How often the scripted recovery's master relays its live nodes' reports between the steps it
# tells: below the 3 s after which the dashboard calls the master quiet
# (master_quiet.QUIET_AFTER_S), so the master and those nodes read as alive throughout.
REPORTS_EVERY_S = 2.0


class Recovery:
    """Qwen3-30B loses mini-b (last heard 2 s before), is placed on studio and mini-a at once,
    mini-a downloads the model in 52 s, the runners are ready 11 s later; ``tell`` feeds it to
    the app, each step a frame of its own, as the master's stream would."""

    def __init__(self) -> None:
        builder = nodes(ClusterBuilder()).deployment(QWEN, on=["mini-a"])
        builder.deployment(QWEN30, on=["studio", "mini-b"])
        for name in ("studio", "mini-a", "mini-b"):
            builder.disk(name, 500, 320)
        builder.download("studio", QWEN30).download("mini-b", QWEN30).download("mini-a", QWEN)
        self.builder = builder
        self.clock = Clock()
        self.app = scenario(builder, self.clock)

    async def tell(self, pilot: Pilot[None]) -> None:
        client = self.app.client
        assert isinstance(client, ScriptedClient)
        placed = (
            ClusterBuilder()
            .node("studio")
            .node("mini-a")
            .instance(QWEN30, on=["studio", "mini-a"], runners=[RunnerIdle()] * 2, suffix="-2")
        )
        instance = placed.state.instances["inst-qwen3-30b-a3b-4bit-2"]

        def entry(**how: object) -> NodeDownloadProgress:
            state = ClusterBuilder().download("mini-a", QWEN30, **how).state  # type: ignore[arg-type]
            return NodeDownloadProgress(download_progress=state.downloads[node_id_for("mini-a")][0])

        steps: list[tuple[float, list[AnyEvent]]] = [
            (10, []),  # mini-b silent since 2 s before
            (29, [NodeTimedOut(node_id=node_id_for("mini-b"))]),
            (29, [InstanceDeleted(instance_id="inst-qwen3-30b-a3b-4bit")]),
            (29.01, [InstanceCreated(instance=instance)]),
            (29.5, [entry(done_gb=0.1, speed_mb=320)]),
            (60, [entry(done_gb=9.4, speed_mb=320, eta_s=21)]),
            (81.5, [entry()]),
            (
                92.5,
                [
                    RunnerStatusUpdated(runner_id=r, runner_status=RunnerReady())
                    for r in instance.shard_assignments.node_to_runner.values()
                ],
            ),
        ]
        idx = self.builder.state.last_event_applied_idx
        spoke = 0.0
        for at, events in steps:
            # Between steps, studio's and mini-a's reports, as the master relays them (every
            # second; every REPORTS_EVERY_S here, enough for neither the master nor its two nodes
            # ever to read as quiet).
            moments = [*range(int(spoke + REPORTS_EVERY_S), math.ceil(at), int(REPORTS_EVERY_S))]
            for moment in [*moments, at]:
                self.clock.now = FROZEN_NOW + moment
                beats = [
                    NodeGatheredInfo(node_id=node_id_for(n), when=iso(self.clock.now - 1))
                    for n in ("studio", "mini-a")
                ]
                for event in [*beats, *(events if moment == at else [])]:
                    idx += 1
                    client.push(EventUpdate(IndexedEvent(idx=idx, event=event)))
                await applied(pilot, idx)
            await settled(pilot)
            spoke = at


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_recovery_with_a_download(snap_compare: Compare, size: tuple[int, int]) -> None:
    """The recovery told while the timeline shows: each step and where the 94 s went."""
    recovery = Recovery()

    async def recover(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await recovery.tell(pilot)
        if size[0] < 120:
            await pilot.press("4")  # the timeline tab when compact
            await settled(pilot)

    assert snap_compare(recovery.app, terminal_size=size, run_before=recover)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_recovery_told_while_the_timeline_was_hidden(
    snap_compare: Compare, size: tuple[int, int]
) -> None:
    """The timeline shown, then the deployments tab, the recovery told meanwhile, then the
    timeline again: every line whole, wrapped at the panel's width. At 120x40 every panel shows,
    so the timeline is hidden the way a terminal does it: narrowed to 80x24 (one tab at a time)
    and widened back once the recovery is told."""
    recovery = Recovery()

    async def recover(pilot: Pilot[None]) -> None:
        await settled(pilot)
        if size[0] >= 120:
            await pilot.resize_terminal(80, 24)
            await settled(pilot)
        await pilot.press("4")
        await settled(pilot)
        await pilot.press("1")
        await settled(pilot)
        await recovery.tell(pilot)
        if size[0] >= 120:
            await pilot.resize_terminal(*size)
        else:
            await pilot.press("4")
        await settled(pilot)

    assert snap_compare(recovery.app, terminal_size=size, run_before=recover)


def test_timeline_wrapped_again_on_resize(snap_compare: Compare) -> None:
    """The recovery told on the timeline tab at 80x24 (wrapped at 77 columns), then the terminal
    widened to 120x40: the wide layout's half-width timeline wraps every line again at its own
    width, none cut off at the panel's edge."""
    recovery = Recovery()

    async def recover(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await pilot.press("4")
        await settled(pilot)
        await recovery.tell(pilot)
        await pilot.resize_terminal(120, 40)
        await settled(pilot)

    assert snap_compare(recovery.app, terminal_size=(80, 24), run_before=recover)


def test_nodes_cordoned_and_draining(snap_compare: Compare) -> None:
    """The nodes tab at 80x24: mini-a draining (one move, one waiting for room, one instance
    left alone, and the keeper's reason wrapped under it), studio cordoned, mini-c cordoned while
    away."""
    app = DashboardApp(draining_client(), clock=Clock(), tick=False)

    async def show(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await pilot.press("2")
        table = app.dashboard.query_one(NodesTable)
        deadline = time.monotonic() + 5
        # GET /nodes is read once the drain shows in the State: its answer, then the frame.
        while not any("stuck:" in cells[0][0] for cells in map(table.row, table.keys)):
            assert time.monotonic() < deadline, "GET /nodes never showed"
            await pilot.pause(0.02)
        await settled(pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=show)


def test_drain_confirm(snap_compare: Compare) -> None:
    """D on mini-a (the nodes tab's first row): what moves and what is left alone."""
    run = pressing("2", "D")
    assert snap_compare(scenario(serving_on_mini_a()), terminal_size=(80, 24), run_before=run)


def test_whatif(snap_compare: Compare) -> None:
    """w on mini-a (the nodes tab's first row): one deployment of each outcome, the keeper's
    long reason wrapped under the one left short."""
    client = ScriptedClient(
        initial=[serving_on_mini_a().snapshot(), ConnectionUpdate("live")],
        whatif_answer=whatif_mini_a(),
    )
    app = DashboardApp(client, clock=Clock(), tick=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=pressing("2", "w"))


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_edit_form(snap_compare: Compare, size: tuple[int, int]) -> None:
    """e on Llama (keeps 2): its settings filled in, then replicas and min_nodes changed: the
    line saying each instance is replaced in turn shows."""
    app = scenario(replicated())

    async def change(pilot: Pilot[None]) -> None:
        await settled(pilot)
        await pilot.press("e")
        await settled(pilot)
        app.screen.query_one("#edit-replicas", Input).value = "3"
        app.screen.query_one("#edit-min_nodes", Input).value = "2"
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=change)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_edit_form_refused(snap_compare: Compare, size: tuple[int, int]) -> None:
    """A service from before placement settings could change refuses sharding (422, unknown
    key): shown beside the field and under the fields, the form still open."""
    client = ScriptedClient(
        initial=[healthy().snapshot(), ConnectionUpdate("live")],
        refuse_with=ApiError("sharding: Extra inputs are not permitted", 422),
    )
    app = DashboardApp(client, clock=Clock(), tick=False)

    async def refused(pilot: Pilot[None]) -> None:
        await settled(pilot)
        app.dashboard.select_deployment("dep-llama-3.2-1b-instruct-4bit")  # it has tensor
        await settled(pilot)
        await pilot.press("e")
        await settled(pilot)
        app.screen.query_one("#edit-sharding", Select).value = "Tensor"
        await pilot.press("ctrl+s")
        await settled(pilot)
        await pilot.pause(0.1)
        await settled(pilot)

    assert snap_compare(app, terminal_size=size, run_before=refused)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize(
    "health",
    [
        ServiceHealthView(name="b1", role="acting", leader="b1"),
        ServiceHealthView(name="b2", role="standby", leader="b1"),
    ],
    ids=lambda h: h.role,
)
def test_header_bridge_role(
    snap_compare: Compare, size: tuple[int, int], health: ServiceHealthView
) -> None:
    """Pointed at a bridge sharing a store: the header names it and its role (and, for a
    standby, the acting one)."""
    client = ScriptedClient(
        initial=[healthy().snapshot(), ConnectionUpdate("polling")], health_answer=health
    )
    app = DashboardApp(client, clock=Clock(), tick=False)
    assert snap_compare(app, terminal_size=size, run_before=settled)


def test_drain_confirm_force_focused(snap_compare: Compare) -> None:
    """D on mini-a, then two moves right: Force drain focused, never by default."""
    run = pressing("2", "D", "right", "right")
    assert snap_compare(scenario(serving_on_mini_a()), terminal_size=(80, 24), run_before=run)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_node_suspect_and_its_deployment_at_risk(
    snap_compare: Compare, size: tuple[int, int]
) -> None:
    """Fast failover (docs/design.md §5.18): studio is suspect (4 s silent), Llama on it reads
    ``⚠ at risk`` with its replacement loading on mini-a, and the header counts the suspect."""
    builder = (
        nodes(ClusterBuilder())
        .deployment(QWEN, on=["mini-a"])
        .deployment(LLAMA, on=["studio"], by_keeper=True)
        .suspect("studio", heard_ago_s=4.0, since_ago_s=1.0)
        .replacement(LLAMA, on=["mini-a"], runners=[RunnerLoading(layers_loaded=6)])
    )
    # The deployments tab, Llama first (sorted by status, at risk before serving) and selected:
    # its failover in words in the detail strip; from 120 columns the nodes panel shows studio.
    assert snap_compare(scenario(builder), terminal_size=size, run_before=settled)
