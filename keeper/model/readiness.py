"""When an instance can serve, and what that makes a deployment's status: the rules every reader
of the cluster State shares (docs/design.md, 3.4 "Deployment status").

The keeper's backoff, ``GET /deployments``, the master's chat routing (``chat_targets``: the
ready instances whose nodes are all connected), the soak's watch and the TUI all ask the same
questions of a State, so the answers are written once, here, in the data model: the TUI may
import nothing above it, and a rule that lived in the keeper would have to be copied into it.
Plain functions of a State, no I/O; ``keeper.core.keeper`` re-exports ``deployment_status`` under
its pinned name.

The service's verdicts on quiet nodes (``State.node_watch``, docs/design.md §5.18) are read here
too, once for every reader: an instance on a node confirmed dead is not ready (its runners read
Ready until it is deleted, yet it answers nothing), and a ready one on a suspect node is at risk.
"""

from __future__ import annotations

from collections.abc import Container

from keeper.model.api_models import DeploymentStatus
from keeper.model.state import (
    SERVING_RUNNER_TYPES,
    AnyInstance,
    Deployment,
    DeploymentId,
    InstanceId,
    ModelId,
    NodeId,
    NodeWatchPhase,
    State,
)


def instance_is_ready(instance: AnyInstance, state: State) -> bool:
    """Every runner of the instance is Ready or Running (an instance with no runner is not), and
    none of its nodes is confirmed dead: a dead node's runners read Ready until its instances are
    deleted, yet answer nothing (docs/design.md §5.18, "Honest clocks")."""
    runner_ids = instance.shard_assignments.node_to_runner.values()
    return (
        bool(runner_ids)
        and all(
            isinstance(state.runners.get(runner_id), SERVING_RUNNER_TYPES)
            for runner_id in runner_ids
        )
        and not on_watched_node(instance, state, "dead")
    )


def on_watched_node(instance: AnyInstance, state: State, phase: NodeWatchPhase) -> bool:
    """Whether a node of the instance is in ``phase`` (suspect, dead) by ``State.node_watch``."""
    watch = state.node_watch
    return any(
        (verdict := watch.get(node_id)) is not None and verdict.phase == phase
        for node_id in instance.shard_assignments.node_to_runner
    )


def instances_at_risk(state: State) -> frozenset[InstanceId]:
    """The ready instances with a node that is suspect: they serve now, and stop if it is
    confirmed dead; the API, the metrics and the TUI say "at risk" of their deployments."""
    return frozenset(
        instance.instance_id
        for instance in state.instances.values()
        if instance_is_ready(instance, state) and on_watched_node(instance, state, "suspect")
    )


def deployment_at_risk(deployment: Deployment, state: State) -> bool:
    """Whether a ready instance of the deployment's model is at risk (``instances_at_risk``)."""
    return any(
        on_watched_node(instance, state, "suspect")
        for instance in ready_instances_of(state, deployment.model_card.model_id)
    )


def chat_targets(
    state: State, model_id: ModelId, connected: Container[NodeId]
) -> list[tuple[InstanceId, NodeId]]:
    """(instance id, rank-0 node) of each instance of the model a chat may go to now, in the
    State's order: ready, and with every one of its nodes in ``connected`` (a node whose
    connection closed can answer nothing, though the State shows it until it times out), and
    not an instance a drain is moving away whose replacement is ready: new chats go to the
    replacement, so the old one has only its chats in progress to finish before it goes."""
    targets: list[tuple[InstanceId, NodeId]] = []
    leaving = instances_leaving(state)
    for instance in ready_instances_of(state, model_id):
        assignments = instance.shard_assignments
        if instance.instance_id in leaving:
            continue
        if not all(node in connected for node in assignments.node_to_runner):
            continue
        rank0 = rank0_node(instance)
        if rank0 is not None:
            targets.append((instance.instance_id, rank0))
    return targets


def rank0_node(instance: AnyInstance) -> NodeId | None:
    """The node holding the instance's first shard, which a chat is sent to (None: no shard of
    rank 0)."""
    assignments = instance.shard_assignments
    return next(
        (
            node
            for node, runner in assignments.node_to_runner.items()
            if (shard := assignments.runner_to_shard.get(runner)) is not None
            and shard.device_rank == 0
        ),
        None,
    )


