"""How many chats each incident touched: held, retried, migrated and failed during a
deployment's incident, for ``GET /deployments/{id}/history`` (docs/design.md §3.5).

Chats are not events: one per log line would flood the log (a busy deployment ends chats
several times a second) for a figure that only annotates an incident. So the front door's
counts (``keeper.runtime.request_counts``) keep, per deployment and in memory only, the notable
outcomes by the second they ended (``ChatSecond``: a burst of a thousand held chats in one
incident is a few seconds' worth, not a thousand records, so it pushes no older incident out),
and this pure function lays them on the incidents when the history is asked for. A restart
loses them; ``KeptChats.complete_from`` says from when they are whole, and an incident that began
before is not annotated (None: unknown, never a misleading zero).

A chat is counted when it ends, and a held chat ends after its deployment serves again (it is
sent then, and answered), a failed one when its hold is spent: so the seconds up to
``CHAT_TAIL_S`` after an incident's end still count for it, unless the next incident has begun.
Each second's chats go to one incident at most: the last that began before that second ended.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace

from keeper.model.api_models import IncidentChats
from keeper.model.history import Incident
from keeper.model.request_rule import Outcome

# After an incident ends, chats that end within this still count for it: a chat held through it
# is sent the moment its deployment serves again and counted when its answer ends, which for
# most answers (a few hundred tokens at exo's tens of tokens a second) is within a minute. A
# longer answer held through an incident is counted in none.
CHAT_TAIL_S = 60.0
# The outcomes an incident is annotated with: those that say the chat met the incident. ``ok``
# met nothing, and ``cancelled`` and ``rejected`` are the client's or the load's doing.
NOTABLE: tuple[Outcome, ...] = ("held", "retried", "migrated", "failed")


@dataclass(frozen=True, slots=True)  # slots: a service holds up to a day's worth per deployment
class ChatSecond:
    """The notable chats of a deployment that ended in one second, from ``at`` (the start of
    the second, on whatever clock the holder keeps), by outcome."""

    at: float
    held: int = 0
    retried: int = 0
    migrated: int = 0
    failed: int = 0


def one_more(second: ChatSecond, outcome: Outcome) -> ChatSecond:
    """``second`` with one more chat that ended ``outcome`` (the same second for any other
    outcome: only the notable ones are kept)."""
    match outcome:
        case "held":
            return replace(second, held=second.held + 1)
        case "retried":
            return replace(second, retried=second.retried + 1)
        case "migrated":
            return replace(second, migrated=second.migrated + 1)
        case "failed":
            return replace(second, failed=second.failed + 1)
        case _:
            return second


@dataclass(frozen=True)
class KeptChats:
    """What a service holds of a deployment's notable chats, on the wall clock (Unix seconds):
    every one that ended from ``complete_from`` on (the service's start, or later when the
    bound dropped older seconds), by second, oldest first."""

    complete_from: float
    seconds: Sequence[ChatSecond]


def incident_chats(incidents: Sequence[Incident], kept: KeptChats) -> list[IncidentChats | None]:
    """For each of ``incidents`` (in time order, as ``summarize`` gives them), its chats by
    outcome (module doc); None for one that began before ``kept.complete_from``."""
    starts = [incident.start for incident in incidents]
    tallies: list[list[int] | None] = [
        [0, 0, 0, 0] if incident.start >= kept.complete_from else None for incident in incidents
    ]
    for second in kept.seconds:
        # The last incident that began before this second ended.
        index = bisect_left(starts, second.at + 1.0) - 1
        if index < 0:
            continue
        incident, tally = incidents[index], tallies[index]
        if tally is None or (incident.end is not None and second.at > incident.end + CHAT_TAIL_S):
            continue
        tally[0] += second.held
        tally[1] += second.retried
        tally[2] += second.migrated
        tally[3] += second.failed
    return [
        None if t is None else IncidentChats(held=t[0], retried=t[1], migrated=t[2], failed=t[3])
        for t in tallies
    ]


def chats_words(chats: IncidentChats | None) -> str:
    """An incident's chats as an operator reads them: ``12 held, 1 failed`` (the outcomes that
    came, in the order a chat meets them), ``none`` when no chat met it, ``-`` when the service
    cannot say (None: no front door, or restarted since)."""
    if chats is None:
        return "-"
    parts = [
        f"{count} {outcome}"
        for outcome, count in (
            ("held", chats.held),
            ("retried", chats.retried),
            ("migrated", chats.migrated),
            ("failed", chats.failed),
        )
        if count
    ]
    return ", ".join(parts) if parts else "none"
