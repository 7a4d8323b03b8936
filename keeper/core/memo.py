"""The keeper's memory of one deployment, and the pure rules that update and read it.

A memo is a frozen value and ``observe`` returns a new one, so the keeper can show an operator
what its next step would decide (``Keeper.timers``) by observing a copy: looking never changes
what the keeper does. The memo holds only what the State cannot tell: the placement still on its
way, whether each of its own instances was ever ready, failures in a row and the waits they
imply, and what its own events will change once applied (the placement error it last sent, the
replica count it last set, the instances it is removing), the priority it was refused on, and
whether it lost an instance to a higher priority (its later errors say so).

Its size is bounded by the deployment's own instances in the State (at most ``MAX_REPLICAS``
plus the ones on their way out), never by history: ids leave the memo as soon as the State no
longer shows them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from keeper.core.view import ClusterSignature
from keeper.model.api_models import WaitReason
from keeper.model.constants import FIRST_BACKOFF, MAX_BACKOFF, PLACEMENT_TIMEOUT, UNPLACEABLE_RETRY
from keeper.model.readiness import instance_is_ready
from keeper.model.state import Deployment, InstanceId, State

# Doublings past this many add nothing (10 s * 2**6 already exceeds MAX_BACKOFF); the cap keeps
# ``2 ** n`` a small number however long a deployment keeps failing.
MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class Watched:
    """One of the keeper's own instances as the state shows it, and whether it was ever ready."""

    instance_id: InstanceId
    ready: bool = False


@dataclass(frozen=True)
class SentError:
    """The placement error carried by the last error-changing event this keeper sent
    (DeploymentPlacementFailed, or DeploymentPlaced clearing it): the state holds it once that
    event is applied, and until then the state's own error is out of date."""

    error: str | None


@dataclass(frozen=True)
class DeploymentMemo:
    # The instance this keeper placed and is waiting to see in the state, and when it placed it.
    # (At most one per deployment: docs/design.md §5.11.)
    in_flight: InstanceId | None = None
    placed_at: float = 0.0
    # The keeper's own instances the state shows, oldest first.
    watched: tuple[Watched, ...] = ()
    # Instances lost before they were ready, in a row, and the wait that follows.
    failures: int = 0
    backoff_until: float | None = None
    # Set after a failed placement: the cluster it failed on, and when to try anyway.
    unplaceable_on: ClusterSignature | None = None
    retry_at: float = 0.0
    sent: SentError | None = None
    # The replica count of the last DeploymentScaled this keeper sent (the state holds it once
    # that event is applied), or None: the deployment's own count is current.
    target: int | None = None
    # Own instances this keeper removed when scaling down, until the state no longer shows them
    # (or, for one still in flight, until it has come and gone): losing them is no failure, and
    # they are neither watched again nor removed twice.
    retiring: frozenset[InstanceId] = frozenset()
    # The priority and preempt flag the deployment had when its placement last failed: either
    # changed is a reason to try again at once (docs/design.md §5.13).
    ranked: tuple[int, bool] | None = None
    # Why the deployment lost an instance to a higher priority ("preempted by <model>"), until it
    # is placed again: its later placement errors say so first.
    preempted: str | None = None


FRESH = DeploymentMemo()


def backoff_delay(failures: int) -> float:
    """The wait after ``failures`` placements in a row were lost before ready: 10, 20, 40, 60."""
    return min(FIRST_BACKOFF * 2 ** min(failures - 1, MAX_DOUBLINGS), MAX_BACKOFF)


def _lost_before_ready(memo: DeploymentMemo, now: float) -> DeploymentMemo:
    failures = memo.failures + 1
    return replace(memo, failures=failures, backoff_until=now + backoff_delay(failures))


def wanted(memo: DeploymentMemo, deployment: Deployment) -> int:
    """The replica count the state holds once the keeper's events so far are applied."""
    return deployment.replicas if memo.target is None else memo.target


def recorded(deployment: Deployment) -> tuple[InstanceId, ...]:
    """The keeper's placements the deployment records, oldest first: its durable list, then the
    instance it names when the list does not hold it (a deployment written before the list)."""
    named = deployment.instance_id
    record = deployment.placed_instance_ids
    if named is None or named in record:
        return record
    return (named, *record)


