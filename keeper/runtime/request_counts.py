"""Every chat through the front door counted (docs/design.md §8.6): in ``/metrics`` and, for
the last ``WINDOW_S``, in each deployment's ``GET /deployments`` view.

A shell of its own beside ``keeper.runtime.front_door``: the front door decides what happens to
a request, this module only records how it ended; the sum is the pure
``keeper.model.request_window``.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Histogram

from keeper.model.api_models import RequestsView
from keeper.model.request_rule import Outcome
from keeper.model.request_window import WINDOW_S, EndedRequest, requests_view
from keeper.runtime.metrics import PREFIX

# Time to first token, seconds: a warm instance answers in well under a second, a held request
# in up to the hold (30 s), a long prompt's prefill in tens of seconds.
TTFT_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


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
            "first token), migrated (continued after a cut), failed, cancelled (client left)",
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

    def count(self, deployment: str, outcome: Outcome, ttft_s: float | None, at: float) -> None:
        self._total.labels(deployment, outcome).inc()
        if ttft_s is not None:
            self._ttft.labels(deployment).observe(ttft_s)
        recent = self._recent.setdefault(deployment, deque())
        recent.append(EndedRequest(at, outcome, ttft_s))
        while recent and recent[0].at <= at - WINDOW_S:
            recent.popleft()

    def view(self, deployment: str, now: float) -> RequestsView | None:
        return requests_view(list(self._recent.get(deployment, ())), now)

    def total(self, deployment: str, outcome: Outcome) -> float:
        """The counter's value (tests and benches read it)."""
        labels = {"deployment": deployment, "outcome": outcome}
        value = self._registry.get_sample_value(PREFIX + "requests_total", labels)
        return value if value is not None else 0.0
