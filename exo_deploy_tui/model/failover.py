"""A deployment's fast failover as its row shows it, read from the State's verdicts.

``GET /deployments`` gives each deployment its ``failover`` (suspect, replacing, confirmed;
``keeper.core.failover.failover_picture``), but the dashboard's stream brings the verdicts and
the recorded replacement as events, at once, while the deployments' views come at most once a
second. The row is read from the State the table shows, so STATUS never says ``⚠ at risk`` a
second after the node was heard again; the same rule as the service's, written again here
because the dashboard may import nothing above the data model, and held to it by a test that
asks both of the same States. What only the service knows (why a replacement cannot be placed)
comes from its view. Against a stock exo the verdicts are the dashboard's own (``verdicts.py``),
and there is no keeper to record a replacement.

An instance on a node confirmed dead is not ready (``dead_nodes``): it serves nothing, though
its runners read Ready until the service deletes it (docs/design.md §5.18).

Pure: the master's clock comes in as a ``MasterClock`` value.
"""

from __future__ import annotations

from collections.abc import Mapping

from exo_deploy_tui.model.format import short_id
from exo_deploy_tui.model.master_clock import MasterClock
from exo_deploy_tui.model.rows import FailoverFacts
from keeper.model.readiness import instance_is_ready
from keeper.model.state import AnyInstance, Deployment, NodeId, State


def dead_nodes(state: State) -> frozenset[NodeId]:
    """The nodes the State's verdicts confirm dead."""
    return frozenset(n for n, watch in state.node_watch.items() if watch.phase == "dead")


def on_dead_node(instance: AnyInstance, dead: frozenset[NodeId]) -> bool:
    return any(n in dead for n in instance.shard_assignments.node_to_runner)


def failover_facts(
    deployment: Deployment,
    state: State,
    names: Mapping[NodeId, str],
    clock: MasterClock,
    now: float,
    why: str | None = None,
) -> FailoverFacts | None:
    """The deployment's failover: ``confirmed`` when an instance of its model is on a dead
    node, else ``replacing`` when its replacement is recorded, else ``suspect`` when one is on
    a suspect node; None when none is. ``why`` (the service's words for a replacement that
    cannot be placed) is kept only while suspect."""
    watch = state.node_watch
    if not watch:
        return None
    model_id = deployment.model_card.model_id
    nodes: set[NodeId] = set()
    for instance in state.instances.values():
        if instance.shard_assignments.model_id == model_id:
            nodes.update(n for n in instance.shard_assignments.node_to_runner if n in watch)
    if not nodes:
        return None
    ordered = sorted(nodes)
    named = tuple(names.get(n) or short_id(n) for n in ordered)
    phases = {watch[n].phase for n in nodes}
    move = deployment.failover
    replacement = state.instances.get(move.new_instance_id) if move is not None else None
    replacing_on: tuple[str, ...] = ()
    ready = False
    if replacement is not None:
        assignments = replacement.shard_assignments
        replacing_on = tuple(names.get(n) or short_id(n) for n in assignments.node_to_runner)
        ready = instance_is_ready(replacement, state)
    if "dead" in phases:
        since = min(watch[n].since for n in nodes if watch[n].phase == "dead")
        return FailoverFacts(
            "confirmed", named, clock.silent_since(since, now), replacing_on, ready
        )
    # Suspect or replacing: counted from the suspicion, which is what waits to be confirmed.
    suspect_for = clock.silent_since(min(watch[n].since for n in nodes), now)
    if move is not None:
        return FailoverFacts("replacing", named, suspect_for, replacing_on, ready)
    return FailoverFacts("suspect", named, suspect_for, why=why)
