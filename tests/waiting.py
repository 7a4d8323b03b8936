"""Waiting on a condition inside an anyio test, with a deadline and a failure that names it.

The in-process tests (the master with simulated nodes, the bridge in front of the stock-exo
stand-in, a node on a real socket) all wait the same way: poll a condition until it holds, and
fail the test naming what never happened rather than hang or sleep-and-hope. Under trio's
MockClock the deadline and the polling are virtual time; on the real clock they are seconds.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import pytest

# How often a wait looks again: small beside every deadline the tests use.
POLL_S = 0.05


async def wait_until(
    condition: Callable[[], bool], within_s: float, what: str, poll_s: float = POLL_S
) -> float:
    """Wait until ``condition`` holds; the time it took. Fails naming ``what`` past ``within_s``."""
    started = anyio.current_time()
    try:
        with anyio.fail_after(within_s):
            while not condition():
                await anyio.sleep(poll_s)
    except TimeoutError:
        pytest.fail(f"not within {within_s} s: {what}")
    return anyio.current_time() - started
