"""exo-deploy's cluster side: the exo-compatible data model, placement, the keeper, and (in
``keeper.master`` and ``keeper.node``) the master service and simulated nodes built on them.

The names re-exported here are pinned (docs/design.md §5.10); other code, tests and tools import
them. They are loaded on first use (PEP 562), not when the package is: every ``exo-deploy``
process imports this package, and a short command (``exo-deploy list``) or a node has no use for
the keeper's core, whose import is most of a start-up (docs/design.md §10, "Start-up").
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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

# Each pinned name and the module it lives in.
_HOMES = {
    "FIRST_BACKOFF": "keeper.model.constants",
    "MAX_BACKOFF": "keeper.model.constants",
    "PLACEMENT_TIMEOUT": "keeper.model.constants",
    "STARTUP_GRACE": "keeper.model.constants",
    "UNPLACEABLE_RETRY": "keeper.model.constants",
    "DeploymentTimer": "keeper.core.keeper",
    "Keeper": "keeper.core.keeper",
    "apply": "keeper.model.apply",
    "deployment_status": "keeper.core.keeper",
    "has_instance": "keeper.core.keeper",
    "place_instance": "keeper.core.placement",
}

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


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'keeper' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
