"""``apply(state, event) -> State``: the one function that changes the State.

Pure and total: it builds a new State (models are frozen; dicts are copied, never mutated) and
never raises on a well-formed event. Events naming things that do not exist change nothing,
because in a distributed log an event may legitimately arrive after what it names is gone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentOptionsChanged,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentPriorityChanged,
    DeploymentRepairChanged,
    DeploymentRepairPlaced,
    DeploymentReplacementPlaced,
    DeploymentScaled,
    DeploymentServingChanged,
    DeploymentStandbyChanged,
    DownloadDeletionRequested,
    DownloadRequested,
    DrainReplacementPlaced,
    FailoverReplacementPlaced,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstanceFoundBroken,
    NodeConfirmedDead,
    NodeCordoned,
    NodeDownloadProgress,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    NodeUncordoned,
    RepairIncidentsExpired,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.state import (
    AVOID_AFTER,
    INCIDENT_WINDOW_S,
    MAX_SERVING_RECORDS,
    SERVING_HISTORY_KEEP_S,
    AnyDownload,
    Deployment,
    DeploymentId,
    Edge,
    InstanceId,
    InstanceMove,
    NodeDrain,
    NodeWatch,
    RepairIncident,
    RepairNote,
    RunnerShutdown,
    ServingRecord,
    State,
    Topology,
    download_model_id,
)

K = TypeVar("K")
V = TypeVar("V")


def _without(mapping: Mapping[K, V], key: K) -> dict[K, V]:
    return {k: v for k, v in mapping.items() if k != key}


def _with(mapping: Mapping[K, V], key: K, value: V) -> dict[K, V]:
    return {**mapping, key: value}


def _changed(state: State, **update: Any) -> State:
    return state.model_copy(update=update)


def _in_order(
    records: tuple[ServingRecord, ...], record: ServingRecord
) -> tuple[ServingRecord, ...]:
    """``records`` with ``record`` after every record not later than it: almost always at the
    end; a stop learnt late (a single replica's failover, confirmed after its replacement was
    ready: docs/design.md 3.5) is dated back before the record that ended it."""
    index = len(records)
    while index > 0 and records[index - 1].at > record.at:
        index -= 1
    return (*records[:index], record, *records[index:])


def _kept(records: tuple[ServingRecord, ...]) -> tuple[ServingRecord, ...]:
    """A deployment's serving records, bounded: those of the last ``SERVING_HISTORY_KEEP_S``
    before the newest, plus the newest older one (it says whether the deployment was serving
    when the kept span begins), and at most ``MAX_SERVING_RECORDS``."""
    cutoff = records[-1].at - SERVING_HISTORY_KEEP_S
    older = [index for index, record in enumerate(records) if record.at <= cutoff]
    first = older[-1] if older else 0
    return records[max(first, len(records) - MAX_SERVING_RECORDS) :]


def apply(state: State, event: AnyEvent) -> State:
    match event:
        case DeploymentCreated(deployment=deployment):
            model_id = deployment.model_card.model_id
            if deployment.deployment_id in state.deployments or any(
                d.model_card.model_id == model_id for d in state.deployments.values()
            ):
                return state  # one deployment per model (and per id): the first applied wins
            return _changed(
                state,
                deployments=_with(state.deployments, deployment.deployment_id, deployment),
            )
        case DeploymentDeleted(deployment_id=deployment_id):
            if deployment_id not in state.deployments:
                return state
            model_id = state.deployments[deployment_id].model_card.model_id
            return _changed(
                state,
                deployments=_without(state.deployments, deployment_id),
                serving_history=_without(state.serving_history, deployment_id),
                repair_notes=_without(state.repair_notes, deployment_id),
                drains=_without_moves(state.drains, lambda m: m.deployment_id == deployment_id),
                repair_incidents=tuple(i for i in state.repair_incidents if i.model_id != model_id),
            )
        case DeploymentServingChanged(deployment_id=deployment_id, record=record):
            if deployment_id not in state.deployments:
                return state
            records = _in_order(state.serving_history.get(deployment_id, ()), record)
            return _changed(
                state,
                serving_history=_with(state.serving_history, deployment_id, _kept(records)),
            )
        case DeploymentPlaced(deployment_id=deployment_id, instance_id=instance_id):
            deployment = state.deployments.get(deployment_id)
            if deployment is None:
                return state
            record = deployment.placed_instance_ids
            if instance_id not in record:
                record = (*record, instance_id)
            placed = deployment.model_copy(
                update={
                    "instance_id": instance_id,
                    "placement_error": None,
                    "placed_instance_ids": record,
                }
            )
            return _changed(state, deployments=_with(state.deployments, deployment_id, placed))
        case DeploymentPlacementFailed(deployment_id=deployment_id, error=error):
            return _with_deployment(state, deployment_id, placement_error=error)
        case DeploymentScaled(deployment_id=deployment_id, replicas=replicas):
            # The error was about the count wanted before; if it still holds, the keeper's next
            # attempt reports it again.
            return _with_deployment(state, deployment_id, replicas=replicas, placement_error=None)
        case DeploymentStandbyChanged(deployment_id=deployment_id, standby=standby):
            return _with_deployment(state, deployment_id, standby=standby)
        case DeploymentPriorityChanged(
            deployment_id=deployment_id, priority=priority, preempt=preempt
        ):
            return _with_deployment(state, deployment_id, priority=priority, preempt=preempt)
        case DeploymentOptionsChanged(
            deployment_id=deployment_id,
            sharding=sharding,
            instance_meta=instance_meta,
            min_nodes=min_nodes,
            replace=replace,
        ):
            # The error was about the options asked before (as for a scale). The instances to
            # replace were judged on the State the command read (the bridge's own log holds no
            # instances: exo's State does); one already being moved is replaced by its move.
            deployment = state.deployments.get(deployment_id)
            moving = (
                ()
                if deployment is None or deployment.moving is None
                else (deployment.moving.old_instance_id,)
            )
            replacing = tuple(i for i in replace if i not in moving)
            return _with_deployment(
                state,
                deployment_id,
                sharding=sharding,
                instance_meta=instance_meta,
                min_nodes=min_nodes,
                placement_error=None,
                replacing=replacing,
            )
        case DeploymentReplacementPlaced(deployment_id=deployment_id, move=move):
            deployment = state.deployments.get(deployment_id)
            if deployment is None or deployment.moving is not None:
                return state  # one replacement per deployment at a time
            if move.old_instance_id not in deployment.replacing:
                return state  # not one this change replaces (deleted meanwhile)
            replacing = tuple(i for i in deployment.replacing if i != move.old_instance_id)
            return _with_deployment(state, deployment_id, moving=move, replacing=replacing)
        case FailoverReplacementPlaced(deployment_id=deployment_id, move=move, at=at):
            deployment = state.deployments.get(deployment_id)
            if deployment is None or deployment.failover is not None:
                return state  # one failover replacement per deployment at a time
            # (The instances are not checked: the bridge's own State holds none, exo's does.)
            return _with_deployment(state, deployment_id, failover=move, failover_since=at)
        case DeploymentRepairPlaced(deployment_id=deployment_id, move=move, problem=p, why=why):
            # One repair at a time (docs/design.md §5.19). Not judged on the State's instances:
            # the bridge's log holds none (exo's State does), and either instance's deletion
            # ends the move, as a rolling change's. The note outlives the move: the serving
            # records name the broken instance as an incident's cause (§3.5).
            deployment = state.deployments.get(deployment_id)
            if deployment is None or deployment.repairing is not None:
                return state
            note = RepairNote(instance_id=move.old_instance_id, problem=p, why=why)
            repairing = _with_deployment(state, deployment_id, repairing=move)
            return _changed(repairing, repair_notes=_with(state.repair_notes, deployment_id, note))
        case InstanceFoundBroken():
            return _apply_incident(state, event)
        case RepairIncidentsExpired(before=before):
            kept = tuple(i for i in state.repair_incidents if i.at >= before)
            if len(kept) == len(state.repair_incidents):
                return state
            return _changed(state, repair_incidents=kept)
        case DeploymentRepairChanged(deployment_id=deployment_id, repair=repair):
            if deployment_id not in state.deployments:
                return state
            return _with_deployment(state, deployment_id, repair=repair)
        case DownloadRequested(deployment_id=deployment_id, node_id=node_id):
            deployment = _staging_deployment(state, deployment_id)
            if deployment is None or node_id in deployment.staged_on:
                return state
            staged = (*deployment.staged_on, node_id)
            return _with_deployment(state, deployment.deployment_id, staged_on=staged)
        case DownloadDeletionRequested(deployment_id=deployment_id, node_id=node_id):
            deployment = _staging_deployment(state, deployment_id)
            if deployment is None or node_id not in deployment.staged_on:
                return state
            staged = tuple(n for n in deployment.staged_on if n != node_id)
            return _with_deployment(state, deployment.deployment_id, staged_on=staged)
        case InstanceCreated(instance=instance):
            return _changed(state, instances=_with(state.instances, instance.instance_id, instance))
        case InstanceDeleted(instance_id=instance_id):
            deployments = _without_placement(state.deployments, instance_id)
            # A move ends with either of its instances: the old one deleted (done) or the
            # replacement lost (the drain places another, under the keeper's backoff).
            drains = _without_moves(state.drains, lambda m: instance_id in _move_instances(m))
            instance = state.instances.get(instance_id)
            if instance is None:
                if deployments is state.deployments and drains is state.drains:
                    return state
                return _changed(state, deployments=deployments, drains=drains)
            # Its runners go with it: a node that died will never report their shutdown, and
            # a live node's later RunnerShuttingDown/RunnerShutdown reports add and remove an
            # entry of their own. Without this, every lost instance would leave runners behind.
            gone = set(instance.shard_assignments.node_to_runner.values())
            return _changed(
                state,
                instances=_without(state.instances, instance_id),
                runners={r: s for r, s in state.runners.items() if r not in gone},
                deployments=deployments,
                drains=drains,
            )
        case RunnerStatusUpdated(runner_id=runner_id, runner_status=status):
            if isinstance(status, RunnerShutdown):
                if runner_id not in state.runners:
                    return state
                return _changed(state, runners=_without(state.runners, runner_id))
            return _changed(state, runners=_with(state.runners, runner_id, status))
        case NodeGatheredInfo():
            return _apply_node_info(state, event)
        case NodeDownloadProgress(download_progress=entry):
            return _apply_download(state, entry)
        case TopologyEdgeCreated(conn=conn):
            return _changed(
                state,
                topology=_with_edge(state.topology, conn.source, conn.sink, conn.edge),
            )
        case TopologyEdgeDeleted(conn=conn):
            return _changed(
                state,
                topology=_without_edge(state.topology, conn.source, conn.sink, conn.edge),
            )
        case NodeTimedOut(node_id=node_id):
            return _remove_node(state, node_id)
        case NodeSuspected(node_id=node_id, last_heard=last_heard, at=at):
            # Only a node still in the topology can be suspected; a verdict already reached
            # (suspect, or dead) is not taken back by a later suspicion.
            if node_id not in state.topology.nodes or node_id in state.node_watch:
                return state
            watch = NodeWatch(phase="suspect", last_heard=last_heard, since=at)
            return _changed(state, node_watch=_with(state.node_watch, node_id, watch))
        case NodeConfirmedDead(node_id=node_id, last_heard=last_heard, at=at, why=why):
            if node_id not in state.topology.nodes:
                return state
            known = state.node_watch.get(node_id)
            if known is not None and known.phase == "dead":
                return state
            watch = NodeWatch(phase="dead", last_heard=last_heard, since=at, why=why)
            return _changed(state, node_watch=_with(state.node_watch, node_id, watch))
        case NodeHeardAgain(node_id=node_id):
            if node_id not in state.node_watch:
                return state
            return _changed(state, node_watch=_without(state.node_watch, node_id))
        case NodeCordoned(name=name):
            if name in state.cordoned:
                return state
            return _changed(state, cordoned=tuple(sorted((*state.cordoned, name))))
        case NodeUncordoned(name=name):
            if name not in state.cordoned and name not in state.drains:
                return state
            return _changed(
                state,
                cordoned=tuple(n for n in state.cordoned if n != name),
                drains=_without(state.drains, name),
            )
        case NodeDrainStarted(name=name, force=force, when=when):
            drain = state.drains.get(name)
            if drain is None:
                drain = NodeDrain(node=name, force=force, started=when)
            elif force and not drain.force:
                drain = drain.model_copy(update={"force": True})  # a forced drain over a drain
            cordoned = state.cordoned if name in state.cordoned else (*state.cordoned, name)
            return _changed(
                state,
                cordoned=tuple(sorted(cordoned)),
                drains=_with(state.drains, name, drain),
            )
        case DrainReplacementPlaced(name=name, move=move):
            drain = state.drains.get(name)
            if drain is None or any(m.deployment_id == move.deployment_id for m in drain.moves):
                return state  # one move per deployment at a time
            moved = drain.model_copy(update={"moves": (*drain.moves, move)})
            return _changed(state, drains=_with(state.drains, name, moved))
        case NodeDrainEnded(name=name):
            if name not in state.drains:
                return state
            return _changed(state, drains=_without(state.drains, name))


def apply_all(state: State, batch: Sequence[IndexedEvent]) -> State:
    """Apply numbered events in order and record the last index, as exo's workers do.

    The one spelling of "apply, then record the index": the log's replay, the master's router,
    the bridge and every follower of the stream use it."""
    if not batch:
        return state
    for indexed in batch:
        state = apply(state, indexed.event)
    return state.model_copy(update={"last_event_applied_idx": batch[-1].idx})


def _without_placement(
    deployments: dict[DeploymentId, Deployment], instance_id: InstanceId
) -> dict[DeploymentId, Deployment]:
    """The deployments with ``instance_id`` gone from every keeper record (the same mapping
    when no record holds it, so an unrelated deletion copies nothing). A rolling change's move
    ends with either of its instances, as a drain's does."""
    holding = [
        d
        for d in deployments.values()
        if instance_id in d.placed_instance_ids
        or instance_id in d.replacing
        or (d.moving is not None and instance_id in _move_instances(d.moving))
        or (d.failover is not None and instance_id in _move_instances(d.failover))
        or (d.repairing is not None and instance_id in _move_instances(d.repairing))
    ]
    if not holding:
        return deployments
    updated = dict(deployments)
    for deployment in holding:
        kept = tuple(i for i in deployment.placed_instance_ids if i != instance_id)
        replacing = tuple(i for i in deployment.replacing if i != instance_id)
        moving = deployment.moving
        if moving is not None and instance_id == moving.new_instance_id:
            # The replacement was lost: the old instance is still to replace (first).
            replacing = (moving.old_instance_id, *replacing)
            moving = None
        elif moving is not None and instance_id == moving.old_instance_id:
            moving = None
        update: dict[str, object] = {
            "placed_instance_ids": kept,
            "replacing": replacing,
            "moving": moving,
        }
        failover = deployment.failover
        if failover is not None and instance_id in _move_instances(failover):
            # A failover ends with either instance: the old one deleted (its node dead), or
            # the replacement (lost, or the surplus once the node was heard again).
            update["failover"] = None
            update["failover_since"] = None
        # A repair ends with either of its instances too: the broken one gone (done), or the
        # replacement lost (the broken one is judged again, under the keeper's backoff).
        repairing = deployment.repairing
        if repairing is not None and instance_id in _move_instances(repairing):
            update["repairing"] = None
        updated[deployment.deployment_id] = deployment.model_copy(update=update)
    return updated


