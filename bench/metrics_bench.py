"""``GET /metrics`` under load: 20 concurrent scrapes of a master keeping 200 deployments.

A real uvicorn master in a separate process (so the scrapers do not share its CPU time), each
scraper a bare keep-alive HTTP client (``bench.master_bench._KeepAliveClient``) so the figure is
the server's. Printed: p50 and p99 per scrape (target p99 <= 50 ms), the body's size, and one
scrape timed while a task of the master holds the keeper's step lock the whole time: a scrape
reads the published snapshot and never takes that lock (design §7.7), so it is answered as fast.
A body is built at most once a second (``keeper.runtime.metrics.METRICS_MAX_AGE_S``); the first
scrape's time is that build's, over HTTP.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from multiprocessing.queues import Queue

import anyio
import httpx

from bench.master_bench import DEPLOYMENTS, _KeepAliveClient, synthetic_cards
from keeper.master.server import serve
from keeper.master.service import Master, MasterConfig

SCRAPERS = 20
SCRAPES_PER_SCRAPER = 50


def _serve_child(port_queue: Queue[int], hold_lock: bool) -> None:
    cards = synthetic_cards(DEPLOYMENTS)
    master = Master(None, config=MasterConfig(model_cards=cards, startup_grace_s=0))

    async def main() -> None:
        async with anyio.create_task_group() as group:
            port = await group.start(serve, master, "127.0.0.1", 0, None)
            for card in cards:
                await master.create_deployment(card.model_id)
            await anyio.sleep(2)  # the keeper has stepped over all of them
            if hold_lock:
                await master._lock.acquire()  # pyright: ignore[reportPrivateUsage]
            port_queue.put(port)
            await anyio.sleep_forever()

    anyio.run(main, backend="asyncio")


async def _hammer(port: int) -> tuple[list[float], int, float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        started = time.perf_counter()
        first = await client.get("/metrics")
        built_s = time.perf_counter() - started  # the first scrape builds the body
        assert first.status_code == 200, first.text
        size = len(first.content)

    async def one_scraper() -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            client = _KeepAliveClient(stream, "/metrics")
            for _ in range(SCRAPES_PER_SCRAPER):
                started = time.perf_counter()
                await client.get()
                latencies.append(time.perf_counter() - started)

    async with anyio.create_task_group() as group:
        for _ in range(SCRAPERS):
            group.start_soon(one_scraper)
    return latencies, size, built_s


def _run(hold_lock: bool) -> tuple[list[float], int, float]:
    context = multiprocessing.get_context("spawn")
    port_queue: Queue[int] = context.Queue()
    child = context.Process(target=_serve_child, args=(port_queue, hold_lock), daemon=True)
    child.start()
    try:
        port = port_queue.get(timeout=180)
        return anyio.run(_hammer, port)
    finally:
        child.terminate()
        child.join(10)


def _figures(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def run() -> None:
    latencies, size, built_s = _run(hold_lock=False)
    p50, p99 = _figures(latencies)
    label = f"GET /metrics, {DEPLOYMENTS} deployments, {SCRAPERS} concurrent scrapers"
    print(f"{label}: p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 <= 50 ms)")
    print(
        f"  body {size / 1024:.0f} kB; the first scrape, which builds it: {built_s * 1000:.0f} ms"
    )
    held, _, _ = _run(hold_lock=True)
    held_p50, held_p99 = _figures(held)
    print(
        f"{label}, the keeper's step lock held throughout: p50 {held_p50:.1f} ms, "
        f"p99 {held_p99:.1f} ms (every scrape answered: it reads the snapshot, not under the lock)"
    )


if __name__ == "__main__":
    run()
