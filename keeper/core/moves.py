"""The keeper's moves: an instance replaced make-before-break, whatever the reason for it
(docs/design.md §5.17).

A drain moves an instance off a node, a rolling change replaces one placed with old options;
the next kinds replace one on a suspect node or a broken one. What differs between them is only
*which* instances to move and *why*, in words; how a move runs is one rule, here, so that a
kind cannot get it subtly wrong and two kinds cannot double up on one deployment:

- the replacement is placed with every keeper rule on the State without the cordoned nodes,
  the nodes the kind leaves out, and the nodes of the model's *other* instances (anti-affinity;
  the instance being moved may share nodes with its replacement, it is about to go);
- the kind's event records the move durably (a new master or a bridge taking over finishes it),
  and the deployment's memory watches the replacement as its placement in flight;
- once the replacement is ready, new chats go to it and the old instance keeps ``MOVE_SETTLE``
  for the chats it is answering; then it is deleted (or earlier, when the kind says so);
- one move per deployment at a time, across every kind, and at most one placement per step,
  none in a step that placed for recovery: so a model holds at most replicas + 1 instances. A
  move holds its deployment while its old instance is in the State (``holding``): once that is
  gone, only the move's record is left to end, and a State that trails its events (the bridge
  records an instance exo deleted once its absence lasts) must not hold the next move back;
- a replacement that does not fit leaves the old instance running and says why, retried when
  the cluster changes or every ``UNPLACEABLE_RETRY``; a forced kind deletes the old one instead.

A kind (``MoveKind``) supplies the moves under way it recorded, the candidates in its order, its
event, its words and, if it needs them, nodes to leave out, an early end and instances to delete
outright. The part keeps only what the State cannot show (the deletions it sent, when each
replacement was first seen ready, the moves that did not fit), bounded by the State.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from keeper.core.memo import DeploymentMemo, busy, wanted
from keeper.core.placement import PlaceFn
from keeper.core.view import ClusterSignature, node_names, without_nodes
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import AnyEvent, DeploymentPlaced, InstanceCreated, InstanceDeleted
from keeper.model.readiness import instance_is_ready
from keeper.model.state import (
    DeploymentId,
    InstanceId,
    InstanceMove,
    NodeId,
    State,
    cordoned_nodes,
)

# How long an instance a move replaces keeps answering the chats it has after its replacement
# is ready (new chats already go to the replacement): a few seconds covers the short chats of
# most clients; a longer reply is cut, as on any deletion.
MOVE_SETTLE = 5.0

NO_NODES: frozenset[NodeId] = frozenset()
# No extra nodes left out (the common case): one shared empty mapping.
NOTHING_AVOIDED: Mapping[str, frozenset[NodeId]] = {}


@dataclass(frozen=True)
class Candidate:
    """An instance a kind wants moved. ``scope`` is what the kind's notes are said for (a
    drain's node, the deployment itself); ``force`` deletes the old instance when no
    replacement fits (break-before-make) and retries on every step."""

    deployment_id: DeploymentId
    old: InstanceId
    scope: str
    force: bool = False


class MoveKind:
    """One reason to move instances (docs/design.md §5.17). Subclasses give ``name`` (the key
    of their notes), ``under_way``, ``candidates``, ``recorded`` and ``words``; the rest have
    defaults that change nothing."""

    name: str = ""
    # Whether a deployment short of instances waits for its recovery before this kind moves
    # one of its instances (a rolling change does: recovery already places with the new
    # options).
    waits_while_short: bool = False
    # Whether the old instance is deleted once its replacement has been ready MOVE_SETTLE. A
    # failover's is not: nothing is deleted for a node that is only suspect; its ``early_end``
    # says which instance goes, and when.
    settles: bool = True

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        """The moves of this kind the State records (durable: a new keeper finds them)."""
        raise NotImplementedError

    def candidates(self, state: State) -> Iterable[Candidate]:
        """The instances to move next, in the kind's order (the part skips a deployment with
        a move under way, one being deleted and an instance whose deletion was sent)."""
        raise NotImplementedError

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        """The event that records ``move`` durably."""
        raise NotImplementedError

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        """Why ``candidate`` cannot be moved now: ``left_out`` names the nodes its replacement
        may not use and why; ``why`` is placement's reason."""
        raise NotImplementedError

    def avoids(self, state: State, candidate: Candidate) -> Mapping[str, frozenset[NodeId]]:
        """Nodes the replacement may not use beyond the cordoned ones and the model's other
        instances', by why (a suspect node, say)."""
        return NOTHING_AVOIDED

    def early_end(self, state: State, move: InstanceMove) -> InstanceId | None:
        """An instance of ``move`` to delete now rather than settling (the old one on a node
        confirmed dead, the replacement when the reason went away), or None."""
        return None

    def doomed(self, state: State) -> Iterable[InstanceId]:
        """Instances this kind deletes outright, each once (a forced drain's unmanaged ones)."""
        return ()


