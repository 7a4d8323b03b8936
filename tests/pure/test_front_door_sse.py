"""exo's SSE bytes into events (keeper.runtime.front_door_sse): the same events however the
bytes are split between reads, every line ending SSE has, a character split between reads,
and each way of stopping (not SSE, an event over its bound), with what came before it kept."""

from __future__ import annotations

import json
from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from keeper.runtime.front_door_sse import SseDecoder

CAP = 1024
CHUNK = {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "naïve — ok"}}]}
STREAM = (
    b": keep-alive\n\n"
    + f"data: {json.dumps(CHUNK, ensure_ascii=False)}\n\n".encode()
    + b'event: message\r\nid: 7\r\nretry: 10\r\ndata: {"a":\r\ndata:  1}\r\n\r\n'
    + b"data: [DONE]\r\r"
)
EVENTS: list[str | None] = [
    None,
    json.dumps(CHUNK, ensure_ascii=False),
    '{"a":\n 1}',
    "[DONE]",
]


def fed(decoder: SseDecoder, *reads: bytes) -> list[str | None]:
    events: list[str | None] = []
    for read in reads:
        events += decoder.feed(read)
    return events + decoder.end()


def test_a_stream_read_at_once() -> None:
    decoder = SseDecoder(CAP)
    assert fed(decoder, STREAM) == EVENTS
    assert decoder.trouble is None


def test_each_read_gives_the_events_it_completes() -> None:
    decoder = SseDecoder(CAP)
    assert decoder.feed(b"data: 1\n\ndata: 2\n") == ["1"]
    assert decoder.feed(b"\ndata: 3") == ["2"]
    assert decoder.feed(b"\n\n") == ["3"]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=8))
def test_the_same_events_however_the_bytes_are_split(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    reads = [STREAM[a:b] for a, b in pairwise(points)]
    decoder = SseDecoder(CAP)
    assert fed(decoder, *reads) == EVENTS
    assert decoder.trouble is None


def test_a_crlf_split_between_reads_is_one_line_end() -> None:
    decoder = SseDecoder(CAP)
    # Were the \r taken for a line's end and the \n for a blank line, "a" would be an event
    # of its own, and "b" another.
    assert fed(decoder, b"data: a\r", b"\ndata: b\r\n\r\n") == ["a\nb"]


def test_an_event_without_its_blank_line_is_not_one() -> None:
    assert fed(SseDecoder(CAP), b"data: 1\n\ndata: 2") == ["1"]


def test_a_line_that_is_not_sse_stops_the_stream_keeping_what_came_before() -> None:
    decoder = SseDecoder(CAP)
    assert decoder.feed(b"data: 1\n\n<html>\ndata: 2\n\n") == ["1"]
    assert decoder.trouble == "exo's stream is not SSE: '<html>'"
    assert decoder.feed(b"data: 3\n\n") == []
    assert decoder.end() == []


def test_a_last_line_unended_that_is_not_sse_is_trouble_too() -> None:
    decoder = SseDecoder(CAP)
    assert fed(decoder, b"Internal Server Error") == []
    assert decoder.trouble == "exo's stream is not SSE: 'Internal Server Error'"


def test_an_event_over_the_bound_in_one_unended_line() -> None:
    decoder = SseDecoder(2**20)
    assert decoder.feed(b"data: " + b"x" * 2**19) == []
    assert decoder.trouble is None
    assert decoder.feed(b"x" * 2**19) == []
    assert decoder.trouble == "an event of exo's stream is over 1 MiB"


def test_an_event_over_the_bound_in_many_lines() -> None:
    decoder = SseDecoder(2**20)
    line = b"data: " + b"x" * 1000 + b"\n"
    assert decoder.feed(line * 1000) == []
    assert decoder.trouble is None
    assert decoder.feed(line * 100 + b"\n") == []
    assert decoder.trouble == "an event of exo's stream is over 1 MiB"


def test_the_bound_is_of_one_event() -> None:
    decoder = SseDecoder(2**20)
    event = b"data: " + b"x" * 1000 + b"\n\n"
    assert len(decoder.feed(event * 2000)) == 2000
    assert decoder.trouble is None


def test_only_sse_s_line_ends_end_a_line() -> None:
    # Text may hold other Unicode line breaks (JSON written with ensure_ascii=False).
    assert fed(SseDecoder(CAP), "data: a\u2028b\x85c\x0cd\n\n".encode()) == ["a\u2028b\x85c\x0cd"]
