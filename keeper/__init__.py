"""exo-deploy's cluster side: the exo-compatible data model, placement, the keeper, and (in
``keeper.master`` and ``keeper.node``) the master service and simulated nodes built on them.

The names re-exported here are pinned (docs/design.md §5.10); other code, tests and tools import
them.
"""

from keeper.core.keeper import DeploymentTimer, Keeper, deployment_status, has_instance
from keeper.core.placement import place_instance
from keeper.model.apply import apply
from keeper.model.constants import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    PLACEMENT_TIMEOUT,
    STARTUP_GRACE,
    UNPLACEABLE_RETRY,
)

__all__ = [
    "FIRST_BACKOFF",
    "MAX_BACKOFF",
    "PLACEMENT_TIMEOUT",
    "STARTUP_GRACE",
    "UNPLACEABLE_RETRY",
    "DeploymentTimer",
    "Keeper",
    "apply",
    "deployment_status",
    "has_instance",
    "place_instance",
]
