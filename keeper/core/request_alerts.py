"""When a deployment's chats start failing, and when they are answered again: the
``requests_failing`` and ``requests_recovered`` notices (docs/design.md §6.9).

Chats are not in the State (a chat per log line would flood the log: §3.5), so this rule is
apart from ``keeper.core.alerts``, which reads changes of the State. It is given what the front
door keeps of each deployment's recent chats (``keeper.runtime.request_counts``: each ended
request with its outcome and when it ended, on the service's monotonic clock), the State the
service acts on (for the model's name and the deployment's status), and a small memory (the
deployments announced failing, and since when); it hands the memory back changed. Nothing here
reads a clock: ``now`` is the records' clock, ``at`` the wall clock for the words, both given.

What an operator woken at 3 a.m. wants is a run of failures, not one flaky chat; and one
notice when it starts and one when it ends, not a storm while a rate hovers at a threshold:

- *Failing*: in the last ``FAILING_WINDOW_S``, at least ``MIN_FAILED`` chats failed and they
  were at least ``MIN_FAILED_SHARE`` of the chats that ended. Only ``failed`` is a failure: a
  ``rejected`` chat was refused by the front door itself (a bad body, too many in flight: the
  client's or the load's doing) and a ``cancelled`` one left by its client; neither is counted
  at all, so neither dilutes the share either. A held, retried or migrated chat was answered.
- *Recovered* (hysteresis): over the longer ``RECOVERY_WINDOW_S``, fewer than ``MIN_FAILED``
  failed or under ``RECOVERED_SHARE`` of the chats did, and the newest chat that ended was
  answered. Silence is not recovery: clients that gave up stop sending, and a deployment whose
  last chat failed stays failing until one is answered.

Each deployment is announced at most once per run: the memory says which are, keyed by the
run's first failed chat (wall clock, Unix seconds), which is also the two notices' id, so a
retry or a restart (the memory is kept on disk) sends the same ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from keeper.core.alerts import TEXT_PREFIX
from keeper.model.notices import (
    AnyNotice,
    RequestsFailing,
    RequestsRecovered,
    clock_utc_of,
    duration_words,
    iso_utc_of,
)
from keeper.model.readiness import deployment_status
from keeper.model.request_rule import Outcome
from keeper.model.request_window import EndedRequest
from keeper.model.state import Deployment, DeploymentId, State

# How far back a run of failures is looked for: a minute, so the first notice comes within a
# minute of the chats failing, and a deployment with a chat every 20 s still has three to judge.
FAILING_WINDOW_S = 60.0
# The fewest failed chats in that minute that make a run: one is a flaky chat (or one client's
# request exo refused, which is counted failed too), two can be one unlucky moment; three in a
# minute, while a normal failover holds chats rather than failing them (§8.6), is a pattern.
MIN_FAILED = 3
# ... and the least share of the chats that ended they must be: a busy deployment answering
# hundreds a minute with a few failures is serving, not failing; one chat in four failing is
# what users notice.
MIN_FAILED_SHARE = 0.25
# The longer stretch the failures must have thinned over before the chats count as answered
# again: three times the failing window, so failures that come in bursts a minute or two apart
# read as one failing stretch, not a pair of notices per burst. At most the counts' own window
# (``WINDOW_S``), which is what the front door keeps.
RECOVERY_WINDOW_S = 180.0
# ... or the share under which the failures that remain are a busy deployment's background.
RECOVERED_SHARE = 0.10
# What a chat failing or answered counts among; ``cancelled`` and ``rejected`` are neither.
JUDGED: frozenset[Outcome] = frozenset({"ok", "held", "retried", "migrated", "failed"})


@dataclass(frozen=True)
class ChatAlertMemory:
    """The deployments announced ``requests_failing`` and not yet recovered: when each run's
    first failed chat ended (Unix seconds; the notices' id)."""

    failing: Mapping[DeploymentId, float] = field(default_factory=dict[DeploymentId, float])


@dataclass(frozen=True)
class Tally:
    """The judged chats (``JUDGED``) of a deployment that ended in a window."""

    chats: int = 0
    failed: int = 0
    first_failed: float | None = None  # when the oldest failed one ended (the records' clock)


def tally(records: Sequence[EndedRequest], now: float, window_s: float) -> Tally:
    """The judged chats that ended after ``now - window_s`` (records oldest first, as counted;
    a record newer than ``now`` ended while the caller looked, and counts)."""
    chats = failed = 0
    first_failed: float | None = None
    for record in reversed(records):
        if record.at <= now - window_s:
            break
        if record.outcome not in JUDGED:
            continue
        chats += 1
        if record.outcome == "failed":
            failed += 1
            first_failed = record.at
    return Tally(chats, failed, first_failed)


def is_failing(run: Tally) -> bool:
    """A run of failures (module doc): enough of them, and a share of the chats."""
    return run.failed >= MIN_FAILED and run.failed >= MIN_FAILED_SHARE * run.chats


def has_recovered(stretch: Tally, records: Sequence[EndedRequest]) -> bool:
    """Few failures over the recovery stretch, and the newest judged chat was answered."""
    thinned = stretch.failed < MIN_FAILED or stretch.failed < RECOVERED_SHARE * stretch.chats
    newest = next((r.outcome for r in reversed(records) if r.outcome in JUDGED), "failed")
    return thinned and newest != "failed"


def chat_notices(
    recent: Mapping[DeploymentId, Sequence[EndedRequest]],
    state: State,
    now: float,
    at: float,
    memory: ChatAlertMemory,
) -> tuple[list[AnyNotice], ChatAlertMemory]:
    """The notices the chats of ``recent``'s deployments call for at ``now`` (the records'
    clock; ``at``: the same moment in Unix seconds), and the memory after them. A deployment
    not in ``recent`` keeps what the memory says; one no longer in ``state`` is forgotten (it
    was deleted), and chats counted under no deployment (``""``) are nobody's to announce."""
    failing = {d: since for d, since in memory.failing.items() if d in state.deployments}
    found: list[AnyNotice] = []
    for deployment_id, records in sorted(recent.items()):
        deployment = state.deployments.get(deployment_id)
        if deployment is None:
            continue
        since = failing.get(deployment_id)
        if since is None:
            run = tally(records, now, FAILING_WINDOW_S)
            if is_failing(run) and run.first_failed is not None:
                since = at - (now - run.first_failed)
                found.append(_failing(deployment, state, run, since, at))
                failing[deployment_id] = since
            continue
        stretch = tally(records, now, RECOVERY_WINDOW_S)
        if has_recovered(stretch, records):
            found.append(_recovered(deployment, records, stretch, since, now, at))
            del failing[deployment_id]
    if failing == memory.failing:
        return found, memory
    return found, ChatAlertMemory(failing)


def status_words(deployment: Deployment, state: State) -> str:
    """The deployment's status as ``GET /deployments`` names it, with placement's reason when
    it cannot be placed (``cant_place: needs 378 GB; ...``)."""
    status = deployment_status(deployment, state)
    if status == "cant_place":
        return f"{status}: {deployment.placement_error}"
    return status


def _failing(
    deployment: Deployment, state: State, run: Tally, since: float, at: float
) -> RequestsFailing:
    model_id = deployment.model_card.model_id
    status = status_words(deployment, state)
    window = duration_words(FAILING_WINDOW_S)
    return RequestsFailing(
        id=f"requests_failing:{deployment.deployment_id}:{iso_utc_of(since)}",
        at=iso_utc_of(at),
        text=f"{TEXT_PREFIX}chats to {model_id} (deployment {deployment.deployment_id}) are "
        f"failing: {run.failed} of {run.chats} failed in the last {window}, the first at "
        f"{clock_utc_of(since)} UTC; its status: {status}",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        failed=run.failed,
        chats=run.chats,
        window_s=FAILING_WINDOW_S,
        since=iso_utc_of(since),
        status=status,
    )


def answered_since_failed(records: Sequence[EndedRequest]) -> tuple[int, float | None]:
    """How many judged chats were answered after the newest failed one, and when that one ended
    (None: none is kept, all of them answered)."""
    answered = 0
    for record in reversed(records):
        if record.outcome == "failed":
            return answered, record.at
        answered += record.outcome in JUDGED
    return answered, None


def _recovered(
    deployment: Deployment,
    records: Sequence[EndedRequest],
    stretch: Tally,
    since: float,
    now: float,
    at: float,
) -> RequestsRecovered:
    model_id = deployment.model_card.model_id
    answered, last = answered_since_failed(records)
    last_failed = at - (now - last) if last is not None else None
    if last_failed is not None:
        after = f"since the last failed one at {clock_utc_of(last_failed)} UTC"
    else:
        after = "with no failed chat on record"
    return RequestsRecovered(
        id=f"requests_recovered:{deployment.deployment_id}:{iso_utc_of(since)}",
        at=iso_utc_of(at),
        text=f"{TEXT_PREFIX}chats to {model_id} (deployment {deployment.deployment_id}) are "
        f"answered again: {answered} answered {after} (failing since {clock_utc_of(since)} "
        f"UTC, {stretch.failed} failed in the last {duration_words(RECOVERY_WINDOW_S)})",
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        since=iso_utc_of(since),
        last_failed=iso_utc_of(last_failed) if last_failed is not None else None,
        answered=answered,
        failed=stretch.failed,
        window_s=RECOVERY_WINDOW_S,
    )
