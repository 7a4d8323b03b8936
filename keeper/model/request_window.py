"""A deployment's recent chats summed for ``GET /deployments`` (docs/design.md §8.6).

Pure, so the bridge, our master and the TUI's reading of it share one sum: the requests that
ended in the last window, their rate, failures, outcomes and 95th-percentile time to first
token. The shell (``keeper.runtime.request_counts``) keeps the records and the clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from keeper.model.api_models import RequestsView
from keeper.model.request_rule import OUTCOMES, Outcome

# What ``GET /deployments`` sums each deployment's requests over: long enough to show a burst
# of failures after an incident an operator is reading about, short enough to be "now".
WINDOW_S = 300.0
# A service that began counting less than a window ago has its rate over the time it counted,
# not the whole window (a minute-old bridge serving 10 chats a second read 2 a second); but over
# no less than this, or its first chats would read as a burst.
MIN_RATE_SPAN_S = 10.0


@dataclass(frozen=True)
class EndedRequest:
    """One request as counted when it ended."""

    at: float  # when it ended (monotonic seconds)
    outcome: Outcome
    ttft_s: float | None  # time to first token, None when it got none


def requests_view(
    records: Sequence[EndedRequest],
    now: float,
    window_s: float = WINDOW_S,
    counted_s: float | None = None,
) -> RequestsView | None:
    """The requests that ended in the last ``window_s`` summed: the rate per second, the
    failures, how many ended each way, the 95th percentile of time to first token (nearest
    rank); None when there were none. ``counted_s``: how long the service has been counting
    (None: longer than the window); a shorter count is the window (and the rate's span), but
    never under MIN_RATE_SPAN_S."""
    if counted_s is not None and counted_s < window_s:
        window_s = max(MIN_RATE_SPAN_S, counted_s)
    kept = [record for record in records if now - window_s < record.at <= now]
    if not kept:
        return None
    ttfts = sorted(record.ttft_s for record in kept if record.ttft_s is not None)
    p95 = ttfts[max(0, math.ceil(0.95 * len(ttfts)) - 1)] if ttfts else None
    outcomes = {name: sum(1 for r in kept if r.outcome == name) for name in OUTCOMES}
    return RequestsView(
        window_s=window_s,
        rate=len(kept) / window_s,
        errors=outcomes["failed"],
        p95_ttft_s=p95,
        outcomes={name: count for name, count in outcomes.items() if count},
    )
