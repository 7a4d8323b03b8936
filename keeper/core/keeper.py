"""The keeper: keeps each deployment's count of instances (``replicas``) of its model, placing
one whenever the cluster holds fewer (the rules are in docs/design.md §5).

It is a pure function of the State plus a small memory per deployment (``keeper.core.memo``):
``step`` reads no clock, does no I/O and returns the events to emit; the master applies them.
The State trails the keeper's events (they go round the router first), so the memory holds
exactly what the State cannot yet show: the placement on its way, whether the instance it
watches was ever ready, the waits that follow failures, and the error already reported.

A step does a bounded amount of work however many deployments wait: every deployment is
observed (cheap dictionary lookups), but placement is attempted for at most
``MAX_PLACEMENT_ATTEMPTS_PER_STEP`` of them, and at most one placement succeeds, so each
placement is made against a state holding the previous one. The attempts, with their resuming
and the crashes of placement they meet, are ``keeper.core.attempts``'s; the keeper logs nothing.

Replicas (docs/design.md §5.11): any instance of the model counts towards the deployment's
count; each deployment has at most one placement of its own in flight, so a replica is placed
only against a state that shows the previous one; a new replica goes only to nodes that hold
no runner of another instance of the model (anti-affinity), by handing placement a State
without those nodes. ``scale`` and ``delete`` are commands (``keeper.core.commands``, the base
class that holds the memory they note), run by the host under the same lock as the steps; they
remove only the keeper's own instances, which the State records durably
(``Deployment.placed_instance_ids``) so that a new master can still find them.

Priorities (docs/design.md §5.13): the due deployments are tried highest priority first. A
deployment that may ``preempt`` and cannot be placed takes the fewest of the keeper's own
instances of strictly lower priorities whose deletion lets it be placed (``keeper.core.attempts``,
with ``keeper.core.preemption``); that preemption is the step's one placement, and its victims
wait like refused ones.

Moves (docs/design.md §5.17): drains and rolling changes are kinds (``move_kinds``) of one
make-before-break move that ``keeper.core.moves`` runs; the step calls it after recovery, so a
move places only in a step that placed nothing else, and the keeper keeps only the step's order
and a drain's end.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keeper.core.attempts import MAX_PLACEMENT_ATTEMPTS_PER_STEP, DuePlacements
from keeper.core.commands import KeeperCommands
from keeper.core.draining import DRAINS, drains_ended
from keeper.core.failover import FailoverMoves, failing_over, failover_kind
from keeper.core.memo import (
    FRESH,
    DeploymentMemo,
    lost_with_master,
    observe,
    placed,
    waiting,
    wanted,
)
from keeper.core.moves import MOVE_SETTLE, Deciding, MoveKind, Stuck
from keeper.core.placement import PlaceFn, place_instance
from keeper.core.preemption import by_priority
from keeper.core.repair import RepairMoves, Repairs, avoiding
from keeper.core.rolling import RollingMoves, rolling_deployments
from keeper.core.stager import MAX_STAGING_PLANS_PER_STEP, STAGING_INTERVAL, Stager
from keeper.core.view import (
    AT_REST,
    ClusterSignature,
    cluster_signature,
    models_instance_counts,
)
from keeper.model.api_models import WaitReason
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentOptionsChanged,
    DeploymentPriorityChanged,
    DeploymentScaled,
    InstanceCreated,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeDrainEnded,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.instance_health import NO_MARKS, Verdict
from keeper.model.master_change import master_changed
from keeper.model.readiness import deployment_status, ready_replicas
from keeper.model.state import (
    Deployment,
    DeploymentId,
    InstanceId,
    RunnerFailed,
    RunnerReady,
    State,
)

# The status rule lives with the data model (``keeper.model.readiness``) so that the TUI shares it;
# it is re-exported here, where ``keeper.deployment_status`` has always come from.
__all__ = [
    "MAX_PLACEMENT_ATTEMPTS_PER_STEP",
    "MAX_STAGING_PLANS_PER_STEP",
    "MOVE_SETTLE",
    "STAGING_INTERVAL",
    "DeploymentTimer",
    "Keeper",
    "PlaceFn",
    "deployment_status",
    "has_instance",
    "ready_replicas",
]


@dataclass(frozen=True)
class DeploymentTimer:
    """A read-only view of the keeper's memory of one deployment, for the API and the TUI."""

    failures: int  # placements lost before ready, in a row
    next_attempt_at: float | None  # on the caller's monotonic clock (the `now` of step)
    waiting: WaitReason | None


