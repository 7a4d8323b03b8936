"""The soak in virtual time, short enough for every ``make test``: hours of faults under load
against a master and four in-process nodes, then the promises checked on its report.

``make soak-sim`` runs the same thing for 24 simulated hours; this is its two-hour cut, plus a
replay check (the same seed gives the same report) on a shorter run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from trio.testing import MockClock

from keeper.soak.faults import FaultKind
from keeper.soak.report import SoakReport
from keeper.soak.run import SOAK_MODELS
from keeper.soak.virtual import deterministic, run_virtual, virtual_settings

HOURS = 2.0
SEED = 11


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})


async def _soak(hours: float, seed: int, data_dir: Path) -> SoakReport:
    lines: list[str] = []
    with deterministic(seed):
        return await run_virtual(virtual_settings(hours, seed, nodes=4), data_dir, lines.append)


@pytest.mark.slow
@pytest.mark.anyio
async def test_hours_of_faults_under_load_lose_nothing_and_never_double(tmp_path: Path) -> None:
    report = await _soak(HOURS, SEED, tmp_path)

    assert report.run == "virtual"
    assert report.minutes == HOURS * 60
    assert [m.model_id for m in report.models] == [m.model_id for m in SOAK_MODELS]
    # The promises.
    assert report.lost == 0, report.lost_examples
    assert report.duplicates == 0, report.duplicate_examples
    assert report.duplicates_seen_live == 0
    assert report.serving_at_end
    # The checks had something to check: load, faults of every kind, a full log.
    assert report.requests == report.results + report.errors + report.lost
    assert report.results > 1000
    assert report.errors > 0  # faults do cost requests (answered with an error, never lost)
    assert report.events_checked > 1000
    injected = {fault.kind for fault in report.faults}
    assert injected == set(FaultKind), f"not injected: {set(FaultKind) - injected}"
    assert len(report.faults) >= HOURS * 60  # one every 20-60 s
    assert all(fault.ended_at is not None for fault in report.faults)
    assert all(fault.recovered_after_s is not None for fault in report.faults)
    assert sum(stats.count for stats in report.recovery.values()) == len(report.faults)
    # Node crashes cost the instances they held; the keeper re-placed them at its next step.
    crashes = [f for f in report.faults if f.kind is FaultKind.NODE_CRASH]
    assert any(fault.instance_survived is False for fault in crashes)
    latency = report.keeper_added_latency
    assert latency.samples > 0
    assert latency.alone_p99_s is not None and latency.alone_p99_s <= 1.1
    # A master crash by itself loses no instance: the new master rebuilds them from its log
    # (one that overlaps a node fault may lose that node's instance).
    restarts = [f for f in report.faults if f.kind is FaultKind.MASTER_CRASH]
    assert any(fault.instance_survived for fault in restarts)


@pytest.mark.anyio
async def test_the_same_seed_replays_the_same_report(tmp_path: Path) -> None:
    first = await _soak(0.25, 3, tmp_path / "first")
    second = await _soak(0.25, 3, tmp_path / "second")
    assert first.faults  # something happened worth replaying
    assert first.model_dump() == second.model_dump()
