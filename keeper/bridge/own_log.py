"""The bridge's own log: its deployments, cordons and drains, as events it numbers, logs and
applies, on a local event store or a shared etcd store (docs/bridge.md).

Both the commands (``keeper.bridge.commands``) and the tick (``keeper.bridge.ticking``) write
it, and they write it differently: a command's events are taken by any bridge and validated
again when another bridge wrote first (``command``, ``record_change``); the tick's records are
fenced, written only while this bridge acts (``record``). One object owns both ways and the
lock they run under, so neither side can write around the other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import anyio

from keeper.bridge.etcd_store import COMMAND_TRIES, EtcdStore, StoreError, StoreMovedOnError
from keeper.model.events import AnyEvent, DeploymentPlaced, DeploymentPlacementFailed
from keeper.model.state import Deployment, State
from keeper.runtime.event_store import EventStore

_T = TypeVar("_T")


class OwnLog:
    """The bridge's log and the lock its commands and ticks take (module doc)."""

    def __init__(self, store: EventStore | EtcdStore, shared: EtcdStore | None) -> None:
        self.store = store
        self.shared = shared  # the same store when it is etcd's, shared with other bridges
        # Taken by every command and by the tick's acting part: one change at a time.
        self.lock = anyio.Lock()

    @property
    def state(self) -> State:
        """The log's State: the bridge's deployments, their records, cordons and drains."""
        return self.store.state

    @property
    def write_error(self) -> str | None:
        return self.store.write_error

    def record(self, events: Sequence[AnyEvent]) -> None:
        """Number, log (durably) and apply the bridge's own events: the tick's records.

        Raises ``LogNotWritableError`` (a 503) with nothing applied if the log cannot take them.
        With a shared store they are fenced (written only while this bridge acts, else
        ``NotActingError``) and written after whatever another bridge wrote first.
        """
        if self.shared is not None:
            # A creation recorded as placed is no longer an intent: both in one write, so a
            # takeover never resumes (re-creates) an instance that landed and went since.
            placed = [f"intent/{e.instance_id}" for e in events if isinstance(e, DeploymentPlaced)]
            self.shared.commit_retrying(events, fenced=True, drop=placed)
            self.shared.snapshot_now_if_due()
            return
        self.store.commit_now(events)
        self.store.snapshot_now_if_due()

    def record_change(self, events: Sequence[AnyEvent], doomed: Sequence[str] = ()) -> None:
        """A command's events (and, with a shared store, the instances it dooms, in the same
        write). Any bridge takes commands; with a shared store ``StoreMovedOnError`` means
        another wrote first: ``command`` validates again on the newer State."""
        if self.shared is not None:
            self.shared.commit_now(events, doomed=doomed)
            return
        self.store.commit_now(events)
        self.store.snapshot_now_if_due()

    async def command(self, body: Callable[[], _T]) -> _T:
        """Run a command's validate-and-record ``body`` under the lock, again on the newer
        State each time another bridge wrote first (a shared store's optimistic concurrency)."""
        async with self.lock:
            for _ in range(COMMAND_TRIES):
                try:
                    return body()
                except StoreMovedOnError:
                    continue
        raise StoreError("too many bridges wrote at once; nothing was changed, try again")

    def fail(self, deployment: Deployment, error: str) -> None:
        """The deployment's placement error, recorded once (exo refused its placement)."""
        current = self.state.deployments.get(deployment.deployment_id)
        if current is not None and current.placement_error != error:
            self.record(
                [DeploymentPlacementFailed(deployment_id=deployment.deployment_id, error=error)]
            )
