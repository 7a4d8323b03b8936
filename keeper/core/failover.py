"""Fast failover's rules in the keeper core (docs/design.md §5.18): which instances a verdict
on their nodes puts at risk, which to delete once a node is dead, and what a deployment's
failover looks like to an operator.

The verdicts themselves are the State's (``State.node_watch``, reached by the service with
``keeper.model.liveness``); everything here is a pure function of the State, so the master's
sweep, the bridge, the keeper's replacement and ``GET /deployments`` read one answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from keeper.core.moves import Candidate, MoveKind
from keeper.core.view import node_names
from keeper.model.events import AnyEvent, FailoverReplacementPlaced
from keeper.model.readiness import instance_is_ready
from keeper.model.state import (
    AnyInstance,
    Deployment,
    InstanceId,
    InstanceMove,
    NodeId,
    NodeWatch,
    State,
)


def watched_nodes(state: State, instance: AnyInstance) -> list[NodeId]:
    """The nodes of ``instance`` that have a verdict (suspect or dead), sorted."""
    watch = state.node_watch
    return sorted(n for n in instance.shard_assignments.node_to_runner if n in watch)


def instances_on_dead_nodes(state: State) -> dict[InstanceId, list[NodeId]]:
    """Each instance with a runner on a node confirmed dead, in id order, with those nodes
    (sorted): what the service deletes once the verdict is in the State, so that no chat is
    sent to it any more (exo's master would keep sending them there until its own timeout)."""
    watch = state.node_watch
    dead = {node_id for node_id, seen in watch.items() if seen.phase == "dead"}
    if not dead:
        return {}
    found: dict[InstanceId, list[NodeId]] = {}
    for instance_id, instance in sorted(state.instances.items()):
        on = sorted(n for n in instance.shard_assignments.node_to_runner if n in dead)
        if on:
            found[instance_id] = on
    return found


def trusted_targets(state: State, targets: list[tuple[str, NodeId]]) -> list[tuple[str, NodeId]]:
    """Of the chat targets (``keeper.model.readiness.chat_targets``: ready instances, so none on
    a node confirmed dead, which readiness already leaves out), those on no suspect node; all of
    them when every one is on one (docs/design.md §5.18: a suspect node may yet answer; a chat
    sent nowhere surely fails)."""
    watch = state.node_watch
    if not watch:
        return targets

    def suspected(instance_id: str) -> bool:
        nodes = state.instances[instance_id].shard_assignments.node_to_runner
        return any(n in watch for n in nodes)

    return [t for t in targets if not suspected(t[0])] or targets


# --- the failover kind of move (keeper.core.moves) ------------------------------------------

# The words a replacement's note gives for the nodes it may not use because of a verdict.
SUSPECT_WORDS = "suspect or dead"


def _replicas_at_risk(state: State, deployment: Deployment) -> list[InstanceId]:
    """The deployment's model's instances on a node with a verdict, in id order, when a
    replacement for one may be placed: fewer instances off such nodes than ``replicas``, and
    the model's count below replicas + 1 (the replacement is the one extra)."""
    watch = state.node_watch
    model_id = deployment.model_card.model_id
    at_risk: list[InstanceId] = []
    healthy = 0
    for instance_id, instance in sorted(state.instances.items()):
        if instance.shard_assignments.model_id != model_id:
            continue
        if any(n in watch for n in instance.shard_assignments.node_to_runner):
            at_risk.append(instance_id)
        else:
            healthy += 1
    # With an instance at risk, healthy >= replicas implies the second test, so making it >
    # changes nothing (an equivalent mutant); the first says in words what is meant.
    if (
        healthy >= deployment.replicas  # pragma: no mutate
        or healthy + len(at_risk) > deployment.replicas
    ):
        return []
    return at_risk


@dataclass(frozen=True)
class FailoverMoves(MoveKind):
    """Fast failover as a kind of move (docs/design.md §5.18): an instance on a suspect node
    gets a replacement off every node with a verdict, before anything is deleted. It never
    settles by itself: the old instance goes when its node is confirmed dead (the service
    deletes it, and the keeper too, should the service not have yet), and the replacement goes
    when the node is heard again, unless only the replacement is ready (then the old one goes).
    """

    state_watch: Mapping[NodeId, NodeWatch]  # the step's State's verdicts
    name = "failover"
    settles = False

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        for deployment_id in sorted(state.deployments):
            move = state.deployments[deployment_id].failover
            if move is not None:
                yield move

    def candidates(self, state: State) -> Iterable[Candidate]:
        for deployment_id, deployment in sorted(state.deployments.items()):
            if deployment.failover is not None:
                continue
            for old in _replicas_at_risk(state, deployment)[:1]:
                nodes = watched_nodes(state, state.instances[old])
                yield Candidate(deployment_id, old, scope=",".join(nodes))

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        # The keeper reads no clock: the record's time is the verdict's on the old instance's
        # nodes (the latest), which is when this failover began.
        watch = self.state_watch
        since = max((watch[n].since for n in candidate.scope.split(",") if n in watch), default=0.0)
        return FailoverReplacementPlaced(deployment_id=candidate.deployment_id, move=move, at=since)

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        where = f" ({'; '.join(left_out)})" if left_out else ""
        nodes = node_names(state, frozenset(candidate.scope.split(",")))
        return (
            f"cannot place a replacement for instance {candidate.old} on suspect node {nodes}"
            f"{where}: {why}; it is left running"
        )

    def avoids(self, state: State, candidate: Candidate) -> Mapping[str, frozenset[NodeId]]:
        return {SUSPECT_WORDS: frozenset(state.node_watch)}

    def early_end(self, state: State, move: InstanceMove) -> InstanceId | None:
        old = state.instances.get(move.old_instance_id)
        new = state.instances.get(move.new_instance_id)
        if old is None or new is None:
            return None  # apply ends the move with either one's deletion
        phases = {state.node_watch[n].phase for n in watched_nodes(state, old)}
        if "dead" in phases:
            return move.old_instance_id
        if phases:
            return None  # still only suspect: both kept (nothing is deleted for a suspicion)
        # Heard again: the surplus goes, the replacement unless only it is ready.
        if instance_is_ready(new, state) and not instance_is_ready(old, state):
            return move.old_instance_id
        return move.new_instance_id


def failing_over(state: State) -> bool:
    """Whether a deployment has a failover under way (read once per change of the deployments
    by the keeper: the steady step does not look through every deployment, §5.9)."""
    return any(d.failover is not None for d in state.deployments.values())


def failover_kind(state: State, under_way: bool) -> FailoverMoves | None:
    """The failover kind when it has work in ``state``: a verdict on a node, or a failover
    under way (``under_way``, from ``failing_over``); None otherwise."""
    if state.node_watch or under_way:
        return FailoverMoves(state.node_watch)
    return None


@dataclass(frozen=True)
class FailoverPicture:
    """What a deployment's failover looks like: its phase, the nodes (ids, sorted) with a
    verdict that its instances are on, and since when (Unix time)."""

    phase: Literal["suspect", "replacing", "confirmed"]
    nodes: tuple[NodeId, ...]
    since: float


def failover_picture(deployment: Deployment, state: State) -> FailoverPicture | None:
    """The deployment's failover, from the State alone: ``confirmed`` when an instance of its
    model is on a dead node, else ``replacing`` when its replacement is recorded, else
    ``suspect`` when an instance is on a suspect node; None when none is."""
    watch = state.node_watch
    # A shortcut: with no verdict no instance is on a watched node, so the loop below ends in
    # None too, whatever the record says (its mutants are equivalent).
    if not watch and deployment.failover is None:  # pragma: no mutate
        return None
    model_id = deployment.model_card.model_id
    nodes: set[NodeId] = set()
    for instance in state.instances.values():
        if instance.shard_assignments.model_id == model_id:
            nodes.update(watched_nodes(state, instance))
    if not nodes:
        return None
    phases = {watch[n].phase for n in nodes}
    since = min(watch[n].since for n in nodes)
    if "dead" in phases:
        dead_since = min(watch[n].since for n in nodes if watch[n].phase == "dead")
        return FailoverPicture("confirmed", tuple(sorted(nodes)), dead_since)
    if deployment.failover is not None:
        placed = deployment.failover_since
        return FailoverPicture("replacing", tuple(sorted(nodes)), placed or since)
    return FailoverPicture("suspect", tuple(sorted(nodes)), since)
