"""A node's reports, coalesced: the latest of each kind is logged, at a bounded rate.

Every report a node sends becomes an event, and every event batch the router writes is an
fsync. A node that reports as fast as it can (hundreds of NodeInfo a second) would make the log
write that often for nothing: only its latest info, the latest state of each of its runners,
downloads and links mean anything. So a session files each report under what it is about
(``ReportKey``): a newer report replaces the one not yet logged and moves to the end, keeping
the order in which the surviving reports were last sent. The session's writer takes everything
filed at once, at most every ``REPORT_INTERVAL_S`` while reports keep coming; the first report
after a quiet spell goes at once, so an idle cluster's reports wait for nothing.

Apart from the session's loops so the rule (what replaces what, in which order) is tested
without a socket or a clock.
"""

from __future__ import annotations

from collections.abc import Hashable

from keeper.model.events import AnyEvent

# The least time between two writes of one node's reports: 20 a second at most per node, far
# above what any report needs (a runner's phases last seconds, heartbeats are 1 s apart) and far
# below an fsync per report from a node that floods.
REPORT_INTERVAL_S = 0.05
# The most distinct things one node's pending reports may be about (runners, downloads, links)
# before its session waits for them to be written: a real node has a few dozen.
MAX_PENDING_REPORTS = 1_024

ReportKey = Hashable


class ReportBuffer:
    """The reports of one node not yet logged, the latest per key, in order of last arrival."""

    def __init__(self) -> None:
        self._pending: dict[ReportKey, AnyEvent] = {}
        self.replaced = 0  # reports made moot before they were written

    def __len__(self) -> int:
        return len(self._pending)

    @property
    def full(self) -> bool:
        return len(self._pending) >= MAX_PENDING_REPORTS

    def file(self, key: ReportKey, event: AnyEvent) -> None:
        if self._pending.pop(key, None) is not None:
            self.replaced += 1
        self._pending[key] = event

    def take(self) -> list[AnyEvent]:
        events = list(self._pending.values())
        self._pending.clear()
        return events
