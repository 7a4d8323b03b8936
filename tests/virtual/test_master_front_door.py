"""Our master's front door (docs/design.md §8.6), in virtual time: the bridge's door over the
master's own chat routing, reached in-process by ``keeper.sim.master.chat_upstream``.

The transport streams (a chat's first text reaches the door when the node sends it, not when the
answer ends); a chat for a deployment not serving yet is held until it serves, and refused with
the hold's 503 when it does not serve in time; ``GET /v1/models`` is the master's catalog through
the door; every chat is counted, in /metrics and in the deployment's view; exo's cancel, which
the door sends when its client leaves, ends a streamed chat on its node. Under a kill:
tests/virtual/test_chat_replicas.py; as processes:
tests/processes/test_master_front_door_process.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import httpx
import pytest
from chat_outcomes import chat_body, outcome_of, sse_data
from metrics_scrape import scrape, value
from model_ids import QWEN
from test_master import wait_until

from keeper.runtime.front_door import FrontDoorConfig
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.api import create_app
from keeper.sim.master.chat_upstream import upstream_client
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import DEFAULT_TOKENS_PER_S, NodeConfig

CHAT = "/v1/chat/completions"
# Tokens of the streamed chat: a second of a simulated node's answer, long enough that a first
# text read at its end would show.
TOKENS = 20


@asynccontextmanager
async def master_with_a_node(
    config: MasterConfig, nodes: int = 1
) -> AsyncIterator[tuple[Master, httpx.AsyncClient]]:
    """A running master with ``nodes`` simulated nodes, and a client of our API on it."""
    master = Master(None, config=config)
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        configs = [NodeConfig(name, 32.0) for name in "abc"[:nodes]]
        await group.start(InProcessCluster(master, configs).run)
        transport = httpx.ASGITransport(app=create_app(master))
        async with httpx.AsyncClient(transport=transport, base_url="http://master") as client:
            yield master, client
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_the_master_s_upstream_streams_each_text_as_its_node_sends_it() -> None:
    async with master_with_a_node(MasterConfig(startup_grace_s=0.0)) as (master, _):
        await master.create_deployment(QWEN)
        await wait_until(lambda: bool(master.ready_instances(QWEN)), 60, "serving")
        arrived: list[float] = []
        received = bytearray()
        async with (
            upstream_client(master.chat_source, master.catalog.values) as upstream,
            upstream.stream("POST", CHAT, json=chat_body(TOKENS)) as answer,
        ):
            assert answer.headers["content-type"] == "text/event-stream"
            async for piece in answer.aiter_bytes():
                arrived.append(anyio.current_time())
                received += piece
        assert outcome_of(answer.status_code, bytes(received), TOKENS) == "ok"
        # One piece per chunk as it came, over the answer's time: not the whole at its end.
        assert len(arrived) >= TOKENS
        assert arrived[-1] - arrived[0] >= (TOKENS - 1) / DEFAULT_TOKENS_PER_S


@pytest.mark.anyio
async def test_a_chat_is_held_until_its_deployment_serves_and_counted_held() -> None:
    async with master_with_a_node(MasterConfig(startup_grace_s=5.0)) as (master, client):
        created = await master.create_deployment(QWEN)  # placed after the grace, then loaded
        assert master.model_deployment(QWEN) is not None
        sent_at = anyio.current_time()
        answer = await client.post(CHAT, json=chat_body(TOKENS))
        assert outcome_of(answer.status_code, answer.content, TOKENS) == "ok"
        assert anyio.current_time() - sent_at >= 5.0  # it waited out the grace
        deployment = created.deployment_id
        assert deployment is not None
        samples = await scrape(client)
        assert value(samples, "exo_deploy_requests_total", deployment=deployment, outcome="held")
        (view,) = (await client.get("/deployments")).json()["deployments"]
        assert view["requests"]["outcomes"] == {"held": 1}
        assert view["requests"]["errors"] == 0


@pytest.mark.anyio
async def test_a_chat_whose_deployment_does_not_serve_in_the_hold_is_a_503() -> None:
    config = MasterConfig(startup_grace_s=0.0, front_door=FrontDoorConfig(hold_s=4.0))
    async with master_with_a_node(config, nodes=0) as (master, client):
        await master.create_deployment(QWEN)  # no node: nothing will serve it
        answer = await client.post(CHAT, json=chat_body(TOKENS))
        assert answer.status_code == 503
        assert answer.headers["retry-after"] == "5"
        message = answer.json()["error"]["message"]
        assert QWEN in message and "not serving" in message and "--hold-s 4" in message


@pytest.mark.anyio
async def test_the_models_through_the_door_are_the_master_s_catalog() -> None:
    async with master_with_a_node(MasterConfig(), nodes=0) as (master, client):
        listed = await client.get("/v1/models")
        assert listed.status_code == 200
        assert listed.json() == (await client.get("/models")).json()
        assert {model["id"] for model in listed.json()["data"]} == set(master.catalog)


@pytest.mark.anyio
async def test_exo_s_cancel_ends_a_streamed_chat_on_its_node_and_its_answer_just_ends() -> None:
    async with master_with_a_node(MasterConfig(startup_grace_s=0.0)) as (master, _):
        await master.create_deployment(QWEN)
        await wait_until(lambda: bool(master.ready_instances(QWEN)), 60, "serving")
        ((instance, _),) = master.ready_instances(QWEN)
        received = bytearray()
        async with (
            upstream_client(master.chat_source, master.catalog.values) as upstream,
            upstream.stream("POST", CHAT, json=chat_body(TOKENS)) as answer,
        ):
            pieces = answer.aiter_bytes()
            while not any('"content"' in event for event in sse_data(bytes(received))):
                received += await anext(pieces)
            (chunk_id,) = {json.loads(event)["id"] for event in sse_data(bytes(received))}
            assert master.chats_in_flight(instance) == 1
            cancelled = await upstream.post(f"/v1/cancel/{chunk_id}")
            assert cancelled.json() == {"message": "Command cancelled.", "command_id": chunk_id}
            assert master.chats_in_flight(instance) == 0  # ended on its node, its answer open
            async for piece in pieces:
                received += piece
            again = await upstream.post(f"/v1/cancel/{chunk_id}")
        assert outcome_of(answer.status_code, bytes(received), TOKENS) == "cut"  # as exo's
        assert again.status_code == 404
        assert "not found or already completed" in again.json()["error"]["message"]


@pytest.mark.anyio
async def test_chats_the_master_refuses_before_its_routing_are_counted_rejected() -> None:
    async with master_with_a_node(MasterConfig(), nodes=0) as (_, client):
        # The door's own 400, and the app's guard's 415 before the door's route runs.
        empty = await client.post(CHAT, json={"model": QWEN, "messages": []})
        assert empty.status_code == 400
        not_json = await client.post(CHAT, content=b"hi", headers={"content-type": "text/plain"})
        assert not_json.status_code == 415
        samples = await scrape(client)
        assert value(samples, "exo_deploy_requests_total", deployment="", outcome="rejected") == 2
