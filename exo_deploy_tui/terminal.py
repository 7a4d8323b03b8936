"""Leaving cleanly when the terminal goes away: end of input and hang-up.

Over SSH the terminal can vanish under the dashboard. Two ways must both end it, promptly and
without a process left behind spinning a core:

- SIGHUP (the SSH session closed) and SIGTERM: the app exits as if the operator pressed q.
- End of input (stdin closed or hung up): Textual's Linux input thread reads zero bytes,
  ignores them and selects again, forever, at 100% CPU. ``EndOfInputDriver`` is that input
  loop with one change: zero bytes (or EIO, a hung-up terminal) mean the terminal is gone, so
  it asks the app to exit and stops reading. It is a workaround until Textual's own fix lands
  (https://github.com/Textualize/textual/pull/6690); then it goes.

The copy keeps the rest of Textual's loop, its final drain included: once the app exits, one
last round with a final decode and a tick, so input already parsed (a lone ESC waiting to see
whether a sequence follows) is still delivered. tests/processes/test_tui_terminal.py holds a
canary that fails when Textual's ``LinuxDriver.run_input_thread`` changes, so the copy is
re-checked.
"""

from __future__ import annotations

import asyncio
import os
import selectors
import signal
from codecs import getincrementaldecoder
from collections.abc import Callable
from typing import Any

from textual._parser import ParseError
from textual._xterm_parser import XTermParser
from textual.app import App
from textual.drivers.linux_driver import LinuxDriver

# How long the input thread waits for a key before checking whether the app is exiting; the
# value Textual itself uses.
_SELECT_TIMEOUT_S = 0.1


class EndOfInputDriver(LinuxDriver):
    def run_input_thread(self) -> None:
        selector = selectors.SelectSelector()
        selector.register(self.fileno, selectors.EVENT_READ)
        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")().decode
        try:
            while not self.exit_event.is_set():
                if not self._read_round(selector, parser, decode):
                    self._end_of_input()
                    return
            # Textual's final drain: stop watching the terminal, then one last round.
            selector.unregister(self.fileno)
            self._read_round(selector, parser, decode, final=True)
        finally:
            selector.close()
            try:
                for _ in parser.feed(""):
                    pass
            except (EOFError, ParseError):
                pass

    def _read_round(
        self,
        selector: selectors.BaseSelector,
        parser: XTermParser,
        decode: Callable[..., str],
        final: bool = False,
    ) -> bool:
        """One round of Textual's loop: read what is ready, feed it to the parser, then tick
        (which sends an ESC no sequence followed). False at end of input (nothing is fed)."""
        for _key, mask in selector.select(_SELECT_TIMEOUT_S):
            if mask & selectors.EVENT_READ:
                try:
                    data = os.read(self.fileno, 4096)
                except OSError:  # EIO: the terminal hung up
                    data = b""
                if not data:
                    return False
                for event in parser.feed(decode(data, final=final)):
                    self.process_message(event)
        for event in parser.tick():
            self.process_message(event)
        return True

    def _end_of_input(self) -> None:
        # Not call_from_thread: the app may already be stopping and waiting for this thread.
        self._loop.call_soon_threadsafe(self._app.exit)


def exit_on_hangup(app: App[Any]) -> None:
    """From the app's loop: SIGHUP and SIGTERM end the app the way q does."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGHUP, signal.SIGTERM):
        loop.add_signal_handler(sig, app.exit)
