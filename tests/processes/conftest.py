"""tests/processes talks to real servers and processes on real time; uvicorn, which serves
them, runs on asyncio only."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
