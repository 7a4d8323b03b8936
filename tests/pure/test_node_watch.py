"""The services' node watcher (``keeper.runtime.node_watch``) across one fault and the next: what
it records of a node's silences shapes how soon it judges the node again."""

from __future__ import annotations

from keeper.model.apply import apply
from keeper.model.events import AnyEvent, NodeConfirmedDead, NodeHeardAgain, NodeSuspected
from keeper.model.liveness import LivenessConfig
from keeper.model.state import State, Topology
from keeper.runtime.node_watch import NodeWatcher

CHECK_S = 0.25  # how often the watcher is asked (the bridge wakes at thresholds; this is finer)
WALL = 1_000_000.0  # Unix time at monotonic 0


class Cluster:
    """Three nodes reporting every second to a watcher, its verdicts applied to the State."""

    def __init__(self) -> None:
        self.watcher = NodeWatcher(LivenessConfig(), 0.0)
        self.state = State(topology=Topology(nodes=["a", "b", "c"]))
        self.now = 0.0
        self.events: list[tuple[float, AnyEvent]] = []

    def run_until(self, end: float, silent: frozenset[str] = frozenset()) -> None:
        while self.now < end:
            self.now = round(self.now + CHECK_S, 2)
            if self.now == int(self.now):  # the reports, once a second
                for node in ("a", "b", "c"):
                    if node not in silent:
                        self.watcher.heard(node, self.now, WALL + self.now, 1.0)
            for event in self.watcher.check(self.state, self.now, WALL + self.now):
                self.events.append((self.now, event))
                self.state = apply(self.state, event)

    def first(self, kind: type, after: float) -> float | None:
        return next((t for t, e in self.events if isinstance(e, kind) and t > after), None)


def test_a_freeze_is_a_fault_not_the_nodes_rhythm() -> None:
    cluster = Cluster()
    cluster.run_until(20.0)
    cluster.run_until(35.0, silent=frozenset({"a"}))  # a 15 s freeze: judged
    assert cluster.first(NodeConfirmedDead, 20.0) is not None
    cluster.run_until(38.0)
    assert cluster.first(NodeHeardAgain, 35.0) is not None
    cluster.run_until(60.0, silent=frozenset({"a"}))  # silent again from its report at 38
    suspected = cluster.first(NodeSuspected, 38.0)
    # Its threshold doubled for the flap (6 s), not stretched by the freeze counted as rhythm.
    assert suspected is not None and suspected - 38.0 <= 6.0 + CHECK_S
