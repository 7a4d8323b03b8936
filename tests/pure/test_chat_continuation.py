"""A chat's chunks read and a cut chat continued (``keeper.model.chat_continuation``,
docs/design.md §8.6): what a chunk brings, the continued request, the first attempt's id on a
continuation's chunks, and the one ``usage`` the client gets for the whole answer."""

from __future__ import annotations

from typing import Any

from keeper.model.chat_continuation import (
    as_one_completion,
    client_usage,
    continued_usage,
    finish_reason,
    read_chunk,
    with_continuation,
)

ASK = [{"role": "user", "content": "hello"}]


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "c1", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def usage(prompt: int, completion: int, **extra: Any) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        **extra,
    }


def test_a_chunk_s_text_id_and_end_are_read() -> None:
    reading = read_chunk(chunk({"role": "assistant", "content": " world"}))
    assert (reading.completion_id, reading.texts, reading.inexact, reading.finished) == (
        "c1",
        (" world",),
        None,
        False,
    )
    assert read_chunk(chunk({}, "stop")).finished
    assert read_chunk({"choices": "none"}) == read_chunk({})
    assert read_chunk({"id": 7}).completion_id is None


def test_what_makes_a_continuation_inexact_is_named() -> None:
    tool = chunk({"tool_calls": [{"index": 0}]})
    assert read_chunk(tool).inexact == "tool calls"
    assert read_chunk(chunk({"reasoning_content": "hm"})).inexact == "reasoning"
    plain: dict[str, Any] = {"choices": [{"delta": {"content": "a"}, "logprobs": None}]}
    assert read_chunk(plain).inexact is None
    plain["choices"][0]["logprobs"] = {"content": [{"token": "a"}]}
    assert read_chunk(plain).inexact == "logprobs"


def test_a_continuation_carries_the_text_as_the_assistant_s_and_what_is_left() -> None:
    body = {"model": "m", "messages": ASK, "max_tokens": 8, "max_completion_tokens": 2}
    continued = with_continuation(body, ["Hi", " there", " you"])
    assert continued["messages"] == [*ASK, {"role": "assistant", "content": "Hi there you"}]
    assert (continued["max_tokens"], continued["max_completion_tokens"]) == (5, 1)
    assert body["messages"] == ASK  # the client's own body untouched
    assert with_continuation(body, []) is body
    assert with_continuation({**body, "max_tokens": True}, ["a"])["max_tokens"] is True


def test_a_continuation_s_chunks_carry_the_first_attempt_s_id() -> None:
    assert as_one_completion({"id": "c2", "x": 1}, "c1") == {"id": "c1", "x": 1}
    first = {"id": "c1"}
    assert as_one_completion(first, "c1") is first
    assert as_one_completion(first, None) is first
    assert finish_reason(chunk({}, "length")) and not finish_reason(chunk({}))


def test_a_continuation_s_usage_moves_the_carried_tokens_to_the_completion() -> None:
    # exo's prompt held the 5 tokens the client had; its completion was the last 3.
    assert continued_usage(usage(16, 3), 5) == usage(11, 8)
    assert continued_usage(usage(16, 3), 0) == usage(16, 3)
    assert continued_usage(usage(2, 3), 5) == usage(0, 5)  # never below nothing
    cached = usage(16, 3, prompt_tokens_details={"cached_tokens": 14})
    assert continued_usage(cached, 5)["prompt_tokens_details"] == {"cached_tokens": 11}
    kept = usage(16, 3, prompt_tokens_details={"cached_tokens": 4})
    assert continued_usage(kept, 5)["prompt_tokens_details"] == {"cached_tokens": 4}
    odd = {"prompt_tokens": "16", "completion_tokens": 3}
    assert continued_usage(odd, 5) == odd


def test_the_client_gets_one_usage_at_the_end() -> None:
    early = chunk({"content": "a"}, usage=usage(16, 1))
    assert "usage" not in client_usage(early, at_end=False, carried=0, sent=False)
    last = chunk({}, "stop", usage=usage(16, 3))
    assert client_usage(last, at_end=True, carried=5, sent=False)["usage"] == usage(11, 8)
    assert client_usage(last, at_end=True, carried=0, sent=False) == last
    assert "usage" not in client_usage(last, at_end=True, carried=5, sent=True)
    none = chunk({"content": "a"}, usage=None)
    assert client_usage(none, at_end=False, carried=0, sent=False) is none
    garbled = chunk({}, "stop", usage=[1])
    assert "usage" not in client_usage(garbled, at_end=True, carried=0, sent=False)
