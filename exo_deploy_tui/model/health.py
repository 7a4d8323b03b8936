"""When an instance looks unhealthy, and why: a pure rule the instances view shows.

The State says what each runner reports; it cannot say that a runner has been "Loading" for ten
minutes without a layer more, or that the node under it stopped talking a few seconds ago. The
dashboard's model keeps what the rule needs across States (the data model's marks of each
instance, how long each node has been quiet) and hands it in, with the clock as a value, so the
rule is tested without a clock or a terminal. It lives apart from ``model`` to keep that module
about keeping the State.

Whether an instance is stalled or hollow is not the dashboard's own rule: it is the data
model's (``keeper.model.instance_health``, docs/design.md §5.19), with its bounds from the
model's size and the node's measured rates, and its words; ``InstanceMarks`` keeps its marks. So
the dashboard pointed at a stock exo, our master and the bridge all say the same thing of the
same instance. What is the dashboard's own is what it sees first and surely: a runner or a
download failed, a node gone or silent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from exo_deploy_tui.model.downloads import DownloadFacts
from keeper.model.instance_health import NO_MARKS, Marks, track, verdict
from keeper.model.state import AnyInstance, NodeId, State

# A node heard of more than this long ago cannot be trusted to serve its part of an instance:
# nodes report at least every 5 s, so this is two missed reports; the master itself gives up on
# the node later (10 s in the demo, 30 s on exo), deleting the instance then.
UNHEALTHY_SILENT_S = 10.0


class RunnerFacts(Protocol):
    """What the health rule reads of a runner row (``model.rows.RunnerRow`` has it): named
    here so the rule needs nothing of the model that calls it."""

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
    quiet_s: Mapping[NodeId, float | None],
    broken: str | None,
) -> str | None:
    """Why an instance looks unhealthy, in words, or None: a runner, or the download of the model
    a runner waits for, failed; a node it runs on left the cluster or has been silent for more
    than ``UNHEALTHY_SILENT_S`` (``quiet_s``: how long each node has been quiet); or the data
    model's rule found it stalled or hollow (``broken``: its words, ``InstanceMarks.why``). The
    first of these that holds is the reason, the most certain first."""
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
    return broken


class InstanceMarks:
    """The data model's marks of the instances (``keeper.model.instance_health.track``): when
    each last moved, its runners' changes, each node's measured rates; bounded by the State."""

    def __init__(self) -> None:
        self._marks: Marks = NO_MARKS

    def note(self, state: State, now: float) -> None:
        """Track ``state`` seen at ``now``. An instance first seen is dated now: how long it
        stood still before we connected cannot be known."""
        self._marks = track(self._marks, state, now)

    def why(self, instance: AnyInstance, state: State, now: float) -> str | None:
        """The data model's words for what is wrong with ``instance`` at ``now``, or None."""
        judged = verdict(instance, state, self._marks, now)
        return judged.why if judged is not None else None
