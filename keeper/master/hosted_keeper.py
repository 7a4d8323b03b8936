"""The keeper as a service hosts it: what the master and the bridge need of one, and how they
start it.

Both step ``keeper.core.Keeper`` on their own loop and read its timers for ``GET /deployments``;
tests inject other keepers (one that fails, one that fails now and then) through the same
``KeeperFactory``, so the seam is one Protocol here rather than a copy in each service.
"""

from __future__ import annotations

from typing import Protocol

from keeper.core import DeploymentTimer, Keeper, PlaceFn
from keeper.events import AnyEvent
from keeper.state import State


class KeeperLike(Protocol):
    """What a service needs of a keeper (``keeper.core.Keeper``; tests may inject another)."""

    def step(self, state: State, now: float) -> list[AnyEvent]: ...
    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]: ...
    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]: ...


class KeeperFactory(Protocol):
    """Makes the keeper a service hosts (``Keeper`` itself fits)."""

    def __call__(
        self, started_at: float, place: PlaceFn, *, startup_grace: float
    ) -> KeeperLike: ...


def default_keeper(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
    return Keeper(started_at, place=place, startup_grace=startup_grace)


def start_keeper(
    factory: KeeperFactory, now: float, startup_grace_s: float, place: PlaceFn
) -> KeeperLike:
    """A keeper started ``now`` whose grace (docs/design.md, "New master") lasts
    ``startup_grace_s``."""
    return factory(now, place, startup_grace=startup_grace_s)
