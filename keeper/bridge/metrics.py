"""The bridge's own families in ``GET /metrics``: whether it can follow exo.

The families every service exports (deployments, nodes, the keeper's step) are built once, in
``keeper.runtime.metrics``; only the bridge reads a stock exo, so whether exo answers and gives a
State to act on (the same two facts as ``/healthz``'s ``exo.reachable`` and
``exo.state_readable``), and how long since each last held, are an extra collector the bridge
adds to its registry. An alert on "exo unreadable" wants the 0/1 gauge; a graph of an outage's
length wants the seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from keeper.runtime.metrics import PREFIX


@dataclass(frozen=True)
class ExoFacts:
    """The bridge's view of exo at one scrape (wall clock, Unix seconds)."""

    reachable: bool
    state_readable: bool
    answered_at: float | None  # exo last answered; None: not since the bridge started
    readable_at: float | None  # exo last gave a State to act on; None: not since start
    now: float
    started_at: float


def _since(moment: float | None, holds: bool, facts: ExoFacts) -> float:
    # 0 while it holds; never held since the start: the whole time since the start.
    if holds:
        return 0.0
    return max(0.0, facts.now - (moment if moment is not None else facts.started_at))


class ExoCollector:
    """``exo_deploy_exo_reachable``, ``..._exo_state_readable`` (0/1) and the seconds since
    each last held."""

    def __init__(self, facts: Callable[[], ExoFacts]) -> None:
        self._facts = facts

    def collect(self) -> Iterator[Metric]:
        facts = self._facts()
        yield GaugeMetricFamily(
            PREFIX + "exo_reachable",
            "1 while exo answers the bridge's reads (whatever its State holds)",
            value=1.0 if facts.reachable else 0.0,
        )
        yield GaugeMetricFamily(
            PREFIX + "exo_state_readable",
            "1 while exo's State can be acted on (the bridge places and deletes nothing else)",
            value=1.0 if facts.state_readable else 0.0,
        )
        yield GaugeMetricFamily(
            PREFIX + "exo_unreachable_seconds",
            "Seconds since exo last answered (0 while it answers)",
            value=_since(facts.answered_at, facts.reachable, facts),
        )
        yield GaugeMetricFamily(
            PREFIX + "exo_state_unreadable_seconds",
            "Seconds since exo last gave a State to act on (0 while it does)",
            value=_since(facts.readable_at, facts.state_readable, facts),
        )
