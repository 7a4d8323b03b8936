"""A bridge on a shared store acts only on an exo that lists nodes (``keeper.bridge.acting``):
during exo's cold start the store prefix's cluster check has nothing to compare, so the bridge
stands by, saying why, and acts once exo lists nodes the prefix knows. The store is a stand-in
with the leader key already this bridge's."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from keeper.bridge.acting import SharedActing, no_nodes_refusal
from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.etcd_store import EtcdStore
from keeper.bridge.exo_client import ExoState
from keeper.model.state import State, Topology

PREFIX = "/exo-deploy/"


class LeaderStore:
    """What ``SharedActing`` asks of the store: it holds the leader key; the prefix records
    ``recorded`` as its cluster's nodes."""

    def __init__(self, recorded: list[str]) -> None:
        self.acting = True
        self.name = "bridge-a"
        self.prefix = PREFIX
        self.recorded = recorded
        self.checked: list[list[str]] = []

    def check_cluster(self, node_ids: Iterable[str]) -> str | None:
        # As the real store's: nothing to compare is no refusal (the hole the rule closes).
        seen = sorted(node_ids)
        self.checked.append(seen)
        if not seen or set(seen) & set(self.recorded):
            return None
        return "belongs to another exo cluster"

    def read_prefix(self, _: str) -> dict[str, str]:
        return {}


class NoCreations:
    """The creations in flight: none, ever (no deployment in these tests)."""

    def forget_all(self) -> None:
        pass

    def pending(self) -> dict[str, object]:
        return {}


def acting_on(store: LeaderStore) -> tuple[SharedActing, list[float]]:
    keepers: list[float] = []
    creations, doomed = cast(Creations, NoCreations()), DoomedInstances(None)
    shared = SharedActing(
        cast(EtcdStore, store),
        own=State,
        creations=lambda: creations,
        doomed=lambda: doomed,
        monotonic=lambda: 0.0,
        new_keeper=keepers.append,
    )
    return shared, keepers


def exo_with(*nodes: str) -> ExoState:
    return ExoState(state=State(topology=Topology(nodes=list(nodes))), raw={}, cards={})


def test_an_exo_listing_no_nodes_is_not_acted_on_and_the_bridge_says_why() -> None:
    store = LeaderStore(recorded=["node-of-cluster-a"])
    shared, keepers = acting_on(store)
    assert shared.may_act(exo_with()) is False
    refusal = shared.foreign
    assert refusal is not None and refusal == no_nodes_refusal(PREFIX)
    assert "exo lists no nodes yet" in refusal and PREFIX in refusal
    assert keepers == []  # no keeper started on records that may be another cluster's
    assert store.checked == []  # nothing recorded from an empty list


def test_once_exo_lists_nodes_the_prefix_knows_the_bridge_acts() -> None:
    store = LeaderStore(recorded=["node-1"])
    shared, keepers = acting_on(store)
    assert shared.may_act(exo_with()) is False
    assert shared.may_act(exo_with("node-1", "node-2")) is True
    assert shared.foreign is None
    assert keepers == [0.0]


def test_nodes_of_another_cluster_after_a_cold_start_are_refused() -> None:
    store = LeaderStore(recorded=["node-of-cluster-a"])
    shared, keepers = acting_on(store)
    assert shared.may_act(exo_with()) is False
    assert shared.may_act(exo_with("node-of-cluster-b")) is False
    assert shared.foreign == "belongs to another exo cluster"
    assert keepers == []
