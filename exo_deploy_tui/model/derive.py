"""The rows derived from a State: what each deployment and each instance shows, from the State
and what the model remembers of it, handed in as values.

A frame derives every row from the State it holds, so what every view needs of one State
(statuses, ready nodes and counts, instances per model, friendly names) is computed once per
State (``derive``: States are immutable, so the model caches by the object itself). The rules
here read the State only through the data model's own rules (``keeper.model.readiness`` for
statuses and ready replicas, the same ones ``GET /deployments`` answers with), so the table and
the API cannot disagree; an instance on a node the State's verdicts confirm dead is not counted
ready (``failover.py``). The memories a row reads (since when a status, the keeper's timers,
availability, how long a node has been quiet, an instance's last progress) are other parts';
they come in as functions, so these rules are tested with a dict. The node rows, which read
liveness, are ``node_rows.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from exo_deploy_tui.model.downloads import DownloadFacts, download_facts, gating_download
from exo_deploy_tui.model.explain import explain_placement
from exo_deploy_tui.model.failover import dead_nodes, on_dead_node
from exo_deploy_tui.model.format import short_id
from exo_deploy_tui.model.health import unhealthy_reason
from exo_deploy_tui.model.moves import Moves
from exo_deploy_tui.model.rows import (
    DeploymentRow,
    FailoverFacts,
    InstanceRow,
    RunnerRow,
    runner_status_word,
)
from exo_deploy_tui.model.timers import Timer
from exo_deploy_tui.model.tracking import Tracked
from keeper.model.api_models import DeploymentStatus, RequestsView
from keeper.model.readiness import instance_is_ready, ready_on_present_nodes, status_of
from keeper.model.runner_failure import failure_words
from keeper.model.state import (
    AnyInstance,
    AnyRunnerStatus,
    Deployment,
    DeploymentId,
    DownloadCompleted,
    MlxJacclInstance,
    ModelId,
    NodeId,
    RunnerConnected,
    RunnerConnecting,
    RunnerFailed,
    RunnerIdle,
    RunnerLoaded,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    RunnerWarmingUp,
    State,
    download_entry,
    node_name,
)

# A runner in one of these has all its layers in memory.
_LOADED_RUNNER_TYPES = (RunnerLoaded, RunnerWarmingUp, RunnerReady, RunnerRunning)
# A runner in one of these (or with no status yet) has not started loading: if its node is
# downloading its model, that download is what it waits for.
_BEFORE_LOADING_TYPES = (RunnerIdle, RunnerConnecting, RunnerConnected)


@dataclass(frozen=True)
class Derived:
    """What every view needs from one State, computed once per State."""

    statuses: dict[DeploymentId, DeploymentStatus]
    ready_nodes: dict[str, tuple[NodeId, ...]]  # per model: the nodes of a ready instance
    ready_count: dict[str, int]  # per model: its ready instances (``ready_replicas``)
    instances_of: dict[str, list[AnyInstance]]  # per model
    names: dict[NodeId, str]  # friendly names, gone nodes included

    def name_of(self, node_id: NodeId) -> str:
        return self.names.get(node_id) or short_id(node_id)


def derive(state: State, remembered: Mapping[NodeId, str]) -> Derived:
    """``state``'s statuses, ready instances and names (``remembered``: names of nodes that
    left, which the State no longer carries; the State's own win)."""
    instances_of: dict[str, list[AnyInstance]] = {}
    ready_nodes: dict[str, tuple[NodeId, ...]] = {}
    ready_count: dict[str, int] = {}
    # An instance on a node confirmed dead serves nothing, though its runners read Ready
    # until the service deletes it (docs/design.md §5.18).
    dead = dead_nodes(state)
    for instance in state.instances.values():
        model = instance.shard_assignments.model_id
        instances_of.setdefault(model, []).append(instance)
        if instance_is_ready(instance, state) and not on_dead_node(instance, dead):
            # keeper.model.readiness.ready_replicas counts these: what GET /deployments shows as
            # readyReplicas, here as fresh as the State (and as the status beside it).
            ready_count[model] = ready_count.get(model, 0) + 1
            if model not in ready_nodes:
                ready_nodes[model] = tuple(instance.shard_assignments.node_to_runner)
    statuses: dict[DeploymentId, DeploymentStatus] = {
        d_id: status_of(d, instances_of, ready_nodes) for d_id, d in state.deployments.items()
    }
    names = dict(remembered)
    names.update(
        (node_id, node_name(state, node_id))
        for node_id, identity in state.node_identities.items()
        if identity.friendly_name
    )
    return Derived(statuses, ready_nodes, ready_count, instances_of, names)


