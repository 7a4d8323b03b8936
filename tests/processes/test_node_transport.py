"""A simulated node on a real socket: the WebSocket client, its reconnect loop, the partitioning
proxy, token refusal, and the embedded demo cluster that the TUI's ``--demo`` starts.

These run on the real clock (sockets cannot run under MockClock) and each finishes in a few
seconds; waits are on conditions with deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import httpx
import pytest
import shared_http as http
from anyio.abc import TaskGroup
from waiting import wait_until

from keeper.runtime.clock import AnyioClock
from keeper.sim.cluster.demo import EmbeddedCluster
from keeper.sim.cluster.proxy import TcpProxy
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master
from keeper.sim.node.sim_node import NodeConfig, SimNode
from keeper.sim.node.ws_client import NodeRejectedError, node_ws_url, run_node_forever

TOKEN = "node-token"


async def until(condition: Callable[[], bool], within: float, what: str) -> None:
    await wait_until(condition, within, what, poll_s=0.02)


async def start_master(
    group: TaskGroup, data_dir: Path | None = None, token: str | None = None, port: int = 0
) -> tuple[Master, int, Callable[[], Awaitable[None]]]:
    """A master serving on ``port`` (0: any); the third item stops it and waits until the
    port is free again."""
    master = Master(data_dir)
    scope = anyio.CancelScope()
    done = anyio.Event()

    async def run(*, task_status: anyio.abc.TaskStatus[int]) -> None:
        try:
            with scope:
                await serve(master, "127.0.0.1", port, token, task_status=task_status)
        finally:
            done.set()

    async def stop() -> None:
        scope.cancel()
        await done.wait()

    bound: int = await group.start(run)
    return master, bound, stop


def test_master_urls_become_node_websocket_urls() -> None:
    assert node_ws_url("http://127.0.0.1:52415") == "ws://127.0.0.1:52415/node/ws"
    assert node_ws_url("https://m.example:443/") == "wss://m.example:443/node/ws"
    assert node_ws_url("127.0.0.1:9") == "ws://127.0.0.1:9/node/ws"
    assert node_ws_url("ws://h:1/node/ws") == "ws://h:1/node/ws"
    with pytest.raises(ValueError, match="not a master URL"):
        node_ws_url("ftp://h:1")


@pytest.mark.anyio
async def test_a_node_joins_through_the_proxy_and_survives_a_partition() -> None:
    async with anyio.create_task_group() as group:
        master, port, _ = await start_master(group)
        proxy = TcpProxy("127.0.0.1", port)
        proxy_port = await group.start(proxy.run)
        node = SimNode(NodeConfig(name="edge", memory_gb=8), AnyioClock())
        group.start_soon(run_node_forever, node, f"http://127.0.0.1:{proxy_port}", AnyioClock())
        await until(lambda: node.node_id in master.connected_nodes(), 10, "joined")
        await until(lambda: node.node_id in master.state.topology.nodes, 5, "in the topology")
        assert master.state.node_identities[node.node_id].friendly_name == "edge"

        sessions = node.welcomed_sessions
        proxy.partition()
        await until(lambda: node.node_id not in master.connected_nodes(), 5, "cut off")
        await until(lambda: proxy.connections_refused >= 1, 5, "refused while partitioned")
        assert node.node_id not in master.connected_nodes()

        proxy.heal()
        await until(lambda: node.node_id in master.connected_nodes(), 10, "reconnected")
        await until(lambda: node.welcomed_sessions > sessions, 5, "welcomed again")
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_follows_a_restarted_master(tmp_path: Path) -> None:
    async with anyio.create_task_group() as group:
        master, port, stop = await start_master(group, tmp_path)
        node = SimNode(NodeConfig(name="steady", memory_gb=8), AnyioClock())
        group.start_soon(run_node_forever, node, f"http://127.0.0.1:{port}", AnyioClock())
        # Joined: connected, and its first report logged (reports are written a moment after
        # they arrive, coalesced; the restarted master can only remember what was written).
        await until(
            lambda: (
                node.node_id in master.connected_nodes()
                and node.node_id in master.state.topology.nodes
            ),
            10,
            "joined",
        )
        sessions = node.welcomed_sessions
        with anyio.fail_after(10):
            await stop()

        second, _, _ = await start_master(group, tmp_path, port=port)
        assert node.node_id in second.state.topology.nodes  # remembered by the log
        await until(lambda: node.node_id in second.connected_nodes(), 15, "back")
        await until(lambda: node.welcomed_sessions > sessions, 5, "welcomed again")
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_master_with_a_token_refuses_a_node_without_it() -> None:
    async with anyio.create_task_group() as group:
        master, port, _ = await start_master(group, token=TOKEN)
        url = f"http://127.0.0.1:{port}"
        stranger = SimNode(NodeConfig(name="stranger", memory_gb=8), AnyioClock())
        with anyio.fail_after(10), pytest.raises(NodeRejectedError, match="token"):
            await run_node_forever(stranger, url, AnyioClock(), token="wrong")
        assert stranger.node_id not in master.state.topology.nodes

        friend = SimNode(NodeConfig(name="friend", memory_gb=8), AnyioClock())
        group.start_soon(run_node_forever, friend, url, AnyioClock(), TOKEN)
        await until(lambda: friend.node_id in master.connected_nodes(), 10, "joined")
        group.cancel_scope.cancel()


def test_the_demo_cluster_starts_serves_its_api_and_stops() -> None:
    demo = EmbeddedCluster()
    url = demo.start()
    try:
        assert demo.node_names() == ["studio", "mini-a", "mini-b"]
        views = http.get(f"{url}/deployments", timeout=5).json()
        models = {v["deployment"]["modelCard"]["modelId"] for v in views["deployments"]}
        assert "mlx-community/DeepSeek-V3.1-4bit" in models
        assert len(models) == 4

        def joined() -> bool:
            health = http.get(f"{url}/healthz", timeout=5).json()
            return health["nodes_connected"] == 3

        _wait(joined, 10, "3 nodes connected")
        assert demo.kill_runner("studio") == 0  # nothing placed yet: the 15 s grace
        demo.partition_node("mini-b", 60)
        _wait(lambda: not joined(), 5, "mini-b cut off")

        demo.restart_master()
        assert demo.url == url  # same port: a connected TUI just reconnects
        health = http.get(f"{url}/healthz", timeout=5).json()
        assert health["deployments"] == 4  # rebuilt from its log
        with pytest.raises(KeyError, match="no node named 'nope'"):
            demo.freeze_node("nope", 1)
    finally:
        demo.stop()
    with pytest.raises(httpx.ConnectError):
        http.get(f"{url}/healthz", timeout=2)
    demo.stop()  # idempotent


def _wait(condition: Callable[[], bool], within: float, what: str) -> None:
    end = time.monotonic() + within
    while not condition():
        if time.monotonic() > end:
            pytest.fail(f"not {what} within {within} s")
        time.sleep(0.05)