class Keeper(KeeperCommands):
    def __init__(
        self,
        started_at: float,
        place: PlaceFn = place_instance,
        *,
        startup_grace: float = STARTUP_GRACE,
        preview: PlaceFn = place_instance,
    ) -> None:
        """A keeper that places nothing before ``started_at + startup_grace`` (a new master
        first waits for its nodes to report the instances they already run). ``preview`` is the
        placement staging asks where a replica would fail over to (the bridge places through
        exo's answers but previews with our placement and exo's cards)."""
        super().__init__(Stager(preview))
        self.started_at = started_at
        self.startup_grace = startup_grace
        self._place = place
        # The due deployments' placement attempts: where they resume, the crashes they met
        # (``keeper.core.attempts``).
        self._placing = DuePlacements()
        # Broken instances: the marks their rules read, the operator's asks, the incidents
        # (``keeper.core.repair``, docs/design.md §5.19).
        self._repairs = Repairs()
        # Unix time minus the step's ``now``: what the durable records of the backoff are
        # stamped in (the host's clocks, set by it; 0 when ``now`` is Unix time already), so a
        # new master or bridge reads them on its own clock (docs/design.md §5.19).
        self.wall_offset = 0.0
        # Which deployments a rolling change is under way for (``_rolling_deployments``).
        self._rolling: tuple[DeploymentId, ...] = ()  # pragma: no mutate (read before used)
        # Whether a deployment has a failover under way, read with the rolling list.
        self._failing_over = False  # pragma: no mutate (read before used)
        # The last step's State, as references to its instances, runners and deployments (not
        # copies, and not the keeper's memory: one State, whatever its size), and each
        # deployment as observed with the memo observe gave (``step``: observed on the same
        # objects again, a memo would not change).
        self._state_read: tuple[object, object, object] = (None, None, None)
        self._observed: dict[DeploymentId, tuple[Deployment, DeploymentMemo]] = {}
        # The State the last step read (a reference): exo's master changing shows only between
        # two States (``keeper.model.master_change``; our own master's index never goes back).
        self._previous: State | None = None

    # --- stepping -------------------------------------------------------------------------

    def step(self, state: State, now: float) -> list[AnyEvent]:
        # Forgetting comes first: a command (scale, delete) may leave memory during the grace.
        self._forget_departed(state)
        self._master_changed(state)
        if now < self.started_at + self.startup_grace:
            return []
        if not state.deployments and not state.drains:
            return []
        counts = models_instance_counts(state)
        short: list[tuple[Deployment, DeploymentMemo]] = []
        memos = self._memos
        deleting = self._deleting
        # observe is idempotent and reads the State's instances and runners, the deployment
        # and the memo (and the time, only for a placement on its way): when none of them is
        # another object than at the last step's observe (apply replaces what it changes; a
        # command replaces the memo), observing again would give the same memo. (The lines of
        # this cache are not mutated: a mutant observes, or reads again, when it need not, and
        # gives the same memos only slower; docs/design.md §5.9. The memo's own identity is
        # checked too though observe leaves a command's memo as it is on an unchanged State
        # today: it keeps the skip right should observe ever read what a command writes.)
        last_read = self._state_read
        seen_i, seen_r, seen_deployments = last_read  # the instances, runners, deployments
        # (The mutants of the next line that survive ignore the instances, and are equivalent:
        # every instance change observe acts on comes with another it reads, a placement on its
        # way, a deployment's record, or the runners removed with a deleted instance; those that
        # ignore the runners are killed, by a runner turning ready at rest.)
        same_state = state.instances is seen_i and state.runners is seen_r  # pragma: no mutate
        observed = self._observed
        for deployment_id, deployment in sorted(state.deployments.items()):
            if deployment_id in deleting:
                continue
            memo = memos.get(deployment_id, FRESH)
            last = observed.get(deployment_id)  # pragma: no mutate
            if not (  # pragma: no mutate
                same_state
                and memo.in_flight is None
                and last is not None
                and last[0] is deployment  # pragma: no mutate
                and last[1] is memo  # pragma: no mutate
            ):
                before = memo.in_flight
                memo = observe(memo, deployment, state, now)
                # Given up on, never arrived (not arrived and gone): said (§5.19).
                if (
                    before is not None
                    and memo.in_flight is None
                    and before not in state.instances
                    and deployment.instance_id != before
                ):
                    self._repairs.never_appeared(deployment_id, before, memo.placed_at)
                memos[deployment_id] = memo
                observed[deployment_id] = (deployment, memo)  # pragma: no mutate
            if counts.get(deployment.model_card.model_id, 0) < wanted(memo, deployment):
                short.append((deployment, memo))
        rolling = self._rolling_deployments(state, seen_deployments)  # pragma: no mutate
        self._state_read = (state.instances, state.runners, state.deployments)
        # The signature is read only when a deployment is short of instances: on a cluster at
        # rest it would be most of the step (docs/design.md §5.9). (No mutation: computing it
        # when none is short changes no answer, only the time.)
        signature = cluster_signature(state) if short else AT_REST  # pragma: no mutate
        due = [deployment for deployment, memo in short if waiting(memo, signature, now) is None]
        # Higher priorities first; equal ones in id order, resumed where the last step stopped.
        placing = self._placing
        events = placing.attempt(
            by_priority(placing.in_turn(due)), state, signature, now, memos, deleting, self._place
        )
        failover = failover_kind(state, self._failing_over)
        wall = now + self.wall_offset
        self._repairs.observe(state, now, wall)
        repair = self._repairs.kind(state, wall)
        if state.drains or rolling or failover is not None or repair is not None:
            # Recovery first: a move places only in a step that placed nothing else, and at
            # most one move places per step (failover first, then drains, then rolling changes).
            placed_now = any(isinstance(e, InstanceCreated) for e in events)
            # The signature read above when a deployment was short, else read now. (No
            # mutation: reading it again when short gives the same signature, only later.)
            move_signature = signature if short else cluster_signature(state)  # pragma: no mutate
            kinds = move_kinds(state, rolling, failover, repair=repair)
            # (No mutation: with no drain none ends; the test saves the look.)
            ended = self._drains_ended(state) if state.drains else []  # pragma: no mutate
            moved = self._move(state, kinds, counts, move_signature, now, placed_now)
            events = [*events, *ended, *moved]
            self._moves.keep_kinds(kind.name for kind in kinds)
        else:
            self._moves.at_rest()
        if not state.drains:
            self._drain_ended = set()
        # Staging only when no placement is due: placing comes first. A deployment short but
        # waiting (its backoff, a cluster nothing fits, a placement on its way) does not hold
        # the others' staging back: one model too big for the cluster would stop it for good.
        if not due and not events and self._stager.due(now):
            events = self._stager.step(state, self._deleting, now)
        # The backoff's facts, said to the State (docs/design.md §5.19): after staging, which
        # they must not hold back.
        return [*events, *self._repairs.recorded(state, wall)]

    def _master_changed(self, state: State) -> None:
        """When exo's master changed since the last step, the instances lost with it are no
        failures of their placement (``memo.lost_with_master``): the deployments are placed
        again at once, with no backoff (docs/design.md §3.5, "exo's master changed")."""
        previous, self._previous = self._previous, state
        if master_changed(previous, state) is None:
            return
        instances = state.instances
        self._memos = {d: lost_with_master(memo, instances) for d, memo in self._memos.items()}

    def _move(
        self,
        state: State,
        kinds: Sequence[MoveKind],
        counts: Mapping[str, int],
        signature: ClusterSignature,
        now: float,
        placed_now: bool,
    ) -> list[AnyEvent]:
        """The moves' step (``keeper.core.moves``) for ``kinds``, in the order they go first;
        a replacement placed is the deployment's placement in flight (one at a time, backoff
        if lost)."""
        deciding = Deciding(
            self._memos, self._deleting, counts, signature, now, not placed_now, self._place
        )
        moved = self._moves.step(state, kinds, deciding)
        if moved.placed is not None:
            deployment_id, instance_id = moved.placed
            self._memos[deployment_id] = placed(self._memos[deployment_id], instance_id, now)
        return moved.events

    def _drains_ended(self, state: State) -> list[AnyEvent]:
        """A drain whose node nothing uses any more ends, said once."""
        self._drain_ended &= set(state.drains)
        events: list[AnyEvent] = []
        for name in drains_ended(state):
            if name not in self._drain_ended:
                self._drain_ended.add(name)
                events.append(NodeDrainEnded(name=name))
        return events

    # (The moves' memory, under the names the memory tests read.)
    @property
    def _move_deleted(self) -> set[InstanceId]:
        return self._moves.deleted

    @property
    def _move_ready_at(self) -> dict[InstanceId, float]:
        return self._moves.ready_at

    @property
    def _drain_stuck(self) -> dict[tuple[str, DeploymentId], Stuck]:
        return self._moves.stuck.get(DRAINS.name, {})

    # --- rolling changes ----------------------------------------------------------------

    def _rolling_deployments(self, state: State, last_read: object) -> tuple[DeploymentId, ...]:
        """The deployments with an instance still to replace or a replacement under way, in id
        order, none being deleted. Read again only when the State's deployments are another
        mapping than at the last step: apply replaces it whenever a deployment changes, and on
        a cluster at rest it does not (the steady step is the master's hot path, §5.9)."""
        deployments = state.deployments
        # (No mutation: reading again every step gives the same answer, only slower.)
        if deployments is not last_read:  # pragma: no mutate
            self._rolling = rolling_deployments(state)
            self._failing_over = failing_over(state)
        rolling = self._rolling
        deleting = self._deleting
        if not deleting:  # pragma: no mutate (filtering when none is deleted gives the same)
            return rolling
        return tuple(d for d in rolling if d not in deleting)

    def update_note(self, deployment_id: str) -> str | None:
        """Why the rolling change of ``deployment_id`` cannot place its next replacement now."""
        notes = self._moves.notes(RollingMoves.name, deployment_id)
        return notes[0] if notes else None

    def failover_note(self, deployment_id: str) -> str | None:
        """Why the failover of ``deployment_id`` cannot place its replacement now, or None."""
        notes = [
            note
            for (_, deployment), (_, _, note) in sorted(
                self._moves.stuck.get(FailoverMoves.name, {}).items()
            )
            if deployment == deployment_id
        ]
        return notes[0] if notes else None

    def drain_note(self, name: str) -> str | None:
        """Why the drain of ``name`` cannot move an instance now, or None."""
        notes = self._moves.notes(DRAINS.name, name)
        return "; ".join(notes) if notes else None

    def staging_note(self, deployment_id: str) -> str | None:
        """Why the deployment has fewer standby sets planned than it asks for, or None."""
        return self._stager.note(deployment_id)

    def _forget_departed(self, state: State) -> None:
        """Drop the memory of deployments the state no longer holds, so it cannot grow."""
        live = state.deployments
        # (Rebuilt only when one departed: at rest, every step would copy every memo. No
        # mutation: rebuilding also when none departed gives the same memos, only slower.)
        if not self._memos.keys() <= live.keys():  # pragma: no mutate
            self._memos = {d: memo for d, memo in self._memos.items() if d in live}
        if not self._observed.keys() <= live.keys():  # pragma: no mutate (as for the memos)
            # (An entry of a departed deployment is never read again, only kept: the memory
            # tests count it.)
            self._observed = {d: seen for d, seen in self._observed.items() if d in live}
        self._stager.forget_departed(live)
        self._deleting = {d for d in self._deleting if d in live}
        repairs = self._repairs
        if not live and (repairs.marks is not NO_MARKS or repairs.chats):  # nothing to repair
            self._repairs = Repairs()
        self._placing.forget_departed(live)

    def placement_crashes(self) -> Mapping[DeploymentId, Exception]:
        """The exception (with its traceback) of each deployment whose latest placement attempt
        raised something other than ValueError; its event carries only "<Type>: <message>"."""
        return self._placing.crashes()

    # --- broken instances (docs/design.md §5.19) --------------------------------------------

    def repair(self, instance_id: InstanceId, state: State) -> str | None:
        """Replace ``instance_id`` as soon as a step may, whatever its deployment's ``repair``
        and whoever placed it (the operator said so); the reason it cannot be, in words, or
        None once asked."""
        instance = state.instances.get(instance_id)
        if instance is None:
            return f"no instance {instance_id}"
        model_id = instance.shard_assignments.model_id
        if not any(d.model_card.model_id == model_id for d in state.deployments.values()):
            return f"instance {instance_id} is of {model_id}, which no deployment keeps"
        self._repairs.asked.add(instance_id)
        return None

    def note_chat(self, instance_id: InstanceId, failed: str | None, now: float) -> None:
        """How a chat to ``instance_id`` went (None: answered; else how it failed), at ``now``
        on the keeper's clock: the failing-chats rule reads the last few."""
        self._repairs.note_chat(instance_id, failed, now)

    def repair_kind(self, state: State, now: float) -> RepairMoves | None:
        """The repairs a step on ``state`` at ``now`` would make (what the bridge asks exo's
        placement about before the step): judged now, as the step will judge them."""
        wall = now + self.wall_offset
        if state.deployments:
            self._repairs.observe(state, now, wall)
        return self._repairs.kind(state, wall)

    def health(self, state: State) -> Mapping[DeploymentId, Verdict]:
        """Per deployment, what is wrong with an instance of its model as of the last step."""
        return self._repairs.health(state)

    def avoiding(self, state: State, model_id: str, now: float) -> list[str]:
        """The nodes a replacement for ``model_id`` avoids now, in words."""
        incidents = self._repairs.known_incidents(state)
        return sorted(avoiding(incidents, state, model_id, now + self.wall_offset))

    # --- the operator's view --------------------------------------------------------------

    def timers(self, state: State, now: float) -> dict[str, DeploymentTimer]:
        """What the next step would wait for, per deployment; never changes the keeper."""
        grace_ends = self.started_at + self.startup_grace
        counts = models_instance_counts(state)
        signature = cluster_signature(state)
        # As the step on ``state`` will see it (``_master_changed``): the bridge asks before.
        reset = master_changed(self._previous, state) is not None
        views: dict[str, DeploymentTimer] = {}
        for deployment_id, deployment in state.deployments.items():
            memo = self._memos.get(deployment_id, FRESH)
            if reset:
                memo = lost_with_master(memo, state.instances)
            memo = observe(memo, deployment, state, now)
            wait: tuple[WaitReason, float] | None
            enough = counts.get(deployment.model_card.model_id, 0) >= wanted(memo, deployment)
            if deployment_id in self._deleting or enough:
                wait = None
            elif now < grace_ends:
                wait = ("grace", grace_ends)
            else:
                wait = waiting(memo, signature, now)
            views[deployment_id] = DeploymentTimer(
                failures=memo.failures,
                next_attempt_at=None if wait is None else wait[1],
                waiting=None if wait is None else wait[0],
            )
        return views


