"""The keeper's staging requests, carried to exo: ``POST /download/start`` for a standby copy,
``DELETE /download/{node_id}/{model_id}`` for a copy its deployment no longer needs.

A request is recorded in the bridge's log only once exo took it (so ``Deployment.staged_on``
lists copies exo was asked for). exo's shard must carry exo's full card of the model, as a
placement does; without one the copy waits. An exo without the download routes (an older
release) is said so once, and the bridge goes on keeping without staging. A deletion that cannot
be sent now is kept and sent again at the next tick: copies a deployment made never outlive it
for want of a retry. Pure bookkeeping beside the I/O, which the bridge's tick drives.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from keeper.bridge.exo_client import ExoApi, ExoRefusedError, ExoUnavailableError
from keeper.bridge.exo_wire import shard_json
from keeper.model.events import AnyEvent, DownloadDeletionRequested, DownloadRequested
from keeper.model.wire import JsonObject

log = logging.getLogger(__name__)

# exo's answers meaning "no such route": an exo from before the download API.
NO_ROUTE = (404, 405)


class StagingCalls:
    """The download calls to exo and what is still owed to it."""

    def __init__(
        self,
        full_card: Callable[[str], JsonObject | None],
        guard: Callable[[str], bool] | None = None,
    ) -> None:
        self._full_card = full_card
        # Asked before each call with what it does: whether it may go out (with a shared store,
        # only while this bridge acts, the intent recorded first).
        self._guard: Callable[[str], bool] = guard if guard is not None else _always
        self.unsupported: str | None = None  # why exo cannot stage, once it said so
        self._deletions: list[DownloadDeletionRequested] = []

    def owe(self, deletions: Sequence[DownloadDeletionRequested]) -> None:
        """Deletions to send at the next tick (a deployment deleted between ticks)."""
        self._deletions.extend(deletions)

    async def carry(self, exo: ExoApi, events: Sequence[AnyEvent]) -> list[AnyEvent]:
        """Send the staging events (and the deletions owed); the ones exo took, to record."""
        taken: list[AnyEvent] = []
        owed, self._deletions = self._deletions, []
        for deletion in owed:
            if await self._delete(exo, deletion):
                taken.append(deletion)
        for event in events:
            match event:
                case DownloadRequested():
                    took = await self._start(exo, event)
                case DownloadDeletionRequested():
                    took = await self._delete(exo, event)
                case _:
                    continue
            if took:
                taken.append(event)
        return taken

    async def _start(self, exo: ExoApi, event: DownloadRequested) -> bool:
        if self.unsupported is not None:
            return False
        model_id = event.shard_metadata.model_card.model_id
        card = self._full_card(model_id)
        if card is None:
            return False  # asked again after the keeper's retry, once exo has shown a card
        if not self._guard(f"download/start {event.node_id} {model_id}"):
            return False
        try:
            await exo.start_download(event.node_id, shard_json(event.shard_metadata, card))
        except ExoRefusedError as exc:
            if exc.status in NO_ROUTE:
                self.unsupported = f"exo at {exo.url} has no download API ({exc.status})"
                log.warning("%s: keeping deployments without staging", self.unsupported)
            else:
                log.warning("exo refused staging %s on %s: %s", model_id, event.node_id, exc)
            return False
        except ExoUnavailableError:
            return False
        log.info("staging %s on node %s", model_id, event.node_id)
        return True

    async def _delete(self, exo: ExoApi, event: DownloadDeletionRequested) -> bool:
        if not self._guard(f"download/delete {event.node_id} {event.model_id}"):
            self._deletions.append(event)
            return False
        try:
            await exo.delete_download(event.node_id, event.model_id)
        except ExoRefusedError as exc:
            if exc.status not in NO_ROUTE:
                log.warning("exo refused deleting %s on %s: %s", event.model_id, event.node_id, exc)
            return True  # nothing to retry: exo will not take it
        except ExoUnavailableError:
            self._deletions.append(event)
            return False
        return True


def _always(what: str) -> bool:
    del what
    return True
