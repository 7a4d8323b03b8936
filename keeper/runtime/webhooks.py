"""Alert webhooks: the notices of ``keeper.core.alerts``, written to an outbox and POSTed to each
webhook at least once, for the master and the bridge alike (docs/design.md, "Alert webhooks").

The shape, and why:

- ``Webhooks.observe`` is the producer. Each service's hosted keeper calls it after every step
  with the State the keeper stepped on (``keeper.runtime.hosted_keeper``); it asks the pure rule
  which notices the change since the last look calls for and appends them to the outbox. It
  never waits on a webhook: it writes a few lines and returns. A write that fails (disk full) is
  counted and logged once, and the notices are still delivered from memory; a bug in the rule is
  logged and never stops the step.
- Chats are not in the State: a service with a front door hands its counts over once
  (``watch_chats``), and the chats' own pure rule (``keeper.core.request_alerts``) is asked after
  each step and at each failed chat counted (the keeper does not step while exo is unreachable,
  which is when chats fail), with the State of the last step for the words.
- ``keeper.runtime.outbox``: the notices on disk in ``DATA_DIR/webhooks`` and each webhook's
  place in them; a restart delivers what was queued, at most ``MAX_QUEUED_NOTICES`` are kept.
  ``memory.json`` beside them keeps the rules' memories (``keeper.core.alerts.AlertMemory``, and
  the deployments announced failing chats: ``keeper.core.request_alerts.ChatAlertMemory``).
- ``Webhooks.run``: one task per webhook, so a dead one (hanging, answering 500, resetting the
  connection) delays only its own queue. Its notices go in order, each retried with a backoff
  from 1 s doubling to 5 min; each POST has ``REQUEST_TIMEOUT_S`` to get an answer.
- A webhook's answer is bounded (docs/design.md §6.9, "Bounded answers"): its status is what
  counts, and at most ``MAX_ANSWER_BYTES`` of its body are read, as sent (``Accept-Encoding:
  identity``, and never decoded), so a receiver answering gigabytes or a gzip bomb costs the
  service 64 KiB. A redirect is not followed: it is the answer (a 3xx, so retried).
- ``Webhooks.health`` (shown in ``/healthz``) is the counters' one accessor: a ``/metrics``
  exporter reads the same ``WebhooksHealth``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import httpx

from keeper.core.alerts import AlertMemory, Observed, first_look, first_memory, notices
from keeper.core.request_alerts import ChatAlertMemory, chat_notices
from keeper.model.api_models import WebhookEndpointHealth, WebhooksHealth
from keeper.model.notices import AnyNotice, TestNotice, iso_utc_of
from keeper.model.request_rule import Outcome
from keeper.model.request_window import EndedRequest
from keeper.model.state import DeploymentId, State
from keeper.runtime.arguments import WEBHOOKS_ENV
from keeper.runtime.outbox import (
    MAX_QUEUED_NOTICES,
    Outbox,
    endpoint_label,
    notice_json,
    write_atomically,
)
from keeper.runtime.starting import MasterStartError

log = logging.getLogger(__name__)

# How long one POST may take to be answered. Chat services answer in well under a second; an
# endpoint that takes longer is treated as down (and retried), never waited on for ever.
REQUEST_TIMEOUT_S = 10.0
# The first retry of a failed delivery, doubled per failure in a row up to the cap: an endpoint
# that blips gets its notice a second later, one down for hours is asked every 5 min, not hammered.
BACKOFF_START_S = 1.0
BACKOFF_MAX_S = 300.0
# The most of a webhook's answer that is read. Chat services answer a few bytes ("ok", a JSON
# id); the body is read only so a small answer leaves the connection reusable and so
# ``webhooks test`` can show its first line. A longer answer is cut there and the connection
# closed: a receiver answering 1.5 GB must not cost the service 1.5 GB.
MAX_ANSWER_BYTES = 64 * 1024
# What every request to a webhook carries. ``identity``: the answer is sent as it is, never
# compressed, so what is read is what arrived (a 1 MiB gzip body can inflate to 1 GiB).
REQUEST_HEADERS = {"User-Agent": "exo-deploy", "Accept-Encoding": "identity"}

MEMORY_FILE = "memory.json"
OUTBOX_DIR = "webhooks"


class WebhookUrlError(MasterStartError):
    """A webhook URL that cannot work: a usage error (exit 2) naming it."""


def check_webhook_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host; ``WebhookUrlError`` naming it otherwise."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise WebhookUrlError(f"webhook {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise WebhookUrlError(
            f"webhook {url!r} is not an http(s) URL (expected http(s)://HOST[:PORT]/PATH)"
        )
    return url


def webhook_urls(given: Iterable[str], env: str | None = None) -> tuple[str, ...]:
    """The webhooks of ``EXO_DEPLOY_WEBHOOKS`` (``env``: its value, None to read it) and then of
    ``--webhook`` (``given``), each checked, in order, each once."""
    listed = os.environ.get(WEBHOOKS_ENV, "") if env is None else env
    items = [*listed.replace(",", " ").split(), *given]
    urls: list[str] = []
    for item in items:
        url = check_webhook_url(item.strip())
        if url not in urls:
            urls.append(url)
    return tuple(urls)


def _read_memory(path: Path) -> tuple[AlertMemory | None, ChatAlertMemory]:
    """The memories a previous run left: the State's rule's (None: none, or damaged) and the
    chats' (empty for a file written before it was kept)."""
    try:
        loaded: dict[str, Any] = json.loads(path.read_bytes())
        cant_place: list[Any] = loaded["cant_place"]
        seen: dict[str, Any] = loaded["records_seen_until"]
        failing: dict[str, Any] = loaded.get("requests_failing", {})
        return AlertMemory(
            cant_place=frozenset(str(d) for d in cant_place),
            records_seen_until={str(k): float(v) for k, v in seen.items()},
        ), ChatAlertMemory({str(k): float(v) for k, v in failing.items()})
    except FileNotFoundError:
        return None, ChatAlertMemory()
    except (ValueError, KeyError, TypeError, AttributeError):
        log.warning("webhooks: %s is damaged; notices start from the State as it is", path)
        return None, ChatAlertMemory()


