"""The keeper's memory of one deployment, and the pure rules that update and read it.

A memo is a frozen value and ``observe`` returns a new one, so the keeper can show an operator
what its next step would decide (``Keeper.timers``) by observing a copy: looking never changes
what the keeper does. The memo holds only what the State cannot tell: the placement still on its
way, whether the instance being watched was ever ready, failures in a row and the waits they
imply, and the placement error already sent but maybe not yet applied.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from keeper.api_models import WaitReason
from keeper.constants import FIRST_BACKOFF, MAX_BACKOFF, PLACEMENT_TIMEOUT, UNPLACEABLE_RETRY
from keeper.keeper_cluster import ClusterSignature, instance_is_ready
from keeper.state import Deployment, InstanceId, State

# Doublings past this many add nothing (10 s * 2**6 already exceeds MAX_BACKOFF); the cap keeps
# ``2 ** n`` a small number however long a deployment keeps failing.
MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class DeploymentMemo:
    # The instance this keeper placed and is waiting to see in the state, and when it placed it.
    in_flight: InstanceId | None = None
    placed_at: float = 0.0
    # The keeper's instance as the state shows it, and whether every runner was ever ready.
    watched: InstanceId | None = None
    watched_ready: bool = False
    # Instances lost before they were ready, in a row, and the wait that follows.
    failures: int = 0
    backoff_until: float | None = None
    # Set after a failed placement: the cluster it failed on, and when to try anyway.
    unplaceable_on: ClusterSignature | None = None
    retry_at: float = 0.0
    # An error-changing event (DeploymentPlacementFailed, or DeploymentPlaced clearing it) sent
    # but not yet seen applied: the placement error the state will hold once it is.
    error_in_transit: bool = False
    expected_error: str | None = None


FRESH = DeploymentMemo()


def backoff_delay(failures: int) -> float:
    """The wait after ``failures`` placements in a row were lost before ready: 10, 20, 40, 60."""
    return min(FIRST_BACKOFF * 2 ** min(failures - 1, MAX_DOUBLINGS), MAX_BACKOFF)


def _lost_before_ready(memo: DeploymentMemo, now: float) -> DeploymentMemo:
    failures = memo.failures + 1
    return replace(
        memo,
        watched=None,
        watched_ready=False,
        failures=failures,
        backoff_until=now + backoff_delay(failures),
    )


def observe(
    memo: DeploymentMemo, deployment: Deployment, state: State, now: float
) -> DeploymentMemo:
    """Bring the memo up to date with what the state now shows (pure)."""
    instances = state.instances
    # 1. The placement on its way: arrived, arrived and already gone, or given up on.
    if memo.in_flight is not None:
        if memo.in_flight in instances:
            memo = replace(memo, in_flight=None, watched=memo.in_flight, watched_ready=False)
        elif deployment.instance_id == memo.in_flight:
            memo = _lost_before_ready(replace(memo, in_flight=None), now)
        elif now >= memo.placed_at + PLACEMENT_TIMEOUT:
            memo = replace(memo, in_flight=None)  # never arrived: not a failure
    # 2. The watched instance vanished: a failure unless it had been ready.
    if memo.watched is not None and memo.watched not in instances:
        if memo.watched_ready:
            memo = replace(memo, watched=None, watched_ready=False, failures=0, backoff_until=None)
        else:
            memo = _lost_before_ready(memo, now)
    # 3. Adopt the instance the deployment names (a new master starts with empty memory).
    named = deployment.instance_id
    if (
        memo.in_flight is None
        and named is not None
        and named != memo.watched
        and named in instances
    ):
        memo = replace(memo, watched=named, watched_ready=False)
    # 4. Readiness of the watched instance; once ready, the failures in a row are over.
    watched = instances.get(memo.watched) if memo.watched is not None else None
    if watched is not None and not memo.watched_ready and instance_is_ready(watched, state):
        memo = replace(memo, watched_ready=True, failures=0, backoff_until=None)
    # 5. The state has caught up with the error-changing event the keeper sent.
    if memo.error_in_transit and deployment.placement_error == memo.expected_error:
        memo = replace(memo, error_in_transit=False, expected_error=None)
    return memo


def reported_error(memo: DeploymentMemo, deployment: Deployment) -> str | None:
    """The placement error the state holds once the keeper's events so far are applied."""
    return memo.expected_error if memo.error_in_transit else deployment.placement_error


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
    return replace(
        memo,
        in_flight=instance_id,
        placed_at=now,
        unplaceable_on=None,
        retry_at=0.0,
        error_in_transit=True,
        expected_error=None,
    )


def unplaceable(
    memo: DeploymentMemo, signature: ClusterSignature, error: str, now: float
) -> DeploymentMemo:
    return replace(
        memo,
        unplaceable_on=signature,
        retry_at=now + UNPLACEABLE_RETRY,
        error_in_transit=True,
        expected_error=error,
    )