# A move that did not fit: the cluster it failed on, when to try anyway, and why (its note).
Stuck = tuple[ClusterSignature, float, str]


@dataclass(frozen=True)
class MoveStep:
    """What the moves did in one step: the events, and the replacement placed (its
    deployment and instance), if one was, for the deployment's memory to watch."""

    events: list[AnyEvent]
    placed: tuple[DeploymentId, InstanceId] | None


@dataclass(frozen=True)
class Deciding:
    """What a step's moves decide on besides the State: the deployments' memories as observed
    in this step, those being deleted, the instance counts by model, the cluster's signature,
    the time, whether the step may still place, and how to place."""

    memos: Mapping[DeploymentId, DeploymentMemo]
    deleting: frozenset[DeploymentId] | set[DeploymentId]
    counts: Mapping[str, int]
    signature: ClusterSignature
    now: float
    may_place: bool
    place: PlaceFn


@dataclass
class Moves:
    """The moves' memory (module doc): only what the State cannot show yet."""

    # Instances whose InstanceDeleted was sent, until the State drops them.
    deleted: set[InstanceId] = field(default_factory=set[InstanceId])
    # Old instance -> when its replacement was first seen ready (on the keeper's clock).
    ready_at: dict[InstanceId, float] = field(default_factory=dict[InstanceId, float])
    # Per kind, per (scope, deployment): a move that did not fit.
    stuck: dict[str, dict[tuple[str, DeploymentId], Stuck]] = field(
        default_factory=dict[str, dict[tuple[str, DeploymentId], Stuck]]
    )

    def step(self, state: State, kinds: Sequence[MoveKind], deciding: Deciding) -> MoveStep:
        """Settle the moves under way, place the next replacement if the step may, delete what
        a kind dooms; ``kinds`` in the order they go first."""
        if self.deleted:
            self.deleted = {i for i in self.deleted if i in state.instances}
        if self.ready_at:
            self.ready_at = {i: t for i, t in self.ready_at.items() if i in state.instances}
        events: list[AnyEvent] = []
        under_way = [(kind, tuple(kind.under_way(state))) for kind in kinds]
        # One move per deployment at a time, whatever its kind: replicas + 1 at most.
        moving = holding(state, (move for _, moves in under_way for move in moves))
        placed: tuple[DeploymentId, InstanceId] | None = None
        for kind, moves in under_way:
            for move in moves:
                events.extend(self._settle(kind, move, state, deciding.now))
            for candidate in kind.candidates(state):
                if (
                    candidate.deployment_id in moving
                    or candidate.deployment_id in deciding.deleting
                    or candidate.old in self.deleted
                ):
                    continue
                may_place = deciding.may_place and placed is None  # one placement per step
                outcome, instance_id = self._move(kind, candidate, state, deciding, may_place)
                events.extend(outcome)
                if instance_id is not None:
                    placed = (candidate.deployment_id, instance_id)
            for instance_id in kind.doomed(state):
                events.extend(self._delete(instance_id, state))
        return MoveStep(events, placed)

    def _move(
        self,
        kind: MoveKind,
        candidate: Candidate,
        state: State,
        deciding: Deciding,
        may_place: bool,
    ) -> tuple[list[AnyEvent], InstanceId | None]:
        """Place a replacement for the candidate if it may be placed now: its events, and the
        replacement's id if one was placed."""
        deployment_id = candidate.deployment_id
        stuck = self.stuck.get(kind.name, {})
        key = (candidate.scope, deployment_id)
        known = stuck.get(key)
        now = deciding.now
        if (
            known is not None
            and known[0] == deciding.signature
            and now < known[1]
            and not candidate.force
        ):
            return [], None
        memo = deciding.memos[deployment_id]  # observed at the start of this step
        if not may_place or busy(memo, now) is not None:
            return [], None
        deployment = state.deployments[deployment_id]
        if kind.waits_while_short:
            # (The model is counted: the old instance is one of its instances.)
            short = deciding.counts[deployment.model_card.model_id] < wanted(memo, deployment)
            if short:
                return [], None
        avoided = kind.avoids(state, candidate)
        try:
            instance = deciding.place(
                replacement_view(state, candidate.old, avoided),
                deployment.model_card,
                deployment.sharding,
                deployment.instance_meta,
                deployment.min_nodes,
            )
        except ValueError as reason:
            left_out = left_out_words(state, candidate.old, avoided)
            note = kind.words(state, candidate, left_out, str(reason))
            self.stuck.setdefault(kind.name, {})[key] = (
                deciding.signature,
                now + UNPLACEABLE_RETRY,
                note,
            )
            if candidate.force:  # break-before-make: the keeper places it as for any fault
                return self._delete(candidate.old, state), None
            return [], None
        stuck.pop(key, None)
        new_id = instance.instance_id
        move = InstanceMove(
            deployment_id=deployment_id, old_instance_id=candidate.old, new_instance_id=new_id
        )
        # The move is recorded before its replacement appears: every State along the batch
        # then shows the extra instance as the move's, never as a duplicate (docs/design.md
        # §5.17; apply does not judge a move's instances, so the order is free).
        return [
            kind.recorded(candidate, move),
            InstanceCreated(instance=instance),
            DeploymentPlaced(deployment_id=deployment_id, instance_id=new_id),
        ], new_id

    def _settle(
        self, kind: MoveKind, move: InstanceMove, state: State, now: float
    ) -> list[AnyEvent]:
        """The old instance's deletion once its replacement has been ready MOVE_SETTLE: from
        the replacement's readiness on, new chats go to it (``chat_targets``), and the old
        instance finishes the chats it is answering. The kind may end the move earlier."""
        early = kind.early_end(state, move)
        if early is not None:
            return self._delete(early, state)
        if not kind.settles:
            return []
        replacement = state.instances.get(move.new_instance_id)
        if replacement is None or not instance_is_ready(replacement, state):
            return []
        old = move.old_instance_id
        ready_at = self.ready_at.setdefault(old, now)
        if now >= ready_at + MOVE_SETTLE:
            return self._delete(old, state)
        return []

    def _delete(self, instance_id: InstanceId, state: State) -> list[AnyEvent]:
        """An instance's deletion, sent once, and only while the State holds it."""
        if instance_id in self.deleted or instance_id not in state.instances:
            return []
        self.deleted.add(instance_id)
        return [InstanceDeleted(instance_id=instance_id)]

    def notes(self, kind: str, scope: str) -> list[str]:
        """Why the moves of ``kind`` for ``scope`` cannot be placed now, in deployment order."""
        stuck = self.stuck.get(kind, {})
        return [note for (where, _), (_, _, note) in sorted(stuck.items()) if where == scope]

    def forget_scope(self, kind: str, scope: str) -> None:
        """Forget why the moves of ``kind`` for ``scope`` did not fit (an uncordon)."""
        stuck = self.stuck.get(kind)
        if stuck:
            self.stuck[kind] = {k: v for k, v in stuck.items() if k[0] != scope}

    def keep_kinds(self, active: Iterable[str]) -> None:
        """Forget the notes of the kinds with nothing to do (the memory stays bounded)."""
        active = frozenset(active)
        if self.stuck.keys() - active:
            self.stuck = {name: s for name, s in self.stuck.items() if name in active}

    def at_rest(self) -> None:
        """No move of any kind: nothing of one to remember."""
        if self.deleted or self.ready_at or self.stuck:
            self.deleted = set()
            self.ready_at = {}
            self.stuck = {}


