"""The node rows and the header's counts: each node of the cluster as the nodes tab shows it, and
the nodes gone or away that the State no longer (or never) lists.

A node row puts together what the State says of a node (memory, disk, backends, links, the
runners it holds and the downloads on its disk), how we hear it (``liveness.py``: its liveness
and how long it has been quiet), its GPU readings (``readings.py``) and its cordon and drain
(``moves.py``). A cordon is by name, so a node not in the cluster has a row of its own: one seen
leaving (``gone``, with how long ago), one a stock exo still describes after it left (``gone``,
since unknown), and a cordoned name no node goes by (``away``, its machine being updated, say).
The header's counts are read from the same judgement as the rows, so they never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from exo_deploy_tui.model.derive import Derived, waiting_download
from exo_deploy_tui.model.downloads import download_facts, download_mark
from exo_deploy_tui.model.draining import handle_of
from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.model.gpu_readings import GpuReadings
from exo_deploy_tui.model.liveness import NodeLiveness
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.moves import Moves
from exo_deploy_tui.model.rows import Liveness, NodeRow, Summary, runner_status_word
from keeper.model.api_models import DeploymentStatus
from keeper.model.state import (
    AnyDownload,
    DownloadCompleted,
    DownloadPending,
    ModelId,
    NodeId,
    State,
    download_model_id,
)


def node_rows(
    state: State,
    derived: Derived,
    now: float,
    *,
    liveness: NodeLiveness,
    clock: MasterClock,
    readings: GpuReadings,
    moves: Moves,
    unread: Mapping[NodeId, tuple[str, ...]] | None = None,
) -> list[NodeRow]:
    """The nodes of the topology by name, then those gone (seen leaving, then departed before
    we connected), then the cordoned names no node goes by (``away``). ``unread``: per node, a
    mark for each part of exo's State naming it that did not read, listed first among its
    models (``unread_parts``)."""
    unread = unread or {}
    wanted = _wanted_models(state)
    name_of = derived.name_of
    runners_on: dict[NodeId, list[str]] = {}
    # Per node: each runner's model, and what it shows (its status, or the download it
    # waits for). Without downloads in the State, that is what its runners show.
    downloads = state.downloads
    held_on: dict[NodeId, dict[ModelId, str]] = {}
    for instance in state.instances.values():
        model_id = instance.shard_assignments.model_id
        model = short_model(model_id)
        for node_id, runner_id in instance.shard_assignments.node_to_runner.items():
            status = state.runners.get(runner_id)
            text = f"{model} {runner_status_word(status)}"
            runners_on.setdefault(node_id, []).append(text)
            if node_id not in downloads:
                continue
            waiting = waiting_download(state, node_id, model_id, status)
            if waiting is not None:
                text = f"{model} {download_mark(waiting)}"
            held_on.setdefault(node_id, {}).setdefault(model_id, text)
    rows: list[NodeRow] = []
    for node_id, heard in liveness.heard(state, clock, now).items():
        memory = state.node_memory.get(node_id)
        identity = state.node_identities.get(node_id)
        sinks = state.topology.connections.get(node_id, {})
        disk = state.node_disk.get(node_id)
        runners = tuple(runners_on.get(node_id, ()))
        models = runners
        if node_id in downloads:
            held = held_on.get(node_id, {})
            listed = list(held.values())
            for entry in sorted(downloads[node_id], key=lambda e: isinstance(e, DownloadCompleted)):
                model_id = download_model_id(entry)
                if _unasked(entry, wanted):
                    continue
                if model_id not in held:
                    mark = download_mark(download_facts(entry))
                    listed.append(f"{short_model(model_id)} {mark}")
            models = tuple(listed)
        models = unread.get(node_id, ()) + models
        handle = handle_of(state, node_id)
        rows.append(
            NodeRow(
                node_id=node_id,
                name=name_of(node_id),
                liveness=heard.liveness,
                quiet_for_s=heard.quiet_for_s,
                ram_used=(
                    memory.ram_total.in_bytes - memory.ram_available.in_bytes if memory else None
                ),
                ram_total=memory.ram_total.in_bytes if memory else None,
                backends=tuple(str(b) for b in state.node_backends.get(node_id, [])),
                links=tuple(name_of(s) for s, edges in sinks.items() if edges),
                runners=runners,
                chip=identity.chip_id if identity else "",
                disk_free=disk.available.in_bytes if disk else None,
                disk_total=disk.total.in_bytes if disk else None,
                models=models,
                vitals=state.node_system.get(node_id),
                gpu_history=readings.of(node_id),
                handle=handle,
                cordoned=handle in state.cordoned,
                drain=moves.drain_of(state, handle),
            )
        )
    rows.sort(key=lambda r: (r.name, r.node_id))
    # A cordon is by name: a row of a node not in the cluster shows it only while no node
    # of that name is back.
    present = {r.handle for r in rows}
    for node_id, gone in liveness.gone(state).items():
        rows.append(_absent(state, moves, node_id, gone.name, "gone", now - gone.at, present))
    departed: list[NodeRow] = []
    for node_id in liveness.departed_unseen(state):
        identity = state.node_identities.get(node_id)
        row = _absent(state, moves, node_id, name_of(node_id), "gone", None, present)
        departed.append(
            replace(
                row,
                backends=tuple(str(b) for b in state.node_backends.get(node_id, [])),
                chip=identity.chip_id if identity else "",
            )
        )
    departed.sort(key=lambda r: (r.name, r.node_id))
    away = [
        _absent(state, moves, n, n, "away", None, present)
        for n in liveness.away_names(state, name_of)
    ]
    return rows + departed + away


def _wanted_models(state: State) -> frozenset[ModelId]:
    """The models something asks for: an instance runs it or a deployment keeps it."""
    running = {i.shard_assignments.model_id for i in state.instances.values()}
    kept = {d.model_card.model_id for d in state.deployments.values()}
    return frozenset(running | kept)


def _unasked(entry: AnyDownload, wanted: frozenset[ModelId]) -> bool:
    """A download entry nobody asked for: pending with nothing fetched, for a model no instance
    runs and no deployment keeps. A stock exo lists every model it knows so on every node (over
    a hundred a node), none of them downloading; shown, each would read as a queued download."""
    return (
        isinstance(entry, DownloadPending)
        and entry.downloaded.in_bytes == 0
        and download_model_id(entry) not in wanted
    )


def _absent(
    state: State,
    moves: Moves,
    node_id: NodeId,
    name: str,
    liveness: Liveness,
    quiet: float | None,
    present: set[str],
) -> NodeRow:
    """The row of a node not in the cluster, with its cordon and drain if no node of its
    name (``present``) is back."""
    mine = name not in present
    return NodeRow(
        node_id,
        name,
        liveness,
        quiet,
        None,
        None,
        (),
        (),
        (),
        "",
        handle=name,
        cordoned=mine and name in state.cordoned,
        drain=moves.drain_of(state, name) if mine else None,
    )


def summary(
    state: State,
    derived: Derived,
    now: float,
    *,
    liveness: NodeLiveness,
    clock: MasterClock,
    deployments_api: bool,
    master_quiet_s: float | None = None,
) -> Summary:
    """The header's counts: nodes by liveness (as their rows say), deployments by status."""
    heard = [h.liveness for h in liveness.heard(state, clock, now).values()]
    silent, suspect, dead = (heard.count(phase) for phase in ("silent", "suspect", "dead"))
    by_status: dict[DeploymentStatus, int] = {}
    for status in derived.statuses.values():
        by_status[status] = by_status.get(status, 0) + 1
    return Summary(
        nodes_alive=len(state.topology.nodes) - silent - suspect - dead,
        nodes_silent=silent,
        nodes_suspect=suspect,
        nodes_dead=dead,
        nodes_gone=liveness.gone_count(state),
        by_status=by_status,
        deployments=len(state.deployments),
        instances=len(state.instances),
        nodes_away=len(liveness.away_names(state, derived.name_of)),
        deployments_api=deployments_api,
        master_quiet_s=master_quiet_s,
    )
