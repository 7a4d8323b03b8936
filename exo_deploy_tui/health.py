"""When an instance looks unhealthy, and why: a pure rule the instances view shows.

The State says what each runner reports; it cannot say that a runner has been "Loading" for ten
minutes without a layer more, or that the node under it stopped talking a few seconds ago. The
dashboard's model keeps what the rule needs across States (when each instance last moved, how
long each node has been quiet) and hands it in, with the clock as a value, so the rule is
tested without a clock or a terminal. It lives apart from ``model`` to keep that module about
keeping the State; what it keeps of each instance's progress is ``InstanceProgress``, here with
the signature it compares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from exo_deploy_tui.downloads import DownloadFacts
from exo_deploy_tui.format import duration
from keeper.model.readiness import instance_is_ready
from keeper.model.state import AnyInstance, InstanceId, NodeId, State, download_model_id

# An instance that is not ready and whose runners and downloads have not moved for this long is
# stuck, not slow: a big model takes minutes to load, but every few seconds of a healthy load
# moves something (bytes downloaded, layers loaded, a runner's status), so five minutes of
# stillness is worth the operator's attention (and, perhaps, ctrl+k).
NO_PROGRESS_AFTER_S = 300.0
# A node heard of more than this long ago cannot be trusted to serve its part of an instance:
# nodes report at least every 5 s, so this is two missed reports; the master itself gives up on
# the node later (10 s in the demo, 30 s on exo), deleting the instance then.
UNHEALTHY_SILENT_S = 10.0


class RunnerFacts(Protocol):
    """What the health rule reads of a runner row (``exo_deploy_tui.model.RunnerRow`` has it):
    named here so the rule needs nothing of the model that calls it."""

    @property
    def node_id(self) -> NodeId: ...
    @property
    def node_name(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def node_present(self) -> bool: ...
    @property
    def download(self) -> DownloadFacts | None: ...


def unhealthy_reason(
    runners: Sequence[RunnerFacts],
    *,
    ready: bool,
    quiet_s: Mapping[NodeId, float | None],
    last_progress_at: float | None,
    now: float,
) -> str | None:
    """Why an instance looks unhealthy, in words, or None: a runner, or the download of the model
    a runner waits for, failed; a node it runs on
    left the cluster or has been silent for more than ``UNHEALTHY_SILENT_S`` (``quiet_s``: how
    long each node has been quiet); or it is not ready and nothing of it (runners, downloads) has
    moved since ``last_progress_at`` for ``NO_PROGRESS_AFTER_S``. The first of these that holds
    is the reason, the most certain first. Pure: the clock comes in as ``now``."""
    for runner in runners:
        if runner.status == "Failed":
            return f"runner failed on {runner.node_name}: {runner.error or 'no message'}"
    for runner in runners:
        download = runner.download
        if download is not None and download.phase == "failed":
            return f"download failed on {runner.node_name}: {download.error or 'no message'}"
    for runner in runners:
        if not runner.node_present:
            return f"node {runner.node_name} left the cluster"
    for runner in runners:
        quiet = quiet_s.get(runner.node_id)
        if quiet is not None and quiet > UNHEALTHY_SILENT_S:
            return f"node {runner.node_name} silent {quiet:.0f} s"
    if not ready and last_progress_at is not None:
        still = now - last_progress_at
        if still >= NO_PROGRESS_AFTER_S:
            return f"no progress for {duration(still)}"
    return None


def progress_signature(instance: AnyInstance, state: State) -> object:
    """What moves while an instance comes up: its runners' statuses (layers loaded included) and
    the download entries of its nodes that name its model. Compared with ``==`` between States:
    a difference is progress."""
    assignments = instance.shard_assignments
    statuses = tuple(state.runners.get(r) for r in assignments.node_to_runner.values())
    model = assignments.model_id
    downloads = tuple(
        entry
        for node_id in assignments.node_to_runner
        for entry in state.downloads.get(node_id, ())
        if download_model_id(entry) == model
    )
    return statuses, downloads


@dataclass(frozen=True)
class _Progress:
    """What an instance's runners and downloads last showed, and since when (our clock)."""

    signature: object
    since: float


class InstanceProgress:
    """Per instance not yet ready: when its runners or downloads last moved."""

    def __init__(self) -> None:
        self._progress: dict[InstanceId, _Progress] = {}

    def note(self, state: State, now: float) -> None:
        """Date each not-ready instance's last progress. An instance first seen is dated now:
        how long it stood still before we connected cannot be known."""
        progress = self._progress
        for instance_id in [i for i in progress if i not in state.instances]:
            del progress[instance_id]
        for instance_id, instance in state.instances.items():
            if instance_is_ready(instance, state):
                progress.pop(instance_id, None)
                continue
            signature = progress_signature(instance, state)
            known = progress.get(instance_id)
            if known is None or known.signature != signature:
                progress[instance_id] = _Progress(signature, now)

    def since(self, instance_id: InstanceId) -> float | None:
        """When the instance last moved; None once it is ready (or never seen)."""
        known = self._progress.get(instance_id)
        return known.since if known is not None else None
