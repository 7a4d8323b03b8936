"""The keeper's memory of one deployment, and the pure rules that update and read it.

A memo is a frozen value and ``observe`` returns a new one, so the keeper can show an operator
what its next step would decide (``Keeper.timers``) by observing a copy: looking never changes
what the keeper does. The memo holds only what the State cannot tell: the placement still on its
way, whether the instance being watched was ever ready, failures in a row and the waits they
imply, and the placement error it last sent (which the state shows only once it is applied).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from keeper.api_models import WaitReason
from keeper.cluster_view import ClusterSignature
from keeper.constants import FIRST_BACKOFF, MAX_BACKOFF, PLACEMENT_TIMEOUT, UNPLACEABLE_RETRY
from keeper.readiness import instance_is_ready
from keeper.state import Deployment, InstanceId, State

# Doublings past this many add nothing (10 s * 2**6 already exceeds MAX_BACKOFF); the cap keeps
# ``2 ** n`` a small number however long a deployment keeps failing.
MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class Watched:
    """The keeper's own instance as the state shows it, and whether it was ever ready."""

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
    in_flight: InstanceId | None = None
    placed_at: float = 0.0
    watched: Watched | None = None
    # Instances lost before they were ready, in a row, and the wait that follows.
    failures: int = 0
    backoff_until: float | None = None
    # Set after a failed placement: the cluster it failed on, and when to try anyway.
    unplaceable_on: ClusterSignature | None = None
    retry_at: float = 0.0
    sent: SentError | None = None


FRESH = DeploymentMemo()


def backoff_delay(failures: int) -> float:
    """The wait after ``failures`` placements in a row were lost before ready: 10, 20, 40, 60."""
    return min(FIRST_BACKOFF * 2 ** min(failures - 1, MAX_DOUBLINGS), MAX_BACKOFF)


def _lost_before_ready(memo: DeploymentMemo, now: float) -> DeploymentMemo:
    failures = memo.failures + 1
    return replace(
        memo, watched=None, failures=failures, backoff_until=now + backoff_delay(failures)
    )


def observe(
    memo: DeploymentMemo, deployment: Deployment, state: State, now: float
) -> DeploymentMemo:
    """Bring the memo up to date with what the state now shows (pure)."""
    instances = state.instances
    # 1. The placement on its way: arrived, arrived and already gone, or given up on.
    if memo.in_flight is not None:
        if memo.in_flight in instances:
            memo = replace(memo, in_flight=None, watched=Watched(memo.in_flight))
        elif deployment.instance_id == memo.in_flight:
            memo = _lost_before_ready(replace(memo, in_flight=None), now)
        elif now >= memo.placed_at + PLACEMENT_TIMEOUT:
            memo = replace(memo, in_flight=None)  # never arrived: not a failure
    # 2. The watched instance vanished: a failure unless it had been ready (which already
    # ended the failures in a row), and then the next placement is due at once.
    watched = memo.watched
    if watched is not None and watched.instance_id not in instances:
        # (No mutation of the ready case: a vanished id left watched acts exactly like none.)
        gone = replace(memo, watched=None)  # pragma: no mutate
        memo = gone if watched.ready else _lost_before_ready(memo, now)
    # 3. Adopt the instance the deployment names (a new master starts with empty memory).
    named = deployment.instance_id
    watched_id = memo.watched.instance_id if memo.watched is not None else None
    if memo.in_flight is None and named in instances and named != watched_id:
        memo = replace(memo, watched=Watched(named))
    # 4. Readiness of the watched instance; once ready, the failures in a row are over.
    watched = memo.watched
    if (
        watched is not None
        and not watched.ready
        and watched.instance_id in instances
        and instance_is_ready(instances[watched.instance_id], state)
    ):
        memo = replace(memo, watched=Watched(watched.instance_id, ready=True), failures=0)
    return memo


def reported_error(memo: DeploymentMemo, deployment: Deployment) -> str | None:
    """The placement error the state holds once the keeper's events so far are applied."""
    return deployment.placement_error if memo.sent is None else memo.sent.error


def waiting(
    memo: DeploymentMemo, signature: ClusterSignature, now: float
) -> tuple[WaitReason, float] | None:
    """Why an observed deployment with no instance must not be placed yet, and until when."""
    if memo.in_flight is not None:
        return "placement_in_flight", memo.placed_at + PLACEMENT_TIMEOUT
    if memo.backoff_until is not None and now < memo.backoff_until:
        return "backoff", memo.backoff_until
    if memo.unplaceable_on == signature and now < memo.retry_at:
        return "unplaceable_retry", memo.retry_at
    return None


def placed(memo: DeploymentMemo, instance_id: InstanceId, now: float) -> DeploymentMemo:
    # DeploymentPlaced clears the placement error; the cluster that failed before is forgotten
    # (its retry time means nothing without it).
    return replace(
        memo, in_flight=instance_id, placed_at=now, unplaceable_on=None, sent=SentError(None)
    )


def unplaceable(
    memo: DeploymentMemo, signature: ClusterSignature, error: str, now: float
) -> DeploymentMemo:
    return replace(
        memo,
        unplaceable_on=signature,
        retry_at=now + UNPLACEABLE_RETRY,
        sent=SentError(error),
    )
