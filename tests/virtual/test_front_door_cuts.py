"""Chats exo cuts, through the bridge's front door (docs/design.md §8.6), in virtual time on the
stock-exo stand-in: a non-streamed chat whose instance is deleted under it (exo answers an empty
200) is sent again from scratch and answered whole, counted ``retried``; a streamed chat
continued after a cut gets one ``usage``, counting the first attempt's prompt and every
attempt's completion tokens."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import cut_after, sse_events, wait_until
from front_door_harness import ASK, CHAT, chat, chats_sent, counted, serving, text_of

from keeper.sim.node.sim_node import reply_tokens

# A prompt's tokens as the scripted exo counts them (any figure: what matters is that the
# continuation's prompt is this plus the text it carries, as exo's is).
PROMPT_TOKENS = 11


@pytest.mark.anyio
async def test_a_non_streamed_chat_whose_instance_is_deleted_is_sent_again_whole() -> None:
    async with serving() as (h, api):
        (first,) = h.exo_instances()
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await api.post(CHAT, json=chat(stream=False, max_tokens=40)))

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await wait_until(lambda: h.master.chats_in_flight(first) == 1, 10, "on the instance")
            # exo loses the instance mid-answer: it closes the chat with an empty 200.
            assert (await h.exo_api("DELETE", f"/instance/{first}")).status_code == 200
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        # One full answer, from an instance placed again, the chat sent again as it was.
        assert answer.json()["choices"][0]["message"]["content"] == "".join(reply_tokens()[:40])
        assert answer.json()["choices"][0]["finish_reason"]
        assert first not in h.exo_instances()
        # Every send was the client's chat as it came (the client had nothing to continue); the
        # ones between the cut and the new instance were exo's 404s, waited on.
        sent = [body["messages"] for body in chats_sent(h)]
        assert len(sent) >= 2 and all(messages == ASK for messages in sent)
        assert counted(h, "retried") == 1 and counted(h, "failed") == 0


def with_usage() -> Callable[[dict[str, Any], Callable[[], Awaitable[httpx.Response]]], Any]:
    """exo's answer with its ``usage`` on the chunk that ends it, as exo writes it: the prompt
    counts the text of a trailing assistant message (exo appends it to the prompt), the
    completion this answer's own chunks."""

    async def script(body: dict[str, Any], real: Callable[[], Awaitable[httpx.Response]]) -> Any:
        answer = await real()
        last = body["messages"][-1]
        carried = 0
        if last["role"] == "assistant":
            tokens = reply_tokens()
            carried = next(
                k for k in range(len(tokens) + 1) if "".join(tokens[:k]) == last["content"]
            )
        events = sse_events(answer.content)
        chunks = [json.loads(event) for event in events if event != "[DONE]"]
        completion = sum(1 for c in chunks if c["choices"][0]["delta"].get("content"))
        for c in chunks:
            if c["choices"][0].get("finish_reason"):
                c["usage"] = {
                    "prompt_tokens": PROMPT_TOKENS + carried,
                    "completion_tokens": completion,
                    "total_tokens": PROMPT_TOKENS + carried + completion,
                }
        content = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    return script


def usages(events: list[str]) -> list[dict[str, Any]]:
    return [json.loads(e)["usage"] for e in events if e != "[DONE]" and "usage" in json.loads(e)]


@pytest.mark.anyio
async def test_a_continued_chat_s_usage_counts_every_attempt_s_completion() -> None:
    async with serving() as (h, api):
        # Uncut, the client gets exo's usage as exo sent it.
        h.link.chat_scripts.append(with_usage())
        whole = await api.post(CHAT, json=chat(stream=True))
        assert usages(sse_events(whole.content)) == [
            {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 8, "total_tokens": 19}
        ]
        # Cut after three tokens, then again after two more: the client got 3 + 2 + 3 tokens
        # from three attempts, and one usage, for the whole answer.
        h.link.chat_scripts.extend([cut_after(3), cut_after(2), with_usage()])
        answer = await api.post(CHAT, json=chat(stream=True))
        events = sse_events(answer.content)
        assert text_of(events) == "".join(reply_tokens()[:8])
        assert events.count("[DONE]") == 1
        assert usages(events) == [
            {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": 8, "total_tokens": 19}
        ]
        assert counted(h, "migrated") == 1
