"""Alert notices: the bodies the master and the bridge POST to their webhooks (docs/design.md,
"Alert webhooks").

One pydantic model per kind, told apart by ``kind`` (a plain string, so a receiver written in any
language switches on one field). Every notice carries:

- ``id``: an idempotency key made of the facts that make the notice (kind, deployment or node,
  the time the State gives for it), never of the moment it was sent, so the same notice has the
  same id across retries and restarts; it is also sent as the ``Idempotency-Key`` header, and a
  receiver drops an id it has seen (delivery is at least once);
- ``at``: when the service saw the change (ISO-8601 UTC);
- ``text``: one readable line, which Slack-, Discord- and ntfy-style endpoints show as it is.

snake_case keys: these are our own API's bodies, as the requests of ``keeper.model.api_models``,
not exo's State. Times are written with ``iso_utc_of`` from plain seconds: the data model reads
no clock and imports no date library, so the arithmetic is spelled out here once.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from keeper.model.state import RecoveryPhases


class NoticeBody(BaseModel):
    """What every notice has. Unknown keys are ignored when read back (the outbox, a newer
    sender's receiver)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    at: str  # ISO-8601 UTC: when the service saw it
    text: str  # one readable line


class IncidentOpened(NoticeBody):
    """A deployment stopped serving (``keeper.model.history``'s incidents, with their cause)."""

    kind: Literal["incident_opened"] = "incident_opened"
    deployment_id: str
    model_id: str
    cause: str
    start: str  # ISO-8601 UTC


class IncidentResolved(NoticeBody):
    """The deployment serves again: the incident's whole length."""

    kind: Literal["incident_resolved"] = "incident_resolved"
    deployment_id: str
    model_id: str
    cause: str
    start: str
    end: str
    downtime_s: float
    # Where the down time went (seconds: detected, placed, downloaded, loaded; they add up to
    # downtime_s); None for an incident with no recovery to tell (docs/design.md 3.5).
    phases: RecoveryPhases | None = None
    # A broken instance's problem when one caused it (the cause names it: docs/design.md §5.19).
    problem: str | None = None


class CantPlace(NoticeBody):
    """The deployment's status went ``cant_place`` (``keeper.model.readiness``): placement said
    why nothing can hold it."""

    kind: Literal["cant_place"] = "cant_place"
    deployment_id: str
    model_id: str
    reason: str
    # When its incident under way began (it stopped serving, or was created when placement
    # explained why it cannot start); None while no record says so yet.
    down_since: str | None


class ServingAgain(NoticeBody):
    """A deployment announced ``cant_place`` serves again."""

    kind: Literal["serving_again"] = "serving_again"
    deployment_id: str
    model_id: str
    since: str  # when it served again


class DrainFinished(NoticeBody):
    """Nothing runs on the drained node any more (``NodeDrainEnded``); it stays cordoned."""

    kind: Literal["drain_finished"] = "drain_finished"
    node: str
    started: str  # when the drain began (ISO-8601 UTC), as the drain records it


class DrainStuck(NoticeBody):
    """The drain cannot move an instance off the node, in the placement's numbers
    (``keeper.core.draining.stuck_note``)."""

    kind: Literal["drain_stuck"] = "drain_stuck"
    node: str
    started: str
    reason: str


class InstanceUnhealthy(NoticeBody):
    """An instance of the deployment's model looks alive but serves nothing (docs/design.md
    §5.19): the problem and why, in words."""

    kind: Literal["instance_unhealthy"] = "instance_unhealthy"
    deployment_id: str
    model_id: str
    instance_id: str
    problem: str  # stalled, hollow, unfulfilled or failing
    why: str


class RequestsFailing(NoticeBody):
    """A deployment's chats through the front door fail in a run (docs/design.md §6.9,
    ``keeper.core.request_alerts``): how many of its chats failed over what time, since when,
    and the deployment's status in the State the service acts on."""

    kind: Literal["requests_failing"] = "requests_failing"
    deployment_id: str
    model_id: str
    failed: int  # chats that failed in the window
    # Chats that ended in the window, failed ones included; the client's cancellations and the
    # front door's own rejections are not the cluster's doing and are left out.
    chats: int
    window_s: float
    since: str  # the run's first failed chat (ISO-8601 UTC): the notice's id
    status: str  # the deployment's status, with placement's reason when it cannot be placed


class RequestsRecovered(NoticeBody):
    """The chats of a deployment announced ``requests_failing`` are answered again: a chat was
    answered after the last failure, and the failures of the last window are few."""

    kind: Literal["requests_recovered"] = "requests_recovered"
    deployment_id: str
    model_id: str
    since: str  # when the failing began: its requests_failing's ``since`` (and id)
    # The newest failed chat the service still holds (ISO-8601 UTC); None when it holds none
    # (it restarted while the chats were failing: the chats are counted in memory only).
    last_failed: str | None
    answered: int  # chats answered since the newest failed one (at least one)
    failed: int  # chats failed in the last ``window_s``: fewer than a run
    window_s: float


class TestNotice(NoticeBody):
    """``exo-deploy webhooks test``: a sample, to see that an endpoint takes our notices."""

    __test__ = False  # not a pytest test class, whatever its name says
    kind: Literal["test"] = "test"


AnyNotice = (
    IncidentOpened
    | IncidentResolved
    | CantPlace
    | ServingAgain
    | DrainFinished
    | DrainStuck
    | InstanceUnhealthy
    | RequestsFailing
    | RequestsRecovered
) | TestNotice
Notice = Annotated[AnyNotice, Field(discriminator="kind")]
NOTICE_ADAPTER: TypeAdapter[AnyNotice] = TypeAdapter(Notice)

NoticeKind = Literal[
    "incident_opened",
    "incident_resolved",
    "cant_place",
    "serving_again",
    "drain_finished",
    "drain_stuck",
    "instance_unhealthy",
    "requests_failing",
    "requests_recovered",
    "test",
]

_DAY_S = 86_400


def iso_utc_of(seconds: float) -> str:
    """Unix seconds as ISO-8601 UTC to the millisecond (``2026-12-01T12:03:04.250Z``).

    The civil date from the day count is Howard Hinnant's ``civil_from_days``, valid for every
    date of the proleptic Gregorian calendar."""
    millis = round(seconds * 1000)
    days, in_day_ms = divmod(millis, _DAY_S * 1000)
    in_day, ms = divmod(in_day_ms, 1000)
    shifted = days + 719_468
    era = shifted // 146_097
    day_of_era = shifted - era * 146_097
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    month_index = (5 * day_of_year + 2) // 153
    day = day_of_year - (153 * month_index + 2) // 5 + 1
    month = month_index + 3 if month_index < 10 else month_index - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return f"{year:04d}-{month:02d}-{day:02d}T{clock_utc_of(in_day)}.{ms:03d}Z"


# An ISO-8601 date and time with its zone, as exo writes ``lastSeen``
# (``2026-12-01T09:39:22.568449Z``) and as ``iso_utc_of`` writes; a space may stand for the T.
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(\.\d+)?"
    r"(?:(Z)|([+-])(\d{2}):?(\d{2}))"
)


