"""What a webhook answers cannot cost the service more than 64 KiB, and no log line names its
secret path or query (``keeper.runtime.webhooks``, docs/design.md §6.9): a receiver on a real
socket that answers a body far larger than that, a gzip bomb, a redirect; and the log of a
delivery that succeeds, fails and cannot connect, at DEBUG, once the service's logging is set up
(``keeper.runtime.service_logging``). Real time (asyncio), the backoff shortened."""

from __future__ import annotations

import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import free_port
from waiting import wait_until
from webhook_receiver import SECRET_PATH, SECRET_QUERY, Receiver, gzip_bomb

from keeper.model.api_models import WebhookEndpointHealth
from keeper.model.notices import DrainFinished
from keeper.runtime.outbox import endpoint_label
from keeper.runtime.service_logging import QUIET_LOGGERS, quiet_http_clients
from keeper.runtime.webhooks import MAX_ANSWER_BYTES, WebhookConfig, Webhooks, send_test

WITHIN_S = 20.0
# The answer the hostile receivers send: far past what may be read. 128 MiB is enough to show
# the difference (the whole of it read, or 64 KiB) in well under a second on loopback.
HOSTILE_BYTES = 128 * 1024 * 1024
# What may reach the kernel's buffers before the client's close is seen: loopback's send and
# receive buffers grow to a few MiB each (net.ipv4.tcp_wmem / tcp_rmem's maxima: 4 + 6 MiB).
IN_FLIGHT_BYTES = 24 * 1024 * 1024
# The Python memory one delivery of a bomb may take at its peak: the 64 KiB read, the request,
# httpx's buffers. Inflated, the bomb is 128 MiB.
PEAK_BYTES = 4 * 1024 * 1024

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real sockets, real time


def notice(n: int) -> DrainFinished:
    return DrainFinished(
        id=f"drain_finished:n{n}:s", at="t", text=f"drain {n}", node=f"n{n}", started="s"
    )


def config(*urls: str) -> WebhookConfig:
    return WebhookConfig(urls=urls, request_timeout_s=5.0, backoff_start_s=0.05, backoff_max_s=0.2)


@asynccontextmanager
async def delivering(webhooks: Webhooks) -> AsyncIterator[Webhooks]:
    async with anyio.create_task_group() as group:
        group.start_soon(webhooks.run)
        yield webhooks
        group.cancel_scope.cancel()


def counters(webhooks: Webhooks) -> WebhookEndpointHealth:
    return webhooks.health().endpoints[0]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver(free_port())
    yield made
    made.stop()


async def test_a_huge_answer_is_read_no_further_than_64_kib(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.mode, receiver.body_bytes = "huge", HOSTILE_BYTES
    receiver.start()
    webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    webhooks.open()
    webhooks.queue([notice(1)])
    async with delivering(webhooks):
        await wait_until(lambda: counters(webhooks).delivered_total == 1, WITHIN_S, "delivery")
        await wait_until(lambda: receiver.hostile_done == 1, WITHIN_S, "the answer cut")
    # Its status counted (200: delivered); of its 128 MiB, the client hung up after 64 KiB.
    assert receiver.ids() == [notice(1).id]
    assert receiver.bytes_sent < IN_FLIGHT_BYTES


async def test_a_gzip_bomb_is_asked_not_to_be_sent_and_is_not_inflated(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.mode, receiver.body_bytes = "gzip", HOSTILE_BYTES
    gzip_bomb(HOSTILE_BYTES)  # made before memory is traced
    receiver.start()
    webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    webhooks.open()
    webhooks.queue([notice(1)])
    tracemalloc.start()
    try:
        async with delivering(webhooks):
            await wait_until(lambda: counters(webhooks).delivered_total == 1, WITHIN_S, "delivery")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert receiver.received[0].accept_encoding == "identity"
    assert peak < PEAK_BYTES


async def test_a_redirect_is_the_answer_and_is_not_followed(
    tmp_path: Path, receiver: Receiver
) -> None:
    elsewhere = Receiver(free_port())
    elsewhere.start()
    receiver.mode, receiver.redirect_to = "redirect", elsewhere.url
    receiver.start()
    try:
        webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
        webhooks.open()
        webhooks.queue([notice(1)])
        async with delivering(webhooks):
            await wait_until(lambda: receiver.attempts >= 2, WITHIN_S, "a retry of the 307")
        assert counters(webhooks).last_error == "answered 307"
        assert counters(webhooks).delivered_total == 0
        assert elsewhere.attempts == 0
    finally:
        elsewhere.stop()


async def test_webhooks_test_shows_a_line_of_a_huge_answer_and_reads_no_more(
    receiver: Receiver,
) -> None:
    receiver.mode, receiver.body_bytes = "huge", HOSTILE_BYTES
    receiver.start()
    (answer,) = await send_test([receiver.url], time.time(), timeout_s=5.0)
    await wait_until(lambda: receiver.hostile_done == 1, WITHIN_S, "the answer cut")
    assert answer.status == 200
    assert len(answer.detail) <= 200
    assert receiver.bytes_sent < IN_FLIGHT_BYTES


@pytest.fixture
def quiet_clients() -> Iterator[None]:
    levels = {name: logging.getLogger(name).level for name in QUIET_LOGGERS}
    quiet_http_clients()
    yield
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("quiet_clients")
async def test_no_log_line_names_the_webhooks_path_or_query(
    tmp_path: Path, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # everything that reaches the root, our DEBUG lines too
    receiver.mode = "error"
    webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    webhooks.open()
    webhooks.queue([notice(1)])
    async with delivering(webhooks):
        await wait_until(lambda: counters(webhooks).failed_attempts_total >= 1, WITHIN_S, "refused")
        receiver.start()  # now it answers 500
        await wait_until(lambda: receiver.attempts >= 1, WITHIN_S, "a 500")
        receiver.mode = "ok"
        await wait_until(lambda: counters(webhooks).delivered_total == 1, WITHIN_S, "delivery")
    await send_test([receiver.url], time.time(), timeout_s=5.0)
    logged = caplog.text
    assert endpoint_label(receiver.url) in logged  # the deliveries were logged, by host
    assert SECRET_PATH not in logged
    assert SECRET_QUERY not in logged


# --- fuzzing what a receiver answers --------------------------------------------------------

statuses = st.sampled_from([200, 201, 204, 301, 302, 307, 400, 404, 429, 500, 503])
bodies = st.sampled_from([0, 1, 100, MAX_ANSWER_BYTES - 1, MAX_ANSWER_BYTES, 4 * MAX_ANSWER_BYTES])


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(status=statuses, size=bodies, encoding=st.sampled_from([None, "gzip", "br", "zstd"]))
async def test_any_answer_is_a_status_and_at_most_64_kib(
    receiver: Receiver, status: int, size: int, encoding: str | None
) -> None:
    """Whatever status, size and claimed encoding the receiver answers with, the test command
    gives its status and a line of at most 200 characters, never an exception."""
    receiver.answer_with(status, size, encoding)
    receiver.start()
    try:
        (answer,) = await send_test([receiver.url], time.time(), timeout_s=5.0)
    finally:
        receiver.stop()
    assert answer.status == status
    assert len(answer.detail) <= 200
