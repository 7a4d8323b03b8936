"""``GET /metrics`` (docs/design.md §7.8), for the master and the bridge alike.

Prometheus' text format, built by the service's ``keeper.runtime.metrics.ServiceMetrics`` from
the snapshot it already publishes. Open like every other read (``keeper.httpapi.auth``: only
changes need the token), so a Prometheus server scrapes it with no credentials. The body is
built from immutable States and takes no lock, so it never waits on the keeper's step; a server
builds it off the event loop (``ServiceMetrics``), and sends it gzipped to a scraper that asks
(Prometheus does). A service that is not running yet answers 503, as
``GET /deployments`` does.
"""

from __future__ import annotations

from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import Response

from keeper.httpapi.contract import refusals
from keeper.runtime.metrics import CONTENT_TYPE, ServiceMetrics

METRICS_PATH = "/metrics"


class MetricsService(Protocol):
    @property
    def metrics(self) -> ServiceMetrics: ...


def metrics_router(service: MetricsService) -> APIRouter:
    router = APIRouter()

    @router.get(
        METRICS_PATH,
        responses={
            200: {
                "description": "The service's metrics in Prometheus' text format (0.0.4)",
                "content": {CONTENT_TYPE.split(";")[0]: {"schema": {"type": "string"}}},
            },
            **refusals((503, "Not running yet")),
        },
        response_class=Response,
    )
    async def metrics(request: Request) -> Response:
        # Prometheus asks for gzip; the body is kept compressed too, so it costs no CPU per scrape.
        gzipped = "gzip" in request.headers.get("accept-encoding", "").lower()
        body = await service.metrics.exposition(gzipped=gzipped)
        headers = {"Vary": "Accept-Encoding"}
        if gzipped:
            headers["Content-Encoding"] = "gzip"
        return Response(body, media_type=CONTENT_TYPE, headers=headers)

    return router
