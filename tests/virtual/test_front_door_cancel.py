"""A client that leaves mid-answer cancels the chat on exo (docs/design.md §8.6), in virtual time:
the front door sends exo's ``POST /v1/cancel/{command_id}`` (the id on the attempt's chunks) to
the exo URL the attempt used, and counts the chat ``cancelled``; the stand-in cancels a streamed
chat so, as exo does: its answer just ends and the chat leaves its instance."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, wait_until
from front_door_harness import Streamed, chat, counted, serving, stream_chat
from model_ids import QWEN

from keeper.bridge.api import create_bridge_app
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.node.sim_node import reply_tokens

COMMAND = "4c7a3f4e-exo-command"  # exo's id of the chat (its chunks' id)


def exo_still_writing(tokens: int) -> Callable[..., Awaitable[httpx.Response]]:
    """exo's stream of a chat it is still generating: ``tokens`` chunks under COMMAND, then
    nothing more for as long as it is read (the model still at work)."""

    async def body() -> AsyncIterator[bytes]:
        yield b": keep-alive\n\n"
        for token in reply_tokens()[:tokens]:
            delta = {"role": "assistant", "content": token}
            chunk = {"id": COMMAND, "model": QWEN, "choices": [{"index": 0, "delta": delta}]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        await anyio.sleep_forever()

    async def script(_: dict[str, Any], __: Callable[[], Awaitable[httpx.Response]]) -> Any:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return script


@pytest.mark.anyio
async def test_a_client_leaving_mid_answer_cancels_the_chat_on_exo() -> None:
    async with serving() as (h, _):
        h.link.chat_scripts.append(exo_still_writing(5))
        answer = await stream_chat(create_bridge_app(h.bridge), chat(stream=True), leave_after=2)
        assert answer.status == 200 and not answer.ended
        assert [json.loads(e)["id"] for e in answer.events[:2]] == [COMMAND, COMMAND]
        cancels = [path for method, path, _ in h.link.calls if path.startswith("/v1/cancel/")]
        assert cancels == [f"/v1/cancel/{COMMAND}"]
        assert counted(h, "cancelled") == 1 and counted(h, "failed") == 0
        assert h.bridge.front_door.inflight == 0


@pytest.mark.anyio
async def test_a_chat_answered_whole_is_not_cancelled() -> None:
    async with serving() as (h, _):
        answer = await stream_chat(create_bridge_app(h.bridge), chat(stream=True))
        assert answer.ended and answer.events[-1] == "[DONE]"
        assert not [path for _, path, _ in h.link.calls if path.startswith("/v1/cancel/")]
        assert counted(h, "ok") == 1 and counted(h, "cancelled") == 0


@pytest.mark.anyio
async def test_the_stand_in_cancels_a_streamed_chat_as_exo_does() -> None:
    async with serving() as (h, _):
        (instance,) = h.exo_instances()
        exo = create_exo_compat_app(h.master)
        body = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        answer = Streamed()
        command = ""
        async with (
            httpx.AsyncClient(transport=httpx.ASGITransport(app=exo), base_url=EXO_URL) as api,
            anyio.create_task_group() as group,
        ):
            group.start_soon(stream_chat, exo, {**body, "max_tokens": 200}, None, answer)
            await wait_until(lambda: len(answer.events) >= 2, 10, "the answer begun")
            command = json.loads(answer.events[0])["id"]
            cancelled = await api.post(f"/v1/cancel/{command}")
            assert cancelled.status_code == 200
            assert cancelled.json() == {"message": "Command cancelled.", "command_id": command}
        # The answer just ended, as exo's does: no finish_reason, no [DONE]; and it left its
        # instance (the node was told to stop).
        assert answer.ended and "[DONE]" not in answer.events
        assert not any(json.loads(e)["choices"][0].get("finish_reason") for e in answer.events)
        assert len(answer.events) < 200
        await wait_until(lambda: h.master.chats_in_flight(instance) == 0, 5, "the chat ended")
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=exo)) as api:
            again = await api.post(f"{EXO_URL}/v1/cancel/{command}")
        assert again.status_code == 404
        assert again.json()["error"]["message"] == "Command not found or already completed"
