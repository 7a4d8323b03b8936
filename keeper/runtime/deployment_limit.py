"""How many deployments a master or a bridge keeps at most (``--max-deployments``).

Apart from the deployments API's rules (``keeper.runtime.deployments``, which re-exports it)
because the command's parser shows the default in ``--help``: every client command (``list``,
``deploy``...) builds the master's and the bridge's parsers with its own, and the rules' module
would load the keeper, the webhooks and httpx into each, about a third of a second of CPU
(docs/design.md §10, "Start-up").
"""

from __future__ import annotations

# The deployments a master or a bridge keeps at most unless started with --max-deployments. Each
# is a model kept running, with memory of its own: a cluster holds a few dozen at the most, so a
# thousand is room for any cluster and for scripts, while GET /deployments stays about half a
# megabyte (about half a kilobyte each) and the keeper's step, which looks at each every second,
# stays cheap.
DEFAULT_MAX_DEPLOYMENTS = 1000