def _move_instances(move: InstanceMove) -> tuple[InstanceId, InstanceId]:
    return move.old_instance_id, move.new_instance_id


def _without_moves(
    drains: dict[str, NodeDrain], ends: Callable[[InstanceMove], bool]
) -> dict[str, NodeDrain]:
    """The drains without the moves ``ends`` picks (the same mapping when none does)."""
    if not any(ends(move) for drain in drains.values() for move in drain.moves):
        return drains
    return {
        name: drain.model_copy(update={"moves": tuple(m for m in drain.moves if not ends(m))})
        for name, drain in drains.items()
    }


def apply_indexed(state: State, indexed: IndexedEvent) -> State:
    """Apply one event from the master's log and record its index."""
    return apply_all(state, (indexed,))


def _apply_node_info(state: State, info: NodeGatheredInfo) -> State:
    node = info.node_id
    update: dict[str, Any] = {"last_seen": _with(state.last_seen, node, info.when)}
    if node not in state.topology.nodes:
        update["topology"] = state.topology.model_copy(
            update={"nodes": [*state.topology.nodes, node]}
        )
    if info.memory is not None:
        update["node_memory"] = _with(state.node_memory, node, info.memory)
    if info.backends is not None:
        update["node_backends"] = _with(state.node_backends, node, list(info.backends))
    if info.identity is not None:
        update["node_identities"] = _with(state.node_identities, node, info.identity)
    if info.network is not None:
        update["node_network"] = _with(state.node_network, node, info.network)
    if info.rdma_ctl is not None:
        update["node_rdma_ctl"] = _with(state.node_rdma_ctl, node, info.rdma_ctl)
    if info.disk is not None:
        update["node_disk"] = _with(state.node_disk, node, info.disk)
    if info.system is not None:
        update["node_system"] = _with(state.node_system, node, info.system)
    return _changed(state, **update)