def observe(
    memo: DeploymentMemo, deployment: Deployment, state: State, now: float
) -> DeploymentMemo:
    """Bring the memo up to date with what the state now shows (pure)."""
    instances = state.instances
    # 1. The placement on its way: arrived, arrived and already gone, or given up on. One the
    # keeper removed while it was on its way is neither watched nor a failure.
    in_flight = memo.in_flight
    if in_flight is not None:
        retiring = in_flight in memo.retiring
        if in_flight in instances:
            watched = memo.watched if retiring else (*memo.watched, Watched(in_flight))
            memo = replace(memo, in_flight=None, watched=watched)
        elif deployment.instance_id == in_flight:
            memo = replace(memo, in_flight=None)
            if not retiring:
                memo = _lost_before_ready(memo, now)
        elif now >= memo.placed_at + PLACEMENT_TIMEOUT:
            memo = replace(memo, in_flight=None)  # never arrived: not a failure
    # 2. Watched instances that vanished: each a failure unless it had been ready (which
    # already ended the failures in a row), and then the next placement is due at once.
    for w in memo.watched:
        if w.instance_id not in instances:
            memo = _without_vanished(memo, instances, now)
            break
    # 3. Adopt the keeper's instances the deployment records (a new master starts with empty
    # memory, and the record is how it knows them).
    adopted = _unknown_recorded(memo, deployment, instances)
    if adopted:
        memo = replace(memo, watched=(*memo.watched, *adopted))
    # 4. Readiness of the watched instances; once one is ready, the failures in a row are over.
    for w in memo.watched:
        if not w.ready and instance_is_ready(instances[w.instance_id], state):
            memo = _with_readiness(memo, state)
            break
    # 5. A new priority or preempt flag is a reason to try again, like a changed cluster. (No
    # mutation of the guard: without it the replace leaves a memo that was never refused as it
    # is, only slower.)
    if memo.unplaceable_on is not None and _reranked(memo, deployment):  # pragma: no mutate
        memo = replace(memo, unplaceable_on=None)
    # 6. Removed instances are forgotten once the state no longer shows them.
    if memo.retiring:
        retiring = frozenset(i for i in memo.retiring if i in instances or i == memo.in_flight)
        memo = replace(memo, retiring=retiring)
    return memo


# observe's steps, each taken only when its loop above found something to do: a steady step
# (nothing arrived, vanished or became ready) builds no new memo, which keeps the keeper's step
# on a cluster at rest a few microseconds per deployment (docs/design.md §5.9).


def _without_vanished(
    memo: DeploymentMemo, instances: Mapping[InstanceId, object], now: float
) -> DeploymentMemo:
    kept = tuple(w for w in memo.watched if w.instance_id in instances)
    lost = [w for w in memo.watched if w.instance_id not in instances and not w.ready]
    memo = replace(memo, watched=kept)
    for _ in lost:
        memo = _lost_before_ready(memo, now)
    return memo


def lost_with_master(
    memo: DeploymentMemo, instances: Mapping[InstanceId, object]
) -> DeploymentMemo:
    """The memo once exo's master changed (``keeper.model.master_change``): the watched
    instances the new master's State lacks went with the old master, whatever their placement
    did, so none counts as a failure (``observe`` would back off after one lost before ready)
    and the deployment is placed again at once, as after a node's failover (docs/design.md
    §5.4)."""
    return replace(memo, watched=tuple(w for w in memo.watched if w.instance_id in instances))


def _knows(memo: DeploymentMemo, instance_id: InstanceId) -> bool:
    """Whether the memo watches the instance or is removing it."""
    if instance_id in memo.retiring:
        return True
    # A loop, not any(): this runs for every deployment at every step, and a generator costs
    # more than the rest of a steady observe.
    for w in memo.watched:  # noqa: SIM110
        if w.instance_id == instance_id:
            return True
    return False


