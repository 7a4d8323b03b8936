"""How a server builds ``GET /metrics`` (``keeper.runtime.metrics.ServiceMetrics``): off the
event loop, once for many scrapes at once, kept a second, gzipped alike. Real time (asyncio):
the worker thread is the point."""

from __future__ import annotations

import gzip

import anyio
import pytest

from keeper.model.state import State
from keeper.runtime.metrics import METRICS_MAX_AGE_S, MetricsSnapshot, ServiceMetrics


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_concurrent_scrapes_share_one_build_kept_for_its_age() -> None:
    clock = [100.0]
    snapshots: list[float] = []

    def snapshot() -> MetricsSnapshot:
        snapshots.append(clock[0])
        return MetricsSnapshot(state=State(), deployments=[], now=clock[0], started_at=0.0)

    metrics = ServiceMetrics(snapshot, lambda: clock[0], build_in_thread=True)
    bodies: list[bytes] = []

    async def scrape(gzipped: bool) -> None:
        bodies.append(await metrics.exposition(gzipped=gzipped))

    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(scrape, index % 2 == 0)
    assert snapshots == [100.0]  # one build for the ten
    plain = {body for body in bodies if not body.startswith(b"\x1f\x8b")}
    zipped = {body for body in bodies if body.startswith(b"\x1f\x8b")}
    assert len(plain) == 1 and len(zipped) == 1
    assert gzip.decompress(zipped.pop()) == plain.pop()
    assert b"exo_deploy_nodes" in bodies[0] or b"exo_deploy_nodes" in gzip.decompress(bodies[0])

    clock[0] += METRICS_MAX_AGE_S / 2
    await metrics.exposition()
    assert snapshots == [100.0]  # still fresh
    clock[0] += METRICS_MAX_AGE_S
    await metrics.exposition()
    assert len(snapshots) == 2  # built again once it aged
