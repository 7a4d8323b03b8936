"""How an ``exo-deploy`` process ends: its exit codes, the run that ends with them, and the watch
that ends a local cluster's child with the cluster.

The master, the bridge, a node and a local cluster all end the same way: 0 after a clean stop,
1 with the reason on stderr when they could not go on. This module is light (anyio only) so a
node process, started once per simulated node, does not pay for the HTTP stack to say so; the
parent watch lives here rather than beside the cluster (``keeper.sim.cluster.local``) for the
same reason: a master or a node that a cluster starts would otherwise import the whole
supervisor, httpx and a node's client with it, to start one thread (docs/design.md §10,
"Start-up").
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Awaitable, Callable

import anyio

EXIT_STOPPED = 0  # served until SIGINT/SIGTERM, then stopped cleanly
EXIT_FAILED = 1  # could not run on: the reason is on stderr

# A process gets this long to exit after SIGTERM before SIGKILL (a cluster's children, and an
# orphan that SIGTERMed itself).
STOP_GRACE_S = 5.0
# How often an orphaned child checks whether its parent is still there.
PARENT_CHECK_S = 1.0


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


def exit_with_parent(parent_pid: int) -> None:
    """Make this process stop (SIGTERM to itself) once ``parent_pid`` is no longer its parent,
    so children of a cluster that was itself killed with SIGKILL do not run on forever."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(STOP_GRACE_S)
        os._exit(1)  # SIGTERM was not enough

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