def _memory_json(memory: AlertMemory, chats: ChatAlertMemory) -> bytes:
    return json.dumps(
        {
            "cant_place": sorted(memory.cant_place),
            "records_seen_until": dict(memory.records_seen_until),
            "requests_failing": dict(chats.failing),
        }
    ).encode()


class ChatSource(Protocol):
    """What the webhooks read of a front door's counts (``keeper.runtime.request_counts``)."""

    def recent(self) -> Mapping[str, Sequence[EndedRequest]]: ...
    def watch(self, listener: Callable[[str, Outcome, float], None]) -> None: ...


# --- the service side -----------------------------------------------------------------------

Sleep = Callable[[float], Awaitable[None]]


@dataclass(frozen=True)
class WebhookConfig:
    urls: tuple[str, ...] = ()
    request_timeout_s: float = REQUEST_TIMEOUT_S
    backoff_start_s: float = BACKOFF_START_S
    backoff_max_s: float = BACKOFF_MAX_S
    max_queued: int = MAX_QUEUED_NOTICES
    # Tests hand the deliveries a transport (an ASGI app, a mock); None: the network.
    transport: httpx.AsyncBaseTransport | None = field(default=None, compare=False)


class Webhooks:
    """A service's webhooks: the producer (``observe``), the deliveries (``run``), the counters
    (``health``). With no URL it does nothing at all."""

    def __init__(
        self,
        config: WebhookConfig,
        data_dir: Path | None,
        *,
        wall: Callable[[], float],
        sleep: Sleep = anyio.sleep,
    ) -> None:
        self.config = config
        directory = data_dir / OUTBOX_DIR if data_dir is not None else None
        self.outbox = Outbox(directory, config.urls, max_queued=config.max_queued)
        self._wall = wall
        self._sleep = sleep
        self._last: Observed | None = None
        self._memory = AlertMemory()
        self._kept_memory: AlertMemory | None = None
        self._chats: ChatSource | None = None
        self._chat_memory = ChatAlertMemory()
        self._wake: dict[str, anyio.Event] = {}
        self._rule_failing = False
        self._chat_rule_failing = False
        self._memory_failing = False
        self._opened = False

    @property
    def enabled(self) -> bool:
        return bool(self.config.urls)

    def open(self) -> None:
        """Read the outbox and the memory a previous run left (after the data dir is ours)."""
        if not self.enabled or self._opened:
            return
        self._opened = True
        self.outbox.open()
        if self.outbox.directory is not None:
            self._kept_memory, self._chat_memory = _read_memory(self.outbox.directory / MEMORY_FILE)
        log.info(
            "webhooks: notices go to %s",
            ", ".join(endpoint_label(url) for url in self.config.urls),
        )

    def close(self) -> None:
        self.outbox.close()

    # --- producing -------------------------------------------------------------------------

    def watch_chats(self, chats: ChatSource) -> None:
        """Say when a deployment's chats through this front door start and stop failing
        (``keeper.core.request_alerts``): looked at after each step and at each failed chat."""
        self._chats = chats
        chats.watch(self._chat_counted)

    def observe(
        self,
        state: State,
        drain_notes: Mapping[str, str],
        unhealthy: Mapping[DeploymentId, tuple[str, str, str]] | None = None,
        now: float | None = None,
    ) -> None:
        """The notices since the last look (``keeper.core.alerts``), queued for every webhook;
        with ``now`` (the step's, on the front door's clock), the chats' too. Never raises and
        never waits on a webhook."""
        if not self.enabled:
            return
        if not self._opened:
            self.open()
        after = Observed(state, drain_notes, unhealthy or {})
        try:
            if self._last is None:
                before = first_look(after, self._kept_memory)
                memory = first_memory(after, self._kept_memory)
            else:
                before, memory = self._last, self._memory
            found, memory = notices(before, after, self._wall(), memory)
        except Exception:
            if not self._rule_failing:
                log.exception("webhooks: the notice rule failed; this change sends no notice")
            self._rule_failing = True
            self._last = after
            return
        self._rule_failing = False
        self._last = after
        self._send(found)
        if memory is not self._memory and memory != self._memory:
            self._memory = memory
            self._save_memory()
        if now is not None and self._chats is not None:
            self._look_at_chats(self._chats.recent(), now)

    def _chat_counted(self, deployment: str, outcome: Outcome, at: float) -> None:
        """A chat counted: a failed one may begin a run (nothing else can: recovery is looked
        for after each step)."""
        if outcome != "failed" or not self.enabled or self._chats is None:
            return
        records = self._chats.recent().get(deployment)
        if records is not None:
            self._look_at_chats({deployment: records}, at)

    def _look_at_chats(self, recent: Mapping[str, Sequence[EndedRequest]], now: float) -> None:
        """The chats' notices for ``recent`` at ``now`` (the State of the last step gives the
        words; before the first step there is none, and nothing is said)."""
        if self._last is None:
            return
        try:
            found, memory = chat_notices(
                recent, self._last.state, now, self._wall(), self._chat_memory
            )
        except Exception:
            if not self._chat_rule_failing:
                log.exception("webhooks: the chats' notice rule failed; no notice of them now")
            self._chat_rule_failing = True
            return
        self._chat_rule_failing = False
        self._send(found)
        if memory is not self._chat_memory:
            self._chat_memory = memory
            self._save_memory()

    def _send(self, found: Sequence[AnyNotice]) -> None:
        if found:
            for notice in found:
                log.info("webhooks: %s", notice.text)
            self.queue(found)

    def queue(self, found: Sequence[AnyNotice]) -> None:
        """Append ``found`` to the outbox and wake each webhook's delivery."""
        self.outbox.append(found)
        for event in self._wake.values():
            event.set()

    def _save_memory(self) -> None:
        if self.outbox.directory is None:
            return
        try:
            write_atomically(
                self.outbox.directory / MEMORY_FILE, _memory_json(self._memory, self._chat_memory)
            )
        except OSError as exc:
            if not self._memory_failing:
                log.error("webhooks: %s not written (%s)", MEMORY_FILE, exc)
            self._memory_failing = True
            return
        self._memory_failing = False

    # --- delivering ------------------------------------------------------------------------

    async def run(self) -> None:
        """Deliver until cancelled: one task per webhook."""
        if not self.enabled:
            return
        if not self._opened:
            self.open()
        try:
            async with (
                webhook_client(self.config.request_timeout_s, self.config.transport) as client,
                anyio.create_task_group() as group,
            ):
                for url in self.config.urls:
                    self._wake[url] = anyio.Event()
                    group.start_soon(self._deliver, client, url)
        finally:
            self.close()

    async def _deliver(self, client: httpx.AsyncClient, url: str) -> None:
        counters = self.outbox.endpoints[url]
        backoff = self.config.backoff_start_s
        failing_since_log = 0
        while True:
            item = self.outbox.next_for(url)
            if item is None:
                await self._wake[url].wait()
                self._wake[url] = anyio.Event()
                continue
            error = await post_notice(client, url, item.body, item.notice_id, self.config)
            if error is None:
                self.outbox.delivered(url, item)
                if failing_since_log:
                    log.warning(
                        "webhooks: %s delivers again (after %d failed attempts)",
                        counters.label,
                        failing_since_log,
                    )
                failing_since_log = 0
                backoff = self.config.backoff_start_s
                continue
            counters.failed_attempts_total += 1
            counters.last_error = error
            if failing_since_log == 0:
                log.warning(
                    "webhooks: %s failed (%s); retrying from %g s, doubling up to %g s",
                    counters.label,
                    error,
                    backoff,
                    self.config.backoff_max_s,
                )
            failing_since_log += 1
            await self._sleep(backoff)
            backoff = min(backoff * 2, self.config.backoff_max_s)

    # --- reading ---------------------------------------------------------------------------

    def health(self) -> WebhooksHealth:
        """The counters: what ``/healthz`` shows, and what a metrics exporter reads."""
        return WebhooksHealth(
            endpoints=[
                WebhookEndpointHealth(
                    url=counters.label,
                    pending=self.outbox.pending(url),
                    delivered_total=counters.delivered_total,
                    dropped_total=counters.dropped_total,
                    failed_attempts_total=counters.failed_attempts_total,
                    last_error=counters.last_error,
                )
                for url, counters in self.outbox.endpoints.items()
            ],
            durable=self.outbox.directory is not None,
            outbox_write_failures_total=self.outbox.write_failures_total,
        )