def _apply_incident(state: State, event: InstanceFoundBroken) -> State:
    """An incident on each of the instance's nodes (docs/design.md §5.19), for a model a
    deployment keeps; the same instance on the same node counts once (a new master recognises
    it again). Bounded: the last AVOID_AFTER per (model, node), none older than
    INCIDENT_WINDOW_S before this one."""
    model_id = event.model_id
    if not any(d.model_card.model_id == model_id for d in state.deployments.values()):
        return state
    known = {(i.instance_id, i.node_id) for i in state.repair_incidents}
    new = [
        RepairIncident(
            model_id=model_id,
            node_id=node_id,
            instance_id=event.instance_id,
            problem=event.problem,
            at=event.at,
        )
        for node_id in dict.fromkeys(event.node_ids)
        if (event.instance_id, node_id) not in known
    ]
    if not new:
        return state
    cutoff = event.at - INCIDENT_WINDOW_S
    recent = [i for i in (*state.repair_incidents, *new) if i.at >= cutoff]
    kept: list[RepairIncident] = []
    for incident in reversed(recent):  # newest first: the last AVOID_AFTER of each pair stay
        pair = (incident.model_id, incident.node_id)
        if sum((i.model_id, i.node_id) == pair for i in kept) < AVOID_AFTER:
            kept.append(incident)
    return _changed(state, repair_incidents=tuple(reversed(kept)))


