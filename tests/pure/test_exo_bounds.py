"""The bounds on what the bridge parses of exo's answers (``keeper.bridge.exo_bounds``).

The depth scan must agree with the depth of the parsed JSON on every value (hypothesis draws
values whose strings are full of brackets, quotes and backslashes, the characters the scan
must see through), on exo's recorded answers, and never let a body past that a parser would
recurse too deeply into, closed or not.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from recorded_exo import RECORDINGS

from keeper.bridge.exo_bounds import (
    MAX_DEPTH,
    STATE_MAX_BYTES,
    OverBoundsError,
    nesting_depth,
    parse_json,
    too_large,
)


def depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth(item) for item in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(item) for item in value), default=0)
    return 0


# Strings made of what could fool a scan: brackets, quotes, backslashes, and a letter or two.
tricky = st.text(alphabet='[]{}"\\ab\n\u00e9', max_size=8)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(tricky, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=500, deadline=None)
@given(values, st.booleans(), st.sampled_from([None, 0, 2]))
def test_the_depth_is_the_parsed_json_s_whatever_its_strings_hold(
    value: Any, ascii_only: bool, indent: int | None
) -> None:
    body = json.dumps(value, ensure_ascii=ascii_only, indent=indent).encode()
    assert nesting_depth(body) == depth(value)


@pytest.mark.parametrize("path", sorted(RECORDINGS.glob("*.json")), ids=lambda path: path.stem)
def test_exo_s_recorded_answers_are_read_as_they_parse(path: Any) -> None:
    body = path.read_bytes()
    assert len(body) < STATE_MAX_BYTES
    assert nesting_depth(body) == depth(json.loads(body)) <= 13  # MAX_DEPTH's reason
    assert parse_json(body, "exo's answer") == json.loads(body)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"", 0),
        (b"42", 0),
        (b'"[[[{{"', 0),
        (b'["\\"[", "]"]', 1),  # an escaped quote does not end the string
        (b'["\\\\", [[]]]', 3),  # an escaped backslash does not escape the quote after it
        (b'[{"a": [1, {"b": []}]}]', 5),
        (b"[" * 100, 100),  # never closed: a parser goes 100 deep before it finds out
        (b'["' + b"[" * 100, 1),  # a string that never ends holds what follows it
        (b"]]][", 0),  # a parser stops at the first "]"
    ],
)
def test_the_depth_of_bodies_that_could_fool_it(body: bytes, expected: int) -> None:
    assert nesting_depth(body) == expected


def test_a_body_nested_100_000_deep_is_refused_before_the_parser_sees_it() -> None:
    deep = b'{"instances": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(OverBoundsError, match=r"^exo's /state is nested deeper than 64 levels$"):
        parse_json(deep, "exo's /state")
    with pytest.raises(RecursionError):
        json.loads(deep)  # what the scan stands in front of
    with pytest.raises(OverBoundsError):
        parse_json(b"[" * 100_000, "exo's /state")  # unclosed: the parser would still recurse


def test_exactly_max_depth_parses_and_one_more_does_not() -> None:
    at_most = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert parse_json(at_most, "exo's answer") is not None
    with pytest.raises(OverBoundsError):
        parse_json(b"[" + at_most + b"]", "exo's answer")


def test_what_is_not_json_is_a_plain_value_error() -> None:
    with pytest.raises(ValueError, match=r"^exo's answer is not JSON$") as raised:
        parse_json(b"<html>", "exo's answer")
    assert not isinstance(raised.value, OverBoundsError)


def test_too_large_says_the_size_when_exo_said_it_and_the_cap_in_mib() -> None:
    assert (
        too_large("exo's /state", STATE_MAX_BYTES, 31_400_000)
        == "exo's /state is 31.4 MB, over the 16 MiB the bridge reads"
    )
    assert (
        too_large("exo's /models", 4 * 2**20) == "exo's /models is over the 4 MiB the bridge reads"
    )