def deployment_rows(
    state: State,
    derived: Derived,
    now: float,
    *,
    tracked: Callable[[DeploymentId], Tracked | None],
    timer: Callable[[DeploymentId], Timer | None],
    availability: Callable[[DeploymentId], float | None],
    moves: Moves,
    failover: Callable[[DeploymentId], FailoverFacts | None] = lambda _: None,
    requests: Callable[[DeploymentId], RequestsView | None] = lambda _: None,
) -> list[DeploymentRow]:
    """Every deployment of ``state`` as its row, in the State's order."""
    statuses = derived.statuses
    names = derived.names
    moving = moves.moving(state)
    rows: list[DeploymentRow] = []
    for d_id, deployment in state.deployments.items():
        model = deployment.model_card.model_id
        instances = derived.instances_of.get(model, [])
        instance = _instance_for(deployment, instances)
        status = statuses[d_id]
        since = tracked(d_id)
        keeper = timer(d_id)
        due_in = None
        if keeper is not None and keeper.due_at is not None and status != "serving":
            due_in = max(0.0, keeper.due_at - now)
        gating = None
        if status == "starting" and instance is not None and state.downloads:
            gating = gating_download(
                (derived.name_of(n), facts) for n, facts in _waiting_downloads(instance, state)
            )
        rows.append(
            DeploymentRow(
                deployment_id=d_id,
                model_id=model,
                status=status,
                instance_id=instance.instance_id if instance else None,
                nodes=_node_names(instance, names) if instance else (),
                in_status_s=now - since.since if since else 0.0,
                in_status_known=since.known if since else False,
                placement_error=deployment.placement_error,
                placement_why=explain_placement(deployment, state, names),
                waiting=keeper.waiting if keeper and status != "serving" else None,
                next_attempt_in_s=due_in,
                failures=keeper.failures if keeper else 0,
                load_progress=load_progress(instance, state) if status == "starting" else None,
                sharding=str(deployment.sharding),
                instance_meta=str(deployment.instance_meta),
                min_nodes=deployment.min_nodes,
                replicas=deployment.replicas,
                ready_replicas=derived.ready_count.get(model, 0),
                replica_nodes=tuple(
                    _node_names(i, names)
                    for i in sorted(instances, key=lambda i: i is not instance)
                ),
                availability=availability(d_id),
                download=gating[1] if gating else None,
                download_on=gating[0] if gating else None,
                updating=moves.updating(deployment),
                moving_off=moving.get(d_id),
                priority=deployment.priority,
                failover=failover(d_id),
                requests=requests(d_id),
            )
        )
    return rows


