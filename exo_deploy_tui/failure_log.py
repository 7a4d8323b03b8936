"""Where the dashboard writes the tracebacks of its own bugs.

The screen has room for one status line, and a full-screen app has no stderr an operator can
read, so an unexpected exception in the feed is shown as "internal error: ..." and its traceback
is appended here, to be read or attached to a bug report. The file follows the XDG base
directory rule for state (``$XDG_STATE_HOME/exo-deploy/tui.log``, by default
``~/.local/state/exo-deploy/tui.log``) and is created only when there is something to write.
Writing it must never fail the dashboard: a file that cannot be written is skipped.
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

# Under the state directory, beside anything else exo-deploy keeps there.
LOG_NAME = Path("exo-deploy") / "tui.log"


def failure_log_path(env: Mapping[str, str] | None = None) -> Path:
    """``$XDG_STATE_HOME/exo-deploy/tui.log``; the XDG default when it is unset or relative
    (the specification says to ignore a relative one)."""
    state_home = (os.environ if env is None else env).get("XDG_STATE_HOME", "")
    if state_home and Path(state_home).is_absolute():
        return Path(state_home) / LOG_NAME
    return Path.home() / ".local" / "state" / LOG_NAME


def record_failure(
    exc: BaseException, what: str, path: Path | None = None, now: float | None = None
) -> Path | None:
    """Append ``exc``'s traceback under a dated heading; the file written, or None if it could
    not be."""
    target = failure_log_path() if path is None else path
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(now))
    text = f"--- {stamp}: {what}\n{''.join(traceback.format_exception(exc))}\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as log:
            log.write(text)
    except OSError:
        return None
    return target
