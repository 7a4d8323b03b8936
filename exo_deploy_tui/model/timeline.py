"""The story of a recovery: timeline entries derived from events and from state diffs.

An event says what happened but not to what (``InstanceDeleted`` carries only an id), so every
entry is worded from the event together with the State just before and just after it: the model
and nodes of a deleted instance are found in the State before, those of a new one in the State
after. When the dashboard only polls (a stock exo master), or reconnects after missing events,
``events_between`` turns the difference of two States into the events that explain it, and the
same wording applies, so both paths tell the same story. Downloads are told the same way: a
node's entry for a model that turned ongoing, completed or failed between two States is a line
(``_download_entries``), with the time it took when the model saw it start (``started``).

What happened before the dashboard connected (or while it was away) comes from the master's
serving records instead: ``incident_entries`` words each incident of ``keeper.model.history`` in the
live lines' words, with its cause, as entries marked ``history`` so they read apart from what
the dashboard saw happen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from exo_deploy_tui.model.downloads import download_facts
from exo_deploy_tui.model.format import duration, precise_duration, short_id, short_model, size_gb
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentOptionsChanged,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentReplacementPlaced,
    DeploymentScaled,
    DrainReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeDownloadProgress,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeTimedOut,
    NodeUncordoned,
    RunnerStatusUpdated,
)
from keeper.model.history import Incident
from keeper.model.runner_failure import failure_words
from keeper.model.state import (
    SERVING_RUNNER_TYPES,
    AnyInstance,
    Deployment,
    DeploymentId,
    DownloadCompleted,
    DownloadFailed,
    DownloadOngoing,
    DownloadPending,
    ModelId,
    NodeId,
    RunnerFailed,
    RunnerId,
    RunnerReady,
    RunnerShutdown,
    State,
    download_entry,
    download_model_id,
    friendly_name,
)
from keeper.model.state import node_name as keeper_node_name

Level = Literal["info", "good", "warn", "error"]

# Enough for the whole story of a long incident and every deployment's recent history, while
# keeping the dashboard's memory flat however long it runs.
TIMELINE_CAPACITY = 1000


@dataclass(frozen=True)
class TimelineEntry:
    at: float  # epoch seconds, on the dashboard's clock
    level: Level
    text: str
    model_id: str | None = None
    node_id: NodeId | None = None
    # Told from the master's serving records (what happened before we connected or while we
    # were away), not seen happening: drawn with a mark of its own.
    history: bool = False


class Timeline:
    """A bounded, append-only list of entries, oldest first."""

    def __init__(self, capacity: int = TIMELINE_CAPACITY) -> None:
        self._entries: deque[TimelineEntry] = deque(maxlen=capacity)
        self.appended = 0  # entries ever appended; lets a view fetch only the new ones

    def extend(self, entries: Iterable[TimelineEntry]) -> None:
        for entry in entries:
            self._entries.append(entry)
            self.appended += 1

    def __iter__(self) -> Iterator[TimelineEntry]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def since(self, appended: int) -> list[TimelineEntry]:
        """The entries appended after the first ``appended`` (those still held)."""
        new = min(self.appended - appended, len(self._entries))
        return list(self._entries)[len(self._entries) - new :] if new > 0 else []

    def about_model(self, model_id: str) -> list[TimelineEntry]:
        return [e for e in self._entries if e.model_id == model_id]


# --- naming things ------------------------------------------------------------------------


_NO_NAMES: Mapping[NodeId, str] = MappingProxyType({})
_NO_STARTS: Mapping[tuple[NodeId, ModelId], float] = MappingProxyType({})


def node_name(node_id: NodeId, *states: State, remembered: Mapping[NodeId, str] = _NO_NAMES) -> str:
    """The node's friendly name from the first State that knows it, else from ``remembered``
    (names of nodes that have left, whose identity the State dropped), else its short id."""
    for state in states:
        if friendly_name(state, node_id) is not None:
            return keeper_node_name(state, node_id)
    return remembered.get(node_id) or short_id(node_id)


def instance_nodes(
    instance: AnyInstance, *states: State, remembered: Mapping[NodeId, str] = _NO_NAMES
) -> str:
    names = [
        node_name(n, *states, remembered=remembered)
        for n in instance.shard_assignments.node_to_runner
    ]
    return ", ".join(names) if names else "no nodes"


def _runner_home(runner_id: RunnerId, *states: State) -> tuple[AnyInstance, NodeId] | None:
    for state in states:
        for instance in state.instances.values():
            for node_id, rid in instance.shard_assignments.node_to_runner.items():
                if rid == runner_id:
                    return instance, node_id
    return None


def _layers(instance: AnyInstance, runner_id: RunnerId) -> str:
    shard = instance.shard_assignments.runner_to_shard.get(runner_id)
    if shard is None:
        return ""
    return f" (layers {shard.start_layer}-{shard.end_layer - 1})"


# --- entries ------------------------------------------------------------------------------


def _deployment_model(state: State, deployment_id: DeploymentId) -> ModelId | None:
    """The model ``state`` deploys under ``deployment_id``; None when it holds no such one."""
    deployment = state.deployments.get(deployment_id)
    return None if deployment is None else deployment.model_card.model_id


def entries_for_event(
    event: AnyEvent,
    before: State,
    after: State,
    at: float,
    remembered: Mapping[NodeId, str] = _NO_NAMES,
    started: Mapping[tuple[NodeId, ModelId], float] = _NO_STARTS,
) -> list[TimelineEntry]:
    """What an operator should read about ``event``, which turned ``before`` into ``after``.

    Events that change nothing worth telling (memory refreshes, links, loading and download
    progress) and events that changed nothing at all yield no entry. ``started``: when each
    (node, model) download was seen to start, for how long a completed one took.
    """
    match event:
        case DeploymentCreated(deployment=deployment):
            if deployment.deployment_id in before.deployments:
                return []
            if deployment.deployment_id not in after.deployments:
                return []  # refused: the model already had a deployment
            model = deployment.model_card.model_id
            text = (
                f"deployment of {short_model(model)} created "
                f"({deployment.sharding}, {deployment.instance_meta}, "
                f"min {deployment.min_nodes} node{'s' if deployment.min_nodes != 1 else ''}"
                + (f", {deployment.replicas} replicas)" if deployment.replicas > 1 else ")")
            )
            return [TimelineEntry(at, "info", text, model)]
        case DeploymentScaled(deployment_id=deployment_id, replicas=replicas):
            old = before.deployments.get(deployment_id)
            if old is None or old.replicas == replicas:
                return []
            model = old.model_card.model_id
            text = f"{short_model(model)} scaled from {old.replicas} to {replicas} replicas"
            return [TimelineEntry(at, "info", text, model)]
        case DeploymentDeleted(deployment_id=deployment_id):
            model = _deployment_model(before, deployment_id)
            if model is None:
                return []
            return [TimelineEntry(at, "warn", f"deployment of {short_model(model)} deleted", model)]
        case DeploymentPlaced(deployment_id=deployment_id, instance_id=instance_id):
            model = _deployment_model(after, deployment_id)
            if model is None:
                return []
            text = f"{short_model(model)} placed: instance {short_id(instance_id)}"
            return [TimelineEntry(at, "info", text, model)]
        case DeploymentPlacementFailed(deployment_id=deployment_id, error=error):
            model = _deployment_model(after, deployment_id)
            if model is None:
                return []
            text = f"{short_model(model)}: placement failed: {error}"
            return [TimelineEntry(at, "error", text, model)]
        case InstanceCreated(instance=instance):
            if instance.instance_id in before.instances:
                return []
            model = instance.shard_assignments.model_id
            text = (
                f"instance {short_id(instance.instance_id)} of {short_model(model)} created "
                f"on {instance_nodes(instance, after, before, remembered=remembered)}"
            )
            return [TimelineEntry(at, "info", text, model)]
        case InstanceDeleted(instance_id=instance_id):
            instance = before.instances.get(instance_id)
            if instance is None:
                return []
            model = instance.shard_assignments.model_id
            text = (
                f"instance {short_id(instance_id)} of {short_model(model)} deleted "
                f"(was on {instance_nodes(instance, before, after, remembered=remembered)})"
            )
            return [TimelineEntry(at, "warn", text, model)]
        case RunnerStatusUpdated(runner_id=runner_id, runner_status=status):
            return _runner_entries(runner_id, status, before, after, at, remembered)
        case NodeGatheredInfo(node_id=node_id):
            if node_id in before.topology.nodes:
                return []
            text = f"node {node_name(node_id, after, before, remembered=remembered)} joined"
            return [TimelineEntry(at, "info", text, node_id=node_id)]
        case NodeTimedOut(node_id=node_id):
            if node_id not in before.topology.nodes:
                return []
            text = f"node {node_name(node_id, before)} timed out and left the cluster"
            return [TimelineEntry(at, "error", text, node_id=node_id)]
        case NodeDownloadProgress(download_progress=entry):
            key = (entry.node_id, download_model_id(entry))
            return _download_entries(key, before, after, at, remembered, started.get(key))
        case NodeCordoned() | NodeUncordoned() | NodeDrainStarted() | NodeDrainEnded():
            return _cordon_entries(event, before, after, at)
        case DeploymentOptionsChanged(deployment_id=deployment_id, replace=replace):
            old = before.deployments.get(deployment_id)
            new = after.deployments.get(deployment_id)
            if old is None or new is None or _options(old) == _options(new):
                return []
            model = new.model_card.model_id
            count = len(replace)
            what = (
                f"replacing {count} instance(s), one at a time" if count else "nothing to replace"
            )
            text = f"{short_model(model)} now {_options(new)} (was {_options(old)}): {what}"
            return [TimelineEntry(at, "info", text, model)]
        case DeploymentReplacementPlaced(deployment_id=deployment_id, move=move):
            deployment = after.deployments.get(deployment_id)
            if deployment is None or deployment.moving != move:
                return []
            model = deployment.model_card.model_id
            text = (
                f"updating {short_model(model)}: replacing instance "
                f"{short_id(move.old_instance_id)} -> {short_id(move.new_instance_id)}"
            )
            return [TimelineEntry(at, "info", text, model)]
        case DrainReplacementPlaced(name=name, move=move):
            if move.deployment_id not in after.deployments or name not in after.drains:
                return []
            model = after.deployments[move.deployment_id].model_card.model_id
            text = (
                f"draining {name}: moving {short_model(model)} "
                f"(instance {short_id(move.old_instance_id)} -> {short_id(move.new_instance_id)})"
            )
            return [TimelineEntry(at, "info", text, model)]
        case _:
            return []


def _download_entries(
    key: tuple[NodeId, ModelId],
    before: State,
    after: State,
    at: float,
    remembered: Mapping[NodeId, str],
    started_at: float | None,
) -> list[TimelineEntry]:
    """A node's download of a model that started, completed or failed between the States. A
    completed entry that was not downloading before (a node reporting what its disk already
    holds) is no news."""
    node_id, model = key
    previous = download_entry(before, node_id, model)
    entry = download_entry(after, node_id, model)
    if entry is None or type(entry) is type(previous):
        return []
    facts = download_facts(entry)
    who = f"{node_name(node_id, after, before, remembered=remembered)}:"
    name = short_model(model)
    if isinstance(entry, DownloadOngoing):
        size = f" ({size_gb(facts.total)})" if facts.total > 0 else ""
        return [TimelineEntry(at, "info", f"{who} downloading {name}{size}", model, node_id)]
    if isinstance(entry, DownloadCompleted) and isinstance(
        previous, (DownloadOngoing, DownloadPending)
    ):
        took = f" in {duration(at - started_at)}" if started_at is not None else ""
        text = f"{who} downloaded {name} {size_gb(facts.total)}{took}"
        return [TimelineEntry(at, "good", text, model, node_id)]
    if isinstance(entry, DownloadFailed):
        reason = f": {entry.error_message}" if entry.error_message else ""
        text = f"{who} download of {name} failed{reason}"
        return [TimelineEntry(at, "error", text, model, node_id)]
    return []


def _runner_entries(
    runner_id: RunnerId,
    status: object,
    before: State,
    after: State,
    at: float,
    remembered: Mapping[NodeId, str],
) -> list[TimelineEntry]:
    home = _runner_home(runner_id, after, before)
    if home is None:
        return []
    instance, node_id = home
    model = instance.shard_assignments.model_id
    where = f"{short_model(model)} on {node_name(node_id, after, before, remembered=remembered)}"
    previous = before.runners.get(runner_id)
    if isinstance(status, RunnerReady) and not isinstance(previous, SERVING_RUNNER_TYPES):
        text = f"runner ready: {where}{_layers(instance, runner_id)}"
        return [TimelineEntry(at, "good", text, model, node_id)]
    if isinstance(status, RunnerFailed) and not isinstance(previous, RunnerFailed):
        reason = f": {failure_words(status)}"  # the data model's words (``runner_failure``)
        return [TimelineEntry(at, "error", f"runner failed: {where}{reason}", model, node_id)]
    return []


def incident_entries(
    model_id: ModelId, incident: Incident, *, had_served: bool, start: bool, end: bool
) -> list[TimelineEntry]:
    """History entries for ``incident`` (times on the dashboard's clock): its ``start`` ("stopped
    serving: <cause>") and, once it ended, its ``end`` ("serving again after 40.2 s"), each when
    asked for. ``had_served``: whether the deployment served before it (else it never could)."""
    name = short_model(model_id)
    entries: list[TimelineEntry] = []
    if start:
        went = "stopped serving" if had_served else "not serving"
        text = f"{name} {went}: {incident.cause}"
        entries.append(TimelineEntry(incident.start, "warn", text, model_id, history=True))
    if end and incident.end is not None:
        again = "serving again" if had_served else "serving"
        text = f"{name} {again} after {precise_duration(incident.downtime_s)}"
        entries.append(TimelineEntry(incident.end, "good", text, model_id, history=True))
    return entries


# --- explaining a state diff --------------------------------------------------------------


def _options(deployment: Deployment) -> str:
    nodes = deployment.min_nodes
    return f"{deployment.sharding}/{deployment.instance_meta}, min {nodes} node{'s' * (nodes != 1)}"


def events_between(before: State, after: State) -> list[AnyEvent]:
    """Events that would turn ``before`` into ``after`` as far as the timeline tells it.

    Losses come first (a node left, so its instance was deleted), then arrivals, so the story
    reads in the order it most likely happened.
    """
    events: list[AnyEvent] = []
    after_nodes = set(after.topology.nodes)
    before_nodes = set(before.topology.nodes)
    events += [NodeTimedOut(node_id=n) for n in before.topology.nodes if n not in after_nodes]
    events += [InstanceDeleted(instance_id=i) for i in before.instances if i not in after.instances]
    events += [
        DeploymentDeleted(deployment_id=d) for d in before.deployments if d not in after.deployments
    ]
    events += [
        DeploymentCreated(deployment=d)
        for d_id, d in after.deployments.items()
        if d_id not in before.deployments
    ]
    events += [
        NodeGatheredInfo(node_id=n, when=after.last_seen.get(n, ""))
        for n in after.topology.nodes
        if n not in before_nodes
    ]
    events += [
        InstanceCreated(instance=i)
        for i_id, i in after.instances.items()
        if i_id not in before.instances
    ]
    for d_id, d in after.deployments.items():
        old = before.deployments.get(d_id)
        if old is None:
            continue
        if d.replicas != old.replicas:
            events.append(DeploymentScaled(deployment_id=d_id, replicas=d.replicas))
        if _options(d) != _options(old):
            events.append(
                DeploymentOptionsChanged(
                    deployment_id=d_id,
                    sharding=d.sharding,
                    instance_meta=d.instance_meta,
                    min_nodes=d.min_nodes,
                    replace=(*d.replacing, *((d.moving.old_instance_id,) if d.moving else ())),
                )
            )
        if d.moving is not None and d.moving != old.moving:
            events.append(DeploymentReplacementPlaced(deployment_id=d_id, move=d.moving))
        if d.instance_id is not None and d.instance_id != old.instance_id:
            events.append(DeploymentPlaced(deployment_id=d_id, instance_id=d.instance_id))
        if d.placement_error is not None and d.placement_error != old.placement_error:
            events.append(DeploymentPlacementFailed(deployment_id=d_id, error=d.placement_error))
    for node_id, entries in after.downloads.items():
        old = before.downloads.get(node_id, ())
        if entries is old or entries == old:
            continue
        events += [NodeDownloadProgress(download_progress=e) for e in entries if e not in old]
    for r_id, status in after.runners.items():
        if before.runners.get(r_id) != status:
            events.append(RunnerStatusUpdated(runner_id=r_id, runner_status=status))
    events += [
        RunnerStatusUpdated(runner_id=r, runner_status=RunnerShutdown())
        for r in before.runners
        if r not in after.runners
    ]
    return events


def _cordon_entries(
    event: NodeCordoned | NodeUncordoned | NodeDrainStarted | NodeDrainEnded,
    before: State,
    after: State,
    at: float,
) -> list[TimelineEntry]:
    """A cordon, an uncordon, a drain's start and its end, once each (a repeat says nothing)."""
    name = event.name
    match event:
        case NodeCordoned():
            if name in before.cordoned:
                return []
            return [TimelineEntry(at, "warn", f"node {name} cordoned: nothing new goes there")]
        case NodeUncordoned():
            if name not in before.cordoned and name not in before.drains:
                return []
            ended = " (its drain ended)" if name in before.drains else ""
            return [TimelineEntry(at, "info", f"node {name} uncordoned{ended}")]
        case NodeDrainStarted():
            if before.drains.get(name) == after.drains.get(name):
                return []
            forced = " (forced)" if event.force else ""
            return [TimelineEntry(at, "warn", f"node {name} draining{forced}")]
        case NodeDrainEnded():
            if name not in before.drains:
                return []
            return [TimelineEntry(at, "info", f"node {name} drained: nothing runs there")]
