"""The tests' port rule (``ports``): each worker starts in a block of its own below the kernel's
ephemeral range, never hands a port out twice, and two test processes on one machine never get
the same port even from the same block (docs/design.md §10)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import ports

# Blocks no worker of `make pytest` starts in (it runs fewer workers), so these tests take no port
# another test is about to bind.
SPARE_BLOCKS = (9, 10, 11)


def test_a_worker_is_named_by_its_xdist_number() -> None:
    assert ports.worker_index(None) == 0
    assert ports.worker_index("gw0") == 0
    assert ports.worker_index("gw7") == 7
    assert ports.worker_index("master") == 0
    assert ports.worker_index("gwx") == 0


def test_each_worker_walks_the_whole_range_once_from_its_own_block() -> None:
    first = list(ports.port_order(0))
    assert first[0] == ports.FIRST_PORT
    assert sorted(first) == list(range(ports.FIRST_PORT, ports.END_PORT))
    third = list(ports.port_order(2))
    assert third[0] == ports.FIRST_PORT + 2 * ports.BLOCK
    assert third[-1] == ports.FIRST_PORT + 2 * ports.BLOCK - 1  # wrapped round
    assert sorted(third) == sorted(first)
    # More workers than blocks wrap round too, and stay in the range.
    many = next(ports.port_order(1000))
    assert ports.FIRST_PORT <= many < ports.END_PORT


def test_the_range_is_below_the_kernels_ephemeral_ports() -> None:
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range")
    low = int(ephemeral.read_text().split()[0]) if ephemeral.exists() else 32768
    assert low >= ports.END_PORT


def test_a_port_is_handed_out_once_and_only_while_it_binds() -> None:
    source = ports.PortSource(SPARE_BLOCKS[0])
    taken = {source.take() for _ in range(20)}
    assert len(taken) == 20
    # A port someone listens on is passed over.
    with socket.socket() as squatter:
        nxt = ports.PortSource(SPARE_BLOCKS[1])
        expected = ports.FIRST_PORT + SPARE_BLOCKS[1] * ports.BLOCK
        try:
            squatter.bind(("127.0.0.1", expected))
        except OSError:
            expected = -1  # taken by something else already: passed over all the same
        assert nxt.take() != expected


def test_another_test_run_on_the_machine_gets_other_ports() -> None:
    mine = ports.PortSource(SPARE_BLOCKS[2])
    held = [mine.take() for _ in range(5)]
    # Another process (another checkout's test run) walking the same block meanwhile.
    block = SPARE_BLOCKS[2]
    code = f"import ports; s = ports.PortSource({block}); print(*[s.take() for _ in range(5)])"
    tests = Path(__file__).resolve().parents[1]
    other = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=tests,
        env={"PYTHONPATH": str(tests)},
    )
    theirs = [int(port) for port in other.stdout.split()]
    assert len(theirs) == 5
    assert not set(theirs) & set(held)
