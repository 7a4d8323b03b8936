"""The bridge's front door (docs/design.md §8.6) in virtual time, on the stock-exo stand-in with
simulated nodes: chats answered through it, held while the deployment fails over, continued
when exo cuts them (only the new text sent, one [DONE]), ended with an error event when a
continuation cannot be exact, refused with 503 and Retry-After past the hold, and the bad
requests and bad answers each with its status. exo's ways of failing a chat (an empty 200, a
cut stream, a 404 for want of an instance, an answer that is not SSE) are scripted on the link
(``ExoLink.chat_scripts``); a failover is a real node frozen under a bridge with fast failover."""

from __future__ import annotations

import json

import anyio
import pytest
from bridge_harness import (
    bridge_api,
    cut_after,
    exo_answers,
    exo_with_bridge,
    no_instance,
    sse_events,
    wait_until,
)
from front_door_harness import ASK, CHAT, chat, chats_sent, counted, serving, text_of
from model_ids import QWEN

from keeper.bridge.service import BridgeConfig
from keeper.model.liveness import LivenessConfig
from keeper.model.request_window import MIN_RATE_SPAN_S, WINDOW_S
from keeper.runtime.front_door import FrontDoorConfig
from keeper.sim.node.sim_node import reply_tokens


@pytest.mark.anyio
async def test_a_chat_through_the_front_door_streamed_and_not() -> None:
    async with serving() as (h, api):
        answer = await api.post(CHAT, json=chat(stream=False))
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["choices"][0]["finish_reason"] and body["choices"][0]["message"]["content"]

        streamed = await api.post(CHAT, json=chat(stream=True))
        assert streamed.status_code == 200
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = sse_events(streamed.content)
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        assert text_of(events)
        assert json.loads(events[-2])["choices"][0]["finish_reason"] is not None
        assert counted(h, "ok") == 2
        (view,) = h.bridge.deployments_view().deployments
        assert view.requests is not None and view.requests.errors == 0
        # over the time the bridge has counted (it started seconds ago), not five minutes
        assert MIN_RATE_SPAN_S <= view.requests.window_s < WINDOW_S
        assert view.requests.rate == pytest.approx(2 / view.requests.window_s)
        metrics = (await api.get("/metrics")).text
        assert 'exo_deploy_requests_total{deployment="' in metrics
        assert "exo_deploy_request_ttft_seconds_bucket" in metrics


@pytest.mark.anyio
async def test_v1_models_is_exos_list() -> None:
    async with exo_with_bridge() as h, bridge_api(h.bridge) as api:
        answer = await api.get("/v1/models")
        assert answer.status_code == 200
        assert QWEN in answer.text


@pytest.mark.anyio
async def test_a_cut_stream_is_continued_with_only_the_new_text() -> None:
    async with serving() as (h, api):
        h.link.chat_scripts.append(cut_after(3))
        answer = await api.post(CHAT, json=chat(stream=True))
        assert answer.status_code == 200
        events = sse_events(answer.content)
        assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
        first, second = chats_sent(h)
        assert first["messages"] == ASK
        # The continuation carries the text the client already has, as the assistant's.
        before_cut = text_of(events[:3])
        assert before_cut
        assert second["messages"] == [*ASK, {"role": "assistant", "content": before_cut}]
        assert second["max_tokens"] == 8 - 3  # what is left of the client's limit
        # The client got the text before the cut once, then the continuation's text only: the
        # node continues from the assistant's text, as exo does, so the answer reads whole, and
        # as long as the client asked.
        assert text_of(events) == "".join(reply_tokens()[:8])
        ids = {json.loads(event)["id"] for event in events if event != "[DONE]"}
        assert len(ids) == 1  # one completion, though exo answered two
        assert counted(h, "migrated") == 1


@pytest.mark.anyio
async def test_an_empty_200_is_sent_again() -> None:
    async with serving() as (h, api):
        h.link.chat_scripts.append(exo_answers(200, b""))
        answer = await api.post(CHAT, json=chat(stream=False))
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"]
        assert len(chats_sent(h)) == 2
        assert counted(h, "retried") == 1


@pytest.mark.anyio
async def test_a_cut_after_tool_calls_ends_with_an_error_event() -> None:
    tool_call = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": QWEN,
        "choices": [
            {
                "index": 0,
                "delta": {
                    "role": "assistant",
                    "tool_calls": [
                        {"id": "t1", "index": 0, "function": {"name": "f", "arguments": "{"}}
                    ],
                },
                "finish_reason": None,
            }
        ],
    }
    cut = f"data: {json.dumps(tool_call)}\n\n".encode()
    async with serving() as (h, api):
        h.link.chat_scripts.append(exo_answers(200, cut, "text/event-stream"))
        answer = await api.post(CHAT, json=chat(stream=True))
        assert answer.status_code == 200
        events = sse_events(answer.content)
        assert "[DONE]" not in events
        error = json.loads(events[-1])["error"]
        assert "cannot be continued exactly (tool calls)" in error["message"]
        assert len(chats_sent(h)) == 1
        assert counted(h, "failed") == 1


