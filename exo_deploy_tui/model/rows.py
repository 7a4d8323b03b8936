"""The rows the widgets render: what the dashboard shows of a deployment, a node, an instance and
its runners, the header's counts and the connection, as frozen data.

They are apart from the model that fills them so that a widget, a cell or a screen can be
written and tested against a row alone, and so that the rules deriving them (``derive.py``,
``node_rows.py``) and the memory they read (``liveness.py``, ``tracking.py``, ...) can change
without touching what the widgets read. ``exo_deploy_tui.model.cluster`` re-exports every name here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from exo_deploy_tui.model.downloads import DownloadFacts
from exo_deploy_tui.model.draining import DrainProgress
from exo_deploy_tui.model.format import STATUS_ORDER
from exo_deploy_tui.model.updates import ConnectionMode
from keeper.model.api_models import DeploymentStatus, RequestsView, WaitReason
from keeper.model.state import (
    DEFAULT_PRIORITY,
    AnyRunnerStatus,
    DeploymentId,
    InstanceId,
    NodeId,
    SystemVitals,
)

# suspect / dead: the verdicts of fast failover (docs/design.md §5.18), the service's (State.
# node_watch) or, against a stock exo, the dashboard's own by the same rule; silent: quiet past
# the coarse threshold with no verdict (fast failover off). away: a name cordoned while no node
# of that name is in the cluster (a Mac being updated).
Liveness = Literal["alive", "suspect", "dead", "silent", "gone", "away"]
FailoverPhase = Literal["suspect", "replacing", "confirmed"]
SortKey = Literal["status", "name", "age"]


# --- rows the widgets render ----------------------------------------------------------------


@dataclass(frozen=True)
class FailoverFacts:
    """A deployment's fast failover as its row shows it (docs/design.md §5.18): ``suspect`` (an
    instance of it is on a suspect node, no replacement yet), ``replacing`` (one is placed, the
    node is still only suspect) or ``confirmed`` (the node is dead: its instance goes)."""

    phase: FailoverPhase
    nodes: tuple[str, ...]  # the names of its nodes with a verdict
    # How long since the suspicion (suspect, replacing) or the confirmation (confirmed).
    for_s: float
    # The nodes of the replacement placed for it, when the State records one, and whether
    # that replacement is ready (then it only waits for the node's fate: ``confirming``).
    replacing_on: tuple[str, ...] = ()
    replacement_ready: bool = False
    # Why no replacement is placed (the service's words), while only suspect.
    why: str | None = None


@dataclass(frozen=True)
class DeploymentRow:
    deployment_id: DeploymentId
    model_id: str
    status: DeploymentStatus
    instance_id: InstanceId | None  # the model's instance in the cluster now, if any
    nodes: tuple[str, ...]  # friendly names of that instance's nodes
    in_status_s: float
    in_status_known: bool  # False when it was already in this status as we connected
    placement_error: str | None
    waiting: WaitReason | None
    next_attempt_in_s: float | None
    failures: int
    load_progress: float | None  # layers loaded / layers, while starting
    sharding: str
    instance_meta: str
    min_nodes: int
    replicas: int = 1
    ready_replicas: int = 0  # instances of the model ready now (keeper.model.readiness's rule)
    # The nodes of every instance of the model, that instance's first: where the replicas run.
    replica_nodes: tuple[tuple[str, ...], ...] = ()
    # The placement error explained in numbers from the State (model.explain), or None.
    placement_why: str | None = None
    # The fraction of the last 24 h it served (keeper.model.history), None without serving records.
    availability: float | None = None
    # While starting: the download its instance waits for (``gating_download``) and its node.
    download: DownloadFacts | None = None
    download_on: str | None = None
    # The node a drain is moving it off (a move under way for it), or None.
    moving_off: str | None = None
    priority: int = DEFAULT_PRIORITY  # which the keeper places first, and what may preempt
    # A rolling change under way: (instances as the options ask, replicas), or None.
    updating: tuple[int, int] | None = None
    # A fast failover under way (an instance of it on a suspect or dead node), or None.
    failover: FailoverFacts | None = None
    # Its chats through the service's front door over the last window (``GET /deployments``);
    # None when none ended then, or the service has none (a master without one, a stock exo).
    requests: RequestsView | None = None

    @property
    def at_risk(self) -> bool:
        """An instance of it is on a node with a verdict and the failover is not settled: STATUS
        says so rather than ``serving`` with that node's name (a dead node's instance is not
        ready, so a confirmed failover shows the status underneath)."""
        return self.failover is not None and self.failover.phase != "confirmed"

    @property
    def draining(self) -> bool:
        """A drain is moving it: STATUS says ``draining`` whatever its status underneath (the
        old instance serves until its replacement is ready)."""
        return self.moving_off is not None

    @property
    def short(self) -> bool:
        """Fewer replicas ready than the deployment keeps."""
        return self.ready_replicas < self.replicas

    @property
    def broken(self) -> bool:
        return self.status != "serving"

    def matches(self, text: str) -> bool:
        needle = text.casefold()
        haystack = " ".join(
            (
                self.model_id,
                self.status,
                "draining" if self.draining else "",
                "updating" if self.updating else "",
                self.deployment_id,
                self.instance_id or "",
                " ".join(" ".join(nodes) for nodes in self.replica_nodes or (self.nodes,)),
                self.placement_error or "",
            )
        ).casefold()
        return needle in haystack


@dataclass(frozen=True)
class NodeRow:
    node_id: NodeId
    name: str
    liveness: Liveness
    quiet_for_s: float | None  # since it was last heard (alive/suspect/dead/silent), or left (gone)
    ram_used: int | None
    ram_total: int | None
    backends: tuple[str, ...]
    links: tuple[str, ...]  # names of the nodes it has an edge to
    runners: tuple[str, ...]  # "Qwen3-0.6B-4bit Ready" per runner it holds
    chip: str
    disk_free: int | None = None  # bytes free in its models directory, as it last reported
    disk_total: int | None = None
    # Its runners, then what else its disk holds or fetches: "Qwen3-0.6B-4bit Ready",
    # "Qwen3-30B-A3B-4bit ↓43%" (a download, also for a runner waiting for it), "… on disk".
    models: tuple[str, ...] = ()
    vitals: SystemVitals | None = None  # GPU, temperature and power, as it last reported
    gpu_history: tuple[float, ...] = ()  # its last GPU readings (0-1), oldest first
    # What the master calls it in cordons and drains: its friendly name, else its id.
    handle: str = ""
    cordoned: bool = False  # no new placement on it (a draining node is cordoned too)
    drain: DrainProgress | None = None  # its drain, while one is under way


@dataclass(frozen=True)
class RunnerRow:
    runner_id: str
    node_id: NodeId
    node_name: str
    rank: int
    start_layer: int
    end_layer: int  # exclusive
    status: str  # "Ready", "Loading", ... ("Unknown" before the node reports)
    progress: float | None  # while loading
    error: str | None
    node_present: bool
    # The node's download of the model, while the runner waits for it (not yet loading).
    download: DownloadFacts | None = None


@dataclass(frozen=True)
class InstanceRow:
    instance_id: InstanceId
    model_id: str
    deployment_id: DeploymentId | None
    kind: str
    ready: bool
    runners: tuple[RunnerRow, ...]
    # Why the instance looks unhealthy (``unhealthy_reason``), or None.
    unhealthy: str | None = None


@dataclass(frozen=True)
class Summary:
    nodes_alive: int
    nodes_silent: int  # quiet past the coarse threshold with no verdict
    nodes_gone: int
    by_status: dict[DeploymentStatus, int]
    deployments: int
    instances: int
    # Names cordoned with no node of that name in the cluster (listed as ``away``).
    nodes_away: int = 0
    # False against a master without the deployments API (a stock exo): there, the header
    # counts instances, since "0 deployments" would read as an empty cluster.
    deployments_api: bool = True
    # Fast failover's verdicts (docs/design.md §5.18): nodes suspect, and confirmed dead.
    nodes_suspect: int = 0
    nodes_dead: int = 0
    # How long the master has said nothing, once it is quiet (master_quiet.QUIET_AFTER_S);
    # None while it speaks or once the connection is lost (the header says that instead).
    master_quiet_s: float | None = None


@dataclass(frozen=True)
class Connection:
    mode: ConnectionMode
    detail: str = ""
    retry_in_s: float | None = None
    stale_since: float | None = None  # when data stopped arriving, while it is stale

    @property
    def stale(self) -> bool:
        return self.stale_since is not None


def runner_status_word(status: AnyRunnerStatus | None) -> str:
    if status is None:
        return "Unknown"
    return type(status).__name__.removeprefix("Runner")


def sort_rows(
    rows: Iterable[DeploymentRow], key: SortKey, reverse: bool = False
) -> list[DeploymentRow]:
    """Stable orders with the model id as tie-break, so rows never shuffle between frames."""
    by_name = sorted(rows, key=lambda r: (r.model_id, r.deployment_id))
    if key == "status":
        ordered = sorted(by_name, key=lambda r: STATUS_ORDER[r.status])
    elif key == "age":
        ordered = sorted(by_name, key=lambda r: r.in_status_s)  # most recent change first
    else:
        ordered = by_name
    return list(reversed(ordered)) if reverse else ordered