def _unknown_recorded(
    memo: DeploymentMemo, deployment: Deployment, instances: Mapping[InstanceId, object]
) -> tuple[Watched, ...]:
    """The recorded instances the state shows that the memo neither watches, removes nor has
    on its way; a loop that builds nothing in the usual case, where there are none."""
    found: tuple[Watched, ...] = ()
    for i in recorded(deployment):
        if i in instances and i != memo.in_flight and not _knows(memo, i):
            found = (*found, Watched(i))
    return found


def _reranked(memo: DeploymentMemo, deployment: Deployment) -> bool:
    """Whether the deployment's priority or preempt flag changed since its placement failed."""
    return memo.ranked != (deployment.priority, deployment.preempt)


def _with_readiness(memo: DeploymentMemo, state: State) -> DeploymentMemo:
    instances = state.instances
    return replace(
        memo,
        watched=tuple(
            Watched(
                w.instance_id,
                ready=w.ready or instance_is_ready(instances[w.instance_id], state),
            )
            for w in memo.watched
        ),
        failures=0,
    )


def reported_error(memo: DeploymentMemo, deployment: Deployment) -> str | None:
    """The placement error the state holds once the keeper's events so far are applied."""
    return deployment.placement_error if memo.sent is None else memo.sent.error


def waiting(
    memo: DeploymentMemo, signature: ClusterSignature, now: float
) -> tuple[WaitReason, float] | None:
    """Why an observed deployment with no instance must not be placed yet, and until when."""
    busy_until = busy(memo, now)
    if busy_until is not None:
        return busy_until
    if memo.unplaceable_on == signature and now < memo.retry_at:
        return "unplaceable_retry", memo.retry_at
    return None


def busy(memo: DeploymentMemo, now: float) -> tuple[WaitReason, float] | None:
    """Why the deployment may place nothing at all now, whatever the cluster: its placement on
    its way (one at a time), or the backoff after losing one before it was ready. A drain's
    move waits on these only: it is not short of instances, so no refusal of its own holds it."""
    if memo.in_flight is not None:
        return "placement_in_flight", memo.placed_at + PLACEMENT_TIMEOUT
    if memo.backoff_until is not None and now < memo.backoff_until:
        return "backoff", memo.backoff_until
    return None


def placed(memo: DeploymentMemo, instance_id: InstanceId, now: float) -> DeploymentMemo:
    # DeploymentPlaced clears the placement error; the cluster that failed before is forgotten
    # (its retry time means nothing without it).
    return replace(
        memo,
        in_flight=instance_id,
        placed_at=now,
        unplaceable_on=None,
        sent=SentError(None),
        preempted=None,
    )


def scaled(memo: DeploymentMemo, replicas: int, removed: tuple[InstanceId, ...]) -> DeploymentMemo:
    """After DeploymentScaled (which clears the placement error) and the removal of ``removed``:
    the new count is a reason to try at once, and the removed instances are no longer watched."""
    return replace(
        memo,
        target=replicas,
        watched=tuple(w for w in memo.watched if w.instance_id not in removed),
        retiring=memo.retiring | frozenset(removed),
        unplaceable_on=None,
        sent=SentError(None),
    )


def unplaceable(
    memo: DeploymentMemo,
    deployment: Deployment,
    signature: ClusterSignature,
    error: str,
    now: float,
) -> DeploymentMemo:
    """After a failed placement, reported as ``error``: tried again when the cluster, the
    deployment's priority or its preempt flag changes, or after UNPLACEABLE_RETRY."""
    return replace(
        memo,
        unplaceable_on=signature,
        retry_at=now + UNPLACEABLE_RETRY,
        sent=SentError(error),
        ranked=(deployment.priority, deployment.preempt),
    )


def preempted(
    memo: DeploymentMemo,
    deployment: Deployment,
    removed: tuple[InstanceId, ...],
    signature: ClusterSignature,
    error: str,
    now: float,
) -> DeploymentMemo:
    """After the keeper deleted ``removed`` to place a higher priority, reported as ``error``:
    their loss is no failure (they are removed, like instances scaled away), and the deployment
    waits as an unplaceable one does, so it does not at once take back the room just made."""
    return replace(
        unplaceable(memo, deployment, signature, error, now),
        watched=tuple(w for w in memo.watched if w.instance_id not in removed),
        retiring=memo.retiring | frozenset(removed),
        preempted=error,
    )
