"""The TUI's times are local times; tests that compare them pin the zone to UTC.

Importing ``utc`` into a test module makes it autouse there (pytest collects fixtures from a
module's names), so the modules that need it share one definition.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()