def holding(state: State, moves: Iterable[InstanceMove]) -> set[DeploymentId]:
    """The deployments a move under way holds: those of ``moves`` whose old instance the State
    still shows. A move whose old instance is gone has done its work (its replacement is the
    deployment's instance or its placement in flight, which the memo holds); only its record is
    left to end, and the bridge ends it seconds later, once exo's deletion lasts
    (``keeper.bridge.vanished``): a failover meanwhile must not wait for that."""
    return {move.deployment_id for move in moves if move.old_instance_id in state.instances}


def deployments_to_move(state: State, kinds: Sequence[MoveKind]) -> frozenset[DeploymentId]:
    """The deployments whose next move a step may place: a candidate of some kind, and no move
    of any kind under way (what the bridge asks exo's placement about before the step)."""
    moving = holding(state, (move for kind in kinds for move in kind.under_way(state)))
    return frozenset(
        candidate.deployment_id
        for kind in kinds
        for candidate in kind.candidates(state)
        if candidate.deployment_id not in moving
    )


def replacement_view(
    state: State,
    old_instance_id: InstanceId,
    avoided: Mapping[str, frozenset[NodeId]] = NOTHING_AVOIDED,
) -> State:
    """The State a replacement for ``old_instance_id`` is placed on: without the cordoned (and
    draining) nodes, those the kind avoids, and the nodes of the model's other instances."""
    others = _other_instances_nodes(state, old_instance_id)
    return without_nodes(state, others | cordoned_nodes(state) | _union(avoided.values()))


