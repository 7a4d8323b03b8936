"""Which applied events call for a keeper step (``keeper.core.keeper.calls_for_step``,
docs/design.md §6.6), event type by event type. Pure and fast, so it runs against every mutant of
the core."""

from __future__ import annotations

import pytest

from keeper.core.keeper import calls_for_step
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentPriorityChanged,
    DeploymentScaled,
    InstanceCreated,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.state import RunnerFailed, RunnerLoading, RunnerReady, RunnerRunning

# Fields do not matter to the rule, only the event's type (and a runner's status).
CALLS_FOR_STEP: list[AnyEvent] = [
    DeploymentCreated.model_construct(),
    DeploymentScaled.model_construct(),
    DeploymentPriorityChanged.model_construct(),
    InstanceCreated.model_construct(),
    InstanceDeleted.model_construct(),
    NodeGatheredInfo.model_construct(),
    NodeTimedOut.model_construct(),
    NodeSuspected.model_construct(),
    NodeConfirmedDead.model_construct(),
    NodeHeardAgain.model_construct(),
    TopologyEdgeCreated.model_construct(),
    TopologyEdgeDeleted.model_construct(),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerFailed(error_message="boom")),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerReady()),
]
CALLS_FOR_NO_STEP: list[AnyEvent] = [
    DeploymentDeleted.model_construct(),
    DeploymentPlaced.model_construct(),
    DeploymentPlacementFailed.model_construct(),
    RunnerStatusUpdated(runner_id="r", runner_status=RunnerRunning()),
    RunnerStatusUpdated(
        runner_id="r", runner_status=RunnerLoading(layers_loaded=1, total_layers=2)
    ),
]


def event_id(event: AnyEvent) -> str:
    """The event's kind, with its runner status for a runner update."""
    return f"{type(event).__name__}-{type(getattr(event, 'runner_status', None)).__name__}"


@pytest.mark.parametrize(
    "event",
    CALLS_FOR_STEP,
    ids=event_id,
)
def test_events_that_may_allow_a_placement_call_for_a_step(event: AnyEvent) -> None:
    assert calls_for_step(event) is True


@pytest.mark.parametrize(
    "event",
    CALLS_FOR_NO_STEP,
    ids=event_id,
)
def test_bookkeeping_and_progress_call_for_no_step(event: AnyEvent) -> None:
    assert calls_for_step(event) is False