def instance_rows(
    state: State,
    derived: Derived,
    *,
    quiet_for: Callable[[NodeId], float | None],
    broken: Callable[[AnyInstance], str | None],
) -> list[InstanceRow]:
    """Every instance of ``state`` with its runners, and why it looks unhealthy, by model."""
    deployment_of = {d.model_card.model_id: d_id for d_id, d in state.deployments.items()}
    present = set(state.topology.nodes)
    dead = dead_nodes(state)
    rows: list[InstanceRow] = []
    for instance in state.instances.values():
        assignments = instance.shard_assignments
        runners: list[RunnerRow] = []
        for node_id, runner_id in assignments.node_to_runner.items():
            shard = assignments.runner_to_shard.get(runner_id)
            status = state.runners.get(runner_id)
            progress = None
            if isinstance(status, RunnerLoading) and status.total_layers > 0:
                progress = status.layers_loaded / status.total_layers
            runners.append(
                RunnerRow(
                    runner_id=runner_id,
                    node_id=node_id,
                    node_name=derived.name_of(node_id),
                    rank=shard.device_rank if shard else 0,
                    start_layer=shard.start_layer if shard else 0,
                    end_layer=shard.end_layer if shard else 0,
                    status=runner_status_word(status),
                    progress=progress,
                    # The data model's words for a failure: its error's line, not a traceback.
                    error=failure_words(status) if isinstance(status, RunnerFailed) else None,
                    node_present=node_id in present,
                    download=waiting_download(state, node_id, assignments.model_id, status),
                )
            )
        runners.sort(key=lambda r: r.rank)
        ready = ready_on_present_nodes(instance, state) and not on_dead_node(instance, dead)
        rows.append(
            InstanceRow(
                instance_id=instance.instance_id,
                model_id=assignments.model_id,
                deployment_id=deployment_of.get(assignments.model_id),
                kind="MlxJaccl" if isinstance(instance, MlxJacclInstance) else "MlxRing",
                ready=ready,
                runners=tuple(runners),
                unhealthy=unhealthy_reason(
                    runners,
                    quiet_s={n: quiet_for(n) for n in assignments.node_to_runner},
                    broken=broken(instance),
                ),
            )
        )
    rows.sort(key=lambda r: (r.model_id, r.instance_id))
    return rows


def waiting_download(
    state: State, node_id: NodeId, model_id: ModelId, status: AnyRunnerStatus | None
) -> DownloadFacts | None:
    """The node's download of the model, if a runner in ``status`` waits for it: the runner has
    not started loading and the download is not complete."""
    if (status is not None and not isinstance(status, _BEFORE_LOADING_TYPES)) or (
        node_id not in state.downloads
    ):
        return None
    entry = download_entry(state, node_id, model_id)
    if entry is None or isinstance(entry, DownloadCompleted):
        return None
    return download_facts(entry)


def load_progress(instance: AnyInstance | None, state: State) -> float | None:
    """The fraction of the instance's layers in memory, None without layers."""
    if instance is None:
        return None
    loaded = total = 0
    for runner_id, shard in instance.shard_assignments.runner_to_shard.items():
        layers = shard.end_layer - shard.start_layer
        total += layers
        status = state.runners.get(runner_id)
        if isinstance(status, RunnerLoading):
            loaded += min(status.layers_loaded, layers)
        elif isinstance(status, _LOADED_RUNNER_TYPES):
            loaded += layers
    return loaded / total if total else None


def _waiting_downloads(
    instance: AnyInstance, state: State
) -> Iterable[tuple[NodeId, DownloadFacts]]:
    """The downloads the instance's runners wait for, each with its node."""
    model_id = instance.shard_assignments.model_id
    for node_id, runner_id in instance.shard_assignments.node_to_runner.items():
        waiting = waiting_download(state, node_id, model_id, state.runners.get(runner_id))
        if waiting is not None:
            yield node_id, waiting


def _instance_for(deployment: Deployment, instances: list[AnyInstance]) -> AnyInstance | None:
    """The deployment's own instance if the State has it, else the model's first."""
    for instance in instances:
        if instance.instance_id == deployment.instance_id:
            return instance
    return instances[0] if instances else None


def _node_names(instance: AnyInstance, names: dict[NodeId, str]) -> tuple[str, ...]:
    return tuple(names.get(n) or short_id(n) for n in instance.shard_assignments.node_to_runner)
