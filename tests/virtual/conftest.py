"""tests/virtual runs on trio's MockClock: timeouts, graces and backoffs pass instantly, and a
test waits on a condition with a virtual-time deadline, never on a wall-clock sleep. A module
on real time overrides ``anyio_backend`` itself (test_api and test_history_api on asyncio, say)."""

from __future__ import annotations

from typing import Any

import pytest
from trio.testing import MockClock


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("trio", {"clock": MockClock(autojump_threshold=0)})
