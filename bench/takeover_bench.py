"""The bridges' shared store: takeover times over many kills, and what a write through etcd costs.

Run with ``make bench`` (``python -m bench takeover``). Figures are printed, never asserted.

1. The kill loop of ``tests/processes/test_bridge_etcd_kills.py`` with ``BENCH_BRIDGE_KILLS``
   kills (default 100): three bridges with a 2 s lease on one local etcd, the stand-in exo
   cluster, writes through random bridges meanwhile. Printed: takeover p50/p99/max (kill -9 of
   the acting bridge until another says it acts), the loop's duration, duplicates (more
   instances of a model in exo's State than asked, sampled every 0.1 s) and acknowledged writes
   lost (not visible on every bridge at the end).
2. One deployment event committed through the local log (``EventStore.commit_now``: append +
   fsync), through etcd (``EtcdStore.commit_now``: one transaction on the JSON gateway), and
   through etcd as production runs it (TLS with ``--client-cert-auth``, auth on, a user whose
   role holds the prefix; certificates from ``tests/etcd_tls.py``), p50 and p99 over ``WRITES``
   writes each.

The loop's helpers live with the tests (``tests/etcd_bridges.py``), so the bench and the test run
the very same loop.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from keeper.bridge.etcd_access import StoreAccessOptions, load_access
from keeper.bridge.etcd_store import EtcdStore, parse_store_url
from keeper.model.events import DeploymentStandbyChanged
from keeper.runtime.event_store import EventStore
from keeper.sim.cluster.etcd_members import EtcdCluster, EtcdTls

# Enough writes for a stable p99 of a few-millisecond call, few enough to take seconds.
WRITES = 500


def _pct(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    return f"p50 {_pct(values, 0.5) * 1e3:.2f} ms, p99 {_pct(values, 0.99) * 1e3:.2f} ms"


def write_cost() -> None:
    event = DeploymentStandbyChanged(deployment_id="bench", standby=1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        local = EventStore(root / "local", snapshot_every=10**9)
        (root / "local").mkdir()
        local.open()
        timings: list[float] = []
        for _ in range(WRITES):
            started = time.perf_counter()
            local.commit_now([event])
            timings.append(time.perf_counter() - started)
        local.close()
        print(f"write through the local log (append + fsync): {_ms(timings)}")
        etcd = EtcdCluster(root / "etcd").start()
        try:
            store = EtcdStore(parse_store_url(etcd.endpoints), "bench")
            store.open()
            timings = []
            for _ in range(WRITES):
                started = time.perf_counter()
                store.commit_now([event])
                timings.append(time.perf_counter() - started)
            store.close()
            print(f"write through etcd (one txn, create_revision == 0): {_ms(timings)}")
        finally:
            etcd.stop()
        print(f"write through etcd over TLS + a user: {_ms(_secure_writes(root, event))}")


def _secure_writes(root: Path, event: DeploymentStandbyChanged) -> list[float]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from etcd_tls import make_pki  # pyright: ignore[reportMissingImports, reportUnknownVariableType]  # noqa: PLC0415

    pki = make_pki(root / "pki")  # pyright: ignore[reportUnknownVariableType]
    tls = EtcdTls(pki.ca, pki.server_cert, pki.server_key, pki.client_cert, pki.client_key)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
    password = root / "password"
    password.write_text("bench-password\n")
    password.chmod(0o600)
    etcd = EtcdCluster(root / "etcd-tls", tls=tls).start()
    try:
        etcd.enable_auth("bench-root", "bench", "bench-password", "/exo-deploy/")
        address = parse_store_url(etcd.endpoints)
        options = StoreAccessOptions(tls.ca, tls.client_cert, tls.client_key, "bench", password)
        store = EtcdStore(address, "bench", access=load_access(address, options))
        store.open()
        timings: list[float] = []
        for _ in range(WRITES):
            started = time.perf_counter()
            store.commit_now([event])
            timings.append(time.perf_counter() - started)
        store.close()
        return timings
    finally:
        etcd.stop()


def kill_loop_figures() -> None:
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests))
    from etcd_bridges import LEASE_S, kill_loop, stack  # pyright: ignore[reportMissingImports]  # noqa: PLC0415

    kills = int(os.environ.get("BENCH_BRIDGE_KILLS", "100"))
    root = Path(tempfile.mkdtemp(prefix="exo-deploy-takeover-"))
    print(f"logs in {root}", flush=True)  # kept: the bridges' logs explain any duplicate
    with stack(root) as running:  # pyright: ignore[reportUnknownVariableType]
        report = kill_loop(running, kills)  # pyright: ignore[reportUnknownVariableType]
    takeovers: list[float] = report.takeovers_s  # pyright: ignore[reportUnknownMemberType]
    print(
        f"{kills} kills of the acting bridge (lease {LEASE_S} s): takeover p50 "
        f"{_pct(takeovers, 0.5):.2f} s, p99 {_pct(takeovers, 0.99):.2f} s, max "
        f"{max(takeovers):.2f} s, mean {statistics.fmean(takeovers):.2f} s; loop "
        f"{report.duration_s:.0f} s; {len(report.duplicates)} duplicate sample(s); "  # pyright: ignore[reportUnknownMemberType]
        f"{report.acknowledged} acknowledged write(s), {len(report.lost)} lost; "  # pyright: ignore[reportUnknownMemberType]
        f"{report.samples} samples of exo's State"  # pyright: ignore[reportUnknownMemberType]
    )
    for line in report.duplicates[:5] + report.lost[:5]:  # pyright: ignore[reportUnknownMemberType]
        print(f"  {line}")


def run() -> None:
    write_cost()
    if os.environ.get("BENCH_WRITES_ONLY"):
        return
    kill_loop_figures()


if __name__ == "__main__":
    run()
