"""How an ``exo-deploy`` process ends: its exit codes, and the run that ends with them.

The master, the bridge, a node and a local cluster all end the same way: 0 after a clean stop,
1 with the reason on stderr when they could not go on. This module is light (anyio only) so a
node process, started once per simulated node, does not pay for the HTTP stack to say so.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable

import anyio

EXIT_STOPPED = 0  # served until SIGINT/SIGTERM, then stopped cleanly
EXIT_FAILED = 1  # could not run on: the reason is on stderr


def run_reporting(command: str, main: Callable[[], Awaitable[None]], kind: type[Exception]) -> int:
    """Run ``main`` on asyncio; each ``kind`` error it ended with goes to stderr, one a line.

    Returns the exit code: EXIT_FAILED if any did, else EXIT_STOPPED. For commands that handle
    their own signals in ``main`` and whose one way to fail is ``kind`` (a node whose token the
    master refuses, a cluster whose child gave up); ``command`` names the process in messages."""
    failures: list[str] = []
    try:
        anyio.run(main, backend="asyncio")
    except* kind as errors:
        failures = [str(exc) for exc in errors.exceptions]
    for failure in failures:
        print(f"exo-deploy {command}: {failure}", file=sys.stderr)
    return EXIT_FAILED if failures else EXIT_STOPPED
