"""A long answer is waited for, not cut (docs/design.md §8.6): exo sends a non-streamed chat's
head only with the whole answer, so the head of such a chat has the answer's bound, not the
stream's 10 s; and a chat request carries no read deadline of the exo client's own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest
from front_door_harness import CHAT, chat, chats_sent, counted, serving

from keeper.runtime.front_door_upstream import CHAT_HTTP_TIMEOUT, HEAD_TIMEOUT_S

# Longer than a stream's head may take, far shorter than a whole answer's bound.
LONG_ANSWER_S = HEAD_TIMEOUT_S + 5.0


def answered_after(seconds: float) -> Callable[..., Awaitable[httpx.Response]]:
    """exo answering a non-streamed chat whole after ``seconds`` (a long answer)."""

    async def script(_: dict[str, Any], real: Callable[[], Awaitable[httpx.Response]]) -> Any:
        await anyio.sleep(seconds)
        return await real()

    return script


@pytest.mark.anyio
async def test_a_non_streamed_answer_longer_than_a_heads_bound_is_passed_on() -> None:
    async with serving() as (h, api):
        h.link.chat_scripts.append(answered_after(LONG_ANSWER_S))
        answer = await api.post(CHAT, json=chat(stream=False), timeout=None)
        assert answer.status_code == 200
        assert answer.json()["choices"][0]["message"]["content"]
        assert len(chats_sent(h)) == 1  # sent once: not taken for an exo that does not answer
        assert counted(h, "ok") == 1


def test_a_chat_request_reads_with_no_deadline_of_the_exo_clients() -> None:
    # The door's own bounds govern reading (the head, a stream's silence, the whole answer);
    # connecting and sending keep the head's.
    assert CHAT_HTTP_TIMEOUT.read is None
    assert CHAT_HTTP_TIMEOUT.connect == HEAD_TIMEOUT_S
