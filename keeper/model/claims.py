"""What a node may say about the cluster: only what concerns its own runners and instances.

A node session speaks for one proven node (``keeper.sim.link.identity``). These rules, pure
functions of the State, say whether a report of that node is about something it holds: the
runner it reports is assigned to it by an instance, the instance it asks to delete has a runner
on it. The master refuses anything else (``keeper.sim.master.membership``), so no node can stop
another's runner or delete an instance it does not run. Each answer is None (allowed) or a
``Refusal``: the reason in words, and whether the report is merely late.
"""

from __future__ import annotations

from dataclasses import dataclass

from keeper.model.state import InstanceId, NodeId, RunnerId, State


@dataclass(frozen=True)
class Refusal:
    """Why a report is not taken. ``stale``: about something that is gone (a report that crossed
    its deletion), not a claim on another node's."""

    reason: str
    stale: bool = False


def runner_holder(state: State, runner_id: RunnerId) -> NodeId | None:
    """The node an instance assigns ``runner_id`` to; None when no instance has it."""
    for instance in state.instances.values():
        for node, runner in instance.shard_assignments.node_to_runner.items():
            if runner == runner_id:
                return node
    return None


def runner_report_refusal(
    state: State, node_id: NodeId, runner_id: RunnerId, *, shutdown: bool
) -> Refusal | None:
    """Why ``node_id`` may not report ``runner_id``'s status (None: it may).

    A runner whose instance is gone may still be reported shut down (that only clears what is
    left of it); any other status of it is stale, and recording it would leave a runner of no
    instance in the State.
    """
    holder = runner_holder(state, runner_id)
    if holder == node_id:
        return None
    if holder is not None:
        return Refusal(f"runner {runner_id} is node {holder}'s")
    if shutdown:
        return None
    return Refusal(f"runner {runner_id} belongs to no instance", stale=True)


def deletion_request_refusal(
    state: State, node_id: NodeId, instance_id: InstanceId
) -> Refusal | None:
    """Why ``node_id`` may not ask for ``instance_id``'s deletion (None: it may)."""
    instance = state.instances.get(instance_id)
    if instance is None:
        return Refusal(f"instance {instance_id} does not exist", stale=True)
    if node_id not in instance.shard_assignments.node_to_runner:
        return Refusal(f"instance {instance_id} has no runner on it")
    return None
