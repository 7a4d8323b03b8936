"""What every test shares: the marker of its kind, from the folder it lives in, and the
fixtures more than one folder uses.

- ``tests/pure``: plain functions; no event loop, no sockets, no processes. Seconds.
- ``tests/virtual``: in-process on an event loop (trio's MockClock, httpx's ASGITransport,
  in-memory channels); no real sockets or subprocesses (but for one test that mounts a real
  tmpfs, marked ``processes`` as well).
- ``tests/tui``: the Textual app run headless (Pilot, snapshots).
- ``tests/processes``: real processes, sockets, signals and ptys.
- ``tests/exo``: against a real exo cluster whose URLs come from the environment (``make
  test-exo``). Collected only when named (``pytest tests/exo``): ``make test`` must run on a
  machine without a cluster, and its collection stays what it was.

So ``pytest tests/pure`` or ``pytest -m "not processes"`` runs a part alone. The helper modules
beside this file (``keeper_harness``, ``bridge_harness``, ...) import by plain name
(``pythonpath`` in pyproject.toml).

``make pytest`` runs the tests in parallel (pytest-xdist), so nothing a test writes may be shared
with another (docs/design.md §10, "Ports and data dirs"): data dirs are the test's ``tmp_path``,
ports come from ``process_helpers.free_port``, and ``$XDG_STATE_HOME`` (where a node keeps its
key by default and the TUI its failure log) is a folder of this test process's own, inherited by
every process a test starts, so no test writes under the user's home either.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

# Hypothesis times each example against a 200 ms deadline by default; on two cores shared by the
# whole parallel suite an example that takes 0.1 ms alone can take 250 ms, and the test fails as
# "flaky" for a reason it does not check. What a property test checks is the property: speed is
# ``make bench``'s. So no deadline, for every property test.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")

TESTS = Path(__file__).parent
KINDS = ("pure", "virtual", "tui", "processes", "exo")
# The folder of the real-exo tier: left out of the collection unless a path under it is named.
EXO_TIER = TESTS / "exo"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """tests/exo is collected only when an argument names it or something under it."""
    if collection_path != EXO_TIER:
        return None
    named = (
        (config.invocation_params.dir / arg.split("::")[0]).resolve().is_relative_to(EXO_TIER)
        for arg in config.args
    )
    return None if any(named) else True


# The e2e tests (real clusters: a master, three nodes, often etcd and bridges, chats without
# pause) run in this many lanes, one after another within a lane, so at most this many clusters
# share the two cores. Measured on 2 cores: six at once starved them (a CLI command waiting 60 s
# for its process to start); with the tests' requests made cheap, five finish about 20 s sooner
# than four (fresh clones: 4 min 39 s and 4 min 46 s of pytest against 5 min 3 s); the other
# worker runs everything else meanwhile, and the lanes' workers join it as they finish
# (docs/design.md §10).
E2E_LANES = int(os.environ.get("EXO_DEPLOY_E2E_LANES", "5"))


# What an e2e test takes unless it says more (``@pytest.mark.e2e(seconds=N)``): most take 10 to
# 40 s. The lanes are filled longest first, each test into the lane with the least so far, so a
# few long ones (a stalled start waits out its 60 s floor) do not end up in one lane.
E2E_TYPICAL_S = 20.0


def _e2e_seconds(item: pytest.Item) -> float:
    marker = item.get_closest_marker("e2e")
    return float(marker.kwargs.get("seconds", E2E_TYPICAL_S)) if marker else 0.0


def _assign_lanes(items: list[pytest.Item]) -> None:
    lanes = [0.0] * E2E_LANES
    e2e = [
        item
        for item in items
        if item.get_closest_marker("e2e") and not item.get_closest_marker("xdist_group")
    ]
    for item in sorted(e2e, key=_e2e_seconds, reverse=True):  # stable: ties keep their order
        lane = lanes.index(min(lanes))
        lanes[lane] += _e2e_seconds(item)
        item.add_marker(pytest.mark.xdist_group(f"e2e-lane-{lane}"))


# First: xdist's own hook reads the xdist_group markers into the test ids.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not item.path.is_relative_to(TESTS):
            continue
        kind = item.path.relative_to(TESTS).parts[0]
        if kind not in KINDS:
            raise pytest.UsageError(
                f"{item.path}: a test module lives in one of tests/{{{','.join(KINDS)}}}/"
            )
        item.add_marker(kind)
    _assign_lanes(items)


@pytest.fixture(scope="session", autouse=True)
def own_state_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """``$XDG_STATE_HOME`` of this test process (each xdist worker has its own basetemp)."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The TUI's times are local times: a module that compares them pins the zone to UTC with
    ``pytestmark = pytest.mark.usefixtures("utc")``."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
