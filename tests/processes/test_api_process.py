"""The HTTP API on real sockets: the streaming endpoints (SSE dashboard stream, chat) against a
real uvicorn with a node joined over the real WebSocket, and the master's process entry
(``run_master``) refusing a public address without a token, then serving and stopping on SIGTERM.
The same API in-process (ASGI, no sockets) is tests/virtual/test_api.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import anyio
import httpx
import pytest
import shared_http as http
from anyio.abc import TaskGroup
from exo_errors import assert_exo_error
from model_ids import QWEN
from process_helpers import free_port
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from keeper.httpapi.serving import MAX_WS_FRAME_BYTES
from keeper.model.api_models import DeploymentsResponse, StreamSnapshot
from keeper.model.events import IndexedEvent, InstanceCreated
from keeper.model.state import (
    Backend,
    Memory,
    MemoryUsage,
    NodeIdentity,
    NodeNetwork,
    RunnerReady,
)
from keeper.runtime.event_log import EventLog
from keeper.sim.link.identity import NodeKey
from keeper.sim.link.protocol import (
    MASTER_MESSAGE,
    NODE_MESSAGE,
    AnyNodeMessage,
    Challenge,
    ChatChunk,
    ChatRequest,
    EventMessage,
    Hello,
    NodeInfo,
    RunnerStatusReport,
    Welcome,
)
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master

TOKEN = "s3cret-token"


# --- a real server: SSE, WebSocket nodes, chat ------------------------------------------


@asynccontextmanager
async def real_server(token: str | None = None) -> AsyncIterator[tuple[Master, str]]:
    master = Master(None)
    async with anyio.create_task_group() as group:
        port = await group.start(serve, master, "127.0.0.1", 0, token)
        yield master, f"127.0.0.1:{port}"
        group.cancel_scope.cancel()


WS_NODE_ID = NodeKey.for_name("ws-node").node_id


class WsNode:
    """A node over the real WebSocket: joins, marks its runners Ready, answers chats."""

    def __init__(self, ws: ClientConnection, name: str = "ws-node") -> None:
        self.ws = ws
        self.key = NodeKey.for_name(name)
        self.node_id = self.key.node_id

    async def send(self, message: AnyNodeMessage) -> None:
        await self.ws.send(NODE_MESSAGE.dump_json(message).decode())

    async def join(self) -> None:
        challenge = MASTER_MESSAGE.validate_json(await self.ws.recv())
        assert isinstance(challenge, Challenge)
        signature = self.key.sign_hello(challenge.nonce)
        await self.send(Hello(node_id=self.node_id, name="ws", signature=signature))
        memory = Memory.from_gb(64)
        await self.send(
            NodeInfo(
                memory=MemoryUsage(ram_total=memory, ram_available=memory),
                backends=[Backend.MLX_METAL],
                identity=NodeIdentity(friendly_name="ws"),
                network=NodeNetwork(),
            )
        )

    async def follow(self, *, die_mid_chat: bool = False) -> None:
        async for frame in self.ws:
            message = MASTER_MESSAGE.validate_json(frame)
            match message:
                case EventMessage(indexed=IndexedEvent(event=InstanceCreated(instance=inst))):
                    runner = inst.shard_assignments.node_to_runner[self.node_id]
                    await self.send(
                        RunnerStatusReport(runner_id=runner, runner_status=RunnerReady())
                    )
                case ChatRequest(request_id=request_id):
                    await self.send(ChatChunk(request_id=request_id, text="Hello"))
                    if die_mid_chat:
                        await self.ws.close()
                        return
                    await self.send(ChatChunk(request_id=request_id, text=" there"))
                    await self.send(ChatChunk(request_id=request_id, finish_reason="stop"))
                case _:
                    pass


async def start_ws_node(
    group: TaskGroup, address: str, master: Master, *, die_mid_chat: bool = False
) -> None:
    async def run() -> None:
        async with connect(f"ws://{address}/node/ws") as ws:
            node = WsNode(ws)
            await node.join()
            with suppress(ConnectionClosed):
                await node.follow(die_mid_chat=die_mid_chat)

    group.start_soon(run)
    with anyio.fail_after(5):
        while WS_NODE_ID not in master.state.node_memory:
            await anyio.sleep(0.01)


@asynccontextmanager
async def serving_qwen_over_ws(*, die_mid_chat: bool = False) -> AsyncIterator[httpx.AsyncClient]:
    """A real server with one WebSocket node and Qwen placed through ``POST /place_instance``
    and ready on it; a client of the server."""
    async with (
        real_server() as (master, address),
        anyio.create_task_group() as group,
        httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as client,
    ):
        await start_ws_node(group, address, master, die_mid_chat=die_mid_chat)
        placed = await client.post("/place_instance", json={"model_id": QWEN})
        assert placed.status_code == 200
        with anyio.fail_after(5):
            while not master.ready_instances(QWEN):
                await anyio.sleep(0.01)
        yield client
        group.cancel_scope.cancel()


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[str, str]]:
    event, data = "", ""
    async for line in response.aiter_lines():
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: "):
            data = line.removeprefix("data: ")
        elif line == "" and event:
            yield event, data
            event, data = "", ""


@pytest.mark.anyio
async def test_dashboard_stream_sends_a_snapshot_then_events_then_deployments() -> None:
    async with (
        real_server() as (_master, address),
        httpx.AsyncClient(base_url=f"http://{address}", timeout=10) as client,
        client.stream("GET", "/events") as response,
    ):
        assert response.headers["content-type"].startswith("text/event-stream")
        stream = sse_events(response)
        kind, data = await anext(stream)
        assert kind == "snapshot"
        snapshot = StreamSnapshot.model_validate_json(data)
        assert snapshot.state.deployments == {}
        created = await client.post("/deployments", json={"model_id": QWEN})
        deployment_id = created.json()["deployment_id"]
        seen: dict[str, list[str]] = {"event": [], "deployments": []}
        with anyio.fail_after(5):
            while not seen["deployments"]:
                kind, data = await anext(stream)
                seen.setdefault(kind, []).append(data)
        indexed = IndexedEvent.model_validate_json(seen["event"][0])
        assert indexed.idx == snapshot.state.last_event_applied_idx + 1
        assert "DeploymentCreated" in seen["event"][0]
        view = DeploymentsResponse.model_validate_json(seen["deployments"][-1])
        assert [item.deployment.deployment_id for item in view.deployments] == [deployment_id]


@pytest.mark.anyio
async def test_chat_completions_stream_and_not_over_a_websocket_node() -> None:
    async with serving_qwen_over_ws() as client:
        request = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}]}
        whole = await client.post("/v1/chat/completions", json=request)
        assert whole.status_code == 200, whole.text
        body = whole.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello there"}
        assert body["choices"][0]["finish_reason"] == "stop"

        pieces: list[str] = []
        async with client.stream(
            "POST", "/v1/chat/completions", json={**request, "stream": True}
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    pieces.append(line.removeprefix("data: "))
        assert pieces[-1] == "[DONE]"
        chunks = [json.loads(piece) for piece in pieces[:-1]]
        assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
        text = "".join(chunk["choices"][0]["delta"].get("content", "") for chunk in chunks)
        assert text == "Hello there"
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


@pytest.mark.anyio
async def test_a_node_dying_mid_chat_ends_the_reply_with_an_error() -> None:
    async with serving_qwen_over_ws(die_mid_chat=True) as client:
        request = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}]}
        with anyio.fail_after(5):
            response = await client.post("/v1/chat/completions", json=request)
        # The front door sends the cut answer again (docs/design.md §8.6); with its only node
        # gone the model has no ready instance, and no deployment to wait for: exo's 404.
        assert_exo_error(response, 404, QWEN, "ready to serve")


@pytest.mark.anyio
async def test_a_malformed_node_frame_closes_only_that_session() -> None:
    async with real_server() as (_master, address):
        async with connect(f"ws://{address}/node/ws") as ws:
            await WsNode(ws).join()
            welcome = MASTER_MESSAGE.validate_json(await ws.recv())
            assert isinstance(welcome, Welcome)
            await ws.send('{"NodeInfo": {"memory": "lots"}}')
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1007
        assert "malformed node message" in closed.value.rcvd.reason
        async with httpx.AsyncClient(base_url=f"http://{address}") as client:
            assert (await client.get("/healthz")).status_code == 200


@pytest.mark.anyio
async def test_the_node_websocket_needs_the_token_before_the_upgrade() -> None:
    async with real_server(TOKEN) as (master, address):
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://{address}/node/ws"):
                pass
        assert refused.value.response.status_code == 401
        assert "bearer token" in json.loads(refused.value.response.body)["error"]["message"]
        headers = {"Authorization": "Bearer wrong"}
        with pytest.raises(InvalidStatus) as refused:
            async with connect(f"ws://{address}/node/ws", additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with connect(f"ws://{address}/node/ws", additional_headers=headers) as ws:
            node = WsNode(ws)
            await node.join()
            assert isinstance(MASTER_MESSAGE.validate_json(await ws.recv()), Welcome)
        assert master.running


@pytest.mark.anyio
async def test_a_hello_that_does_not_prove_its_id_is_closed_with_the_reason() -> None:
    async with real_server() as (master, address):
        async with connect(f"ws://{address}/node/ws") as ws:
            challenge = MASTER_MESSAGE.validate_json(await ws.recv())
            assert isinstance(challenge, Challenge)
            someone = NodeKey.for_name("someone")
            # Signed, but by another key than the one the claimed id is made of.
            forged = NodeKey.for_name("forger").sign_hello(challenge.nonce)
            hello = Hello(node_id=someone.node_id, name="someone", signature=forged)
            await ws.send(NODE_MESSAGE.dump_json(hello).decode())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
        assert "node identity not proven" in closed.value.rcvd.reason
        assert master.connected_nodes() == []
        assert master.membership_refusals() == {"hello not proven": 1}


# --- the process entry ------------------------------------------------------------------


def _master_process(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    code = (
        "import sys; from keeper.sim.master.server import run_master as r; "
        "a = sys.argv[1:]; sys.exit(r(a[0], *(int(p) for p in a[1:2]), *a[2:]))"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_run_master_refuses_a_public_address_without_a_token() -> None:
    process = _master_process("0.0.0.0", str(free_port()), env={"EXO_DEPLOY_TOKEN": ""})
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "Refusing to listen on 0.0.0.0 without a token" in stderr
    assert "Traceback" not in stderr


@pytest.mark.e2e
def test_run_master_serves_then_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    process = _master_process("127.0.0.1", str(port), str(tmp_path))
    line = ""
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while "listening on" not in line and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break  # the process ended: its stderr is in the failure below
        if not line:
            process.kill()
            out, err = process.communicate()
            pytest.fail(f"the master did not start ({process.returncode}): {out} {err}")
        assert f"exo-deploy master listening on http://127.0.0.1:{port}" in line
        created = http.post(f"http://127.0.0.1:{port}/deployments", json={"model_id": QWEN})
        assert created.status_code == 200
        process.send_signal(signal.SIGTERM)
        _, rest = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, rest
    assert "Traceback" not in rest
    assert (tmp_path / "snapshot.json").exists()  # a clean stop leaves a restart point
    log = EventLog(tmp_path)
    assert created.json()["deployment_id"] in log.open().state.deployments
    log.close()


@pytest.mark.anyio
async def test_an_oversized_node_frame_closes_that_connection_with_1009() -> None:
    async with real_server() as (master, address):
        async with connect(f"ws://{address}/node/ws", max_size=None) as ws:
            await ws.send("x" * (MAX_WS_FRAME_BYTES + 1))
            with pytest.raises(ConnectionClosed) as closed:
                while True:  # the master's challenge, then the close
                    await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
        async with httpx.AsyncClient() as client:  # the master goes on serving
            assert (await client.get(f"http://{address}/healthz")).status_code == 200
        assert master.state.topology.nodes == []  # and took nothing from it
