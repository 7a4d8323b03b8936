"""exo-deploy: deployments for exo clusters, and a keeper that keeps them running.

The product a real operator runs is the bridge (``keeper.bridge``: the keeper beside a stock exo,
through exo's HTTP API), the CLI (``keeper.cli``) and its deployments client (``keeper.client``).
They stand on the shared layers: the exo-compatible data model and its pure rules
(``keeper.model``), the keeper and placement (``keeper.core``), the shell every service shares
(``keeper.runtime``) and the HTTP layer on it (``keeper.httpapi``). ``keeper.sim`` is the
simulation we demo and test with: our own master, simulated nodes, local clusters, a stock-exo
stand-in and the soak; the product never imports it (docs/design.md §2.1).

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
