"""Staged failover: keep a deployment's model on disk where its replicas would fail over to.

A re-placement onto a node that lacks the model must first download it (minutes for tens of
GB), so a node fault costs detection + download + load. With ``standby`` N the keeper keeps the
model downloaded on N more node sets, and a fault costs detection + load: placement prefers the
nodes that hold the model (exo's rule), so the staged nodes are where the replacement goes.

Where: for each standby level, placement on the State without the nodes serving the model and
without the sets already chosen, exactly as a replacement would be placed once those nodes were
lost (anti-affinity takes them out the same way). Nodes that would keep too little disk free
(``has_room``) are left out of that view, so the plan picks a node that can hold the copy and
the download-score rule then makes it the fallback.

What: a ``DownloadRequested`` per planned node that holds no copy and is not fetching one, at
most one download per node at a time, asked again only after ``STAGE_RETRY``. Never a deletion
here: copies are removed when their deployment goes (``Keeper.delete``), and only the ones the
deployment records as its own (``Deployment.staged_on``).

Pure, as every keeper rule (docs/design.md §5.12): plans are functions of the State and the
placement function; the keeper bounds how many it computes per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from keeper.core.placement import PlaceFn
from keeper.core.view import nodes_serving, without_nodes
from keeper.model.events import DownloadRequested
from keeper.model.state import (
    Deployment,
    DownloadCompleted,
    DownloadOngoing,
    ModelId,
    NodeId,
    Shard,
    State,
    cordoned_nodes,
    download_entry,
)

# A staged copy never leaves a node's disk with less than this free, nor less than
# STAGING_DISK_FRACTION of it: a full models disk fails the downloads a real placement needs.
STAGING_DISK_FLOOR_BYTES = 20 * 1024**3
STAGING_DISK_FRACTION = 0.10
# A copy asked for that the State does not show coming (a lost command, an exo that cancelled
# it, a failed download) is asked for again after this long, as a lost placement is.
STAGE_RETRY = 30.0


@dataclass(frozen=True)
class StagingTarget:
    node_id: NodeId
    shard: Shard


@dataclass(frozen=True)
class StagingPlan:
    """Where the deployment's model should be on disk beyond its serving nodes, and why there
    are fewer standby sets than asked for (None: all of them)."""

    targets: tuple[StagingTarget, ...]
    shortfall: str | None = None


NOTHING_TO_STAGE = StagingPlan(())


def holds_or_fetches(state: State, node_id: NodeId, model_id: ModelId) -> bool:
    """Whether the node has the model on disk or is downloading it now."""
    return isinstance(download_entry(state, node_id, model_id), DownloadCompleted | DownloadOngoing)


def has_room(state: State, node_id: NodeId, size_bytes: int) -> bool:
    """Whether a copy of ``size_bytes`` leaves the node's disk at least the floor free. A node
    that reports no disk has none we can count on: what we cannot read, we do not act on."""
    disk = state.node_disk.get(node_id)
    if disk is None:
        return False
    floor = max(STAGING_DISK_FLOOR_BYTES, disk.total.in_bytes * STAGING_DISK_FRACTION)
    return disk.available.in_bytes - size_bytes >= floor


def staging_plan(state: State, deployment: Deployment, place: PlaceFn) -> StagingPlan:
    """The node sets the deployment's replicas would fail over to, ``standby`` of them."""
    card = deployment.model_card
    model_id = card.model_id
    serving = nodes_serving(state, model_id)
    if deployment.standby == 0 or not serving:
        return NOTHING_TO_STAGE  # nothing serves yet: placing comes before staging
    excluded = set(serving | cordoned_nodes(state))  # cordoned nodes get no new copy either
    size = card.storage_size.in_bytes
    no_room = {
        node
        for node in state.topology.nodes
        if node not in excluded
        and not holds_or_fetches(state, node, model_id)
        and not has_room(state, node, size)
    }
    targets: list[StagingTarget] = []
    for level in range(deployment.standby):
        view = without_nodes(state, frozenset(excluded | no_room))
        try:
            instance = place(
                view, card, deployment.sharding, deployment.instance_meta, deployment.min_nodes
            )
        except ValueError as reason:
            return StagingPlan(tuple(targets), _shortfall(deployment, level, no_room, reason))
        assignments = instance.shard_assignments
        for node_id, runner_id in sorted(assignments.node_to_runner.items()):
            targets.append(StagingTarget(node_id, assignments.runner_to_shard[runner_id]))
            excluded.add(node_id)
    return StagingPlan(tuple(targets))


def _shortfall(
    deployment: Deployment, staged: int, no_room: set[NodeId], reason: ValueError
) -> str:
    wanted = deployment.standby
    size_gb = deployment.model_card.storage_size.in_bytes / 1024**3
    if no_room:
        why = f"no node apart has disk for {size_gb:.1f} GB"
    else:
        why = f"no placement apart from the serving nodes: {reason}"
    return f"standby {staged} of {wanted}: {why}"


def staging_requests(
    state: State,
    deployment: Deployment,
    plan: StagingPlan,
    requested: Mapping[NodeId, float],
    busy: set[NodeId],
    now: float,
) -> list[DownloadRequested]:
    """The copies to ask for now: planned nodes without the model and not fetching it, not
    asked within ``STAGE_RETRY``, and not busy with another download (``busy`` is the nodes
    downloading, shared by the deployments of one step; the nodes asked here join it)."""
    model_id = deployment.model_card.model_id
    asks: list[DownloadRequested] = []
    for target in plan.targets:
        node_id = target.node_id
        if node_id in busy or holds_or_fetches(state, node_id, model_id):
            continue
        asked_at = requested.get(node_id)
        if asked_at is not None and now < asked_at + STAGE_RETRY:
            continue
        asks.append(
            DownloadRequested(
                deployment_id=deployment.deployment_id, node_id=node_id, shard_metadata=target.shard
            )
        )
        busy.add(node_id)
    return asks


def downloading_nodes(state: State) -> set[NodeId]:
    """The nodes with a download under way (one at a time per node)."""
    return {
        node_id
        for node_id, entries in state.downloads.items()
        if any(isinstance(entry, DownloadOngoing) for entry in entries)
    }