def left_out_words(
    state: State,
    old_instance_id: InstanceId,
    avoided: Mapping[str, frozenset[NodeId]] = NOTHING_AVOIDED,
) -> list[str]:
    """The nodes a replacement for ``old_instance_id`` may not use, and why, in words: the
    cordoned ones, those the kind avoids, and those serving the model already."""
    cordoned = cordoned_nodes(state)
    kept_out = cordoned | _union(avoided.values())
    others = _other_instances_nodes(state, old_instance_id)
    serving = frozenset(node for node in state.topology.nodes if node in others) - kept_out
    words = [f"cordoned: {node_names(state, cordoned)}"] if cordoned else []
    words.extend(f"{why}: {node_names(state, nodes)}" for why, nodes in avoided.items() if nodes)
    if serving:
        words.append(f"serving it already: {node_names(state, serving)}")
    return words


def _other_instances_nodes(state: State, old_instance_id: InstanceId) -> frozenset[NodeId]:
    """The nodes of the model's instances other than ``old_instance_id`` (anti-affinity)."""
    model_id = state.instances[old_instance_id].shard_assignments.model_id
    return frozenset(
        node
        for instance_id, instance in state.instances.items()
        if instance_id != old_instance_id and instance.shard_assignments.model_id == model_id
        for node in instance.shard_assignments.node_to_runner
    )


def _union(sets: Iterable[frozenset[NodeId]]) -> frozenset[NodeId]:
    return NO_NODES.union(*sets)
