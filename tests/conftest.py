"""What every test shares: the marker of its kind, from the folder it lives in, and the
fixtures more than one folder uses.

- ``tests/pure``: plain functions; no event loop, no sockets, no processes. Seconds.
- ``tests/virtual``: in-process on an event loop (trio's MockClock, httpx's ASGITransport,
  in-memory channels); no real sockets or subprocesses (but for one test that mounts a real
  tmpfs, marked ``processes`` as well).
- ``tests/tui``: the Textual app run headless (Pilot, snapshots).
- ``tests/processes``: real processes, sockets, signals and ptys.

So ``pytest tests/pure`` or ``pytest -m "not processes"`` runs a part alone. The helper modules
beside this file (``keeper_harness``, ``bridge_harness``, ...) import by plain name
(``pythonpath`` in pyproject.toml).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
KINDS = ("pure", "virtual", "tui", "processes")


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


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The TUI's times are local times: a module that compares them pins the zone to UTC with
    ``pytestmark = pytest.mark.usefixtures("utc")``."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
