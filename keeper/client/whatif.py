"""``GET /whatif`` from the outside (docs/design.md §5.14), for ``exo-deploy whatif``.

One request through the deployments client's connection (``keeper.client.deployments``), so a
refusal reads the same way as every other: a 404 naming the node, a 422 saying what is wrong
with the list, the master unreachable. A service without the route (an older exo-deploy, or a
stock exo) answers a bare 404, said here in words rather than as an unknown node.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlencode

from keeper.client.deployments import Answer, DeploymentsClient
from keeper.model.api_models import WhatIfResponse

NO_WHATIF_API = (
    "this master has no GET /whatif (an older exo-deploy, or a stock exo: run `exo-deploy "
    "bridge` beside it)"
)


async def what_if(client: DeploymentsClient, nodes: Sequence[str]) -> Answer[WhatIfResponse]:
    """What losing ``nodes`` (friendly names or ids) now would do, as the master answers it."""
    path = "/whatif?" + urlencode({"nodes": ",".join(nodes)})
    return await client.call(
        "GET", path, WhatIfResponse, what="GET /whatif", no_route=NO_WHATIF_API
    )
