"""``GET /whatif`` from the outside (docs/design.md §5.14), for ``exo-deploy whatif``.

One request through the deployments client's connection (``keeper.client.deployments``), so a
refusal reads the same way as every other: a 404 naming the node, a 422 saying what is wrong
with the list, the master unreachable. A service without the route (an older exo-deploy, or a
stock exo) answers a bare 404, said here in words rather than as an unknown node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import urlencode

from pydantic import ValidationError

from keeper.client.deployments import Answer, ApiError, DeploymentsClient, validation_summary
from keeper.model.api_models import WhatIfResponse

NO_WHATIF_API = (
    "this master has no GET /whatif (an older exo-deploy, or a stock exo: run `exo-deploy "
    "bridge` beside it)"
)


async def what_if(client: DeploymentsClient, nodes: Sequence[str]) -> Answer[WhatIfResponse]:
    """What losing ``nodes`` (friendly names or ids) now would do, as the master answers it."""
    path = "/whatif?" + urlencode({"nodes": ",".join(nodes)})
    try:
        response = await client.request("GET", path)
    except ApiError as exc:
        if exc.status == 404 and exc.message == "Not Found":
            raise ApiError(NO_WHATIF_API, 404) from exc
        raise
    try:
        payload: Any = response.json()
    except ValueError:
        raise ApiError(
            f"the master at {client.url} answered GET /whatif with something that is not JSON"
        ) from None
    try:
        return Answer(WhatIfResponse.model_validate(payload), payload)
    except ValidationError as exc:
        summary = validation_summary(exc.errors())
        raise ApiError(f"unexpected answer to GET /whatif: {summary}") from None