def _staging_deployment(state: State, deployment_id: DeploymentId | None) -> Deployment | None:
    """The deployment a download request is for; None for exo's own requests (no deployment)
    and for one that is gone."""
    if deployment_id is None:
        return None
    return state.deployments.get(deployment_id)


def _with_deployment(state: State, deployment_id: DeploymentId, **update: Any) -> State:
    """The State with one deployment's fields changed; an unknown deployment changes nothing."""
    deployment = state.deployments.get(deployment_id)
    if deployment is None:
        return state
    changed = deployment.model_copy(update=update)
    return _changed(state, deployments=_with(state.deployments, deployment_id, changed))


def _apply_download(state: State, entry: AnyDownload) -> State:
    """exo's rule: one entry per (node, model), replaced in place as the download moves. A node
    the topology does not know is not given one (a report racing its timeout, as for edges)."""
    node = entry.node_id
    if node not in state.topology.nodes:
        return state
    model_id = download_model_id(entry)
    entries = state.downloads.get(node, [])
    if any(download_model_id(e) == model_id for e in entries):
        updated = [entry if download_model_id(e) == model_id else e for e in entries]
    else:
        updated = [*entries, entry]
    return _changed(state, downloads=_with(state.downloads, node, updated))


def _with_edge(topology: Topology, source: str, sink: str, edge: Edge) -> Topology:
    # An edge only joins nodes the topology knows, as in exo: an edge report that races a
    # node's timeout must not resurrect half of a node.
    if source not in topology.nodes or sink not in topology.nodes:
        return topology
    sinks = topology.connections.get(source, {})
    edges = sinks.get(sink, [])
    if edge in edges:
        return topology
    connections = _with(topology.connections, source, _with(sinks, sink, [*edges, edge]))
    return topology.model_copy(update={"connections": connections})


