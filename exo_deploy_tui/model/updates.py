"""What the client tells the dashboard: the messages between the connection and the model.

They are plain frozen data with no behaviour, so the client (which speaks HTTP) and the model
(which is pure) can both depend on them without depending on each other, and a fake client in
tests produces exactly what the real one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from keeper.model.api_models import DeploymentView, NodeView
from keeper.model.events import IndexedEvent
from keeper.model.exo_state import UnreadablePart
from keeper.model.state import State

# connecting: nothing received yet; live: the event stream is open; polling: reading /state and
# /deployments every second; down: the last attempt failed and a retry is scheduled; unreadable:
# the master answered, but with nothing we can read (the detail says why), and a retry is
# scheduled.
ConnectionMode = Literal["connecting", "live", "polling", "down", "unreadable"]


@dataclass(frozen=True)
class SnapshotUpdate:
    """A whole State, replacing the one the dashboard holds.

    ``deployments`` is None when the master has no deployments API (a stock exo master); the
    model then derives each deployment's status from the State alone.
    """

    state: State
    deployments: tuple[DeploymentView, ...] | None
    # The master's clock minus ours, from the response's Date header, when it could be read.
    master_clock_offset_s: float | None = None
    # The entries of the State that did not read and were left out (keeper.model.exo_state).
    unreadable: tuple[UnreadablePart, ...] = ()


@dataclass(frozen=True)
class EventUpdate:
    """One event of the master's log, to apply to the State the dashboard holds."""

    indexed: IndexedEvent


@dataclass(frozen=True)
class DeploymentsUpdate:
    """The keeper's view of every deployment (its timers), replacing the previous one."""

    deployments: tuple[DeploymentView, ...]


@dataclass(frozen=True)
class ConnectionUpdate:
    """The connection changed: how we read the master now, or why we cannot."""

    mode: ConnectionMode
    detail: str = ""
    retry_in_s: float | None = None


@dataclass(frozen=True)
class HeardUpdate:
    """The master spoke and had nothing new to say (its stream's keepalive, a poll that changed
    nothing). Every update from the master dates its last word, and the dashboard judges the
    cluster as of that word (``MasterClock.heard_at``): this one only says it was alive now."""


@dataclass(frozen=True)
class NodesUpdate:
    """The master's ``GET /nodes`` answer, read while a drain is under way: what each drain has
    left to move and, only there, the keeper's reason a move cannot be placed. ``nodes`` is None
    when it could not be read (``detail`` says why); the drains then show what the State says."""

    nodes: tuple[NodeView, ...] | None
    detail: str = ""


Update = (
    SnapshotUpdate | EventUpdate | DeploymentsUpdate | HeardUpdate | ConnectionUpdate | NodesUpdate
)