def exo_chat_targets(state: State, model_id: ModelId) -> list[tuple[InstanceId, NodeId]]:
    """(instance id, rank-0 node) of every instance of the model, in the State's order, as a
    stock exo's master chooses among them: ready or not, wherever its nodes (its worker then
    holds the chat until every runner is ready; docs/design.md §7.5)."""
    targets: list[tuple[InstanceId, NodeId]] = []
    for instance in instances_of(state, model_id):
        rank0 = rank0_node(instance)
        if rank0 is not None:
            targets.append((instance.instance_id, rank0))
    return targets


def instances_leaving(state: State) -> frozenset[InstanceId]:
    """The old instances of moves (a drain's, a rolling change's, a repair's) whose
    replacement is ready: about to be deleted."""
    moves = [move for drain in state.drains.values() for move in drain.moves]
    moves += [d.moving for d in state.deployments.values() if d.moving is not None]
    moves += [d.repairing for d in state.deployments.values() if d.repairing is not None]
    leaving: set[InstanceId] = set()
    for move in moves:
        replacement = state.instances.get(move.new_instance_id)
        if replacement is not None and instance_is_ready(replacement, state):
            leaving.add(move.old_instance_id)
    return frozenset(leaving)


def ready_on_present_nodes(instance: AnyInstance, state: State) -> bool:
    """Ready (``instance_is_ready``) and every node it runs on still in the topology. A node that
    timed out serves nothing, yet its runners read Ready until the sweep deletes its instances
    (and a stock exo lists them a while longer): the TUI's rows and the deployment history both
    count such an instance as not serving."""
    present = state.topology.nodes
    on_present = all(node in present for node in instance.shard_assignments.node_to_runner)
    return on_present and instance_is_ready(instance, state)


def instances_of(state: State, model_id: ModelId) -> list[AnyInstance]:
    """The model's instances, in the State's order."""
    return [
        instance
        for instance in state.instances.values()
        if instance.shard_assignments.model_id == model_id
    ]


def chat_homes(state: State, model_id: ModelId) -> frozenset[InstanceId]:
    """The model's instances a chat sent to exo may be on and still be answered: every one,
    ready or not (exo routes to the instance with the fewest tasks, ready or not), but those
    with a node gone from the topology or confirmed dead (docs/design.md §5.18). A chat in
    flight on none of them will not be answered, whatever exo keeps its stream open for (the
    front door's stranded attempt, §8.6)."""
    present = state.topology.nodes
    return frozenset(
        instance.instance_id
        for instance in instances_of(state, model_id)
        if all(node in present for node in instance.shard_assignments.node_to_runner)
        and not on_watched_node(instance, state, "dead")
    )


def ready_instances_of(state: State, model_id: ModelId) -> list[AnyInstance]:
    """The model's instances that can serve now, in the State's order."""
    return [
        instance for instance in instances_of(state, model_id) if instance_is_ready(instance, state)
    ]


def status_of(
    deployment: Deployment, with_instance: Container[ModelId], with_ready: Container[ModelId]
) -> DeploymentStatus:
    """The status rule, given the models that have an instance and those that have a ready one:
    serving while any instance of its model is ready (however it was placed), starting while one
    exists, cant_place once placement said why not, placing until then."""
    model_id = deployment.model_card.model_id
    if model_id in with_ready:
        return "serving"
    if model_id in with_instance:
        return "starting"
    if deployment.placement_error is not None:
        return "cant_place"
    return "placing"


def models_served(state: State) -> tuple[set[ModelId], set[ModelId]]:
    """The models with an instance, and those with a ready one."""
    with_instance: set[ModelId] = set()
    with_ready: set[ModelId] = set()
    for instance in state.instances.values():
        model_id = instance.shard_assignments.model_id
        with_instance.add(model_id)
        if model_id not in with_ready and instance_is_ready(instance, state):
            with_ready.add(model_id)
    return with_instance, with_ready


def deployment_status(deployment: Deployment, state: State) -> DeploymentStatus:
    """One deployment's status in ``state`` (``status_of``)."""
    model_id = deployment.model_card.model_id
    instances = instances_of(state, model_id)
    ready = [model_id] if any(instance_is_ready(i, state) for i in instances) else []
    return status_of(deployment, [model_id] if instances else [], ready)


def deployment_statuses(state: State) -> dict[DeploymentId, DeploymentStatus]:
    """Every deployment's status in ``state``, reading the instances once for all of them."""
    with_instance, with_ready = models_served(state)
    return {d_id: status_of(d, with_instance, with_ready) for d_id, d in state.deployments.items()}


def ready_replicas(deployment: Deployment, state: State) -> int:
    """How many instances of the deployment's model have every runner Ready or Running (any
    instance counts, however placed): what the API shows as ``readyReplicas``."""
    return len(ready_instances_of(state, deployment.model_card.model_id))
