"""The parts of exo's State the dashboard could not read: told once, shown on the rows they touch.

A State read from a stock exo is read entry by entry (``keeper.model.exo_state``): an instance,
runner, node report or download entry that does not read is left out and named, and the rest is
shown. Left out silently, a node would just look emptier than it is; so each part is said in the
timeline when it first appears (a few by name, then how many more: exo lists every model it
knows on every node, and one unreadable kind of entry could be hundreds), said again when the
State reads whole, and marked on the node rows it names.

Plain data and words; no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from exo_deploy_tui.model.timeline import TimelineEntry
from keeper.model.exo_state import UnreadablePart
from keeper.model.state import NodeId

# How many new parts the timeline names one by one in a batch; the rest are counted. Three fit
# the timeline's few lines, and one kind of unreadable entry tends to repeat on every node.
NAMED_PER_BATCH = 3


@dataclass
class UnreadParts:
    """The parts left out of the last State read (module doc)."""

    parts: tuple[UnreadablePart, ...] = ()

    def took(self, parts: tuple[UnreadablePart, ...], now: float) -> list[TimelineEntry]:
        """The parts of a new State; what the timeline says of the change."""
        known = set(self.parts)
        new = [part for part in parts if part not in known]
        entries = [
            TimelineEntry(
                now,
                "warn",
                f"{part.words} (shown without it)",
                model_id=part.model_id,
                node_id=part.node_ids[0] if part.node_ids else None,
            )
            for part in new[:NAMED_PER_BATCH]
        ]
        if len(new) > NAMED_PER_BATCH:
            more = len(new) - NAMED_PER_BATCH
            entries.append(TimelineEntry(now, "warn", f"{more} more parts of exo's State unread"))
        if self.parts and not parts:
            entries.append(TimelineEntry(now, "info", "exo's State reads whole again"))
        self.parts = parts
        return entries

    def marks(self) -> dict[NodeId, tuple[str, ...]]:
        """Per node, a mark for each part that names it: ``⚠ runner r-1 unreadable``."""
        marks: dict[NodeId, list[str]] = {}
        for part in self.parts:
            for node_id in part.node_ids:
                marks.setdefault(node_id, []).append(f"⚠ {part.kind} {part.key} unreadable")
        return {node_id: tuple(texts) for node_id, texts in marks.items()}
