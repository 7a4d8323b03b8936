"""A chat exo keeps open on an instance that is gone (docs/design.md §8.6), through the bridge's
front door in virtual time on the stock-exo stand-in. When exo's master changes, its new State
has lost the instance; when a node dies, exo keeps its instances until its own timeout: either
way exo holds the chat's stream open with keep-alives (or a whole answer that never comes) and
nothing will answer it. The door cuts it once none of the instances it may be on is left and it
has brought no token for ``STRANDED_AFTER_S``, and sends it again: the client gets its answer,
counted ``retried``, never a hung request."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import ChatScript, sse_events, wait_until
from front_door_harness import CHAT, chat, chats_sent, counted, serving, text_of

from keeper.model.request_rule import STRANDED_AFTER_S
from keeper.sim.node.sim_node import reply_tokens

# exo writes a keep-alive comment on a waiting stream every 10 s.
EXO_KEEP_ALIVE_S = 10.0


class _KeptOpen(httpx.AsyncByteStream):
    """A chat's body as exo writes it for a chat nothing will answer: keep-alive comments on a
    stream, nothing at all for a whole answer, for ever."""

    def __init__(self, streamed: bool) -> None:
        self._streamed = streamed

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            if self._streamed:
                yield b": keep-alive\n\n"
            await anyio.sleep(EXO_KEEP_ALIVE_S)


def kept_open(streamed: bool) -> ChatScript:
    async def script(_: dict[str, Any], __: Callable[[], Awaitable[httpx.Response]]) -> Any:
        kind = "text/event-stream" if streamed else "application/json"
        return httpx.Response(200, headers={"content-type": kind}, stream=_KeptOpen(streamed))

    return script


@pytest.mark.anyio
@pytest.mark.parametrize("streamed", [True, False])
async def test_a_chat_on_an_instance_exo_lost_is_sent_again_and_answered(streamed: bool) -> None:
    async with serving() as (h, api):
        (first,) = h.exo_instances()
        h.link.chat_scripts.append(kept_open(streamed))
        answers: list[httpx.Response] = []

        async def ask() -> None:
            answers.append(await api.post(CHAT, json=chat(stream=streamed, max_tokens=40)))

        answered_s = -1.0
        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            await wait_until(lambda: len(chats_sent(h)) == 1, 10, "the chat sent to exo")
            lost_at = anyio.current_time()
            # exo loses the instance, and (as after its master changed) keeps the chat open.
            assert (await h.exo_api("DELETE", f"/instance/{first}")).status_code == 200
            await wait_until(lambda: bool(answers), 60, "the chat answered")
            answered_s = anyio.current_time() - lost_at
        (answer,) = answers
        assert answer.status_code == 200, answer.text
        whole = "".join(reply_tokens()[:40])
        if streamed:
            events = sse_events(answer.content)
            assert text_of(events) == whole and events[-1] == "[DONE]"
        else:
            assert answer.json()["choices"][0]["message"]["content"] == whole
        # Sent again, as it was (the client had nothing to continue), once it was stranded:
        # not before STRANDED_AFTER_S without a token, and well within the hold (30 s).
        sent = chats_sent(h)
        assert len(sent) >= 2 and all(body["messages"] == sent[0]["messages"] for body in sent)
        assert counted(h, "retried") == 1 and counted(h, "failed") == 0
        assert STRANDED_AFTER_S <= answered_s < STRANDED_AFTER_S + 2 * EXO_KEEP_ALIVE_S
        print(f"\nstranded ({'streamed' if streamed else 'whole'}): answered {answered_s:.1f} s")


@pytest.mark.anyio
async def test_a_chat_whose_instances_are_all_there_is_never_taken_for_stranded() -> None:
    # exo takes its time (a long prompt, a busy instance): keep-alives only, for a minute, on
    # an instance that is still there. The door waits for it (its bound is the stream's
    # silence, 30 s without a byte), and never sends it again.
    async with serving() as (h, api):
        answered: list[httpx.Response] = []

        async def slow(body: dict[str, Any], real: Callable[[], Awaitable[httpx.Response]]) -> Any:
            answer = await real()
            content = answer.content

            class Late(httpx.AsyncByteStream):
                async def __aiter__(self) -> AsyncIterator[bytes]:
                    for _ in range(6):
                        yield b": keep-alive\n\n"
                        await anyio.sleep(EXO_KEEP_ALIVE_S)
                    yield content

            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Late())

        h.link.chat_scripts.append(slow)
        answered.append(await api.post(CHAT, json=chat(stream=True)))
        (answer,) = answered
        events = sse_events(answer.content)
        assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"]
        assert len(chats_sent(h)) == 1 and counted(h, "ok") == 1
