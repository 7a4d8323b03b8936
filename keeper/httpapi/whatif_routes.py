"""``GET /whatif?nodes=NODE,NODE`` (docs/design.md §5.14), for the master and the bridge alike.

What losing those nodes now would do to each deployment: the answer is the pure
``keeper.core.whatif``'s, on the State the service holds. The route is written once, over the
one function each service provides (``WhatIfService.what_if``: the master on its State, the
bridge on exo's with its deployments in it), so a client cannot tell the two apart; and so is
its contract: a node no one has is a 404 naming it, no node at all (or a friendly name several
share) a 422, a service that cannot answer now a 503.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Protocol

from fastapi import APIRouter, Query
from fastapi.responses import Response

from keeper.core.whatif import node_list
from keeper.httpapi.app import JSON
from keeper.httpapi.contract import ok_body, refusals
from keeper.model.api_models import WhatIfResponse

# What the document says a node list is: at least one name that is not all commas and spaces.
# The route checks it itself (``node_list``), so that the refusal says it in words.
NODE_LIST_PATTERN = r"[^,\s]"


class WhatIfService(Protocol):
    def what_if(self, nodes: Sequence[str]) -> WhatIfResponse:
        """What losing ``nodes`` (friendly names or ids) now would do; refusals raise
        ``keeper.model.refusals`` types (``keeper.core.whatif.resolve_nodes``)."""
        ...


def whatif_router(service: WhatIfService) -> APIRouter:
    router = APIRouter()

    @router.get(
        "/whatif",
        responses={
            **ok_body(WhatIfResponse),
            **refusals(
                (404, "No node has this friendly name or id (the message names it)"),
                (
                    422,
                    "No node named (none given, or only commas), or a friendly name several "
                    "nodes share",
                ),
                (503, "The service cannot read the cluster now"),
            ),
        },
    )
    async def what_if(
        nodes: Annotated[
            str,
            Query(
                description="The nodes to suppose lost, comma-separated: each a friendly name "
                "or a node id",
                json_schema_extra={"pattern": NODE_LIST_PATTERN},
            ),
        ],
    ) -> Response:
        answer = service.what_if(node_list(nodes))
        return Response(answer.model_dump_json().encode(), media_type=JSON)

    return router
