"""Loopback ports for the servers the tests start, safe when pytest-xdist runs tests in parallel.

A test that starts ``exo-deploy master --port P`` (or etcd, or a webhook receiver) must name the
port before the process binds it. The usual trick, bind port 0, read the number, close, races
once several tests run at once: between the close and the process's bind (a second or more for
a Python process to start), the kernel may hand the same number to another worker's probe, or to
any outgoing connection as its source port, because it picks both from its ephemeral range. So
every port a test gets comes from here (docs/design.md §10, "Ports and data dirs"):

- from below the kernel's ephemeral range (Linux's default is 32768-60999, macOS's 49152-65535),
  which the kernel never hands out by itself, so no bind(0) or connect can take one meanwhile;
- each xdist worker starts in a block of its own (``gw0`` the first, ``gw1`` the next, ...) and
  walks on from there, never handing a port out twice;
- a port handed out is held by a lock file (``flock``) until this process exits, so two test runs
  on one machine (two checkouts, two developers) never hand out the same port either;
- and only a port that binds right now is handed out: nothing of anyone else's listens there.

This module holds the one rule; ``process_helpers.free_port`` is what the tests call.
"""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

# The ports handed out: above the well-known and the usual registered services (<= 10000 or so),
# below every common ephemeral range (see the docstring).
FIRST_PORT = 20000
END_PORT = 32768
# Each worker's own block: far more ports than one worker uses (the busiest took 40 in a whole
# `make test`), and 12 blocks fit the range, more workers than `make pytest` starts.
BLOCK = 1000
# Where the per-port lock files live: one folder every test run on this machine shares.
LOCK_DIR = Path(tempfile.gettempdir()) / "exo-deploy-test-ports"


def worker_index(worker: str | None) -> int:
    """0 for ``gw0`` (or no xdist at all), 1 for ``gw1``, ...; pytest-xdist names its workers
    in ``PYTEST_XDIST_WORKER``."""
    if worker is None or not worker.startswith("gw") or not worker[2:].isdigit():
        return 0
    return int(worker[2:])


def port_order(index: int) -> Iterator[int]:
    """Every port of the range once, starting at worker ``index``'s block and wrapping round:
    workers of one run start apart and meet only after one has used a whole block."""
    size = END_PORT - FIRST_PORT
    start = (index * BLOCK) % size
    for step in range(size):
        yield FIRST_PORT + (start + step) % size


def _binds(port: int) -> bool:
    """Whether ``port`` is free on loopback now. No SO_REUSEADDR: a port still in TIME_WAIT from
    an earlier test is passed over too."""
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _lock(port: int) -> IO[bytes] | None:
    """The lock file of ``port``, held; None when another process holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    handle = (LOCK_DIR / f"{port}.lock").open("ab")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    return handle


class PortSource:
    """Hands out each port once, in this worker's order, holding each one's lock."""

    def __init__(self, index: int) -> None:
        self._order = port_order(index)
        # Held open (and so locked) until the process exits.
        self._held: list[IO[bytes]] = []

    def take(self) -> int:
        for port in self._order:
            held = _lock(port)
            if held is None:
                continue
            if not _binds(port):
                held.close()
                continue
            self._held.append(held)
            return port
        raise RuntimeError(f"no free port left in {FIRST_PORT}-{END_PORT - 1} for the tests")


_SOURCE = PortSource(worker_index(os.environ.get("PYTEST_XDIST_WORKER")))


def free_port() -> int:
    """A loopback port no other test, worker or test run on this machine is given, and free now."""
    return _SOURCE.take()
