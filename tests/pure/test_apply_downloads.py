"""apply for downloads and staging (docs/design.md §3.6, §5.12): one entry per node and model,
replaced in place; disk and vitals with the node's reports, gone with the node; a deployment's
standby and the copies it staged."""

from __future__ import annotations

from keeper_harness import build_instance, card, node_info

from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentStandbyChanged,
    DownloadDeletionRequested,
    DownloadRequested,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeTimedOut,
)
from keeper.model.state import (
    AnyShard,
    Deployment,
    DiskUsage,
    DownloadCompleted,
    DownloadOngoing,
    DownloadPending,
    DownloadProgressData,
    Memory,
    State,
    SystemVitals,
)

WHEN = "2026-12-01T10:00:00Z"


def applied(*events: AnyEvent, state: State | None = None) -> State:
    state = state if state is not None else State()
    for event in events:
        state = apply(state, event)
    return state


def shard(model_id: str) -> AnyShard:
    instance = build_instance(card(model_id), ["a"], f"i-{model_id}")
    return next(iter(instance.shard_assignments.runner_to_shard.values()))


def ongoing(node: str, model_id: str, done: int) -> NodeDownloadProgress:
    data = DownloadProgressData(total=Memory(in_bytes=100), downloaded=Memory(in_bytes=done))
    return NodeDownloadProgress(
        download_progress=DownloadOngoing(
            node_id=node, shard_metadata=shard(model_id), download_progress=data
        )
    )


def completed(node: str, model_id: str) -> NodeDownloadProgress:
    return NodeDownloadProgress(
        download_progress=DownloadCompleted(
            node_id=node, shard_metadata=shard(model_id), total=Memory(in_bytes=100)
        )
    )


def test_a_download_entry_is_replaced_in_place_per_model_and_others_are_kept() -> None:
    state = applied(node_info("a"), node_info("b"), ongoing("b", "x", 1))
    state = applied(ongoing("a", "m", 10), ongoing("a", "n", 5), ongoing("a", "m", 50), state=state)
    entries = state.downloads["a"]
    assert [type(e).__name__ for e in entries] == ["DownloadOngoing", "DownloadOngoing"]
    first, second = entries
    assert isinstance(first, DownloadOngoing) and isinstance(second, DownloadOngoing)
    assert first.shard_metadata.model_card.model_id == "m"
    assert first.download_progress.downloaded.in_bytes == 50  # replaced where it was
    assert second.shard_metadata.model_card.model_id == "n"
    assert second.download_progress.downloaded.in_bytes == 5
    state = applied(completed("a", "n"), state=state)
    assert [type(e).__name__ for e in state.downloads["a"]] == [
        "DownloadOngoing",
        "DownloadCompleted",
    ]
    assert len(state.downloads["b"]) == 1  # another node's entries untouched


def test_a_download_of_a_node_the_topology_does_not_know_is_dropped() -> None:
    state = applied(node_info("a"), ongoing("ghost", "m", 1))
    assert state.downloads == {}


def test_disk_and_vitals_come_with_the_nodes_report_and_go_with_the_node() -> None:
    disk = DiskUsage(total=Memory.from_gb(500), available=Memory.from_gb(300))
    vitals = SystemVitals(gpu_usage=0.5, temp=55.0, sys_power=80.0)
    report = NodeGatheredInfo(node_id="a", when=WHEN, disk=disk, system=vitals)
    state = applied(node_info("a"), node_info("b"), report, ongoing("a", "m", 1))
    assert state.node_disk == {"a": disk}
    assert state.node_system == {"a": vitals}
    # A report without them leaves them as they were.
    state = applied(NodeGatheredInfo(node_id="a", when=WHEN), state=state)
    assert state.node_disk == {"a": disk} and state.node_system == {"a": vitals}
    other = NodeGatheredInfo(node_id="b", when=WHEN, disk=disk, system=vitals)
    state = applied(other, NodeTimedOut(node_id="a"), state=state)
    assert state.node_disk == {"b": disk}
    assert state.node_system == {"b": vitals}
    assert "a" not in state.downloads


def _deployment(deployment_id: str = "d") -> DeploymentCreated:
    """A deployment of its own model (one deployment per model)."""
    model = card(f"model-of-{deployment_id}")
    return DeploymentCreated(deployment=Deployment(deployment_id=deployment_id, model_card=model))


def test_standby_changes_only_its_deployment() -> None:
    state = applied(_deployment("d"), _deployment("e"))
    state = applied(DeploymentStandbyChanged(deployment_id="d", standby=3), state=state)
    assert state.deployments["d"].standby == 3
    assert state.deployments["e"].standby == 1  # the default
    unknown = applied(DeploymentStandbyChanged(deployment_id="nope", standby=2), state=state)
    assert unknown == state


def test_the_copies_a_deployment_staged_are_recorded_once_and_removed_by_node() -> None:
    state = applied(_deployment("d"), _deployment("e"))
    for node in ("b", "c", "b"):
        state = applied(
            DownloadRequested(deployment_id="d", node_id=node, shard_metadata=shard("m")),
            state=state,
        )
    assert state.deployments["d"].staged_on == ("b", "c")
    assert state.deployments["e"].staged_on == ()
    # exo's own download requests, and ones for a deployment that is gone, record nothing.
    for deployment_id in (None, "gone"):
        again = applied(
            DownloadRequested(deployment_id=deployment_id, node_id="x", shard_metadata=shard("m")),
            DownloadDeletionRequested(deployment_id=deployment_id, node_id="b", model_id="m"),
            state=state,
        )
        assert again == state
    state = applied(
        DownloadDeletionRequested(deployment_id="d", node_id="b", model_id="m"), state=state
    )
    assert state.deployments["d"].staged_on == ("c",)
    unchanged = applied(
        DownloadDeletionRequested(deployment_id="d", node_id="b", model_id="m"), state=state
    )
    assert unchanged == state
    assert unchanged.deployments["d"].staged_on == ("c",)


def test_a_pending_entry_replaces_a_completed_one_after_its_files_are_deleted() -> None:
    state = applied(node_info("a"), completed("a", "m"))
    pending = DownloadPending(node_id="a", shard_metadata=shard("m"))
    state = applied(NodeDownloadProgress(download_progress=pending), state=state)
    assert state.downloads["a"] == [pending]
