"""The master's times on our clock: its ISO dates read, and the difference between the clocks.

The master dates what it says (a node's ``lastSeen``, a timer's ``nextAttemptAt``, a serving
record) on its own clock; the dashboard counts on its own. Every part of the model that turns one
into the other goes through ``MasterClock``, a value the model rebuilds from what it knows now
(the offset the HTTP Date header measured, when the master last said anything, and when it was
lost, if it is), so the parts hold no copy of any of them that could fall out of step.

How long a node has been quiet is known only up to the master's last word: a master that stops
speaking (frozen, or its link cut before the connection notices) stops relaying every node's
reports at once, and judging those nodes by our clock would call each of them silent when it is
the master that is. So every silence is measured to ``heard_at`` at the latest (docs/design.md
§9.6, "The master's last word").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# A master whose clock differs from ours by less than this is taken as in step: the HTTP Date
# header that measures the difference has a resolution of one second.
CLOCK_SKEW_IGNORED_S = 2.0


def parse_iso(text: str | None) -> float | None:
    """An ISO date with its zone as epoch seconds; None for none, or one that cannot be read."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return None  # a time without a zone cannot be placed on our clock
    return parsed.timestamp()


def offset_taken(measured: float) -> float:
    """The offset the model uses for one ``measured`` (master minus ours): none within the
    header's resolution (``CLOCK_SKEW_IGNORED_S``)."""
    return measured if abs(measured) >= CLOCK_SKEW_IGNORED_S else 0.0


@dataclass(frozen=True)
class MasterClock:
    """The master's clock as seen from ours: ``offset_s`` (its clock minus ours), ``heard_at``
    (when it last said anything, our clock) and, while it is out of reach, ``stale_since``
    (when we lost it, our clock)."""

    offset_s: float = 0.0
    stale_since: float | None = None
    heard_at: float | None = None
    # A master that speaks again after a quiet first relays the node reports it held back: until
    # ``catching_up_until`` the cluster is known only as of its word before the quiet
    # (master_quiet.LastWord).
    word_before_quiet: float | None = None
    catching_up_until: float | None = None

    def known_until(self, now: float) -> float:
        """The latest moment of ours we know the cluster at: ``now``, or the master's last word
        (its word before a quiet while it catches up), or when we lost it, whichever is
        earliest."""
        catching_up = self.catching_up_until is not None and now < self.catching_up_until
        word = self.word_before_quiet if catching_up else self.heard_at
        for bound in (word, self.stale_since):
            if bound is not None:
                now = min(now, bound)
        return now

    def ours(self, text: str | None) -> float | None:
        """A date the master wrote, on our clock; None when it cannot be read."""
        at = parse_iso(text)
        return None if at is None else at - self.offset_s

    def silent_since(self, at: float, now: float) -> float:
        """How long since ``at`` (Unix seconds on the master's clock: a verdict's
        ``last_heard`` or ``since``), never negative, known no further than the moment we lost
        the master (as ``quiet_for``)."""
        return max(0.0, self.known_until(now) + self.offset_s - at)

    def quiet_for(self, last_seen: str | None, now: float) -> float | None:
        """How long since a node was last heard of (its ``lastSeen``), never negative. While
        the master is quiet or out of reach we know nothing newer than its last word (or the
        moment we lost it): judging nodes by our clock would call every one of them silent."""
        seen = parse_iso(last_seen)
        if seen is None:
            return None
        return max(0.0, self.known_until(now) + self.offset_s - seen)
