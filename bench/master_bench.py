"""Master benchmarks: router throughput, GET /deployments latency, restart time vs log size.

Run with ``make bench`` (``python -m bench``) or ``python -m bench.master_bench``. Figures are
printed, never asserted; the targets are printed beside them:
- events through the router (number, log, apply, publish): >= 20,000/s;
- ``GET /deployments`` p99 with 200 deployments under 20 concurrent clients: <= 20 ms, against
  a real uvicorn in a separate process so the clients do not share its CPU time;
- restart (State rebuilt from the data dir) at 10k, 100k and 1M logged events: <= 5 s at 1M.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.queues import Queue
from pathlib import Path

import anyio
import httpx
from anyio.abc import SocketStream

from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    IndexedEvent,
    NodeGatheredInfo,
    RunnerStatusUpdated,
)
from keeper.model.state import (
    Backend,
    Deployment,
    Memory,
    MemoryUsage,
    ModelCard,
    RunnerLoading,
    RunnerReady,
    State,
)
from keeper.runtime.event_log import LOG_FILE, SNAPSHOT_FILE, EventLog
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.master.subscriptions import SubscriptionLaggedError

ROUTER_EVENTS = 60_000
CLIENTS = 20
REQUESTS_PER_CLIENT = 100
DEPLOYMENTS = 200
LOG_SIZES = (10_000, 100_000, 1_000_000)
# The master's own default: restart replays at most this many events after the snapshot.
SNAPSHOT_EVERY = MasterConfig().snapshot_every_events
NODES = 8
RUNNERS = 16


def _node_info(j: int) -> NodeGatheredInfo:
    node = f"node-{j % NODES}"
    free = Memory.from_gb(32 + (j % 7))
    return NodeGatheredInfo(
        node_id=node,
        when=f"2026-01-01T00:00:{j % 60:02d}.000Z",
        memory=MemoryUsage(ram_total=Memory.from_gb(64), ram_available=free),
        backends=[Backend.MLX_METAL],
    )


def _runner_update(j: int) -> RunnerStatusUpdated:
    status = RunnerReady() if j % 5 == 0 else RunnerLoading(layers_loaded=j % 48, total_layers=48)
    return RunnerStatusUpdated(runner_id=f"runner-{j % RUNNERS}", runner_status=status)


def churn(i: int) -> AnyEvent:
    """The steady traffic of a live cluster: node reports and runner progress, alternating."""
    return _node_info(i // 2) if i % 2 == 0 else _runner_update(i // 2)


# Every PERIOD churn events report every node and every runner once (RUNNERS is a multiple of
# NODES), so the State after them no longer depends on anything earlier.
PERIOD = 2 * RUNNERS


def synthetic_cards(count: int) -> tuple[ModelCard, ...]:
    return tuple(
        ModelCard(
            model_id=f"bench/model-{n:03d}",
            storage_size=Memory.from_gb(1 + n % 50),
            n_layers=32,
            hidden_size=4096,
            supports_tensor=True,
        )
        for n in range(count)
    )


# --- router throughput ------------------------------------------------------------------


async def _router_rate(
    data_dir: Path | None, per_emit: int, producers: int, in_thread: bool, total: int
) -> tuple[float, bool]:
    """Events per second through the router, and whether the draining dashboard was dropped as
    too slow (the master's rule for a subscriber that falls a buffer behind)."""
    master = Master(data_dir, config=MasterConfig(log_io_in_thread=in_thread))
    events = [churn(i) for i in range(total)]
    elapsed = 0.0
    dropped = False
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        subscription = master.subscribe()  # one dashboard drains the stream, as in production

        async def drain() -> None:
            nonlocal dropped
            try:
                async for _ in subscription:
                    pass
            except SubscriptionLaggedError:
                dropped = True

        async def produce(share: list[AnyEvent]) -> None:
            for start in range(0, len(share), per_emit):
                await master.emit(share[start : start + per_emit])

        group.start_soon(drain)
        started = time.perf_counter()
        async with anyio.create_task_group() as producing:
            for n in range(producers):
                producing.start_soon(produce, events[n::producers])
        while master.state.last_event_applied_idx < total - 1:
            await anyio.sleep(0.001)
        elapsed = time.perf_counter() - started
        group.cancel_scope.cancel()
    return total / elapsed, dropped


def bench_router() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    # (label, durable, events per emit, producers, log I/O in a thread, events)
    cases = [
        ("in memory, bursts of 100", False, 100, 1, False, ROUTER_EVENTS),
        ("in memory, single events", False, 1, 1, False, ROUTER_EVENTS),
        ("log in loop, bursts of 100", True, 100, 1, False, ROUTER_EVENTS),
        ("log in loop, single events, 50 producers", True, 1, 50, False, ROUTER_EVENTS // 4),
        ("log in loop, single events, 1 producer", True, 1, 1, False, 1_000),
        ("log in thread, bursts of 100", True, 100, 1, True, ROUTER_EVENTS),
        ("log in thread, single events, 1 producer", True, 1, 1, True, ROUTER_EVENTS // 4),
        ("log in thread, single events, 50 producers", True, 1, 50, True, ROUTER_EVENTS // 4),
    ]
    for label, durable, per_emit, producers, in_thread, total in cases:
        with tempfile.TemporaryDirectory() as tmp:
            data_dir = Path(tmp) if durable else None
            rate, dropped = anyio.run(_router_rate, data_dir, per_emit, producers, in_thread, total)
        note = " (its dashboard dropped as too slow)" if dropped else ""
        rows.append((f"router: {label}{note}", f"{rate:,.0f} events/s", ">= 20,000/s"))
    return rows


# --- GET /deployments latency -----------------------------------------------------------


def _serve_child(port_queue: Queue[int]) -> None:
    cards = synthetic_cards(DEPLOYMENTS)
    master = Master(None, config=MasterConfig(model_cards=cards, startup_grace_s=0))

    async def main() -> None:
        async with anyio.create_task_group() as group:
            port = await group.start(serve, master, "127.0.0.1", 0, None)
            for card in cards:
                await master.create_deployment(card.model_id)
            await anyio.sleep(2)  # the keeper has stepped over all of them: timers are live
            port_queue.put(port)

    anyio.run(main, backend="asyncio")


class _KeepAliveClient:
    """A bare HTTP/1.1 keep-alive GET client: so little client work that the figure is the
    server's latency, not httpx's (the client shares the machine's two cores)."""

    def __init__(self, stream: SocketStream, path: str) -> None:
        self._stream = stream
        self._request = f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        self._buffer = b""

    async def get(self) -> bytes:
        await self._stream.send(self._request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status = head.split(b" ", 2)[1]
        if status != b"200":
            raise RuntimeError(f"GET answered {status.decode()}")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(self._buffer) < length:
            self._buffer += await self._stream.receive()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return body


def _http_parser() -> str:
    try:
        importlib.import_module("httptools")
    except ImportError:
        return "h11"
    return "httptools"


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (Linux /proc), so the server's own cost per
    request can be told apart from waiting for a core on a busy machine."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


async def timed_gets(port: int, path: str, count: int) -> list[float]:
    """Seconds of each of ``count`` ``GET path`` on one keep-alive connection to ``port``."""
    took: list[float] = []
    async with await anyio.connect_tcp("127.0.0.1", port) as stream:
        client = _KeepAliveClient(stream, path)
        for _ in range(count):
            started = time.perf_counter()
            await client.get()
            took.append(time.perf_counter() - started)
    return took


async def _hammer(port: int) -> list[float]:
    latencies: list[float] = []
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
        first = await client.get("/deployments")
        assert len(first.json()["deployments"]) == DEPLOYMENTS

    async def one_client() -> None:
        latencies.extend(await timed_gets(port, "/deployments", REQUESTS_PER_CLIENT))

    async with anyio.create_task_group() as group:
        for _ in range(CLIENTS):
            group.start_soon(one_client)
    return latencies


def bench_deployments_latency() -> list[tuple[str, str, str]]:
    context = multiprocessing.get_context("spawn")
    port_queue: Queue[int] = context.Queue()
    child = context.Process(target=_serve_child, args=(port_queue,), daemon=True)
    child.start()
    try:
        port = port_queue.get(timeout=120)
        cpu_before = _cpu_seconds(child.pid)
        latencies = anyio.run(_hammer, port)
        cpu_per_request = (_cpu_seconds(child.pid) - cpu_before) / len(latencies) * 1000
    finally:
        child.terminate()
        child.join(10)
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000
    # uvicorn parses HTTP with httptools when it is installed, else with the slower h11.
    parser = _http_parser()
    label = f"GET /deployments, {DEPLOYMENTS} deployments, {CLIENTS} clients ({parser})"
    return [
        (f"{label}: server CPU per request", f"{cpu_per_request:.2f} ms", ""),
        (f"{label}: p50", f"{p50:.1f} ms", ""),
        (f"{label}: p99", f"{p99:.1f} ms", "<= 20 ms"),
    ]


# --- restart time vs log size -----------------------------------------------------------


def _header() -> list[AnyEvent]:
    return [
        DeploymentCreated(deployment=Deployment(deployment_id=f"dep-{n:03d}", model_card=card))
        for n, card in enumerate(synthetic_cards(50))
    ]


def write_data_dir(data_dir: Path, total: int) -> None:
    """A data dir as a master that logged ``total`` events would leave it: the log, written
    directly (encoding each churn event once and stamping its index), and the latest snapshot.

    The log repeats the first ``PERIOD`` churn events: each overwrites one node's report or
    one runner's status, and a period overwrites all of them. So the State after
    event k equals the header's State with the last period of events applied, which is how the
    snapshot is computed here without replaying a million events; ``check_shortcut`` verifies
    that against a full replay.
    """
    header = _header()
    period = PERIOD
    templates = [
        IndexedEvent(idx=0, event=churn(i)).model_dump_json().removeprefix('{"idx":0,')
        for i in range(period)
    ]
    snapshot_at = ((total - 1) // SNAPSHOT_EVERY) * SNAPSHOT_EVERY - 1  # last snapshot's event
    offset_after_snapshot = 0
    with (data_dir / LOG_FILE).open("wb") as log:
        for idx, event in enumerate(header):
            log.write(IndexedEvent(idx=idx, event=event).model_dump_json().encode() + b"\n")
        written = log.tell()
        for idx in range(len(header), total):
            line = f'{{"idx":{idx},{templates[(idx - len(header)) % period]}\n'.encode()
            log.write(line)
            written += len(line)
            if idx == snapshot_at:
                offset_after_snapshot = written
    if snapshot_at >= len(header) + period:
        state = state_after(snapshot_at, header, period)
        body = (
            b'{"lastIdx":%d,"logOffset":%d,"state":' % (snapshot_at, offset_after_snapshot)
            + state.model_dump_json().encode()
            + b"}"
        )
        (data_dir / SNAPSHOT_FILE).write_bytes(body)


def state_after(idx: int, header: list[AnyEvent], period: int) -> State:
    from keeper.model.apply import apply  # noqa: PLC0415 (only the data generator needs it)

    state = State()
    for event in header:
        state = apply(state, event)
    # The first period fixes what depends on order (the topology's node list), the last one
    # every value; the events in between overwrite values only.
    for i in range(period):
        state = apply(state, churn(i))
    first = max(len(header), idx + 1 - period)
    for i in range(first, idx + 1):
        state = apply(state, churn((i - len(header)) % period))
    return state.model_copy(update={"last_event_applied_idx": idx})


def check_shortcut(data_dir: Path) -> None:
    log = EventLog(data_dir)
    from_snapshot = log.open().state
    log.close()
    (data_dir / SNAPSHOT_FILE).unlink()
    full = EventLog(data_dir)
    replayed = full.open().state
    full.close()
    if replayed != from_snapshot:
        raise AssertionError("the benchmark's snapshot differs from a full replay")


async def _restart_seconds(data_dir: Path) -> float:
    started = time.perf_counter()
    elapsed = 0.0
    # No compaction on stopping: the next case replays this same log without its snapshot.
    master = Master(data_dir, config=MasterConfig(compact_log=False))
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        elapsed = time.perf_counter() - started
        group.cancel_scope.cancel()
    return elapsed


def bench_restart() -> list[tuple[str, str, str]]:
    rows: list[tuple[str, str, str]] = []
    with tempfile.TemporaryDirectory() as tmp:
        check_dir = Path(tmp) / "check"
        check_dir.mkdir()
        write_data_dir(check_dir, 30_000)
        check_shortcut(check_dir)
    for total in LOG_SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            data_dir = Path(tmp)
            write_data_dir(data_dir, total)
            size_mb = (data_dir / LOG_FILE).stat().st_size / 1e6
            seconds = anyio.run(_restart_seconds, data_dir)
            target = "<= 5 s" if total == max(LOG_SIZES) else ""
            rows.append(
                (f"restart, {total:,} events ({size_mb:.0f} MB log)", f"{seconds:.2f} s", target)
            )
            if total <= 100_000:
                (data_dir / SNAPSHOT_FILE).unlink(missing_ok=True)
                seconds = anyio.run(_restart_seconds, data_dir)
                rows.append(("  same, no snapshot (full replay)", f"{seconds:.2f} s", ""))
    return rows


def _table(rows: list[tuple[str, str, str]]) -> None:
    width = max(len(row[0]) for row in rows)
    print(f"{'master benchmark':<{width}}  {'measured':>18}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>18}  {target}")


def run() -> None:
    benches: list[Callable[[], list[tuple[str, str, str]]]] = [
        bench_router,
        bench_deployments_latency,
        bench_restart,
    ]
    rows: list[tuple[str, str, str]] = []
    for bench in benches:
        rows.extend(bench())
    _table(rows)


if __name__ == "__main__":
    run()
