"""The bridge's health: the ``GET /healthz`` body, and the record of its failing steps.

``/healthz`` must say what the bridge is really doing, not only whether exo answers: a bridge
whose every step raises (a bug, a State that trips one) reads exo fine and keeps nothing. So
beside exo's side (``exo``: reachable, readable, why not) and the log's (``event_log``) it says
whether the last step went through (``step``). Each part is its own model, so the OpenAPI
document describes the body exactly as it is sent.

``StepFailures`` is the step's side: the first failure of a run of them (its time is the
"since"), the last error, and which error was last logged, so the same failure is logged with
its traceback once, not once a second. It knows nothing of the service but an exception and a
time; the service reports each step's end to it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from keeper.bridge.following import OutageKind
from keeper.model.api_models import ApiModel, BridgeRole, WebhooksHealth

# How much of an error goes into ``/healthz`` and each deployment's detail: its first line's
# worth. The whole of it, with its traceback, is in the log.
ERROR_CHARS = 300

HealthStatus = Literal["ok", "degraded", "stopped"]


class ExoHealth(ApiModel):
    url: str  # the exo URL in use
    urls: list[str]  # every exo URL given, in order of preference
    reachable: bool  # exo answered the last read (whatever the State held)
    state_readable: bool  # and its State could be acted on
    unreachable_since: str | None  # ISO time the outage began
    reason: str | None  # why exo's State is not followed, in words
    outage: OutageKind | None


class EventLogHealth(ApiModel):
    writable: bool
    error: str | None  # why the bridge's log cannot be written (changes are refused)


class StepHealth(ApiModel):
    ok: bool  # the last step went through (or none has run yet)
    failing_since: str | None  # ISO time the steps began failing
    error: str | None  # the last step's error: "RecursionError: maximum recursion depth ..."


class StoreHealth(ApiModel):
    """The shared store (``--store etcd://...``): whether it answers, and whether the view the
    reads come from may be stale (the store stopped answering, or the watch is down)."""

    url: str
    prefix: str
    reachable: bool
    stale: bool
    unreachable_since: str | None  # ISO time the store stopped answering
    error: str | None


class BridgeHealth(ApiModel):
    """``GET /healthz``: ``status`` is ``degraded`` while the log cannot be written or the steps
    fail (answered with a 503 then), ``stopped`` when the bridge is not running. ``role`` is
    ``acting`` for the bridge that steps the keeper and calls exo, ``standby`` for the others
    (with ``--store``; a bridge without one always acts), ``leader`` the acting one's name as
    the store says (None while nobody holds the leader key)."""

    status: HealthStatus
    # This bridge's role and name, and the acting bridge's name: what the TUI's header shows
    # (read with ``keeper.model.api_models.ServiceHealthView``).
    role: BridgeRole
    name: str
    leader: str | None
    store: StoreHealth | None
    exo: ExoHealth
    deployments: int
    instances_to_delete: int
    event_log: EventLogHealth
    step: StepHealth
    webhooks: WebhooksHealth  # alert webhooks' deliveries (keeper.runtime.webhooks)
    # Fast failover (docs/design.md §5.18): "on", or why it is off for exo's State (no lastSeen,
    # an unreadable date, --suspect-after-s 0) or why the view is stale now.
    fast_failover: str = "on"


def described(error: BaseException) -> str:
    """An error in words: its type and its message, cut to ``ERROR_CHARS``."""
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text if len(text) <= ERROR_CHARS else text[: ERROR_CHARS - 3] + "..."


class StepFailures:
    """Whether the bridge's steps are failing, since when and with what."""

    def __init__(self) -> None:
        self.since: datetime | None = None  # wall clock of the first failure in a row
        self.error: str | None = None  # the last failure, in words
        self._logged: str | None = None  # the last failure logged with its traceback

    @property
    def failing(self) -> bool:
        return self.since is not None

    def failed(self, error: Exception, now: datetime) -> bool:
        """A step raised ``error`` at ``now``; whether it is to be logged (not just logged)."""
        if self.since is None:
            self.since = now
        self.error = described(error)
        new = self.error != self._logged
        self._logged = self.error
        return new

    def succeeded(self) -> None:
        """A step went through: the failure, if any, is over (a new one is logged anew)."""
        self.since = None
        self.error = None
        self._logged = None

    def detail(self) -> str | None:
        """What every deployment says while the steps fail: ``step failing since 12:03:04: ...``."""
        if self.since is None:
            return None
        return f"step failing since {self.since.astimezone().strftime('%H:%M:%S')}: {self.error}"
