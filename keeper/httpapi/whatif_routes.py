"""``GET /whatif?nodes=NODE,NODE`` (docs/design.md §5.14), for the master and the bridge alike.

What losing those nodes now would do to each deployment: the answer is the pure
``keeper.core.whatif``'s, on the State the service holds. The route is written once, over the
one function each service provides (``WhatIfService.what_if_state``: the master's State, or
exo's with the bridge's deployments in it), so a client cannot tell the two apart; and so is
its contract: a node no one has is a 404 naming it, no node at all a 422, a service that cannot
answer now a 503. Each service also gives the thresholds it runs with
(``WhatIfService.what_if_thresholds``), so the answer says in seconds when each replacement
would serve, counted from that service's own detection.

The State is read on the event loop and the answer computed in a worker thread, one at a time:
a what-if is up to a placement per deployment (over a second for a thousand deployments that
all move, ``bench.whatif_bench``), and the loop it would otherwise hold is the one that
heartbeats, steps the keeper and serves.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Protocol

import anyio
from fastapi import APIRouter, Query
from fastapi.responses import Response

from keeper.core.whatif import node_list, what_if_named
from keeper.httpapi.app import JSON
from keeper.httpapi.contract import ok_body, refusals
from keeper.model.api_models import WhatIfResponse, WhatIfThresholds
from keeper.model.state import State

# What the document says a node list is: at least one name that is not all commas and spaces.
# The route checks it itself (``node_list``), so that the refusal says it in words.
NODE_LIST_PATTERN = r"[^,\s]"


# What-ifs computed at once: each is CPU the event loop shares, so more at once only slow each
# other and the loop; the next waits its turn.
CONCURRENT_WHATIFS = 1


class WhatIfService(Protocol):
    def what_if_state(self) -> State:
        """The State a what-if reads now; a refusal (``keeper.model.refusals``) if there is
        none to trust."""
        ...

    def what_if_thresholds(self) -> WhatIfThresholds:
        """How soon the service acts on a lost node now (``keeper.core.whatif.
        service_thresholds`` of its flags): what each placement's time to serve counts from."""
        ...


def whatif_router(service: WhatIfService) -> APIRouter:
    router = APIRouter()
    limiter = anyio.CapacityLimiter(CONCURRENT_WHATIFS)

    @router.get(
        "/whatif",
        responses={
            **ok_body(WhatIfResponse),
            **refusals(
                (404, "No node has this friendly name or id (the message names it)"),
                (422, "No node named: none given, or only commas"),
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
        state = service.what_if_state()
        thresholds = service.what_if_thresholds()
        answer = await anyio.to_thread.run_sync(
            partial(what_if_named, state, node_list(nodes), thresholds=thresholds),
            limiter=limiter,
        )
        return Response(answer.model_dump_json().encode(), media_type=JSON)

    return router