def webhook_client(
    timeout_s: float, transport: httpx.AsyncBaseTransport | None = None
) -> httpx.AsyncClient:
    """The client every webhook request goes through: no redirect followed (a 3xx is the
    answer: a webhook that moved is fixed by its operator, not chased), the answer asked for
    uncompressed. A proxy from the environment is used: webhooks are often on the internet."""
    return httpx.AsyncClient(
        transport=transport,
        timeout=timeout_s,
        headers=REQUEST_HEADERS,
        follow_redirects=False,
    )


@dataclass(frozen=True)
class Answer:
    """A webhook's answer: its status, and the first ``MAX_ANSWER_BYTES`` of its body as sent."""

    status: int
    start: bytes


async def post_bounded(
    client: httpx.AsyncClient, url: str, body: bytes, notice_id: str, timeout_s: float
) -> Answer:
    """POST ``body`` and read the answer's status and at most ``MAX_ANSWER_BYTES`` of it, within
    ``timeout_s`` in all. Raises TimeoutError, httpx.HTTPError, httpx.StreamError or OSError."""
    with anyio.fail_after(timeout_s):
        async with client.stream(
            "POST",
            url,
            content=body,
            headers={"Content-Type": "application/json", "Idempotency-Key": notice_id},
        ) as response:
            if response.is_stream_consumed:  # a transport that read it whole (a test's mock)
                return Answer(response.status_code, response.content[:MAX_ANSWER_BYTES])
            start = bytearray()
            # Raw: as sent, never inflated, whatever Content-Encoding the receiver claims.
            async for chunk in response.aiter_raw():
                start += chunk[: MAX_ANSWER_BYTES - len(start)]
                if len(start) >= MAX_ANSWER_BYTES:
                    break  # leaving the block closes the connection, unread
            return Answer(response.status_code, bytes(start))