def _without_edge(topology: Topology, source: str, sink: str, edge: Edge) -> Topology:
    edges = topology.connections.get(source, {}).get(sink, [])
    if edge not in edges:
        return topology
    remaining = [e for e in edges if e != edge]
    sinks = topology.connections[source]
    new_sinks = _with(sinks, sink, remaining) if remaining else _without(sinks, sink)
    connections = (
        _with(topology.connections, source, new_sinks)
        if new_sinks
        else _without(topology.connections, source)
    )
    return topology.model_copy(update={"connections": connections})


def _remove_node(state: State, node: str) -> State:
    topology = state.topology
    connections = {
        src: {snk: edges for snk, edges in sinks.items() if snk != node}
        for src, sinks in topology.connections.items()
        if src != node
    }
    connections = {src: sinks for src, sinks in connections.items() if sinks}
    return _changed(
        state,
        topology=Topology(nodes=[n for n in topology.nodes if n != node], connections=connections),
        node_memory=_without(state.node_memory, node),
        node_backends=_without(state.node_backends, node),
        node_identities=_without(state.node_identities, node),
        node_network=_without(state.node_network, node),
        node_rdma_ctl=_without(state.node_rdma_ctl, node),
        last_seen=_without(state.last_seen, node),
        downloads=_without(state.downloads, node),
        node_disk=_without(state.node_disk, node),
        node_system=_without(state.node_system, node),
        node_watch=_without(state.node_watch, node),
    )
