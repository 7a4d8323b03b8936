"""One owner per data dir (``keeper.runtime.dir_lock``), with real processes: a second master on
a master's data dir, and ``exo-deploy log repair`` on it, stop with exit 2 naming the dir and the
holder's pid, changing nothing; a ``kill -9`` of the owner frees the dir for the next one."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import START_DEADLINE_S, free_port


def _exo_deploy(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "keeper.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _master(data_dir: Path) -> subprocess.Popen[str]:
    return _exo_deploy("master", "--port", str(free_port()), "--data-dir", str(data_dir))


def _wait_listening(process: subprocess.Popen[str]) -> None:
    assert process.stderr is not None
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            pytest.fail(f"the master ended ({process.wait()}): {process.stderr.read()}")
        if "listening on" in line:
            return
    pytest.fail("the master did not start")


@pytest.mark.e2e
def test_a_second_process_on_a_data_dir_stops_naming_the_holder(tmp_path: Path) -> None:
    data_dir = tmp_path / "master"
    owner = _master(data_dir)
    try:
        _wait_listening(owner)
        log_before = (data_dir / "events.jsonl").read_bytes()

        second = _master(data_dir)
        _, err = second.communicate(timeout=START_DEADLINE_S)
        assert second.returncode == 2, err
        assert f"data dir {data_dir} is in use by process {owner.pid}" in err
        assert "Traceback" not in err

        repair = _exo_deploy("log", "repair", str(data_dir))
        _, err = repair.communicate(timeout=START_DEADLINE_S)
        assert repair.returncode == 2, err
        assert f"in use by process {owner.pid}" in err
        assert (data_dir / "events.jsonl").read_bytes() == log_before  # nothing changed
        assert not list(data_dir.glob("events.jsonl.bak-*"))

        owner.send_signal(signal.SIGKILL)  # the lock goes with the process, however it ends
        owner.wait(timeout=30)
        after = _master(data_dir)
        try:
            _wait_listening(after)
        finally:
            after.send_signal(signal.SIGTERM)
            after.communicate(timeout=30)
        assert after.returncode == 0
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
