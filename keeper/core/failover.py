"""Fast failover's rules in the keeper core (docs/design.md §5.18): which instances a verdict
on their nodes puts at risk, which to delete once a node is dead, and what a deployment's
failover looks like to an operator.

The verdicts themselves are the State's (``State.node_watch``, reached by the service with
``keeper.model.liveness``); everything here is a pure function of the State, so the master's
sweep, the bridge, the keeper's replacement and ``GET /deployments`` read one answer.
"""

from __future__ import annotations

from keeper.model.state import AnyInstance, InstanceId, NodeId, State


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
    """The chat targets a chat may go to given the State's verdicts on nodes (docs/design.md
    §5.18): never an instance on a node confirmed dead; one on a suspect node only when no
    other instance is left (a suspect node may yet answer; a chat sent nowhere surely fails)."""
    watch = state.node_watch
    if not watch:
        return targets

    def phases(instance_id: str) -> set[str]:
        nodes = state.instances[instance_id].shard_assignments.node_to_runner
        return {watch[n].phase for n in nodes if n in watch}

    alive = [t for t in targets if "dead" not in phases(t[0])]
    trusted = [t for t in alive if not phases(t[0])]
    return trusted or alive
