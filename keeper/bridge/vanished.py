"""Which of the keeper's recorded instances exo has deleted (pure: exo's States in, ids out).

The bridge records each instance the keeper placed (``Deployment.placed_instance_ids``) once
exo's State shows it. exo deletes instances by itself (a node left, a runner failed, an
operator's ``DELETE /instance``), and the record must follow, or it only grows: the keeper's
scale-down and deletion read it to find their own instances. So when exo's State no longer shows
a recorded instance, the bridge records ``InstanceDeleted`` in its own log (docs/bridge.md,
"Replicas").

An absence is only believed from a State that could be behind the one that showed the
instance if it said so, and only when it lasts:

- only readable States are looked at (the bridge does not step on others, nor call this);
- every State carries the index of the last event it applied (``lastEventAppliedIdx``); one
  whose index is below that of a State that showed the instance is older than that sighting (a
  node replaying its log after a restart, a lagging node after failover), so its absence says
  nothing;
- the absence must last ``GONE_AFTER_S`` over consecutive reads from the same exo URL, and a
  move to another URL starts every count again: a bridge restarted since the sighting has no
  index to compare with, and this is what keeps a short lag from erasing a record;
- when exo's master changes (``keeper.model.master_change``) the new master numbers its events
  from 0 again: the indices of earlier sightings belong to another log, and are forgotten. (On a
  real cluster they kept an instance lost with a master "recorded" for minutes, and with it a
  failover's record, so the next suspicion placed nothing.)
"""

from __future__ import annotations

from collections.abc import Iterable

from keeper.model.state import InstanceId, State

# How long a recorded instance must be missing from exo's States, read after read, before the
# bridge records it gone: three polls, well past a follower's lag behind exo's master (under a
# second), and short next to how long an operator waits for a scale-down to show.
GONE_AFTER_S = 3.0


class VanishedInstances:
    """Follows the recorded instances across exo's States; ``gone`` names those exo deleted."""

    def __init__(self) -> None:
        # The highest event index of a State that showed each recorded instance.
        self._seen_at: dict[InstanceId, int] = {}
        # Since when each recorded instance has been missing, read after read.
        self._missing_since: dict[InstanceId, float] = {}

    def gone(self, recorded: Iterable[InstanceId], state: State, now: float) -> list[InstanceId]:
        """The recorded instances exo has deleted, judged on ``state`` (a readable State read
        ``now``); each is named once the absence is believed, in the order given."""
        recorded = list(dict.fromkeys(recorded))
        live = set(recorded)
        self._seen_at = {i: idx for i, idx in self._seen_at.items() if i in live}
        self._missing_since = {i: t for i, t in self._missing_since.items() if i in live}
        index = state.last_event_applied_idx
        gone: list[InstanceId] = []
        for instance_id in recorded:
            if instance_id in state.instances:
                self._seen_at[instance_id] = max(index, self._seen_at.get(instance_id, index))
                self._missing_since.pop(instance_id, None)
                continue
            seen_at = self._seen_at.get(instance_id)
            if seen_at is not None and index < seen_at:
                self._missing_since.pop(instance_id, None)  # an older State: it says nothing
                continue
            since = self._missing_since.setdefault(instance_id, now)
            if now - since >= GONE_AFTER_S:
                gone.append(instance_id)
        return gone

    def forget(self, instance_ids: Iterable[InstanceId]) -> None:
        """No longer follow these (their deletion is recorded)."""
        for instance_id in instance_ids:
            self._seen_at.pop(instance_id, None)
            self._missing_since.pop(instance_id, None)

    def master_changed(self) -> None:
        """exo's master changed: the sightings' indices are another log's (module doc)."""
        self._seen_at.clear()

    def restart_counts(self) -> None:
        """Another exo URL is in use: every absence is counted again from its States."""
        self._missing_since.clear()
