"""What a rolling change replaces, and how far it has come (docs/design.md §5.16).

A change of ``sharding``, ``instance_meta`` or ``min_nodes`` is not applied to running
instances (exo cannot reshard one in place): each instance the keeper placed with the old
options is replaced make-before-break, one at a time. Which ones is judged once, when the
change is made (``outdated_instances``, read off each instance: its kind, its shards' kind, its
node count), and carried by the change's event into ``Deployment.replacing``: an instance
placed afterwards is never replaced by that change, so a placement that answers in a shape of
its own (exo's, through the bridge) cannot make the change replace forever. The keeper
(``keeper.core.keeper``) decides when to move; the API and the TUI read the progress here, in
the data model, which both may import.
"""

from __future__ import annotations

from keeper.model.state import (
    AnyInstance,
    Deployment,
    InstanceId,
    InstanceMeta,
    MlxJacclInstance,
    PipelineShardMetadata,
    Sharding,
    State,
)


def matches_options(instance: AnyInstance, deployment: Deployment) -> bool:
    """Whether ``instance`` is one the deployment's options could have placed: it spans at
    least min_nodes nodes (more is what placement picks when fewer cannot hold the model), and
    over several nodes its kind is the deployment's instance_meta and its shards the
    deployment's sharding. One node is always MlxRing + Pipeline whatever was asked (exo's
    placement rule, ours too): any sharding matches it."""
    assignments = instance.shard_assignments
    if len(assignments.node_to_runner) < deployment.min_nodes:
        return False
    if len(assignments.node_to_runner) == 1:
        return True
    meta = (
        InstanceMeta.MLX_JACCL if isinstance(instance, MlxJacclInstance) else InstanceMeta.MLX_RING
    )
    shards = assignments.runner_to_shard.values()
    sharding = (
        Sharding.PIPELINE
        if all(isinstance(shard, PipelineShardMetadata) for shard in shards)
        else Sharding.TENSOR
    )
    return meta == deployment.instance_meta and sharding == deployment.sharding


def options_words(deployment: Deployment) -> str:
    """A deployment's placement options as the keeper's notes and the API's answers say them:
    ``Tensor/MlxRing, min_nodes 2``."""
    return f"{deployment.sharding}/{deployment.instance_meta}, min_nodes {deployment.min_nodes}"


def outdated_instances(state: State, deployment: Deployment) -> tuple[InstanceId, ...]:
    """The deployment's instances (those the keeper placed for it and the State still has)
    placed with options it no longer has, in id order: what a rolling change replaces."""
    return tuple(
        sorted(
            instance_id
            for instance_id in deployment.placed_instance_ids
            if (instance := state.instances.get(instance_id)) is not None
            and not matches_options(instance, deployment)
        )
    )


def update_progress(deployment: Deployment) -> tuple[int, int] | None:
    """(replaced, replicas) while a rolling change runs, else None: the deployment says
    ``updating 1/2`` when one of its two instances is as its options ask and the other is still
    to be replaced (or its replacement is on its way)."""
    to_replace = len(deployment.replacing) + (deployment.moving is not None)
    if not to_replace:
        return None
    return max(0, deployment.replicas - to_replace), deployment.replicas