@pytest.mark.anyio
async def test_no_instance_is_held_then_503_with_retry_after_past_the_hold() -> None:
    config = BridgeConfig(front_door=FrontDoorConfig(hold_s=4.0))
    async with serving(config) as (h, api):
        h.link.chat_scripts.extend(no_instance() for _ in range(100))
        started = anyio.current_time()
        answer = await api.post(CHAT, json=chat(stream=True))
        waited = anyio.current_time() - started
        assert answer.status_code == 503
        assert answer.headers["retry-after"].isdigit()
        message = answer.json()["error"]["message"]
        assert "not serving" in message and "--hold-s 4" in message
        assert 4.0 <= waited < 5.0
        assert len(chats_sent(h)) > 2  # sent again while held, the view saying serving
        assert counted(h, "failed") == 1


@pytest.mark.anyio
async def test_no_instance_then_an_instance_is_answered_held() -> None:
    async with serving() as (h, api):
        h.link.chat_scripts.extend([no_instance(), no_instance()])
        answer = await api.post(CHAT, json=chat(stream=False))
        assert answer.status_code == 200, answer.text
        assert len(chats_sent(h)) == 3
        assert counted(h, "retried") == 1


@pytest.mark.anyio
async def test_chats_sent_through_a_frozen_node_s_failover_are_all_answered() -> None:
    fast = BridgeConfig(liveness=LivenessConfig(3.0, 8.0))
    async with serving(fast) as (h, api):
        (first,) = h.exo_instances()
        holder = next(iter(h.master.state.instances[first].shard_assignments.node_to_runner))
        name = h.master.state.node_identities[holder].friendly_name
        h.nodes.freeze(name, 60.0)
        # Chats sent while the node is frozen and after: none fails, each answered whole.
        results: list[int] = []

        async def one() -> None:
            answer = await api.post(CHAT, json=chat(stream=True))
            events = sse_events(answer.content)
            results.append(answer.status_code if events[-1:] == ["[DONE]"] else -1)

        async with anyio.create_task_group() as group:
            for _ in range(5):
                group.start_soon(one)
                await anyio.sleep(2.0)
        await wait_until(lambda: first not in h.exo_instances(), 30, "the old one deleted")
        assert results == [200] * 5
        assert counted(h, "failed") == 0


@pytest.mark.anyio
async def test_chats_are_held_while_the_instance_is_placed_again() -> None:
    async with serving() as (h, api):
        (first,) = h.exo_instances()
        deleted = await h.exo_api("DELETE", f"/instance/{first}")  # exo loses the instance
        assert deleted.status_code == 200
        await wait_until(lambda: not h.exo_instances(), 5, "the instance gone from exo")
        statuses: list[int] = []

        async def one(stream: bool) -> None:
            answer = await api.post(CHAT, json=chat(stream=stream))
            statuses.append(answer.status_code)

        async with anyio.create_task_group() as group:
            for stream in (True, False, True):
                group.start_soon(one, stream)
        assert statuses == [200, 200, 200]
        assert h.exo_instances() and first not in h.exo_instances()
        held = sum(counted(h, outcome) for outcome in ("held", "retried"))
        print({o: counted(h, o) for o in ("ok", "held", "retried", "migrated", "failed")})
        assert held == 3 and counted(h, "failed") == 0


@pytest.mark.anyio
async def test_bad_requests_are_refused_naming_why() -> None:
    async with exo_with_bridge() as h, bridge_api(h.bridge) as api:
        big = await api.post(CHAT, content=b"{" + b" " * (1024 * 1024 + 1) + b"}", headers=JSON)
        assert big.status_code == 413
        broken = await api.post(CHAT, content=b'{"model": ', headers=JSON)
        assert broken.status_code == 400 and "JSON" in broken.json()["error"]["message"]
        no_model = await api.post(CHAT, json={"messages": ASK})
        assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"
        no_messages = await api.post(CHAT, json={"model": QWEN})
        assert no_messages.json()["error"]["param"] == "messages"


@pytest.mark.anyio
async def test_exo_answering_garbage_is_a_502_naming_it() -> None:
    async with serving() as (h, api):
        h.link.chat_scripts.append(exo_answers(200, b"<html>hi</html>", "text/html"))
        answer = await api.post(CHAT, json=chat(stream=True))
        assert answer.status_code == 502
        assert "exo answered text/html" in answer.json()["error"]["message"]
        h.link.chat_scripts.append(exo_answers(200, b"<html>hi</html>", "application/json"))
        whole = await api.post(CHAT, json=chat(stream=False))
        assert whole.status_code == 502 and "not JSON" in whole.json()["error"]["message"]


@pytest.mark.anyio
async def test_past_max_inflight_a_chat_is_a_429_with_retry_after() -> None:
    config = BridgeConfig(front_door=FrontDoorConfig(max_inflight=2, hold_s=10.0))
    async with serving(config) as (h, api):
        h.link.chat_scripts.extend(no_instance() for _ in range(1000))
        async with anyio.create_task_group() as group:

            async def held() -> None:
                await api.post(CHAT, json=chat(stream=True))

            for _ in range(2):
                group.start_soon(held)
            await wait_until(lambda: h.bridge.front_door.inflight == 2, 5, "two chats held")
            refused = await api.post(CHAT, json=chat(stream=True))
            assert refused.status_code == 429
            assert refused.headers["retry-after"].isdigit()
            assert "--max-inflight 2" in refused.json()["error"]["message"]
        assert h.bridge.front_door.inflight == 0


JSON = {"content-type": "application/json"}