async def post_notice(
    client: httpx.AsyncClient, url: str, body: bytes, notice_id: str, config: WebhookConfig
) -> str | None:
    """POST one notice; None when the webhook answered 2xx, else what went wrong, in words."""
    try:
        answer = await post_bounded(client, url, body, notice_id, config.request_timeout_s)
    except TimeoutError:
        return f"no answer within {config.request_timeout_s:g} s"
    except (httpx.HTTPError, httpx.StreamError, OSError) as exc:
        return _failure_words(exc)
    if 200 <= answer.status < 300:
        return None
    return f"answered {answer.status}"


def _failure_words(exc: BaseException) -> str:
    """Why a request failed, without its URL: httpx's messages can quote the request's URL, and
    a webhook's path and query are its secret (docs/design.md §6.9)."""
    if isinstance(exc, httpx.HTTPStatusError | httpx.InvalidURL):
        return type(exc).__name__
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- exo-deploy webhooks test ----------------------------------------------------------------


@dataclass(frozen=True)
class TestAnswer:
    """What one webhook answered the sample notice."""

    __test__ = False  # not a pytest test class, whatever its name says
    url: str
    status: int | None  # None: no answer (unreachable, timed out)
    detail: str  # the answer's first line of body, or why there was none


def sample_notice(at: float) -> TestNotice:
    seen = iso_utc_of(at)
    return TestNotice(
        id=f"test:{seen}",
        at=seen,
        text="exo-deploy: a test notice; alerts from this cluster will arrive here",
    )


async def send_test(
    urls: Sequence[str],
    at: float,
    *,
    timeout_s: float = REQUEST_TIMEOUT_S,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[TestAnswer]:
    """POST the sample notice to each webhook, one after the other, and say what each answered."""
    notice = sample_notice(at)
    answers: list[TestAnswer] = []
    async with webhook_client(timeout_s, transport) as client:
        for url in urls:
            try:
                answer = await post_bounded(client, url, notice_json(notice), notice.id, timeout_s)
            except TimeoutError:
                answers.append(TestAnswer(url, None, f"no answer within {timeout_s:g} s"))
                continue
            except (httpx.HTTPError, httpx.StreamError, OSError) as exc:
                answers.append(TestAnswer(url, None, _failure_words(exc)))
                continue
            text = answer.start.decode("utf-8", errors="replace")
            first = text.strip().splitlines()[:1]
            answers.append(TestAnswer(url, answer.status, first[0][:200] if first else ""))
    return answers
