"""The stand-in (``master --exo-compat``) routes and ends chats as a stock exo does
(docs/design.md §7.5), straight on its API with simulated nodes in virtual time: a chat goes to
an instance that is not ready and waits for it; a deleted instance's chats end with neither a
result nor an error (a streamed one with no finish_reason and no [DONE], a non-streamed one as an
empty 200); a chat whose last message is the assistant's is continued from its text; a model with
no instance is exo's 404."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import ExoWithBridge, exo_with_bridge, sse_events, wait_until
from model_ids import QWEN

from keeper.model.readiness import instance_is_ready
from keeper.model.state import RunnerRunning
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.node.sim_node import reply_tokens

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "hello"}]
PLACEMENT = {"sharding": "Pipeline", "instance_meta": "MlxRing", "min_nodes": "1"}
WHOLE = "".join(reply_tokens())


@asynccontextmanager
async def stand_in(
    stalled: bool = False,
) -> AsyncIterator[tuple[ExoWithBridge, httpx.AsyncClient]]:
    """One node ``a`` (its warm-up hung when ``stalled``, until healed) behind the stand-in's
    API, no deployment (the bridge beside it places nothing)."""
    faults: Any = {"a": "stall-warmup"} if stalled else None
    async with exo_with_bridge(nodes=(("a", 32.0),), faults=faults) as h:
        transport = httpx.ASGITransport(app=create_exo_compat_app(h.master))
        async with httpx.AsyncClient(transport=transport, base_url="http://exo") as exo:
            yield h, exo


async def place(exo: httpx.AsyncClient) -> str:
    """An instance of Qwen posted to the stand-in as exo's placement has it; its id."""
    placed = await exo.get("/instance/placement", params={"model_id": QWEN, **PLACEMENT})
    assert placed.status_code == 200, placed.text
    instance = placed.json()
    assert (await exo.post("/instance", json={"instance": instance})).status_code == 200
    return next(iter(instance.values()))["instanceId"]


def ready(h: ExoWithBridge, instance_id: str) -> bool:
    instance = h.master.state.instances.get(instance_id)
    return instance is not None and instance_is_ready(instance, h.master.state)


def text_of(events: list[str]) -> str:
    return "".join(
        choice["delta"].get("content") or ""
        for event in events
        if event != "[DONE]"
        for choice in json.loads(event)["choices"]
    )


@pytest.mark.anyio
async def test_a_chat_sent_to_an_instance_not_ready_waits_for_it() -> None:
    async with stand_in(stalled=True) as (h, exo):
        instance_id = await place(exo)
        await wait_until(lambda: instance_id in h.master.state.instances, 10, "it is applied")
        answers: list[httpx.Response] = []
        ready_when_answered: list[bool] = []

        async def ask() -> None:
            answers.append(await exo.post(CHAT, json={"model": QWEN, "messages": ASK}))
            ready_when_answered.append(ready(h, instance_id))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await wait_until(lambda: h.master.chats_in_flight(instance_id) == 1, 10, "sent")
            await anyio.wait_all_tasks_blocked()
            assert not answers and not ready(h, instance_id)  # held, not refused
            h.nodes.node("a").set_fault(None)  # the warm-up ends
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == WHOLE
        assert ready_when_answered == [True]


@pytest.mark.anyio
async def test_a_deleted_instance_s_chats_end_with_neither_result_nor_error() -> None:
    async with stand_in(stalled=True) as (h, exo):
        instance_id = await place(exo)
        await wait_until(lambda: instance_id in h.master.state.instances, 10, "it is applied")
        answers: dict[bool, httpx.Response] = {}

        async def ask(stream: bool) -> None:
            body = {"model": QWEN, "messages": ASK, "stream": stream}
            answers[stream] = await exo.post(CHAT, json=body)

        async with anyio.create_task_group() as group:
            for stream in (True, False):
                group.start_soon(ask, stream)
            await wait_until(lambda: h.master.chats_in_flight(instance_id) == 2, 10, "both sent")
            assert (await exo.delete(f"/instance/{instance_id}")).status_code == 200
        streamed, whole = answers[True], answers[False]
        assert streamed.status_code == 200
        assert streamed.text.startswith(": keep-alive")
        assert sse_events(streamed.content) == []  # no text, no finish_reason, no [DONE]
        assert (whole.status_code, whole.content) == (200, b"")


@pytest.mark.anyio
async def test_a_stream_whose_node_dies_hangs_until_exo_deletes_its_instance() -> None:
    async with stand_in() as (h, exo):
        instance_id = await place(exo)
        await wait_until(lambda: ready(h, instance_id), 60, "the instance ready")
        (node_id,) = h.master.state.topology.nodes
        answers: list[httpx.Response] = []
        deleted_when_answered: list[bool] = []

        async def ask() -> None:
            body = {"model": QWEN, "messages": ASK, "stream": True}
            answers.append(await exo.post(CHAT, json=body))
            deleted_when_answered.append(instance_id not in h.master.state.instances)

        def answering() -> bool:
            return any(isinstance(r, RunnerRunning) for r in h.master.state.runners.values())

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await wait_until(answering, 10, "the node answering")
            h.nodes.crash("a", 3600.0)
            # exo's master times the node out (30 s), then its sweep deletes the instance.
            await wait_until(lambda: node_id not in h.master.state.topology.nodes, 60, "gone")
            assert not answers  # the node is gone, the stream still open
        (answer,) = answers
        assert deleted_when_answered == [True]
        events = sse_events(answer.content)
        assert "[DONE]" not in events
        assert not any(json.loads(e)["choices"][0].get("finish_reason") for e in events)
        assert WHOLE.startswith(text_of(events)) and text_of(events) != WHOLE
        assert answer.text.count(": keep-alive") >= 2  # the first, and one while it hung


@pytest.mark.anyio
async def test_a_trailing_assistant_message_is_continued_from_its_text() -> None:
    async with stand_in() as (h, exo):
        instance_id = await place(exo)
        await wait_until(lambda: ready(h, instance_id), 60, "the instance ready")
        so_far = "".join(reply_tokens()[:5])
        messages = [*ASK, {"role": "assistant", "content": so_far}]
        answer = await exo.post(CHAT, json={"model": QWEN, "messages": messages})
        assert answer.status_code == 200, answer.text
        assert so_far + answer.json()["choices"][0]["message"]["content"] == WHOLE


@pytest.mark.anyio
async def test_no_instance_is_exo_s_404_at_once() -> None:
    async with stand_in() as (_, exo):
        started = anyio.current_time()
        answer = await exo.post(CHAT, json={"model": QWEN, "messages": ASK, "stream": True})
        assert anyio.current_time() == started
        assert answer.status_code == 404
        message = f"No instance found for model {QWEN}"
        assert answer.json() == {
            "error": {"message": message, "type": "Not Found", "param": None, "code": 404}
        }