def unix_seconds_of(text: str | None) -> float | None:
    """An ISO-8601 time with its zone as Unix seconds (``iso_utc_of``'s inverse, to the
    microsecond); None for no text, one that does not parse, or a time with no zone (it could
    be any clock's). The day count is Howard Hinnant's ``days_from_civil``."""
    found = _ISO.fullmatch(text.strip()) if text is not None else None
    if found is None:
        return None
    year, month, day, hour, minute, second = (int(found.group(i)) for i in range(1, 7))
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60 and second < 61):
        return None
    shifted_year = year - 1 if month <= 2 else year
    era = shifted_year // 400
    year_of_era = shifted_year - era * 400
    day_of_year = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    day_of_era = year_of_era * 365 + year_of_era // 4 - year_of_era // 100 + day_of_year
    days = era * 146_097 + day_of_era - 719_468
    fraction = float(found.group(7)) if found.group(7) else 0.0
    offset = 0
    if found.group(8) is None:
        sign = 1 if found.group(9) == "+" else -1
        offset = sign * (int(found.group(10)) * 3600 + int(found.group(11)) * 60)
    return days * _DAY_S + hour * 3600 + minute * 60 + second + fraction - offset


def clock_utc_of(seconds: float) -> str:
    """The time of day of Unix seconds, UTC, as ``12:03:04``: what a notice's text shows."""
    in_day = int(seconds // 1) % _DAY_S
    hours, rest = divmod(in_day, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}"


def phases_words(phases: RecoveryPhases) -> str:
    """Where a recovery's time went, as the timeline says it: ``detected 8.0 s, placed 0.05 s,
    loaded 3.2 s``; a phase of no time (a model already on disk) is left out, and a recovery
    that took none at all says ``at once``."""
    parts = [
        f"{name} {_short_seconds(seconds)}"
        for name, seconds in (
            ("detected", phases.detected),
            ("placed", phases.placed),
            ("downloaded", phases.downloaded),
            ("loaded", phases.loaded),
        )
        if seconds > 0
    ]
    return ", ".join(parts) if parts else "at once"


def _short_seconds(seconds: float) -> str:
    """A phase's length: two decimals under a second (``0.05 s``), one under a minute
    (``3.2 s``), then as ``duration_words`` says it."""
    if seconds < 1:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return duration_words(seconds)


def duration_words(seconds: float) -> str:
    """A downtime as a person says it: ``42 s``, ``3 min 5 s``, ``2 h 10 min``."""
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
