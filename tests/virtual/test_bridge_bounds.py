"""The bridge reads no more of exo than it can use (``keeper.bridge.exo_bounds``).

exo's answers are made to be what no real exo sends: nested 100,000 deep, or 30 MB streamed in
chunks the test counts as they are taken. exo's State is then unreadable, with the reason in
words, was not read past its cap, and nothing is acted on while the bridge keeps running (the
``--exo-compat`` stand-in, ``tests/bridge_harness.py``, in virtual time); every other answer is
unreadable by its own rule, and no answer raises anything but the client's own errors
(``httpx.MockTransport`` standing in for exo).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, ExoWithBridge, bridge_api, exo_with_bridge, wait_until
from model_ids import QWEN

from keeper.bridge.exo_client import ExoClient, ExoRefusedError, ExoUnavailableError
from keeper.bridge.service import STATE_UNREADABLE
from keeper.model.constants import PLACEMENT_TIMEOUT

CHUNK = 64 * 1024  # what the streaming stand-in sends at a time
CAP = 16 * 2**20  # the most of exo's /state the bridge reads (exo_client.STATE_MAX_BYTES)
UNREADABLE_DETAIL = r"exo state unreadable since \d\d:\d\d:\d\d: "


class Drip(httpx.AsyncByteStream):
    """A body of ``total`` bytes, made one chunk at a time as it is read, counting what was
    taken: what a reader kept in memory is at most that."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        prefix = b'{"instances": {}, "padding": "'
        while self.sent < self.total:
            size = min(CHUNK, self.total - self.sent)
            chunk = prefix[:size] if self.sent == 0 else b"x" * size
            self.sent += len(chunk)
            yield chunk


def nested(depth: int) -> bytes:
    return b'{"instances": ' + b"[" * depth + b"]" * depth + b"}"


async def assert_refused_and_kept_running(h: ExoWithBridge, first: str, reason: str) -> None:
    """The State is unreadable for ``reason``: /healthz says so, every deployment says so,
    nothing is placed over two placement timeouts, and the bridge keeps stepping."""
    await wait_until(lambda: h.bridge.outage is not None, 3, "the State refused")
    await h.master.delete_instance(first)  # exo lost it: only a State the bridge reads tells it
    await anyio.sleep(2 * PLACEMENT_TIMEOUT)
    assert h.bridge.running
    async with bridge_api(h.bridge) as api:
        response = await api.get("/healthz")
        deployments = (await api.get("/deployments")).json()["deployments"]
    health = response.json()
    assert health["exo"]["outage"] == STATE_UNREADABLE
    assert health["exo"]["reachable"] is True and health["exo"]["state_readable"] is False
    assert reason in health["exo"]["reason"], health["exo"]["reason"]
    assert health["step"] == {"ok": True, "failing_since": None, "error": None}
    (view,) = deployments
    assert re.match(UNREADABLE_DETAIL + ".*" + re.escape(reason), view["detail"]), view["detail"]
    assert h.link.posted_instances() == [first]


@pytest.mark.anyio
async def test_a_state_nested_100_000_deep_is_unreadable_and_the_bridge_keeps_running() -> None:
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        h.link.state_answer = (200, nested(100_000))
        await assert_refused_and_kept_running(h, first, "nested deeper than 64 levels")

        h.link.state_answer = None  # the next good read brings everything back by itself
        await wait_until(lambda: len(h.exo_instances()) == 1, 10, "placed again")
        await wait_until(
            lambda: h.serving() and h.bridge.deployments_view().deployments[0].detail is None,
            10,
            "serving again, with nothing more to say",
        )
        assert len(h.link.posted_instances()) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("says_its_length", [True, False], ids=["content-length", "chunked"])
async def test_a_30_mb_state_is_unreadable_and_read_no_further_than_the_cap(
    says_its_length: bool,
) -> None:
    streams: list[Drip] = []

    def answer() -> httpx.Response:
        stream = Drip(30_000_000)
        streams.append(stream)
        headers = {"Content-Length": str(stream.total)} if says_its_length else {}
        return httpx.Response(200, headers=headers, stream=stream)

    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        h.link.state_response = answer
        reason = (
            "exo's /state is 30.0 MB, over the 16 MiB the bridge reads"
            if says_its_length
            else "exo's /state is over the 16 MiB the bridge reads"
        )
        await assert_refused_and_kept_running(h, first, reason)
        assert len(streams) >= 2 * PLACEMENT_TIMEOUT  # read every second, each time refused
        # Each read stopped at the cap: a length said up front is not read at all.
        most = 0 if says_its_length else CAP + CHUNK
        assert max(stream.sent for stream in streams) <= most


# --- every other answer, read within bounds too ------------------------------------------------


def exo_answering(status: int, stream: httpx.AsyncByteStream) -> ExoClient:
    """An exo answering every request with ``status`` and ``stream`` (no length said)."""
    return ExoClient(
        EXO_URL, transport=httpx.MockTransport(lambda _: httpx.Response(status, stream=stream))
    )


@pytest.mark.anyio
async def test_an_over_large_model_list_is_unavailable_and_read_no_further_than_its_cap() -> None:
    stream = Drip(30_000_000)
    with pytest.raises(ExoUnavailableError) as raised:
        await exo_answering(200, stream).models()
    assert str(raised.value) == "GET /models: exo's /models is over the 4 MiB the bridge reads"
    assert stream.sent <= 4 * 2**20 + CHUNK


@pytest.mark.anyio
async def test_over_large_or_deep_placement_answers_are_unreadable_not_a_crash() -> None:
    stream = Drip(30_000_000)
    with pytest.raises(ValueError, match="exo's /instance/previews is over the 4 MiB"):
        await exo_answering(200, stream).previews(QWEN)
    assert stream.sent <= 4 * 2**20 + CHUNK
    deep = httpx.ByteStream(nested(100_000))
    with pytest.raises(ValueError, match="exo's /instance/placement is nested deeper than 64"):
        await exo_answering(200, deep).placement(QWEN, "Pipeline", "MlxRing", 1)


@pytest.mark.anyio
async def test_a_command_s_over_large_answer_is_taken_as_empty_and_not_read_whole() -> None:
    stream = Drip(30_000_000)
    assert await exo_answering(200, stream).create_instance({"instance": {}}) == {}
    assert stream.sent <= 2**20 + CHUNK
    assert await exo_answering(200, httpx.ByteStream(nested(100_000))).create_instance({}) == {}


@pytest.mark.anyio
async def test_error_answers_too_large_or_deep_still_give_a_reason_and_no_crash() -> None:
    stream = Drip(30_000_000)
    with pytest.raises(ExoRefusedError) as refused:
        await exo_answering(400, stream).create_instance({"instance": {}})
    assert refused.value.message.startswith('{"instances": {}, "padding": "xxx')
    assert stream.sent <= 2**20 + CHUNK
    with pytest.raises(ExoUnavailableError, match=r"GET /state: exo answered HTTP 500: \{"):
        await exo_answering(500, httpx.ByteStream(nested(100_000))).state()
