"""The dashboard polling a stock exo whose master changed (``keeper.model.master_change``): the
timeline says so first, in the words the history gives the incident, before the instances and
the node that went with the old master."""

from __future__ import annotations

from recorded_exo import recorded_state

from exo_deploy_tui.feed.client import STOCK_EXO
from exo_deploy_tui.model.cluster import ClusterModel, parse_iso
from exo_deploy_tui.model.updates import ConnectionUpdate, SnapshotUpdate
from keeper.model.notices import iso_utc_of


def test_a_new_masters_empty_state_is_told_as_the_masters_change() -> None:
    ready = recorded_state("state-instance-ready")
    heard = {node: parse_iso(at) or 0.0 for node, at in ready.last_seen.items()}
    now = max(heard.values()) + 1
    gone, *survivors = sorted(ready.topology.nodes)
    new_master = ready.model_copy(
        update={
            "instances": {},
            "runners": {},
            "last_event_applied_idx": 5,
            "topology": ready.topology.model_copy(update={"nodes": survivors, "connections": {}}),
            "last_seen": {node: iso_utc_of(now + 3) for node in survivors},
        }
    )
    model = ClusterModel()
    model.handle([SnapshotUpdate(ready, None), ConnectionUpdate("polling", STOCK_EXO)], now)
    told = len(model.timeline)
    model.handle(SnapshotUpdate(new_master, None), now + 4)
    new = [entry.text for entry in model.timeline][told:]
    name = ready.node_identities[gone].friendly_name if gone in ready.node_identities else gone
    assert new[0] == f"exo's master changed (its State started empty; node {name} left)"
    # The same master's next State says nothing of the kind.
    model.handle(SnapshotUpdate(new_master, None), now + 5)
    assert not [e for e in list(model.timeline)[told + len(new) :] if "master" in e.text]
