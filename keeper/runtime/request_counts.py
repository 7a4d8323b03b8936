"""Every chat through the front door counted (docs/design.md §8.6): in ``/metrics`` and, for
the last ``WINDOW_S``, in each deployment's ``GET /deployments`` view.

A shell of its own beside ``keeper.runtime.front_door``: the front door decides what happens to
a request, this module only records how it ended; the sum is the pure
``keeper.model.request_window``.

Two more readers take what it keeps, each through a pure rule, so the front door stays as it is
and the master and the bridge share them by mounting the same door:

- the alert webhooks (``keeper.runtime.webhooks``) read the recent ended requests to say when a
  deployment's chats start and stop failing (``keeper.core.request_alerts``, docs/design.md
  §6.9), after each keeper step and, through ``watch``, at each request counted (so a run of
  failures is announced even while the keeper cannot step, exo unreachable);
- the history (``GET /deployments/{id}/history``) reads the notable outcomes kept by the second
  (``kept``) to say how many chats each incident held, retried, migrated and failed
  (``keeper.model.incident_chats``, docs/design.md §3.5). In memory only: a chat per log line
  would flood the log.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Histogram

from keeper.model.api_models import RequestsView
from keeper.model.incident_chats import NOTABLE, ChatSecond, KeptChats, one_more
from keeper.model.request_rule import Outcome
from keeper.model.request_window import WINDOW_S, EndedRequest, requests_view
from keeper.runtime.metrics import PREFIX

log = logging.getLogger(__name__)

# Time to first token, seconds: a warm instance answers in well under a second, a held request
# in up to the hold (30 s), a long prompt's prefill in tens of seconds.
TTFT_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
# The seconds with a notable chat (held, retried, migrated, failed) kept per deployment for the
# history's incidents: a day of one a minute (a trickle of failures), or 24 minutes in which
# every second had one (a busy deployment's incidents). About 100 bytes each: 148 KiB for a
# deployment at the bound (tracemalloc, one failed chat a second). Past it the oldest go, and
# the history says from when it is whole.
MAX_NOTABLE_SECONDS = 1_440

# Told of each request counted: its deployment, its outcome, when it ended (monotonic).
Listener = Callable[[str, Outcome, float], None]


class RequestCounts:
    """Every request counted: ``exo_deploy_requests_total{deployment,outcome}`` and
    ``exo_deploy_request_ttft_seconds{deployment}`` in the service's registry, and the last
    ``WINDOW_S`` of them per deployment for ``GET /deployments``."""

    def __init__(self, registry: CollectorRegistry | None) -> None:
        # A registry of its own when the service gives none (a front door in a test).
        self._registry = registry if registry is not None else CollectorRegistry()
        self._total = Counter(
            PREFIX + "requests",
            "Chat requests through the front door, by deployment ('' for a model with none) "
            "and outcome: ok, held (waited for its deployment), retried (sent again before its "
            "first token), migrated (continued after a cut), failed, cancelled (client left), "
            "rejected (refused as a request, by the front door or by exo)",
            ["deployment", "outcome"],
            registry=self._registry,
        )
        self._ttft = Histogram(
            PREFIX + "request_ttft_seconds",
            "Time from a chat's arrival to its first token sent (a non-streamed chat: to its "
            "answer), by deployment",
            ["deployment"],
            buckets=TTFT_BUCKETS_S,
            registry=self._registry,
        )
        self._recent: dict[str, deque[EndedRequest]] = {}
        # Per deployment, the notable chats by the second they ended (monotonic), oldest first,
        # and the end of the newest second the bound dropped.
        self._notable: dict[str, deque[ChatSecond]] = {}
        self._dropped_until: dict[str, float] = {}
        self._listeners: list[Listener] = []

    def count(self, deployment: str, outcome: Outcome, ttft_s: float | None, at: float) -> None:
        self._total.labels(deployment, outcome).inc()
        if ttft_s is not None:
            self._ttft.labels(deployment).observe(ttft_s)
        recent = self._recent.setdefault(deployment, deque())
        recent.append(EndedRequest(at, outcome, ttft_s))
        while recent and recent[0].at <= at - WINDOW_S:
            recent.popleft()
        if outcome in NOTABLE:
            self._note(deployment, outcome, at)
        for listener in self._listeners:
            try:
                listener(deployment, outcome, at)
            except Exception:  # a reader's bug must not break the chat being ended
                log.exception("a reader of the request counts failed")

    def _note(self, deployment: str, outcome: Outcome, at: float) -> None:
        seconds = self._notable.setdefault(deployment, deque())
        second = float(int(at // 1))
        if seconds and seconds[-1].at == second:
            seconds[-1] = one_more(seconds[-1], outcome)
            return
        if len(seconds) >= MAX_NOTABLE_SECONDS:
            self._dropped_until[deployment] = seconds.popleft().at + 1.0
        seconds.append(one_more(ChatSecond(second), outcome))

    def watch(self, listener: Listener) -> None:
        """Tell ``listener`` of each request counted from now on, as it is counted."""
        self._listeners.append(listener)

    def recent(self) -> Mapping[str, Sequence[EndedRequest]]:
        """Each deployment's requests ended in about the last ``WINDOW_S`` (monotonic), oldest
        first: what ``keeper.core.request_alerts`` reads. Not a copy: read it at once."""
        return self._recent

    def kept(self, deployment: str, now: float, wall: float, started_at: float | None) -> KeptChats:
        """The deployment's notable chats by second on the wall clock (``now`` and ``wall``:
        this moment on the monotonic clock and in Unix seconds), whole from ``started_at``
        (Unix seconds: the service's start, when this front door began counting; None: not
        started, nothing before ``wall``) or from the newest second the bound dropped."""
        wall_offset = wall - now
        whole_from = started_at if started_at is not None else wall
        dropped = self._dropped_until.get(deployment)
        if dropped is not None:
            whole_from = max(whole_from, dropped + wall_offset)
        return KeptChats(
            complete_from=whole_from,
            seconds=[
                ChatSecond(s.at + wall_offset, s.held, s.retried, s.migrated, s.failed)
                for s in self._notable.get(deployment, ())
            ],
        )

    def view(
        self, deployment: str, now: float, wall: float, started_at: float | None
    ) -> RequestsView | None:
        """The deployment's last ``WINDOW_S`` summed; over less when this front door began
        counting (``started_at``, Unix seconds; ``wall``: now in Unix seconds) less than a
        window ago, so a new service's rate is not read low."""
        counted_s = wall - started_at if started_at is not None else None
        return requests_view(list(self._recent.get(deployment, ())), now, counted_s=counted_s)

    def total(self, deployment: str, outcome: Outcome) -> float:
        """The counter's value (tests and benches read it)."""
        labels = {"deployment": deployment, "outcome": outcome}
        value = self._registry.get_sample_value(PREFIX + "requests_total", labels)
        return value if value is not None else 0.0
