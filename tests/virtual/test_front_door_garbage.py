"""exo answering garbage through the bridge's front door (docs/design.md §8.6), in virtual time:
a 502 naming what was wrong (or, after the first token, an error event naming it), never a
traceback; and in the service's log one line per kind of failure at most once a minute, with
how many more came, not a line a chat."""

from __future__ import annotations

import json
import logging

import anyio
import pytest
from bridge_harness import exo_answers, sse_events
from front_door_harness import CHAT, chat, counted, serving
from model_ids import QWEN

SSE = "text/event-stream"
LOGGER = "keeper.runtime.front_door_failures"


def failure_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER]


@pytest.mark.anyio
async def test_each_kind_of_garbage_is_a_502_naming_it(caplog: pytest.LogCaptureFixture) -> None:
    good = {"id": "c1", "model": QWEN, "choices": [{"index": 0, "delta": {"content": "Hi"}}]}
    cases = [
        # (exo's body, its content type, streamed, what the client is told)
        (b"<html>hi</html>", "text/html", True, "a stream was asked, exo answered text/html"),
        (b"<html>hi</html>\n\n", SSE, True, "exo's stream is not SSE: '<html>hi</html>'"),
        (b"data: {oops\n\n", SSE, True, "not JSON: '{oops'"),
        (b"data: [1, 2]\n\n", SSE, True, "not a JSON object: '[1, 2]'"),
        (b"[1, 2]", "application/json", False, "not a JSON object: '[1, 2]'"),
        (b"\xff\xfe<html>", "application/json", False, "not JSON: "),
    ]
    async with serving() as (h, api):
        for body, kind, streamed, words in cases:
            h.link.chat_scripts.append(exo_answers(200, body, kind))
            answer = await api.post(CHAT, json=chat(stream=streamed))
            assert answer.status_code == 502, (body, answer.text)
            message = answer.json()["error"]["message"]
            assert message.startswith("exo's answer cannot be read: ") and words in message
        # After the first token, the status is sent: the stream ends with an error event.
        cut = f"data: {json.dumps(good)}\n\ndata: {{oops\n\n".encode()
        h.link.chat_scripts.append(exo_answers(200, cut, SSE))
        answer = await api.post(CHAT, json=chat(stream=True))
        assert answer.status_code == 200
        events = sse_events(answer.content)
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "Hi"
        assert "[DONE]" not in events
        assert "not JSON: '{oops'" in json.loads(events[-1])["error"]["message"]
        assert counted(h, "failed") == len(cases) + 1
    lines = failure_lines(caplog)
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "exo's answer cannot be read" in lines[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # never a traceback


@pytest.mark.anyio
async def test_garbage_is_logged_once_a_minute_with_how_many_came(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with serving() as (h, api):
        for _ in range(3):
            h.link.chat_scripts.append(exo_answers(200, b"<html>", "text/html"))
            assert (await api.post(CHAT, json=chat(stream=True))).status_code == 502
        assert len(failure_lines(caplog)) == 1
        await anyio.sleep(61.0)
        h.link.chat_scripts.append(exo_answers(200, b"<html>", "text/html"))
        assert (await api.post(CHAT, json=chat(stream=True))).status_code == 502
        first, second = failure_lines(caplog)
        assert "more chats failed" not in first.getMessage()
        assert "(2 more chats failed so since the last such line)" in second.getMessage()
