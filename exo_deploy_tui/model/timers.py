"""The keeper's timers as the dashboard counts them down: each deployment's failures, when it
tries again and what it waits for, from ``GET /deployments``.

The keeper says when it tries again both ways: in seconds from its answer
(``next_attempt_in_s``, immune to the clocks' difference) and as a date on the master's clock
(``next_attempt_at``). The seconds win when given; the date is put on our clock through the
``MasterClock``. The countdown then ticks by asking again with a later ``now``, never by
refetching.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from exo_deploy_tui.model.master_clock import MasterClock
from keeper.model.api_models import DeploymentView, WaitReason
from keeper.model.state import DeploymentId


@dataclass(frozen=True)
class Timer:
    failures: int
    due_at: float | None  # epoch seconds on our clock
    waiting: WaitReason | None


def keeper_timers(
    views: Iterable[DeploymentView], now: float, clock: MasterClock
) -> dict[DeploymentId, Timer]:
    """Each deployment's timer from the keeper's views, received at ``now``."""
    timers: dict[DeploymentId, Timer] = {}
    for view in views:
        if view.next_attempt_in_s is not None:
            due: float | None = now + view.next_attempt_in_s
        else:
            due = clock.ours(view.next_attempt_at)
        timers[view.deployment.deployment_id] = Timer(view.failures, due, view.waiting)
    return timers
