"""The keeper (stub; being written)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from keeper.api_models import DeploymentStatus, WaitReason
from keeper.events import AnyEvent
from keeper.placement import place_instance
from keeper.state import AnyInstance, Deployment, InstanceMeta, ModelCard, Sharding, State

PlaceFn = Callable[[State, ModelCard, Sharding, InstanceMeta, int], AnyInstance]


@dataclass(frozen=True)
class DeploymentTimer:
    """A read-only view of the keeper's memory of one deployment, for the API and the TUI."""

    failures: int  # placements lost before ready, in a row
    next_attempt_at: float | None  # on the caller's monotonic clock (the `now` of step)
    waiting: WaitReason | None


class Keeper:
    def __init__(self, started_at: float, place: PlaceFn = place_instance) -> None:
        self.started_at = started_at
        self._place = place

    def step(self, state: State, now: float) -> list[AnyEvent]:
        raise NotImplementedError

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        raise NotImplementedError

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        raise NotImplementedError


def has_instance(state: State, model_id: str) -> bool:
    raise NotImplementedError


def deployment_status(deployment: Deployment, state: State) -> DeploymentStatus:
    raise NotImplementedError
