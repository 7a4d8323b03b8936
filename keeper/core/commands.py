"""The keeper's commands: what the host runs under the lock it steps the keeper under.

``delete``, ``scale``, ``cordon``, ``uncordon`` and ``drain`` decide a command's events from the
State and note their effect in the memory the step reads (the State shows the events only
later): the deployment being deleted, the memo's new count and the instances it retires, a
drain's end forgotten. That memory is this class's; ``Keeper`` (``keeper.core.keeper``) derives
from it and adds the step, so the commands and their memory are read apart from the step's
order. ``checkpoint`` and ``restore`` take a command's notes back when the host could not record
its events (docs/design.md §5.8: a refused write, asked again, is written again, never found
done).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keeper.core.draining import DRAINS
from keeper.core.memo import FRESH, DeploymentMemo, recorded, scaled, wanted
from keeper.core.moves import Moves
from keeper.core.stager import Stager
from keeper.model.events import (
    AnyEvent,
    DeploymentDeleted,
    DeploymentScaled,
    DownloadDeletionRequested,
    InstanceDeleted,
    NodeCordoned,
    NodeDrainStarted,
    NodeUncordoned,
)
from keeper.model.state import Deployment, DeploymentId, InstanceId, State


@dataclass(frozen=True)
class CommandMemory:
    """What a command (``delete``, ``scale``, ``drain``) notes in the keeper's memory, as it was
    before the command: ``Keeper.checkpoint`` takes it, ``Keeper.restore`` puts it back when the
    host could not record the command's events. A command notes its effect at once (the State
    trails the events), so a refused write must take the note back, or the command asked again
    finds it done: "scaled", and nothing was."""

    memos: Mapping[DeploymentId, DeploymentMemo]
    deleting: frozenset[DeploymentId]
    drain_ended: frozenset[str]


class KeeperCommands:
    """The commands and the memory they note (module doc); ``Keeper`` is one."""

    def __init__(self, stager: Stager) -> None:
        # Staging's plans, the copies asked for and its pace (``keeper.core.stager``).
        self._stager = stager
        self._memos: dict[DeploymentId, DeploymentMemo] = {}
        # Deployments whose DeploymentDeleted was emitted but is not yet in the state.
        self._deleting: set[DeploymentId] = set()
        # The moves' memory, every kind's (drains, rolling changes; ``keeper.core.moves``).
        self._moves = Moves()
        # Drains whose end was sent, until the State drops them.
        self._drain_ended: set[str] = set()

    def checkpoint(self) -> CommandMemory:
        """The memory a command may change, before it runs (``CommandMemory``)."""
        return CommandMemory(
            dict(self._memos), frozenset(self._deleting), frozenset(self._drain_ended)
        )

    def restore(self, memory: CommandMemory | None) -> None:
        """The memory as ``checkpoint`` took it: the command's events were not recorded."""
        if memory is None:
            return
        self._memos = dict(memory.memos)
        self._deleting = set(memory.deleting)
        self._drain_ended = set(memory.drain_ended)

    # --- cordons and drains (commands) ------------------------------------------------------

    def cordon(self, name: str, state: State) -> list[AnyEvent]:
        """No new placement on ``name``; nothing if it is cordoned already."""
        return [] if name in state.cordoned else [NodeCordoned(name=name)]

    def uncordon(self, name: str, state: State) -> list[AnyEvent]:
        """Placements on ``name`` again; a drain of it ends, and the replacement of a move
        under way (the extra instance) is deleted."""
        drain = state.drains.get(name)
        if name not in state.cordoned and drain is None:
            return []
        self._moves.forget_scope(DRAINS.name, name)
        surge = [] if drain is None else [m.new_instance_id for m in drain.moves]
        return [
            NodeUncordoned(name=name),
            *(InstanceDeleted(instance_id=i) for i in surge if i in state.instances),
        ]

    def drain(self, name: str, force: bool, when: str, state: State) -> list[AnyEvent]:
        """Cordon ``name`` and move the keeper's instances off it; nothing if it drains
        already as asked."""
        drain = state.drains.get(name)
        if drain is not None and (drain.force or not force):
            return []
        self._drain_ended.discard(name)
        return [NodeDrainStarted(name=name, force=force, when=when)]

    # --- deletion -------------------------------------------------------------------------

    def delete(self, deployment_id: str, state: State) -> list[AnyEvent]:
        """The deployment's deletion: DeploymentDeleted, then an InstanceDeleted for each of the
        keeper's own instances of it that exists or is on its way (never one placed some other
        way). Deleting twice, or an unknown id, returns nothing."""
        deployment = state.deployments.get(deployment_id)
        memo = self._memos.get(deployment_id)
        if deployment_id in self._deleting or (deployment is None and memo is None):
            return []
        self._deleting.add(deployment_id)
        events: list[AnyEvent] = [DeploymentDeleted(deployment_id=deployment_id)]
        events.extend(
            InstanceDeleted(instance_id=instance_id)
            for instance_id in own_instances(deployment, memo or FRESH, state)
        )
        # The copies it staged go with it (those it recorded, and those asked for whose record
        # is still on its way); never a copy it did not make.
        staged = dict.fromkeys(deployment.staged_on if deployment is not None else ())
        staged.update(dict.fromkeys(self._stager.asked(deployment_id)))
        if deployment is not None:
            events.extend(
                DownloadDeletionRequested(
                    deployment_id=deployment_id,
                    node_id=node_id,
                    model_id=deployment.model_card.model_id,
                )
                for node_id in staged
            )
        return events

    # --- scaling --------------------------------------------------------------------------

    def scale(self, deployment_id: str, replicas: int, state: State) -> list[AnyEvent]:
        """Keep ``replicas`` instances of the deployment's model from now on.

        Returns DeploymentScaled and, scaling down, an InstanceDeleted for each of the keeper's
        own instances beyond ``replicas`` (counting every instance of the model, however placed),
        newest first, the one in flight included; an instance placed some other way is never
        removed. Scaling up only records the count: the steps add the replicas, one at a time.
        The same count again, an unknown deployment or one being deleted: no events.
        A count outside 1..MAX_REPLICAS raises ValueError (the host validates before).
        Like ``delete``, the host runs it under the lock it steps the keeper under.
        """
        deployment = state.deployments.get(deployment_id)
        if deployment is None or deployment_id in self._deleting:
            return []
        event = DeploymentScaled(deployment_id=deployment_id, replicas=replicas)
        memo = self._memos.get(deployment_id, FRESH)
        if replicas == wanted(memo, deployment):
            return []
        own = own_instances(deployment, memo, state)
        model_id = deployment.model_card.model_id
        present = sum(
            1
            for instance_id, instance in state.instances.items()
            if instance.shard_assignments.model_id == model_id and instance_id not in memo.retiring
        ) + sum(1 for instance_id in own if instance_id not in state.instances)
        removed = tuple(reversed(own))[: max(0, present - replicas)]
        self._memos[deployment_id] = scaled(memo, replicas, removed)
        return [event, *(InstanceDeleted(instance_id=i) for i in removed)]


def own_instances(
    deployment: Deployment | None, memo: DeploymentMemo, state: State
) -> list[InstanceId]:
    """The instances the keeper placed for a deployment that still exist or are on their way,
    oldest first, leaving out those it is already removing.

    They are the ones the deployment records (durable, so a new master knows them too), the
    ones this keeper watches (recorded once their DeploymentPlaced is applied), and the one in
    flight, newest of all: it counts even if the state does not show it yet (its InstanceDeleted
    is emitted after its InstanceCreated), unless the state shows it already came and went.
    """
    named = deployment.instance_id if deployment is not None else None
    record = recorded(deployment) if deployment is not None else ()
    own: list[InstanceId] = []
    for candidate in (*record, *(w.instance_id for w in memo.watched)):
        if candidate in state.instances and candidate not in own:
            own.append(candidate)
    in_flight = memo.in_flight
    if (
        in_flight is not None
        and in_flight not in own
        and (in_flight in state.instances or named != in_flight)
    ):
        own.append(in_flight)
    return [i for i in own if i not in memo.retiring]
