"""What a change of the connection to the master does to the dashboard's view of it.

One rule, pure: the connection the model holds after a ``ConnectionUpdate`` and what the
timeline says of it. Losing the master is said once, when data stops arriving (``stale_since``
is set then and kept through the retries that follow, so "stale for 40 s" counts from the loss,
not from the last retry); getting it back is said with how long it was lost and how it is read
now. Before the first snapshot nothing is said: there was nothing to lose.
"""

from __future__ import annotations

from exo_deploy_tui.model.format import precise_duration
from exo_deploy_tui.model.rows import Connection
from exo_deploy_tui.model.timeline import TimelineEntry
from exo_deploy_tui.model.updates import ConnectionUpdate


def connection_changed(
    old: Connection, update: ConnectionUpdate, now: float, *, has_data: bool
) -> tuple[Connection, list[TimelineEntry]]:
    """The connection after ``update``, and the timeline's entries about the change."""
    if update.mode in ("live", "polling"):
        entries: list[TimelineEntry] = []
        if old.stale_since is not None and has_data:
            lost_for = precise_duration(now - old.stale_since)
            how = "live" if update.mode == "live" else "polling"
            again = "readable" if old.mode == "unreadable" else "reachable"
            entries.append(
                TimelineEntry(now, "good", f"master {again} again after {lost_for} ({how})")
            )
        return Connection(update.mode, update.detail), entries
    stale_since = old.stale_since
    entries = []
    if stale_since is None and has_data:
        stale_since = now
        detail = f": {update.detail}" if update.detail else ""
        lost = "cannot read the master" if update.mode == "unreadable" else "lost the master"
        entries.append(TimelineEntry(now, "error", f"{lost}{detail}"))
    return Connection(update.mode, update.detail, update.retry_in_s, stale_since), entries
