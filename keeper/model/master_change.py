"""exo's master changed: recognised from two of its States alone (docs/design.md §3.5, "exo's
master changed", and §8.3).

exo's ``GET /state`` says nothing about its master, its session or its elections. What it does
say is how a new master shows: every node's API resets its State to an empty one when an
election ends with a new master, and rebuilds it from the new master's events, numbered from 0
again, while that master starts from an empty State too (its instances are gone and the workers
stop their runners). So between the last State of the old master and the first of the new one:

- the index of the last event applied (``lastEventAppliedIdx``) goes *backwards*;
- none of the old State's instances is left;
- and the State is not merely an older copy of the same log (a lagging node's API, read after the
  bridge moved to another URL, also shows a lower index): a node it shows was heard *later* than
  the old State heard it (the new master applied a report the old one never had), or it shows no
  node at all (the new master's State before any node reported again; an older copy of a log
  that ever held a node still holds it).

The rule is pure (two States in, a value out) and sits in the data model so that the history
(``keeper.model.history``), the keeper's memory (``keeper.core.memo``) and the TUI read one
answer. It is shaped on what the bridge keeps anyway, the State it last judged and the new one,
so nothing else is remembered for it.

When the old master's node left with it (its process was killed, the usual way a master
changes), the one node of the old State the new one lacks is that node, and the outage is dated
from its last heartbeat, its ``lastSeen`` in the old State. When several nodes or none left
(the new State read before every survivor reported again, or a master that stepped down alive),
which was master cannot be told; the outage is then dated from the newest ``lastSeen`` of the old
State: the old master applied that report, so it was alive then, and served nothing after its
last State.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper.model.notices import unix_seconds_of
from keeper.model.state import NodeId, State, node_name


@dataclass(frozen=True)
class MasterChange:
    """What two States say of exo's master changing between them."""

    left: tuple[NodeId, ...]  # the old State's nodes the new one lacks, sorted
    old_master: NodeId | None  # the one node that left, when exactly one did
    last_heard: float | None  # Unix seconds the old master was last heard (module doc)


def master_changed(before: State | None, after: State) -> MasterChange | None:
    """The change of exo's master between ``before`` (the State last read) and ``after`` (the
    new one), or None when ``after`` is the same master's (module doc)."""
    if before is None or after.last_event_applied_idx >= before.last_event_applied_idx:
        return None
    if any(instance_id in after.instances for instance_id in before.instances):
        return None  # an older copy of the same log: the new master keeps no instance
    if after.topology.nodes and not _heard_later(before, after):
        return None
    left = tuple(sorted(set(before.topology.nodes) - set(after.topology.nodes)))
    old_master = left[0] if len(left) == 1 else None
    if old_master is not None:
        last_heard = unix_seconds_of(before.last_seen.get(old_master))
    else:
        heard = [unix_seconds_of(seen) for seen in before.last_seen.values()]
        dated = [moment for moment in heard if moment is not None]
        last_heard = max(dated) if dated else None
    return MasterChange(left=left, old_master=old_master, last_heard=last_heard)


def _heard_later(before: State, after: State) -> bool:
    """Whether ``after`` heard a node later than ``before`` did: a report ``before``'s master
    never applied, which no older copy of its log can hold."""
    for node_id, seen in after.last_seen.items():
        now = unix_seconds_of(seen)
        then = unix_seconds_of(before.last_seen.get(node_id))
        if now is not None and then is not None and now > then:
            return True
    return False


# The cause of an incident a master change made, as the history, the webhooks and the TUI say
# it: what the operator can check in exo's own log.
MASTER_CHANGED = "exo's master changed (its State started empty)"


def master_change_words(change: MasterChange, before: State) -> str:
    """The cause in words, naming the old master's node when it is known (by its name in
    ``before``, where it is still described)."""
    if change.old_master is None:
        return MASTER_CHANGED
    return f"{MASTER_CHANGED[:-1]}; node {node_name(before, change.old_master)} left)"
