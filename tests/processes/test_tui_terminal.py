"""Leaving cleanly when the terminal goes: end of input, hang-up, no process left spinning."""

from __future__ import annotations

import hashlib
import inspect
import os
import pty
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from importlib.metadata import version

import pytest
from process_helpers import START_DEADLINE_S
from textual.drivers.linux_driver import LinuxDriver

from exo_deploy_tui import terminal
from exo_deploy_tui.terminal import EndOfInputDriver

EXIT_DEADLINE_S = 10.0


@dataclass
class FakeLoop:
    scheduled: list[object] = field(default_factory=list)

    def call_soon_threadsafe(self, callback: object) -> None:
        self.scheduled.append(callback)


@dataclass
class FakeApp:
    def exit(self) -> None:
        raise AssertionError("called on the wrong thread")


def test_end_of_input_ends_the_app_instead_of_spinning() -> None:
    read_end, write_end = os.pipe()
    driver = EndOfInputDriver.__new__(EndOfInputDriver)
    driver.fileno = read_end
    driver.exit_event = threading.Event()
    driver._debug = False
    loop, app = FakeLoop(), FakeApp()
    driver._loop = loop  # type: ignore[assignment]
    driver._app = app  # type: ignore[assignment]
    received: list[object] = []
    driver.process_message = received.append  # type: ignore[method-assign]
    thread = threading.Thread(target=driver.run_input_thread, daemon=True)
    thread.start()
    os.write(write_end, b"q")
    os.close(write_end)
    thread.join(EXIT_DEADLINE_S)
    os.close(read_end)
    assert not thread.is_alive(), "the input thread kept running after end of input"
    assert loop.scheduled == [app.exit]
    assert any(getattr(m, "key", None) == "q" for m in received)


# Textual's own input loop, as our copy in exo_deploy_tui/terminal.py was last checked against.
CHECKED_TEXTUAL = "8.2.8"
CHECKED_INPUT_LOOP_SHA256 = "d796af6d69db337d6fa6bd463984f7d17188d991dbb22f60efb92a8a9619507c"


def test_textuals_input_loop_is_the_one_our_copy_follows() -> None:
    source = inspect.getsource(LinuxDriver.run_input_thread)
    digest = hashlib.sha256(source.encode()).hexdigest()
    assert digest == CHECKED_INPUT_LOOP_SHA256, (
        f"Textual {version('textual')} changed LinuxDriver.run_input_thread (last checked: "
        f"Textual {CHECKED_TEXTUAL}). Re-check EndOfInputDriver.run_input_thread in "
        "exo_deploy_tui/terminal.py against it: carry over what changed (the final drain, "
        "the read size, the parser calls), and if https://github.com/Textualize/textual/pull/6690 "
        "has landed (end of input ends the app), drop EndOfInputDriver. Then record the new "
        "version and digest here."
    )


class TickingParser:
    """Stands in for XTermParser: records what it is fed, and has one event for its first
    tick after the app began exiting (an ESC no sequence followed)."""

    def __init__(self, debug: bool = False) -> None:
        self.fed: list[str] = []
        self.pending = ["escape"]

    def feed(self, data: str) -> list[object]:
        self.fed.append(data)
        return []

    def tick(self) -> list[object]:
        ready, self.pending = self.pending, []
        return list(ready)


def test_input_parsed_before_the_exit_is_still_delivered(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = TickingParser()
    monkeypatch.setattr(terminal, "XTermParser", lambda debug: parser)
    read_end, write_end = os.pipe()
    driver = EndOfInputDriver.__new__(EndOfInputDriver)
    driver.fileno = read_end
    driver.exit_event = threading.Event()
    driver.exit_event.set()  # the app is exiting: no round of the main loop runs
    driver._debug = False
    received: list[object] = []
    driver.process_message = received.append  # type: ignore[method-assign]
    try:
        driver.run_input_thread()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert received == ["escape"]  # the final drain's tick delivered it
    assert parser.fed == [""]  # and the parser was flushed at the end, as Textual does


def _spawn_in_a_pty() -> tuple[subprocess.Popen[bytes], int]:
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "80", "LINES": "24"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from exo_deploy_tui.cli import main; main()",
            "--url",
            "http://127.0.0.1:9",
        ],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        env=env,
        start_new_session=True,
    )
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + START_DEADLINE_S
    while b"exo-deploy" not in seen:
        assert time.monotonic() < deadline, f"the dashboard did not start: {seen[-300:]!r}"
        try:
            seen += os.read(primary, 65536)
        except OSError:
            break
    return process, primary


def _exits(process: subprocess.Popen[bytes], primary: int | None) -> int:
    deadline = time.monotonic() + EXIT_DEADLINE_S
    while process.poll() is None:
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError("the dashboard was still running after its terminal went")
        if primary is not None:
            try:
                os.read(primary, 65536)  # keep the terminal drained while it shuts down
            except OSError:
                primary = None
        time.sleep(0.05)
    return process.returncode


@pytest.mark.e2e
def test_sighup_ends_the_dashboard() -> None:
    process, primary = _spawn_in_a_pty()
    try:
        process.send_signal(signal.SIGHUP)
        assert _exits(process, primary) == 0
    finally:
        os.close(primary)


@pytest.mark.e2e
def test_a_vanished_terminal_ends_the_dashboard() -> None:
    process, primary = _spawn_in_a_pty()
    os.close(primary)  # the SSH session is gone: reads now fail or return nothing
    assert _exits(process, None) == 0  # as if q was pressed: a clean exit, not a crash
