"""What-if: what losing some nodes now would do to each deployment (docs/design.md §5.14).

An operator about to reboot a machine, or asking which one the cluster cannot afford to lose,
wants the answer the cluster itself would give, not a guess. So the answer is computed the way a
real loss unfolds, from the State alone:

1. the loss: ``NodeTimedOut`` for each node, then the sweep's ``InstanceDeleted`` for every
   instance left on a node missing from the topology (``instances_off_topology``, the rule the
   master's sweep runs), each applied with ``apply``: the State is exactly the one a real loss
   leaves;
2. the keeper's placement decisions on it: a deployment with fewer instances of its model than
   its replicas gets one more, placed on the State without the nodes already serving the model
   (anti-affinity, §5.11) and without the cordoned ones (§5.15), its refusal worded as the
   keeper words the deployment's ``placementError``; one placement at a time, each applied to
   the State before the next is decided (§5.2), the deployments taking turns in
   ``placement_order``, until none can have more. Placement prefers the nodes holding the model
   (§4.1 rule 7), so staged copies (§5.12) are where the replacements go, as they would be.

Given the thresholds the service runs with, each placement also says when it would serve again
(``placement_estimate``: detection, download and load, in seconds).

What it leaves out is what the State does not hold: the keeper's memory (a backoff, a placement
on its way) delays a placement but does not change where it goes; a drain under way moves its
instances after the recovery (a fault comes first, §5.15); and, as the keeper, it does not
subtract the memory a placed instance will take: placement reads the memory nodes report, and
they report an instance's memory only once it has loaded.

Pure: a function of the State and a placement function (by default ours, minting ids of its
own: a preview must not draw on the ids a master mints); no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial
from itertools import count

from keeper.core.apart import place_apart
from keeper.core.placement import PlaceFn, place_instance
from keeper.core.preemption import by_priority
from keeper.core.view import (
    instances_off_topology,
    models_instance_counts,
)
from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfEstimate,
    WhatIfInstance,
    WhatIfNode,
    WhatIfOutcome,
    WhatIfPlacement,
    WhatIfResponse,
    WhatIfThresholds,
)
from keeper.model.apply import apply
from keeper.model.events import DeploymentPlaced, InstanceCreated, InstanceDeleted, NodeTimedOut
from keeper.model.instance_health import shard_bytes
from keeper.model.liveness import LivenessConfig
from keeper.model.refusals import NotFoundError, UnprocessableError
from keeper.model.state import (
    MAX_REPLICAS,
    AnyInstance,
    Deployment,
    DeploymentId,
    DownloadCompleted,
    DownloadOngoing,
    ModelId,
    NodeId,
    State,
    cordoned_nodes,
    download_entry,
    node_name,
    nodes_named,
)

# Node names quoted in a refusal are cut to this many characters: a megabyte-long query need not
# come back in full.
QUOTED_NAME_CHARS = 120
# The (never shown) instance and runner ids of a what-if's placements: UUIDs, as placement
# derives an instance's ports from its id, numbered from 1 so that every preview is the same.
PREVIEW_ID_FORMAT = "00000000-0000-0000-0000-{:012x}"


def placement_order(deployments: Iterable[Deployment]) -> list[Deployment]:
    """The order the keeper considers deployments in: highest priority first, then by id
    (§5.2, §5.13)."""
    return by_priority(sorted(deployments, key=lambda deployment: deployment.deployment_id))


def preview_placement() -> PlaceFn:
    """Our placement (exo's rules), with ids numbered for this preview alone."""
    numbers = count(1)
    return partial(place_instance, new_id=lambda: PREVIEW_ID_FORMAT.format(next(numbers)))


# --- naming the nodes -----------------------------------------------------------------------


def node_list(text: str) -> list[str]:
    """``a, b,c`` as the names it holds: split at commas, each stripped, empty ones dropped."""
    return [name for name in (part.strip() for part in text.split(",")) if name]


def resolve_nodes(state: State, names: Sequence[str]) -> list[NodeId]:
    """The nodes ``names`` mean, in the order given, each once: a node id is that node; a
    friendly name is every node that goes by it (one Mac, whose old id may linger until it times
    out: exo gives a node a new id when it restarts). A name no node has is a NotFoundError
    naming it and the names the cluster knows; none given, an UnprocessableError."""
    if not names:
        raise UnprocessableError(
            "nodes: name at least one node (its friendly name or its id), comma-separated",
            param="nodes",
        )
    known = _known_nodes(state)
    resolved: dict[NodeId, None] = {}
    for name in names:
        matches = [name] if name in known else sorted(nodes_named(state, name))
        if not matches:
            names_known = sorted({node_name(state, node) for node in state.topology.nodes})
            raise NotFoundError(
                f"No node {_quoted(name)} in the cluster (known: "
                f"{', '.join(names_known) or 'none'}); name a node by its friendly name or its id",
                param="nodes",
            )
        resolved.update(dict.fromkeys(matches))
    return list(resolved)


def _known_nodes(state: State) -> dict[NodeId, None]:
    """The topology's nodes, and any an instance still uses (gone, not swept yet)."""
    known = dict.fromkeys(state.topology.nodes)
    for instance in state.instances.values():
        known.update(dict.fromkeys(instance.shard_assignments.node_to_runner))
    return known


def _quoted(name: str) -> str:
    return repr(name if len(name) <= QUOTED_NAME_CHARS else name[:QUOTED_NAME_CHARS] + "...")


# --- the loss and the keeper's answer to it -------------------------------------------------


def without_lost_nodes(state: State, nodes: Iterable[NodeId]) -> State:
    """The State a real loss of ``nodes`` leaves: each times out, then the sweep deletes every
    instance left on a node missing from the topology, all through ``apply``."""
    for node in nodes:
        state = apply(state, NodeTimedOut(node_id=node))
    for instance_id in instances_off_topology(state):
        state = apply(state, InstanceDeleted(instance_id=instance_id))
    return state


def what_if(
    state: State,
    nodes: Sequence[NodeId],
    place: PlaceFn | None = None,
    thresholds: WhatIfThresholds | None = None,
) -> WhatIfResponse:
    """Per deployment, in placement order, what losing ``nodes`` now would do (module doc);
    given the service's ``thresholds``, each placement's time to serve (``placement_estimate``)."""
    place = place if place is not None else preview_placement()
    lost_state = without_lost_nodes(state, nodes)
    order = placement_order(lost_state.deployments.values())
    placed, reasons = _replace(lost_state, order, place)
    # The instances the loss deletes, by model (named from the State before it: a node's
    # identity goes with the node).
    lost: dict[ModelId, list[AnyInstance]] = {}
    for instance_id in sorted(state.instances.keys() - lost_state.instances.keys()):
        instance = state.instances[instance_id]
        lost.setdefault(instance.shard_assignments.model_id, []).append(instance)
    before = models_instance_counts(state)
    return WhatIfResponse(
        nodes=[_node(state, node) for node in nodes],
        deployments=[
            _outcome(
                deployment,
                state,
                lost_state,
                before.get(deployment.model_card.model_id, 0),
                lost.get(deployment.model_card.model_id, []),
                placed.get(deployment.deployment_id, []),
                reasons.get(deployment.deployment_id),
                thresholds,
            )
            for deployment in order
        ],
        thresholds=thresholds,
    )


def what_if_named(
    state: State,
    names: Sequence[str],
    place: PlaceFn | None = None,
    thresholds: WhatIfThresholds | None = None,
) -> WhatIfResponse:
    """``what_if`` for the nodes ``names`` mean (``resolve_nodes``: its refusals too)."""
    return what_if(state, resolve_nodes(state, names), place, thresholds)


def _replace(
    state: State, order: Sequence[Deployment], place: PlaceFn
) -> tuple[dict[DeploymentId, list[AnyInstance]], dict[DeploymentId, str]]:
    """The keeper's placements on ``state``: per deployment, the instances placed and, if one
    more could not be, why. Each round gives every deployment still short one placement, in
    ``order``, on the State holding every placement before it; a deployment refused once is
    not tried again (nothing a later placement adds changes what placement reads of it: its
    nodes, their memory and downloads, its own model's instances). At most MAX_REPLICAS rounds:
    no deployment needs more."""
    placed: dict[DeploymentId, list[AnyInstance]] = {}
    reasons: dict[DeploymentId, str] = {}
    # Kept up to date as instances are added: reading them afresh from the State for each
    # attempt (``models_instance_counts``, ``nodes_serving``) would walk every instance each time.
    counts = models_instance_counts(state)
    serving: dict[ModelId, set[NodeId]] = {}
    for instance in state.instances.values():
        nodes = instance.shard_assignments.node_to_runner
        serving.setdefault(instance.shard_assignments.model_id, set()).update(nodes)
    # No placement goes to a cordoned or draining node (§5.15); nothing here changes which.
    cordoned = cordoned_nodes(state)
    active = list(order)
    for _ in range(MAX_REPLICAS):
        still: list[Deployment] = []
        for deployment in active:
            if counts.get(deployment.model_card.model_id, 0) >= deployment.replicas:
                continue
            apart = frozenset(serving.get(deployment.model_card.model_id, ()))
            outcome = _place_one(state, deployment, apart, cordoned, place)
            if isinstance(outcome, str):
                reasons[deployment.deployment_id] = outcome
                continue
            model_id = outcome.shard_assignments.model_id
            if outcome.instance_id not in state.instances:
                counts[model_id] = counts.get(model_id, 0) + 1
            serving.setdefault(model_id, set()).update(outcome.shard_assignments.node_to_runner)
            state = apply(state, InstanceCreated(instance=outcome))
            state = apply(
                state,
                DeploymentPlaced(
                    deployment_id=deployment.deployment_id, instance_id=outcome.instance_id
                ),
            )
            placed.setdefault(deployment.deployment_id, []).append(outcome)
            still.append(deployment)
        if not still:
            break
        active = still
    return placed, reasons


def _place_one(
    state: State,
    deployment: Deployment,
    serving: frozenset[NodeId],
    cordoned: frozenset[NodeId],
    place: PlaceFn,
) -> AnyInstance | str:
    """One more instance of the deployment's model, apart from the nodes serving it
    (``serving``: ``nodes_serving`` of the model on ``state``) and off the cordoned ones, or
    the refusal as the keeper records it in the deployment's ``placementError``."""
    try:
        return place_apart(place, state, deployment, serving, cordoned)
    except ValueError as reason:
        return str(reason)
    except Exception as crash:  # a bug in placement is said, as the keeper says it, not raised
        return f"{type(crash).__name__}: {crash}"


def _outcome(
    deployment: Deployment,
    state: State,
    lost_state: State,
    before: int,
    lost: list[AnyInstance],
    placed: list[AnyInstance],
    reason: str | None,
    thresholds: WhatIfThresholds | None,
) -> WhatIfDeployment:
    after = before - len(lost) + len(placed)
    outcome: WhatIfOutcome
    if not lost:
        outcome = "stays"
    elif after >= min(before, deployment.replicas):
        outcome = "moves"
    elif after > 0:
        outcome = "loses_replica"
    else:
        outcome = "cannot_place"
    model_id = deployment.model_card.model_id
    return WhatIfDeployment(
        deployment_id=deployment.deployment_id,
        model_id=model_id,
        outcome=outcome,
        replicas=deployment.replicas,
        before=before,
        after=after,
        lost=[
            WhatIfInstance(instance_id=instance.instance_id, nodes=_nodes(state, instance))
            for instance in sorted(lost, key=lambda instance: instance.instance_id)
        ],
        placed=[
            WhatIfPlacement(
                nodes=_nodes(lost_state, instance),
                model_on_disk=all(
                    _on_disk(lost_state, node, model_id)
                    for node in instance.shard_assignments.node_to_runner
                ),
                estimate=(
                    placement_estimate(lost_state, instance, thresholds)
                    if thresholds is not None
                    else None
                ),
            )
            for instance in placed
        ],
        reason=reason,
    )


def _node(state: State, node: NodeId) -> WhatIfNode:
    return WhatIfNode(node_id=node, name=node_name(state, node))


def _nodes(state: State, instance: AnyInstance) -> list[WhatIfNode]:
    nodes = [_node(state, node) for node in instance.shard_assignments.node_to_runner]
    return sorted(nodes, key=lambda node: (node.name, node.node_id))


def _on_disk(state: State, node: NodeId, model_id: ModelId) -> bool:
    return isinstance(download_entry(state, node, model_id), DownloadCompleted)


# --- in seconds: how long a replacement takes to serve (docs/design.md §5.14) -----------------

# exo's own node timeout and the sweep that deletes a gone node's instances, at exo's defaults:
# the bridge cannot read the flags exo runs with (our master runs its own, from its config).
EXO_NODE_TIMEOUT_S = 30.0
EXO_SWEEP_INTERVAL_S = 10.0
# A load's rate when nothing better is known: a Mac reads a model's weights from its SSD into
# unified memory at a few GB/s, and exo's warm-up adds a little; 2 GB/s errs slow.
ASSUMED_LOAD_RATE = 2 * 1024**3  # bytes per second


def detection_s(thresholds: WhatIfThresholds) -> float:
    """When a replacement can start after the loss: at suspicion with fast failover on (a
    replacement is placed for a suspect node, §5.18), else at exo's timeout and its sweep (the
    worst case: the timeout is checked once per sweep)."""
    if thresholds.suspect_after_s > 0:
        return thresholds.suspect_after_s
    return thresholds.exo_timeout_s + thresholds.exo_sweep_s


def estimate(
    thresholds: WhatIfThresholds,
    model_bytes: int,
    on_disk: bool,
    download_rate: float | None,
    load_rate: float | None = None,
    load_bytes: int | None = None,
) -> WhatIfEstimate:
    """The time to serve again on a replacement: detection + download (0 on disk; the model's
    bytes over the node's measured rate, None when unknown) + load (``load_bytes``, by default
    the model's, over the measured load rate, else ``ASSUMED_LOAD_RATE``), each to a tenth of a
    second."""
    detect = detection_s(thresholds)
    if on_disk:
        download: float | None = 0.0
    elif download_rate is not None and download_rate > 0:
        download = round(model_bytes / download_rate, 1)
    else:
        download = None
    measured = load_rate is not None and load_rate > 0
    rate = load_rate if load_rate is not None and measured else ASSUMED_LOAD_RATE
    load = round((model_bytes if load_bytes is None else load_bytes) / rate, 1)
    total = round(detect + download + load, 1) if download is not None else None
    return WhatIfEstimate(
        detection_s=detect,
        download_s=download,
        load_s=load,
        total_s=total,
        load_rate=rate,
        load_rate_assumed=not measured,
    )


def service_thresholds(
    liveness: LivenessConfig,
    exo_timeout_s: float = EXO_NODE_TIMEOUT_S,
    exo_sweep_s: float = EXO_SWEEP_INTERVAL_S,
) -> WhatIfThresholds:
    """The thresholds a service runs with, from its flags: fast failover's (0 when off) and
    exo's timeout and sweep (exo's defaults unless the service runs them itself, as our master
    does)."""
    on = liveness.enabled
    return WhatIfThresholds(
        suspect_after_s=liveness.suspect_after_s if on else 0.0,
        dead_after_s=liveness.dead_after_s if on else 0.0,
        exo_timeout_s=exo_timeout_s,
        exo_sweep_s=exo_sweep_s,
    )


def download_rate(state: State, nodes: Iterable[NodeId], model_id: ModelId) -> float | None:
    """The rate a replacement's download is reckoned at: the slowest of its nodes lacking the
    model, each at the fastest download it reports now (the State holds a rate only while a
    download is under way); None when one of them reports none, or when none lacks it."""
    slowest: float | None = None
    for node in nodes:
        if _on_disk(state, node, model_id):
            continue
        speeds = [
            entry.download_progress.speed
            for entry in state.downloads.get(node, ())
            if isinstance(entry, DownloadOngoing) and entry.download_progress.speed > 0
        ]
        if not speeds:
            return None
        slowest = max(speeds) if slowest is None else min(slowest, max(speeds))
    return slowest


def placement_estimate(
    state: State, instance: AnyInstance, thresholds: WhatIfThresholds
) -> WhatIfEstimate:
    """``estimate`` for a replacement placed on ``state``: the whole model downloaded to each
    node lacking it, at ``download_rate``; its largest shard loaded (the nodes load their shards
    side by side) at the assumed rate, as the rates the repairs measure are not in the State."""
    model_id = instance.shard_assignments.model_id
    nodes = instance.shard_assignments.node_to_runner
    shards = instance.shard_assignments.runner_to_shard.values()
    model_bytes = max((shard.model_card.storage_size.in_bytes for shard in shards), default=0)
    return estimate(
        thresholds,
        model_bytes,
        on_disk=all(_on_disk(state, node, model_id) for node in nodes),
        download_rate=download_rate(state, nodes, model_id),
        load_bytes=max((shard_bytes(instance, runner) for runner in nodes.values()), default=0),
    )
