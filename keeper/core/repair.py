"""Repair: a broken instance replaced make-before-break, as one more kind of move
(docs/design.md §5.19).

Which instances are broken is the data model's rule (``keeper.model.instance_health``); how a
move runs is the moves' part (``keeper.core.moves``). This module holds what is repair's own:

- ``RepairMoves``, the kind: the candidates are the broken instances the keeper placed for a
  deployment in ``repair: auto`` (an instance placed by hand only when the operator asked, with
  ``exo-deploy repair ID``), at most one per deployment; its early end deletes a hollow instance
  whose node reports its runner gone without waiting for the replacement to be ready, and a
  replacement that is broken itself (the broken one is judged again, under the backoff);
- ``Repairs``, the memory the step keeps: the marks the rules read (fed with the State and the
  step's ``now``, never a clock), the instances the operator asked to replace, and the
  placements exo accepted that never appeared.

Backoff (§5.19): ``AVOID_AFTER`` broken instances of one model on one node within
``INCIDENT_WINDOW_S`` make its replacements avoid that node for ``AVOID_FOR_S``; never for ever
(the incidents age out), and never so that nothing may hold the model: a replacement that does
not fit with the avoided nodes left out keeps the broken instance and says so, in the part's
words. The incidents are not the step's memory but the State's (``State.repair_incidents``):
the step says each newly broken instance with ``InstanceFoundBroken`` and the old ones gone with
``RepairIncidentsExpired``, stamped in Unix time (the step's ``now`` plus the host's
``wall_offset``), so a master rebuilt from its log or a bridge taking over from etcd avoids the
same nodes until the same moment, in the same words.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from keeper.core.moves import Candidate, MoveKind
from keeper.model.constants import PLACEMENT_TIMEOUT
from keeper.model.events import (
    AnyEvent,
    DeploymentRepairPlaced,
    InstanceFoundBroken,
    RepairIncidentsExpired,
)
from keeper.model.instance_health import (
    FAILING_CHATS,
    NO_MARKS,
    Marks,
    Verdict,
    chats_failing,
    time_judged,
    track,
    verdicts,
)
from keeper.model.state import (
    AVOID_AFTER,
    INCIDENT_WINDOW_S,
    DeploymentId,
    InstanceId,
    InstanceMove,
    ModelId,
    NodeId,
    RepairIncident,
    State,
    keeper_placements,
    node_name,
)

# AVOID_AFTER and INCIDENT_WINDOW_S live with the incidents in the State (keeper.model.state),
# which apply bounds by them. How long the node is avoided for the model after the last of
# them: long enough for a replacement to settle elsewhere, short enough that a fixed node is
# used again the same hour.
AVOID_FOR_S = 10 * 60.0
PROBLEM_WORDS = {
    "stalled": ("stalled start", "stalled starts"),
    "hollow": ("hollow instance", "hollow instances"),
    "failing": ("instance failing chats", "instances failing chats"),
    "unfulfilled": ("placement never fulfilled", "placements never fulfilled"),
}


def problem_words(problem: str, count: int) -> str:
    """``3 stalled starts``, ``1 hollow instance``."""
    one, many = PROBLEM_WORDS.get(problem, (problem, problem))
    return f"{count} {one if count == 1 else many}"


def avoiding(
    incidents: Iterable[RepairIncident], state: State, model_id: ModelId, now: float
) -> dict[str, frozenset[NodeId]]:
    """The nodes a replacement for ``model_id`` avoids at ``now`` (Unix time), by why in words
    (module doc)."""
    by_node: dict[NodeId, list[RepairIncident]] = {}
    for incident in incidents:
        if incident.model_id == model_id and incident.at >= now - INCIDENT_WINDOW_S:
            by_node.setdefault(incident.node_id, []).append(incident)
    avoided: dict[str, frozenset[NodeId]] = {}
    for node_id, recent in sorted(by_node.items()):
        last = max(i.at for i in recent)
        if len(recent) < AVOID_AFTER or now >= last + AVOID_FOR_S:
            continue
        problem = max(
            sorted({i.problem for i in recent}), key=lambda p: sum(i.problem == p for i in recent)
        )
        left = last + AVOID_FOR_S - now
        words = (
            f"avoiding {node_name(state, node_id)} for {model_id} for {left / 60:.0f} min: "
            f"{problem_words(problem, len(recent))}"
        )
        avoided[words] = frozenset({node_id})
    return avoided


@dataclass(frozen=True)
class RepairMoves(MoveKind):
    """The repairs of one step: the broken instances (``found``), the ones the operator asked
    to replace (``asked``), and the nodes to avoid by model (``avoided``)."""

    found: Mapping[InstanceId, Verdict]
    asked: frozenset[InstanceId] = frozenset()
    avoided: Mapping[ModelId, Mapping[str, frozenset[NodeId]]] = field(
        default_factory=dict[ModelId, Mapping[str, frozenset[NodeId]]]
    )
    name = "repair"

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        for _, deployment in sorted(state.deployments.items()):
            if deployment.repairing is not None:
                yield deployment.repairing

    def candidates(self, state: State) -> Iterable[Candidate]:
        owner = keeper_placements(state)
        for deployment_id, deployment in sorted(state.deployments.items()):
            if deployment.repairing is not None:
                continue
            model_id = deployment.model_card.model_id
            for instance_id in sorted(state.instances):
                instance = state.instances[instance_id]
                if instance.shard_assignments.model_id != model_id:
                    continue
                if instance_id in self.asked or (
                    instance_id in self.found
                    and owner.get(instance_id) == deployment_id
                    and deployment.repair == "auto"
                ):
                    yield Candidate(deployment_id, instance_id, scope=deployment_id)
                    break  # one at a time per deployment

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        found = self.found.get(candidate.old)
        return DeploymentRepairPlaced(
            deployment_id=candidate.deployment_id,
            move=move,
            problem=found.problem if found is not None else "asked",
            why=found.why if found is not None else "the operator asked",
        )

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        """Why a broken instance cannot be replaced now, naming the nodes left out and why."""
        where = f" ({'; '.join(left_out)})" if left_out else ""
        return f"cannot replace broken instance {candidate.old}{where}: {why}"

    def avoids(self, state: State, candidate: Candidate) -> Mapping[str, frozenset[NodeId]]:
        """The broken instance's own nodes (a replacement goes elsewhere: what broke it there
        may break the next), and those the model keeps breaking on (the backoff)."""
        model_id = state.deployments[candidate.deployment_id].model_card.model_id
        own = frozenset(state.instances[candidate.old].shard_assignments.node_to_runner)
        return {"the broken instance's": own, **self.avoided.get(model_id, {})}

    def early_end(self, state: State, move: InstanceMove) -> InstanceId | None:
        """The broken instance at once when its node reports its runner gone (it serves
        nothing, and waiting keeps its memory); a replacement broken itself."""
        old = self.found.get(move.old_instance_id)
        if old is not None and old.gone:
            return move.old_instance_id
        if move.new_instance_id in self.found:
            return move.new_instance_id
        return None


@dataclass
class Repairs:
    """The repair memory of a keeper (module doc), bounded by the State."""

    marks: Marks = NO_MARKS
    # The broken instances as of the last step.
    found: dict[InstanceId, Verdict] = field(default_factory=dict[InstanceId, Verdict])
    # Instances the operator asked to replace, until the State drops them.
    asked: set[InstanceId] = field(default_factory=set[InstanceId])
    # Per deployment, a placement exo accepted that never appeared (said until one does).
    unfulfilled: dict[DeploymentId, Verdict] = field(default_factory=dict[DeploymentId, Verdict])
    # The incidents found and not yet said to the State (``recorded`` hands them to the step).
    incidents: list[InstanceFoundBroken] = field(default_factory=list[InstanceFoundBroken])
    # Per instance, its last chats (when sent, and None or how it failed), FAILING_CHATS at most.
    chats: dict[InstanceId, tuple[tuple[float, str | None], ...]] = field(
        default_factory=dict[InstanceId, tuple[tuple[float, str | None], ...]]
    )
    # The State's parts the marks were last tracked on (the same objects: nothing to track).
    _read: tuple[object, ...] = (None, None, None, None, None)
    # The instances time alone may find broken on the State last tracked (``time_judged``), in
    # id order (the order they are judged and said in).
    _pending: tuple[InstanceId, ...] = ()
    # The deployments mapping ``_under_way`` last read, and its answer.
    _deployments_read: object = None
    _repairing: bool = False

    def observe(self, state: State, now: float, wall: float) -> dict[InstanceId, Verdict]:
        """Track ``state`` at ``now`` and judge its instances; a newly broken one of a
        deployment's model is an incident on its nodes, at ``wall`` (Unix time), unless the
        State has it already (a new master finds the same broken instance again)."""
        parts = (state.instances, state.runners, state.downloads, state.topology, state.node_watch)
        # (No mutation of the next lines: ``strict`` never matters, both have five parts; and
        # judging every instance rather than the pending gives the same verdicts, only slower.)
        if any(a is not b for a, b in zip(parts, self._read, strict=True)):  # pragma: no mutate
            self.marks = track(self.marks, state, now)
            self._read = parts
            self._pending = tuple(sorted(time_judged(state, self.marks)))  # pragma: no mutate
        # Only these can be found broken by time passing on the same State: on a cluster at
        # rest, none (docs/design.md §5.9: the steady step reads what changed, not everything).
        found = verdicts(state, self.marks, now, self._pending)  # pragma: no mutate
        if self.chats:
            self.chats = {i: c for i, c in self.chats.items() if i in state.instances}
            for instance_id, chats in self.chats.items():
                if instance_id in found:
                    continue
                outcomes = [outcome for _, outcome in chats]
                failing = chats_failing(state.instances[instance_id], state, outcomes, chats[0][0])
                if failing is not None:
                    found[instance_id] = failing
        for instance_id, judged in found.items():
            if instance_id in self.found:
                continue
            model_id = state.instances[instance_id].shard_assignments.model_id
            if not any(d.model_card.model_id == model_id for d in state.deployments.values()):
                continue
            if any(i.instance_id == instance_id for i in state.repair_incidents):
                continue
            self.incidents.append(
                InstanceFoundBroken(
                    instance_id=instance_id,
                    model_id=model_id,
                    node_ids=tuple(judged.nodes),
                    problem=judged.problem,
                    at=wall,
                )
            )
        self.found = found
        if self.asked:
            self.asked &= set(state.instances)
        if self.unfulfilled:
            self.unfulfilled = {
                d: v
                for d, v in self.unfulfilled.items()
                if d in state.deployments
                and not _has_instance(state, state.deployments[d].model_card.model_id)
            }
        return found

    def note_chat(self, instance_id: InstanceId, failed: str | None, now: float) -> None:
        """How a chat to ``instance_id`` went (module doc); the last FAILING_CHATS are kept."""
        chats = (*self.chats.get(instance_id, ()), (now, failed))
        self.chats[instance_id] = chats[-FAILING_CHATS:]

    def never_appeared(
        self, deployment_id: DeploymentId, instance_id: InstanceId, placed_at: float
    ) -> None:
        """A placement exo accepted did not appear within PLACEMENT_TIMEOUT: placed again, and
        said until the model has an instance."""
        why = (
            f"placement of instance {instance_id} accepted but never appeared in "
            f"{PLACEMENT_TIMEOUT:.0f}s; placing again"
        )
        self.unfulfilled[deployment_id] = Verdict(instance_id, "unfulfilled", why, placed_at)

    def recorded(self, state: State, wall: float) -> list[AnyEvent]:
        """The incidents to say to the State (each once), and the expiry of those older than
        the window at ``wall`` (Unix time), so the State holds no incident that counts for
        nothing."""
        events: list[AnyEvent] = list(self.incidents)
        self.incidents = []
        before = wall - INCIDENT_WINDOW_S
        if any(i.at < before for i in state.repair_incidents):
            events.append(RepairIncidentsExpired(before=before))
        return events

    def known_incidents(self, state: State) -> list[RepairIncident]:
        """The State's incidents and those found but not yet said to it."""
        pending = [
            RepairIncident(
                model_id=e.model_id,
                node_id=n,
                instance_id=e.instance_id,
                problem=e.problem,
                at=e.at,
            )
            for e in self.incidents
            for n in e.node_ids
        ]
        return [*state.repair_incidents, *pending]

    def kind(self, state: State, wall: float) -> RepairMoves | None:
        """The step's repair kind, or None when it has nothing to do; the backoff read at
        ``wall`` (Unix time)."""
        if not (self.found or self.asked or self._under_way(state)):
            return None
        models = {state.instances[i].shard_assignments.model_id for i in (*self.found, *self.asked)}
        incidents = self.known_incidents(state)
        avoided = {m: avoiding(incidents, state, m, wall) for m in sorted(models)}
        return RepairMoves(dict(self.found), frozenset(self.asked), avoided)

    def _under_way(self, state: State) -> bool:
        """Whether a deployment records a repair under way; read again only when the State's
        deployments are another mapping (apply replaces it on any change; §5.9)."""
        if state.deployments is not self._deployments_read:  # pragma: no mutate (a cache)
            self._deployments_read = state.deployments  # pragma: no mutate (read again: same)
            self._repairing = any(d.repairing is not None for d in state.deployments.values())
        return self._repairing

    def health(self, state: State) -> dict[DeploymentId, Verdict]:
        """Per deployment, what is wrong with an instance of its model (the first in id order),
        or the placement that never appeared."""
        said: dict[DeploymentId, Verdict] = dict(self.unfulfilled)
        by_model = {d.model_card.model_id: d_id for d_id, d in state.deployments.items()}
        for instance_id, judged in sorted(self.found.items()):
            instance = state.instances.get(instance_id)
            if instance is None:
                continue
            deployment_id = by_model.get(instance.shard_assignments.model_id)
            if deployment_id is not None and deployment_id not in said:
                said[deployment_id] = judged
        return said


def _has_instance(state: State, model_id: ModelId) -> bool:
    return any(i.shard_assignments.model_id == model_id for i in state.instances.values())
