"""A master that stops speaking: said once in the timeline, shown in the header, and its end.

A live master says something at least once a second: its stream's keepalive
(``keeper.sim.master.dashboard_stream.KEEPALIVE_S``) or a poll's answer (``POLL_INTERVAL_S``). When
it stops (frozen, or the link cut before the connection notices, ``STREAM_SILENCE_S`` later),
every node's reports stop reaching us at once, and it is the master that is quiet, not the
nodes. The dashboard then judges each node as of the master's last word
(``MasterClock.heard_at``) and says that it does, instead of telling each node silent and then
each one reporting again. When it speaks again its first word (often the keepalive, overdue)
comes before the reports it held back, so the nodes stay judged as of the word before the quiet
for ``CATCH_UP_S`` more (``LastWord``). Losing the connection says more and supersedes this:
the quiet is then forgotten without a line of its own (``connection_changes`` tells the loss
and the return).

Pure: the time comes in as ``now``, the last word as ``heard_at``. Why: docs/design.md §9.6.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exo_deploy_tui.model.format import clock_time, precise_duration
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.timeline import TimelineEntry

# Three words missed in a row (one a second) is not a late packet: the master is quiet. Well
# below the 8 s after which a node is told silent (keeper.model.liveness.SILENT_AFTER_S), and
# below fast failover's 3 s suspect default, so the master's quiet is said before either could
# be misread from it.
QUIET_AFTER_S = 3.0
# After a quiet, how long the master is given to relay the node reports it held back before its
# nodes are judged by its new word: two of a node's one-second reports, so a node that reported
# meanwhile is never told silent for the master's quiet, and one that did not is told soon after.
CATCH_UP_S = 2.0


def quiet_for(heard_at: float | None, now: float) -> float | None:
    """How long the master has said nothing, once that is ``QUIET_AFTER_S`` or more; else
    None (it speaks, or has not spoken yet)."""
    if heard_at is None:
        return None
    quiet = now - heard_at
    return quiet if quiet >= QUIET_AFTER_S else None


@dataclass
class LastWord:
    """When the master last said anything, and, after a quiet, the word before it while it
    catches up: what ``MasterClock`` bounds the nodes' quiet by."""

    heard_at: float | None = None
    word_before_quiet: float | None = None
    catching_up_until: float | None = None

    def heard(self, now: float) -> None:
        """The master spoke at ``now``."""
        if self.heard_at is not None and quiet_for(self.heard_at, now) is not None:
            self.word_before_quiet = self.heard_at
            self.catching_up_until = now + CATCH_UP_S
        self.heard_at = now


class MasterQuiet:
    """The quiet told, if one is: the master's last word before it, so its end is told once."""

    def __init__(self) -> None:
        self._told: float | None = None

    def check(self, heard_at: float | None, *, lost: bool, now: float) -> list[TimelineEntry]:
        """The master's quiet begun (told once) or ended since the last check."""
        if lost:
            self._told = None  # the loss of the connection is told instead, and its end
            return []
        if self._told is not None and heard_at is not None and heard_at > self._told:
            quiet = precise_duration(heard_at - self._told)
            self._told = None
            return [TimelineEntry(heard_at, "good", f"the master spoke again after {quiet}")]
        if self._told is None and heard_at is not None and quiet_for(heard_at, now) is not None:
            self._told = heard_at
            said = precise_duration(now - heard_at)
            text = (
                f"no word from the master for {said}: its nodes are judged as of "
                f"{clock_time(heard_at)}, its last word"
            )
            return [TimelineEntry(now, "warn", text)]
        return []


@dataclass
class MasterWord:
    """The master's word as the model keeps it: when it last spoke (``LastWord``), the clock
    the nodes are judged by, and its quiet, told once (``MasterQuiet``)."""

    last: LastWord = field(default_factory=LastWord)
    _quiet: MasterQuiet = field(default_factory=MasterQuiet)

    def heard(self, now: float) -> None:
        self.last.heard(now)

    def clock(self, offset_s: float, stale_since: float | None) -> MasterClock:
        """The master's clock as we know it: ``offset_s``, bounded by its word and the loss."""
        last = self.last
        return MasterClock(
            offset_s, stale_since, last.heard_at, last.word_before_quiet, last.catching_up_until
        )

    def check(self, *, lost: bool, now: float) -> list[TimelineEntry]:
        """What the timeline says of the master's quiet since the last check."""
        return self._quiet.check(self.last.heard_at, lost=lost, now=now)

    def quiet_s(self, now: float, *, lost: bool) -> float | None:
        """How long the master has been quiet, for the header; None while it speaks or once
        the connection is lost (the header says that instead)."""
        return None if lost else quiet_for(self.last.heard_at, now)
