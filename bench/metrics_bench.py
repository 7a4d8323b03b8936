"""``GET /metrics`` under load: 20 concurrent scrapes of a master keeping 200 deployments.

A real uvicorn master in a separate process (so the scrapers do not share its CPU time), each
scraper a bare keep-alive HTTP client (``bench.master_bench._KeepAliveClient``) so the figure is
the server's. Printed: p50 and p99 per scrape (target p99 <= 50 ms), the body's size, and one
scrape timed while a task of the master holds the keeper's step lock the whole time: a scrape
reads the published snapshot and never takes that lock (design §7.8), so it is answered as fast.
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
from anyio.abc import SocketStream

from bench.master_bench import (  # pyright: ignore[reportPrivateUsage]
    DEPLOYMENTS,
    _cpu_seconds,
    _KeepAliveClient,
    synthetic_cards,
)
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig

SCRAPERS = 20
SCRAPES_PER_SCRAPER = 50


class _GzipScraper(_KeepAliveClient):
    """The bare keep-alive client, asking for gzip as Prometheus does."""

    def __init__(self, stream: SocketStream, path: str) -> None:
        super().__init__(stream, path)
        self._request = (
            f"GET {path} HTTP/1.1\r\nHost: bench\r\nAccept-Encoding: gzip\r\n\r\n".encode()
        )


def _serve_child(port_queue: Queue[int], hold_lock: bool) -> None:
    cards = synthetic_cards(DEPLOYMENTS)
    # As ``exo-deploy master`` runs it: GET /metrics built off the event loop.
    config = MasterConfig(model_cards=cards, startup_grace_s=0, metrics_in_thread=True)
    master = Master(None, config=config)

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


async def _hammer(port: int, path: str, gzipped: bool) -> list[float]:
    latencies: list[float] = []

    async def one_scraper() -> None:
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            client = (_GzipScraper if gzipped else _KeepAliveClient)(stream, path)
            for _ in range(SCRAPES_PER_SCRAPER):
                started = time.perf_counter()
                await client.get()
                latencies.append(time.perf_counter() - started)

    async with anyio.create_task_group() as group:
        for _ in range(SCRAPERS):
            group.start_soon(one_scraper)
    return latencies


async def _first_scrape(port: int) -> tuple[int, float]:
    """The body's size and the first scrape's time (it builds the body)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        started = time.perf_counter()
        first = await client.get("/metrics")
        took = time.perf_counter() - started
    assert first.status_code == 200, first.text
    return len(first.content), took


Runs = dict[str, tuple[list[float], float]]  # by run: latencies, server CPU ms per request


def _run(hold_lock: bool, runs: tuple[tuple[str, str, bool], ...]) -> tuple[Runs, int, float]:
    context = multiprocessing.get_context("spawn")
    port_queue: Queue[int] = context.Queue()
    child = context.Process(target=_serve_child, args=(port_queue, hold_lock), daemon=True)
    child.start()
    try:
        port = port_queue.get(timeout=180)
        size, built_s = anyio.run(_first_scrape, port)
        results: Runs = {}
        for name, path, gzipped in runs:
            cpu_before = _cpu_seconds(child.pid)
            latencies = anyio.run(_hammer, port, path, gzipped)
            cpu = (_cpu_seconds(child.pid) - cpu_before) / len(latencies) * 1000
            results[name] = (latencies, cpu)
        return results, size, built_s
    finally:
        child.terminate()
        child.join(10)


def _figures(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


def run() -> None:
    label = f"{DEPLOYMENTS} deployments, {SCRAPERS} concurrent clients"
    runs = (
        ("GET /metrics, gzip (as Prometheus asks)", "/metrics", True),
        ("GET /metrics, plain text", "/metrics", False),
        (
            "GET /deployments on the same master, for scale (README: p99 9.7 ms quiet)",
            "/deployments",
            False,
        ),
    )
    results, size, built_s = _run(False, runs)
    print(
        f"{label}; body {size / 1024:.0f} kB plain; "
        f"the first scrape (a build): {built_s * 1000:.0f} ms"
    )
    for name, (latencies, cpu) in results.items():
        p50, p99 = _figures(latencies)
        target = " (target p99 <= 50 ms)" if name.startswith("GET /metrics") else ""
        print(f"  {name}: p50 {p50:.1f} ms, p99 {p99:.1f} ms{target}; server CPU {cpu:.2f} ms each")
    held, _, _ = _run(True, runs[:1])
    for name, (latencies, _) in held.items():
        p50, p99 = _figures(latencies)
        print(
            f"  {name}, the keeper's step lock held throughout: p50 {p50:.1f} ms, p99 {p99:.1f} ms"
            " (every scrape answered: it reads the snapshot, never under the lock)"
        )


if __name__ == "__main__":
    run()
