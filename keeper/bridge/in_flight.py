"""Instances the bridge sent to exo that exo's State does not show yet: when to send each again,
when to give up on it, and why the keeper may not place another meanwhile.

Two facts of exo's code shape these rules (docs/bridge.md, "Elections"):

- exo's master keys instances by id. A ``CreateInstance`` command becomes "the current instances
  plus this one under its id", and only ids the current instances lack become ``InstanceCreated``
  events. POSTing the same instance again is therefore idempotent: however often it arrives, and
  at whichever node's API, it makes that one instance at most.
- exo's API holds every command while its nodes elect a master (``POST /instance`` answers only
  when the election is over, seconds later) and then forwards it. A POST that outlived our
  deadline has not failed: exo may still apply it.

So, per creation (one instance id the keeper placed):

1. It is in flight from its first POST until exo's State shows it, or it is given up.
2. Not shown yet, it is POSTed again, the same body, every ``RESEND_S``: a command lost in a
   master move is recovered with the same id instead of a new placement. While exo does not
   answer at all, it is resent for as long as that lasts; once exo answers, only while the
   keeper's ``PLACEMENT_TIMEOUT`` has not run out.
3. It is given up only once exo *answered* its last POST (so exo is not holding commands: any it
   held were forwarded when it answered), ``APPLY_S`` after that answer, and no sooner than
   ``PLACEMENT_TIMEOUT`` after the first POST, when the keeper stops waiting for it too. A
   creation exo never answers is never given up: it may still land.
4. While a deployment has a creation in flight, the bridge sends no other instance for it, so
   two placements never race (``keeper.bridge.service``).
5. A creation given up is doomed (``keeper.bridge.doomed``) and watched for
   ``LATE_LANDING_WATCH_S``: if it lands after all, after the keeper placed another, the extra
   is deleted.
6. When exo's master changes (``keeper.model.master_change``), every creation not shown is sent
   again at once, not ``RESEND_S`` after its last POST: the new master starts from an empty
   State, and a POST exo held through the election was seen forwarded and lost (a real
   cluster whose master was killed placed its replacement again only 21 s later). The new
   State is read through an API that has already started again, so the POST goes to the new
   master.

Pure: values in, values out, the caller's monotonic ``now``; the service does the calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from keeper.model.constants import PLACEMENT_TIMEOUT

# exo applies an accepted command within a second, and the bridge reads its State every second:
# a creation still not shown this long after a POST was lost (or is held) and is sent again.
RESEND_S = 5.0
# After exo answered a POST, the State shows what it (and any POST exo held before it) created
# within a poll or two; after this long, nothing of that creation is still on its way.
APPLY_S = 2.0
# How long a creation given up is watched, to delete it if it lands after all. exo holds commands
# only while an election runs (seconds); an exo holding them for minutes is down, and what it
# held is gone with it.
LATE_LANDING_WATCH_S = 600.0


@dataclass(frozen=True)
class Creation:
    """One instance POSTed to exo, not yet shown by exo's State."""

    deployment_id: str
    body: Mapping[str, Any]  # exactly what is POSTed, every time
    first_sent_at: float
    last_sent_at: float
    sends: int = 1
    answered_at: float | None = None  # exo's last answer to a POST of it (2xx or 4xx)
    unanswered_since: float | None = None  # set while POSTs of it go unanswered
    master_changed: bool = False  # exo's master changed since its last POST (rule 6)


def first_send(deployment_id: str, body: Mapping[str, Any], now: float) -> Creation:
    return Creation(deployment_id, body, first_sent_at=now, last_sent_at=now)


def resent(creation: Creation, now: float) -> Creation:
    return replace(creation, last_sent_at=now, sends=creation.sends + 1, master_changed=False)


def master_changed(creation: Creation) -> Creation:
    """exo's master changed before the State showed it (rule 6): what its POSTs reached may
    be gone with the old master."""
    return replace(creation, master_changed=True)


def answered(creation: Creation, now: float) -> Creation:
    """exo answered the last POST (accepted it, or refused it)."""
    return replace(creation, answered_at=now, unanswered_since=None)


def unanswered(creation: Creation) -> Creation:
    """The last POST got no answer (a timeout, a lost connection): exo may still apply it."""
    since = creation.unanswered_since
    return replace(creation, unanswered_since=creation.last_sent_at if since is None else since)


def resend_due(creation: Creation, now: float) -> bool:
    """Whether to POST it again now (rules 2 and 6); the caller knows it is not shown."""
    if creation.master_changed:
        return True
    if now - creation.last_sent_at < RESEND_S:
        return False
    if creation.unanswered_since is not None:
        return True
    # Stop early enough that the last answer is settled when the keeper's wait runs out.
    return now + APPLY_S <= creation.first_sent_at + PLACEMENT_TIMEOUT


def given_up(creation: Creation, now: float) -> bool:
    """Whether it can no longer land on its own (rule 3); the caller knows it is not shown."""
    if creation.unanswered_since is not None or creation.answered_at is None:
        return False
    return (
        now >= creation.first_sent_at + PLACEMENT_TIMEOUT and now >= creation.answered_at + APPLY_S
    )


def detail(instance_id: str, creation: Creation, now: float) -> str:
    """What the deployment waits for, in words."""
    short = instance_id[:8]
    if creation.unanswered_since is not None:
        waited = now - creation.unanswered_since
        return (
            f"instance {short}: exo has not answered POST /instance for {waited:.0f} s "
            "(an election?); sending the same instance again, nothing else meanwhile"
        )
    return f"instance {short} sent to exo; waiting for exo's State to show it"
