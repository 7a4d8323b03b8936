"""When each node's download of a model was seen to start and to complete, on our clock.

The State says where a download is now, not since when. The timeline says how long a completed
download took ("downloaded … in 52 s") and a recovery's parts how long its downloads held it
up, so the model dates each change of a (node, model) entry as it sees it: ongoing is a start,
completed an end, queued again or failed forgets both. Only changes seen as they happened are
dated: after a gap (``blind``) or for a node the State does not hold, the moment is unknown and
what was kept for that download is dropped rather than left to mislead. Pure: the time comes in
as ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from exo_deploy_tui.model.recovery import NodeDownload
from keeper.model.events import NodeDownloadProgress
from keeper.model.state import (
    DownloadCompleted,
    DownloadOngoing,
    ModelId,
    NodeId,
    State,
    download_entry,
    download_model_id,
)

_NONE: Mapping[tuple[NodeId, ModelId], float] = MappingProxyType({})


class DownloadMoments:
    """Per (node, model): when its download was seen to start, and to complete."""

    def __init__(self) -> None:
        self._started: dict[tuple[NodeId, ModelId], float] = {}
        self._done: dict[tuple[NodeId, ModelId], float] = {}

    def note(self, event: NodeDownloadProgress, before: State, now: float, blind: bool) -> None:
        """Date the change ``event`` makes to ``before``'s entry for its node and model."""
        entry = event.download_progress
        key = (entry.node_id, download_model_id(entry))
        previous = download_entry(before, *key)
        if type(entry) is type(previous):
            return  # progress, or a report of the same: no moment
        if blind or entry.node_id not in before.topology.nodes:
            # It moved while we were away (or for a node the State does not hold).
            self._forget(key)
        elif isinstance(entry, DownloadOngoing):
            self._started[key] = now
            self._done.pop(key, None)
        elif isinstance(entry, DownloadCompleted):
            if not isinstance(previous, DownloadOngoing):
                self._started.pop(key, None)  # it never showed as downloading
            if previous is not None:
                self._done[key] = now
        else:  # queued again, or failed
            self._forget(key)

    def starts(self, blind: bool) -> Mapping[tuple[NodeId, ModelId], float]:
        """When downloads were seen to start, for the timeline; none after a gap (how long a
        download took that completed while we were away cannot be told)."""
        return _NONE if blind else MappingProxyType(self._started)

    def of(self, node_id: NodeId, model: ModelId) -> NodeDownload:
        """What was seen of the node's download of the model, for a recovery's parts."""
        key = (node_id, model)
        return NodeDownload(self._started.get(key), self._done.get(key))

    def forget_node(self, node_id: NodeId) -> None:
        """The node left: its downloads' moments go with it."""
        for kept in (self._started, self._done):
            for key in [k for k in kept if k[0] == node_id]:
                del kept[key]

    def _forget(self, key: tuple[NodeId, ModelId]) -> None:
        self._started.pop(key, None)
        self._done.pop(key, None)
