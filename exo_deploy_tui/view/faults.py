"""What the dashboard needs from an embedded demo cluster to inject faults.

``keeper.sim.cluster.demo.EmbeddedCluster`` provides these methods; they are thread-safe and may
block
briefly, so the app calls them from a worker thread. Naming the protocol here keeps the app
independent of the demo's implementation (and testable with a recording fake).
"""

from __future__ import annotations

from typing import Protocol

# How long a frozen or partitioned node stays so when no duration is given: longer than the
# master's 30 s node timeout, so the operator sees the whole story (silent, timed out,
# instance deleted, placed again elsewhere, the node rejoining).
DEFAULT_FAULT_SECONDS = 45.0


class FaultInjector(Protocol):
    def node_names(self) -> list[str]: ...
    def kill_node(self, name: str) -> None: ...
    def freeze_node(self, name: str, seconds: float) -> None: ...
    def partition_node(self, name: str, seconds: float) -> None: ...
    def kill_runner(self, name: str) -> object: ...
    def restart_master(self) -> None: ...


FAULT_WORDS: dict[str, str] = {
    "kill": "kill node",
    "freeze": "freeze node",
    "partition": "partition node",
    "kill_runner": "kill a runner on",
    "restart_master": "restart the master",
}


def inject(faults: FaultInjector, kind: str, node: str | None, seconds: float | None) -> str:
    """Run one fault; returns what was done, for the operator. Raises ValueError if unknown."""
    duration = DEFAULT_FAULT_SECONDS if seconds is None else seconds
    if kind == "restart_master":
        faults.restart_master()
        return "restarted the master"
    if node is None:
        raise ValueError(f"{FAULT_WORDS.get(kind, kind)}: which node?")
    if node not in faults.node_names():
        raise ValueError(f"no node named '{node}' (nodes: {', '.join(faults.node_names())})")
    if kind == "kill":
        faults.kill_node(node)
        return f"killed node {node}"
    if kind == "freeze":
        faults.freeze_node(node, duration)
        return f"froze node {node} for {duration:.0f} s"
    if kind == "partition":
        faults.partition_node(node, duration)
        return f"cut node {node} off the network for {duration:.0f} s"
    if kind == "kill_runner":
        faults.kill_runner(node)
        return f"killed a runner on {node}"
    raise ValueError(f"unknown fault '{kind}'")
