"""Each node's last GPU readings, for the nodes view's sparkline.

The State holds a node's latest vitals only; the sparkline needs a few in a row, so the model
keeps the last ``GPU_READINGS_KEPT`` per node as they arrive: one per ``NodeGatheredInfo`` that
carries vitals, and, when polling, one per poll that shows the node reported since the last
(its ``lastSeen`` moved) or that its vitals changed, so a poll sees each report once. A node's
readings go when the State stops holding its vitals, or when it leaves.
"""

from __future__ import annotations

from collections import deque

from keeper.model.state import NodeId, State, SystemVitals

# GPU readings kept per node: the nodes view's sparkline, the last half-minute or so of reports.
GPU_READINGS_KEPT = 8


class GpuReadings:
    """Per node: its last GPU readings (0-1), oldest first."""

    def __init__(self) -> None:
        self._gpu: dict[NodeId, deque[float]] = {}

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._gpu

    def of(self, node_id: NodeId) -> tuple[float, ...]:
        return tuple(self._gpu.get(node_id, ()))

    def reading(self, node_id: NodeId, vitals: SystemVitals) -> None:
        history = self._gpu.get(node_id)
        if history is None:
            history = self._gpu[node_id] = deque(maxlen=GPU_READINGS_KEPT)
        history.append(vitals.gpu_usage)

    def note_snapshot(self, before: State | None, after: State) -> None:
        """A snapshot's readings: a node's counts as new when it differs from the last one or
        the node reported since (``before`` None: the first snapshot, all new)."""
        for node_id in [n for n in self._gpu if n not in after.node_system]:
            del self._gpu[node_id]
        for node_id, vitals in after.node_system.items():
            if before is not None and (
                before.node_system.get(node_id) == vitals
                and before.last_seen.get(node_id) == after.last_seen.get(node_id)
            ):
                continue
            self.reading(node_id, vitals)

    def forget(self, node_id: NodeId) -> None:
        self._gpu.pop(node_id, None)
