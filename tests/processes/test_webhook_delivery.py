"""Alert webhook delivery (``keeper.runtime.webhooks``) against a receiver on a real socket: a
receiver down for a while gets every notice once it is up, in order, each id once; the outbox
survives a restart; a hanging, failing or resetting webhook delays only its own queue; the
outbox keeps at most 10,000 notices, or 10 MiB of them, and counts what it dropped. Real time
(asyncio), with the backoff shortened so retries come in tenths of a second."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from process_helpers import free_port
from waiting import wait_until
from webhook_receiver import Receiver

from keeper.model.api_models import WebhookEndpointHealth
from keeper.model.notices import DrainFinished
from keeper.runtime.outbox import (
    MAX_QUEUED_BYTES,
    MAX_QUEUED_NOTICES,
    NOTICES_FILE,
    Outbox,
    endpoint_label,
    notice_json,
)
from keeper.runtime.webhooks import OUTBOX_DIR, WebhookConfig, Webhooks

WITHIN_S = 20.0

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # real sockets, real time


def notice(n: int) -> DrainFinished:
    return DrainFinished(
        id=f"drain_finished:n{n}:s", at="t", text=f"drain {n}", node=f"n{n}", started="s"
    )


def config(*urls: str, timeout_s: float = 2.0) -> WebhookConfig:
    return WebhookConfig(
        urls=urls, request_timeout_s=timeout_s, backoff_start_s=0.05, backoff_max_s=0.2
    )


@asynccontextmanager
async def delivering(webhooks: Webhooks) -> AsyncIterator[Webhooks]:
    async with anyio.create_task_group() as group:
        group.start_soon(webhooks.run)
        yield webhooks
        group.cancel_scope.cancel()


def counters(webhooks: Webhooks, index: int = 0) -> WebhookEndpointHealth:
    return webhooks.health().endpoints[index]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver(free_port())
    yield made
    made.stop()


async def test_every_notice_queued_while_the_receiver_is_down_arrives_once_it_is_up(
    tmp_path: Path, receiver: Receiver
) -> None:
    webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    webhooks.open()
    sent = [notice(n) for n in range(20)]
    webhooks.queue(sent[:10])
    async with delivering(webhooks):
        await wait_until(lambda: counters(webhooks).failed_attempts_total >= 3, WITHIN_S, "retries")
        webhooks.queue(sent[10:])  # more while it is down
        assert counters(webhooks).pending == 20
        assert counters(webhooks).last_error is not None
        receiver.start()
        await wait_until(lambda: counters(webhooks).delivered_total == 20, WITHIN_S, "delivery")
    assert receiver.ids() == [n.id for n in sent]  # all of them, in order, each once
    assert [r.key for r in receiver.received] == [n.id for n in sent]  # the header too
    health = counters(webhooks)
    assert (health.pending, health.dropped_total, health.last_error) == (0, 0, None)
    # The secret path is not shown.
    assert health.url == f"http://127.0.0.1:{receiver.port}/…" == endpoint_label(receiver.url)


async def test_notices_queued_before_a_stop_are_delivered_after_the_restart(
    tmp_path: Path, receiver: Receiver
) -> None:
    first = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    first.open()
    sent = [notice(n) for n in range(5)]
    first.queue(sent)
    async with delivering(first):
        await wait_until(lambda: counters(first).failed_attempts_total >= 1, WITHIN_S, "a try")
    receiver.start()
    second = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    async with delivering(second):
        await wait_until(lambda: counters(second).delivered_total == 5, WITHIN_S, "delivery")
    assert receiver.ids() == [n.id for n in sent]
    # Delivered is remembered: a third start has nothing to send.
    third = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    third.open()
    assert counters(third).pending == 0
    third.close()


async def test_a_hanging_webhook_delays_only_its_own_queue(tmp_path: Path) -> None:
    hanging, healthy = Receiver(free_port(), mode="hang"), Receiver(free_port())
    hanging.start()
    healthy.start()
    try:
        webhooks = Webhooks(
            config(hanging.url, healthy.url, timeout_s=0.5), tmp_path, wall=time.time
        )
        webhooks.open()
        sent = [notice(n) for n in range(3)]
        async with delivering(webhooks):
            webhooks.queue(sent)
            await wait_until(lambda: counters(webhooks, 1).delivered_total == 3, WITHIN_S, "B")
            assert counters(webhooks, 0).delivered_total == 0
            await wait_until(
                lambda: counters(webhooks, 0).failed_attempts_total >= 1, WITHIN_S, "timeout"
            )
            assert counters(webhooks, 0).last_error == "no answer within 0.5 s"
            # The producer never waits on it: more notices are queued at once.
            started = time.monotonic()
            webhooks.queue([notice(9)])
            assert time.monotonic() - started < 0.5
            hanging.mode = "ok"
            await wait_until(lambda: counters(webhooks, 0).delivered_total == 4, WITHIN_S, "A")
            await wait_until(lambda: counters(webhooks, 1).delivered_total == 4, WITHIN_S, "B")
        assert hanging.ids() == [n.id for n in sent] + [notice(9).id]
        assert healthy.ids() == hanging.ids()
    finally:
        hanging.stop()
        healthy.stop()


async def test_a_webhook_answering_500_or_resetting_is_retried_until_it_takes_the_notice(
    tmp_path: Path, receiver: Receiver
) -> None:
    receiver.mode = "error"
    receiver.start()
    webhooks = Webhooks(config(receiver.url), tmp_path, wall=time.time)
    webhooks.open()
    webhooks.queue([notice(1), notice(2)])
    async with delivering(webhooks):
        await wait_until(lambda: receiver.attempts >= 2, WITHIN_S, "retries of a 500")
        assert counters(webhooks).last_error == "answered 500"
        receiver.mode = "reset"
        seen = receiver.attempts
        await wait_until(lambda: receiver.attempts >= seen + 2, WITHIN_S, "retries of a reset")
        await wait_until(
            lambda: counters(webhooks).last_error != "answered 500", WITHIN_S, "the reset's error"
        )
        receiver.mode = "ok"
        await wait_until(lambda: counters(webhooks).delivered_total == 2, WITHIN_S, "delivery")
    assert receiver.ids() == [notice(1).id, notice(2).id]
    assert counters(webhooks).failed_attempts_total >= 4


@pytest.mark.filterwarnings("ignore")
def test_the_outbox_keeps_the_newest_10000_notices_and_counts_and_logs_the_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://127.0.0.1:9/never"
    outbox = Outbox(tmp_path / OUTBOX_DIR, [url])
    outbox.open()
    total = MAX_QUEUED_NOTICES + 500
    with caplog.at_level(logging.WARNING, logger="keeper.runtime.webhooks"):
        for start in range(0, total, 500):
            outbox.append([notice(n) for n in range(start, start + 500)])
    assert outbox.pending(url) == MAX_QUEUED_NOTICES
    assert outbox.endpoints[url].dropped_total == 500
    assert any("dropped" in record.getMessage() for record in caplog.records)
    item = outbox.next_for(url)
    assert item is not None and item.notice_id == notice(500).id  # the oldest 500 went
    path = tmp_path / OUTBOX_DIR / NOTICES_FILE
    lines = path.read_bytes().count(b"\n")
    assert lines <= 2 * MAX_QUEUED_NOTICES
    assert path.stat().st_size < 10 * 1024 * 1024
    outbox.close()
    # What a restart reads back: the same 10,000, the count of the dropped starting again.
    again = Outbox(tmp_path / OUTBOX_DIR, [url])
    again.open()
    assert again.pending(url) == MAX_QUEUED_NOTICES
    first = again.next_for(url)
    assert first is not None and first.notice_id == notice(500).id
    assert path.read_bytes().count(b"\n") == MAX_QUEUED_NOTICES  # compacted at the start
    again.close()


def test_the_outbox_keeps_at_most_10_mib_of_notices_however_large_each_is(
    tmp_path: Path,
) -> None:
    """Notices of 100 KiB each (a node's name, a placement's reason: what a notice holds is
    given to the service): the count's bound alone would keep 10,000 of them, 1 GB."""
    url = "http://127.0.0.1:9/never"
    outbox = Outbox(tmp_path / OUTBOX_DIR, [url])
    outbox.open()
    big = [
        DrainFinished(id=f"d:{n}", at="t", text="x" * 100_000, node=f"n{n}", started="s")
        for n in range(300)
    ]
    for start in range(0, len(big), 50):
        outbox.append(big[start : start + 50])
    kept = outbox.pending(url)
    each = len(notice_json(big[0]))
    assert kept == MAX_QUEUED_BYTES // each  # the newest that fit
    assert outbox.endpoints[url].dropped_total == len(big) - kept
    item = outbox.next_for(url)
    assert item is not None and item.notice_id == big[len(big) - kept].id
    assert (tmp_path / OUTBOX_DIR / NOTICES_FILE).stat().st_size < 2 * MAX_QUEUED_BYTES + each
    outbox.close()
    again = Outbox(tmp_path / OUTBOX_DIR, [url])
    again.open()
    assert again.pending(url) == kept
    again.close()


def test_an_outbox_that_cannot_be_written_counts_and_still_delivers_from_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = "http://127.0.0.1:9/never"
    outbox = Outbox(tmp_path / OUTBOX_DIR, [url])
    outbox.open()
    (tmp_path / OUTBOX_DIR / NOTICES_FILE).unlink()
    (tmp_path / OUTBOX_DIR / NOTICES_FILE).mkdir()  # a write now fails, as on a full disk
    outbox.close()
    with caplog.at_level(logging.ERROR, logger="keeper.runtime.webhooks"):
        outbox.append([notice(1)])
        outbox.append([notice(2)])
    assert outbox.write_failures_total == 2
    assert [r.getMessage() for r in caplog.records if "not writable" in r.getMessage()] != []
    assert len([r for r in caplog.records if "not writable" in r.getMessage()]) == 1  # once
    assert outbox.pending(url) == 2