def move_kinds(
    state: State,
    rolling: Sequence[DeploymentId],
    failover: MoveKind | None = None,
    repair: RepairMoves | None = None,
) -> list[MoveKind]:
    """The kinds of move with work in ``state``, in the order they go first (docs/design.md
    §5.17): a failover (``failover_kind``: an outage beats planned work, §5.18), drains, the
    rolling changes of ``rolling`` (``rolling_deployments``), then the repairs of broken
    instances (§5.19)."""
    kinds: list[MoveKind] = [failover] if failover is not None else []
    # (No mutation: the drains' kind with no drain finds nothing to do; the test saves its work.)
    if state.drains:  # pragma: no mutate
        kinds.append(DRAINS)
    if rolling:
        kinds.append(RollingMoves(rolling))
    if repair is not None:
        kinds.append(repair)
    return kinds


def has_instance(state: State, model_id: str) -> bool:
    """Whether any instance of the model exists, however it was placed."""
    return any(
        instance.shard_assignments.model_id == model_id for instance in state.instances.values()
    )


def calls_for_step(event: AnyEvent) -> bool:
    """Whether an applied event may call for a placement, so the host steps now rather than at
    the next tick (docs/design.md §6.6, prompt stepping).

    A deployment created or scaled wants instances; one given a new priority or leave to preempt
    may now go first, or displace a lower one (docs/design.md §5.13); an instance deleted may
    leave one short; an instance created is the previous placement now visible, so the next one
    (another replica, another deployment) can be decided against it; a node's report may be a
    node joining or carry the memory and backends placement reads; a node timing out or a link
    changing alters the cluster placement sees, and so does a verdict on a node (suspect, dead,
    heard again: fast failover's replacement and its surplus, docs/design.md §5.18). A runner
    turning Ready or Failed changes what the keeper must remember of its instance: whether it
    was ever ready decides whether its loss is placed again at once or backs off (docs/design.md
    §5.4), so a step must see it ready before a loss can follow. The rest (the keeper's own
    bookkeeping, a deployment deleted, a runner loading or busy with a chat) never make a
    placement possible that was not possible before.
    """
    match event:
        case (
            DeploymentCreated()
            | DeploymentScaled()
            | DeploymentPriorityChanged()
            | DeploymentOptionsChanged()
            | InstanceCreated()
            | InstanceDeleted()
            | NodeGatheredInfo()
            | NodeTimedOut()
            | NodeSuspected()
            | NodeConfirmedDead()
            | NodeHeardAgain()
            | TopologyEdgeCreated()
            | TopologyEdgeDeleted()
        ):
            return True
        case RunnerStatusUpdated(runner_status=status):
            return isinstance(status, RunnerReady | RunnerFailed)
        case _:
            return False
