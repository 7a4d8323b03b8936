"""The keeper as a service hosts it: what the master and the bridge need of one, and how they
start it.

Both step ``keeper.core.keeper.Keeper`` on their own loop and read its timers for ``GET
/deployments``; tests inject other keepers (one that fails, one that fails now and then) through
the same ``KeeperFactory``, so the seam is one Protocol here rather than a copy in each service.

``start_keeper`` wraps whatever the factory makes in ``HostedKeeper``, the one place where the
pure keeper's kept placement crashes meet a logger: each is logged with its traceback, once per
deployment and distinct error, for the master and the bridge alike. It is also where each step
is timed and its placements counted for ``GET /metrics`` (``keeper.runtime.metrics``), so both
services measure them the same way.

After each step ``HostedKeeper`` also shows the State stepped on to an observer, the alert
webhooks' producer (``keeper.runtime.webhooks``): both services pass theirs to ``start_keeper``.
And it logs why a failover cannot place its replacement when that changes: ``GET
/deployments`` says it live, the log keeps it for whoever reads what happened afterwards (on a
real cluster a suspicion that placed nothing could not be told from the log alone).

``Started`` holds what a service has only once it runs, its clock and its keeper: read before,
either is a ``NotRunningError`` (a 503) naming the service, for the master and the bridge alike.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Generator, Mapping
from typing import Protocol, runtime_checkable

from keeper.core.commands import CommandMemory
from keeper.core.keeper import DeploymentTimer, Keeper, PlaceFn
from keeper.core.repair import RepairMoves
from keeper.model.events import AnyEvent
from keeper.model.instance_health import Verdict
from keeper.model.refusals import NotRunningError
from keeper.model.state import DeploymentId, State
from keeper.runtime.clock import AnyioClock, Clock
from keeper.runtime.metrics import StepMetrics, timed_step

log = logging.getLogger(__name__)


class KeeperLike(Protocol):
    """What a service needs of a keeper (``keeper.core.keeper.Keeper``; tests may inject
    another)."""

    def step(self, state: State, now: float) -> list[AnyEvent]: ...
    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]: ...
    def scale(self, deployment_id: str, replicas: int, state: State) -> list[AnyEvent]: ...
    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]: ...
    # Cordons and drains (docs/design.md §5.15).
    def cordon(self, name: str, state: State) -> list[AnyEvent]: ...
    def uncordon(self, name: str, state: State) -> list[AnyEvent]: ...
    def drain(self, name: str, force: bool, when: str, state: State) -> list[AnyEvent]: ...
    def drain_note(self, name: str) -> str | None: ...


@runtime_checkable
class KeepsPlacementCrashes(Protocol):
    """A keeper that keeps the exceptions its placements raised (``keeper.core.keeper.Keeper``)."""

    def placement_crashes(self) -> Mapping[DeploymentId, Exception]: ...


@runtime_checkable
class ReportsStaging(Protocol):
    """A keeper that says why a deployment has fewer standby sets than it asks for."""

    def staging_note(self, deployment_id: str) -> str | None: ...


@runtime_checkable
class ReportsUpdates(Protocol):
    """A keeper that says why a rolling change cannot place its next replacement."""

    def update_note(self, deployment_id: str) -> str | None: ...


@runtime_checkable
class ReportsFailovers(Protocol):
    """A keeper that says why a failover cannot place its replacement (docs/design.md §5.18)."""

    def failover_note(self, deployment_id: str) -> str | None: ...


@runtime_checkable
class ReportsHealth(Protocol):
    """A keeper that recognises broken instances and replaces one when asked (docs/design.md
    §5.19)."""

    def health(self, state: State) -> Mapping[DeploymentId, Verdict]: ...
    def repair(self, instance_id: str, state: State) -> str | None: ...
    def note_chat(self, instance_id: str, failed: str | None, now: float) -> None: ...
    def repair_kind(self, state: State, now: float) -> RepairMoves | None: ...


@runtime_checkable
class TakesBackCommands(Protocol):
    """A keeper whose commands note their effect at once, and can take the note back
    (``keeper.core.keeper.CommandMemory``)."""

    def checkpoint(self) -> CommandMemory | None: ...
    def restore(self, memory: CommandMemory | None) -> None: ...


@contextlib.contextmanager
def taken_back_unless_recorded(keeper: KeeperLike) -> Generator[None]:
    """A command's keeper calls and the recording of their events: if the block raises (the
    log or the store refused the write, its outcome is unknown, another bridge wrote first), the
    keeper's notes of the command are taken back, so the command asked again is done again
    rather than found done. An unknown outcome that did land shows in the State. A cancellation
    is not a refusal: the events may be logged after it (the master's router has them), so the
    notes stay, as they would have once the write answered."""
    memory = keeper.checkpoint() if isinstance(keeper, TakesBackCommands) else None
    try:
        yield
    except Exception:
        if memory is not None and isinstance(keeper, TakesBackCommands):
            keeper.restore(memory)
        raise


def describe(crash: BaseException) -> str:
    """An exception as the keeper records it on the deployment."""
    return f"{type(crash).__name__}: {crash}"


class KeeperWrapper:
    """A keeper around ``inner``: every call goes to ``inner``. A wrapper overrides what it
    adds to (``HostedKeeper`` and the bridge's pause while its log is unwritable: the step)."""

    def __init__(self, inner: KeeperLike) -> None:
        self.inner = inner

    def step(self, state: State, now: float) -> list[AnyEvent]:
        return self.inner.step(state, now)

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        return self.inner.delete(deployment_id, state)

    def scale(self, deployment_id: str, replicas: int, state: State) -> list[AnyEvent]:
        return self.inner.scale(deployment_id, replicas, state)

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        return self.inner.timers(state, now)

    def cordon(self, name: str, state: State) -> list[AnyEvent]:
        return self.inner.cordon(name, state)

    def uncordon(self, name: str, state: State) -> list[AnyEvent]:
        return self.inner.uncordon(name, state)

    def drain(self, name: str, force: bool, when: str, state: State) -> list[AnyEvent]:
        return self.inner.drain(name, force, when, state)

    def drain_note(self, name: str) -> str | None:
        return self.inner.drain_note(name)

    def checkpoint(self) -> CommandMemory | None:
        inner = self.inner
        return inner.checkpoint() if isinstance(inner, TakesBackCommands) else None

    def restore(self, memory: CommandMemory | None) -> None:
        inner = self.inner
        if isinstance(inner, TakesBackCommands):
            inner.restore(memory)

    def staging_note(self, deployment_id: str) -> str | None:
        inner = self.inner
        return inner.staging_note(deployment_id) if isinstance(inner, ReportsStaging) else None

    def update_note(self, deployment_id: str) -> str | None:
        inner = self.inner
        return inner.update_note(deployment_id) if isinstance(inner, ReportsUpdates) else None

    def failover_note(self, deployment_id: str) -> str | None:
        inner = self.inner
        return inner.failover_note(deployment_id) if isinstance(inner, ReportsFailovers) else None

    def health(self, state: State) -> Mapping[DeploymentId, Verdict]:
        inner = self.inner
        return inner.health(state) if isinstance(inner, ReportsHealth) else {}

    def repair(self, instance_id: str, state: State) -> str | None:
        inner = self.inner
        if isinstance(inner, ReportsHealth):
            return inner.repair(instance_id, state)
        return "this keeper does not repair instances"

    def note_chat(self, instance_id: str, failed: str | None, now: float) -> None:
        inner = self.inner
        if isinstance(inner, ReportsHealth):
            inner.note_chat(instance_id, failed, now)

    def repair_kind(self, state: State, now: float) -> RepairMoves | None:
        inner = self.inner
        return inner.repair_kind(state, now) if isinstance(inner, ReportsHealth) else None


class StepObserver(Protocol):
    """Told, after each step, the State the keeper stepped on, why each drain is stuck (by
    node, the stuck ones only) and the step's ``now`` (the service's monotonic clock, which the
    front door's counts are on too): the alert webhooks' producer (``keeper.runtime.webhooks``)."""

    def observe(
        self,
        state: State,
        drain_notes: Mapping[str, str],
        unhealthy: Mapping[DeploymentId, tuple[str, str, str]] | None = None,
        now: float | None = None,
    ) -> None: ...


class HostedKeeper(KeeperWrapper):
    """A keeper as a service runs it: every call goes to ``inner``; after each step, each
    placement crash ``inner`` keeps is logged with its traceback, unless that deployment's
    crash with the same description was logged already; each step is timed into
    ``step_metrics`` when given, and the observer (if any) is shown the State stepped on: the
    one place where the master (its whole State) and the bridge (exo's State with its
    deployments merged in) both hand over the State they act on."""

    def __init__(
        self,
        inner: KeeperLike,
        step_metrics: StepMetrics | None = None,
        observer: StepObserver | None = None,
    ) -> None:
        super().__init__(inner)
        # What was logged per deployment that is still crashing (so it stays bounded).
        self._logged: dict[DeploymentId, str] = {}
        # The failover notes logged, per deployment whose failover is still held back.
        self._failover_notes: dict[DeploymentId, str] = {}
        self._step_metrics = step_metrics
        self._observer = observer

    def step(self, state: State, now: float) -> list[AnyEvent]:
        events = timed_step(self._step_metrics, lambda: self.inner.step(state, now))
        if isinstance(self.inner, KeepsPlacementCrashes):
            self._log_crashes(self.inner.placement_crashes())
        # Only with a verdict on some node: a cluster at rest has no failover to ask about.
        if state.node_watch or self._failover_notes:
            self._log_failover_notes(state)
        if self._observer is not None:
            notes = {name: note for name in state.drains if (note := self.drain_note(name))}
            unhealthy = {
                d: (v.instance_id, v.problem, v.why) for d, v in self.health(state).items()
            }
            self._observer.observe(state, notes, unhealthy, now)
        return events

    def _log_failover_notes(self, state: State) -> None:
        notes: dict[DeploymentId, str] = {}
        for deployment_id in state.deployments:
            note = self.failover_note(deployment_id)
            if note is None:
                continue
            if self._failover_notes.get(deployment_id) != note:
                log.warning("deployment %s: %s", deployment_id, note)
            notes[deployment_id] = note
        self._failover_notes = notes

    def _log_crashes(self, crashes: Mapping[DeploymentId, Exception]) -> None:
        logged: dict[DeploymentId, str] = {}
        for deployment_id, crash in crashes.items():
            described = describe(crash)
            if self._logged.get(deployment_id) != described:
                log.error(
                    "placement crashed for deployment %s (%s); it is retried as unplaceable",
                    deployment_id,
                    described,
                    exc_info=crash,
                )
            logged[deployment_id] = described
        self._logged = logged


class KeeperFactory(Protocol):
    """Makes the keeper a service hosts (``Keeper`` itself fits)."""

    def __call__(
        self, started_at: float, place: PlaceFn, *, startup_grace: float
    ) -> KeeperLike: ...


def default_keeper(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
    return Keeper(started_at, place=place, startup_grace=startup_grace)


def start_keeper(
    factory: KeeperFactory,
    now: float,
    startup_grace_s: float,
    place: PlaceFn,
    step_metrics: StepMetrics | None = None,
    observer: StepObserver | None = None,
    wall_offset: float = 0.0,
) -> KeeperLike:
    """A keeper started ``now`` whose grace (docs/design.md, "New master") lasts
    ``startup_grace_s``, as its host runs it (``HostedKeeper``, its steps timed into
    ``step_metrics``), showing ``observer`` each State it steps on; ``wall_offset`` is Unix
    time minus the host's monotonic clock (the time the keeper's durable records are in)."""
    keeper = factory(now, place, startup_grace=startup_grace_s)
    if isinstance(keeper, Keeper):
        keeper.wall_offset = wall_offset
    return HostedKeeper(keeper, step_metrics, observer)


class Started:
    """A service's clock (given, or made when it runs) and its keeper (made when it runs)."""

    def __init__(self, service: str, clock: Clock | None) -> None:
        self._service = service  # "master", "bridge": named in the NotRunningError
        self.clock_or_none = clock
        self.keeper_or_none: KeeperLike | None = None
        self.started_at: float | None = None  # wall clock (Unix seconds) when it began to run

    @property
    def clock(self) -> Clock:
        if self.clock_or_none is None:
            raise NotRunningError(f"the {self._service} is not running yet")
        return self.clock_or_none

    @property
    def keeper(self) -> KeeperLike:
        if self.keeper_or_none is None:
            raise NotRunningError(f"the {self._service} is not running yet")
        return self.keeper_or_none

    def start_clock(self) -> Clock:
        """The clock given, else the event loop's (made inside it, as the service runs)."""
        if self.clock_or_none is None:
            self.clock_or_none = AnyioClock()
        self.started_at = self.clock_or_none.wall().timestamp()
        return self.clock_or_none
