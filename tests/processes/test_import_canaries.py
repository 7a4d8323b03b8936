"""Canary for the two import-time shortcuts our processes take in httpx and httpcore
(``keeper.cli``: ``sys.modules`` entries of None, docs/design.md §10, "Start-up").

- ``httpx._main``, a private module: httpx's package imports its command line (click, rich) at
  import, and falls back to a stub ``main`` when that import fails. Upstream:
  https://github.com/encode/httpx/pull/3547 (the CLI imported in ``__main__`` instead).
- ``trio``: httpcore's ``_synchronization`` (private) imports trio wherever it is installed, and
  runs without it when the import fails. Upstream: https://github.com/encode/httpcore/issues/946
  ("ideally we ensure that we don't run `import trio` … unless we're actually running async").

Each is checked both ways in a fresh interpreter (a process of its own: the test's own process
has both loaded already): the shortcut still saves the import, and the package still works
without it. When httpx or httpcore moves (the import made lazy upstream, or the fallback gone),
a test here fails first, naming what to re-check; then update ``keeper/cli/__init__.py`` and the
bounds in pyproject.toml.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

RECHECK = (
    "{package} {version} moved what keeper/cli/__init__.py's import shortcut relies on ({what});"
    " re-check {link}, then update the shortcut and the {package} bound in pyproject.toml"
)
HTTPX_LINK = "https://github.com/encode/httpx/pull/3547"
HTTPCORE_LINK = "https://github.com/encode/httpcore/issues/946"


def _fresh(code: str) -> str:
    """What ``code`` prints in a fresh interpreter (its stderr on failure, for the message)."""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout.strip() if done.returncode == 0 else f"failed: {done.stderr.strip()}"


def test_httpx_still_imports_its_command_line_and_runs_without_it() -> None:
    message = RECHECK.format(
        package="httpx", version=version("httpx"), what="httpx._main", link=HTTPX_LINK
    )
    eager = _fresh("import sys, httpx; print('httpx._main' in sys.modules)")
    assert eager == "True", f"{message}: it no longer imports its CLI at import ({eager})"
    without = _fresh(
        "import sys; sys.modules['httpx._main'] = None\n"
        "import httpx; print(callable(httpx.main), 'click' in sys.modules)"
    )
    assert without == "True False", f"{message}: without it, {without}"


def test_httpcore_still_imports_trio_and_runs_without_it() -> None:
    message = RECHECK.format(
        package="httpcore",
        version=version("httpcore"),
        what="httpcore._synchronization's import of trio",
        link=HTTPCORE_LINK,
    )
    eager = _fresh("import sys, httpcore; print('trio' in sys.modules)")
    assert eager == "True", f"{message}: it no longer imports trio at import ({eager})"
    without = _fresh(
        "import sys; sys.modules['trio'] = None\n"
        "import anyio, httpcore, httpx\n"
        "from httpcore import _synchronization as s\n"
        "async def main():\n"
        "    lock = s.AsyncLock()\n"
        "    async with lock:\n"
        "        pass\n"
        "    return s.trio is None\n"
        "print(anyio.run(main))"
    )
    assert without == "True", f"{message}: without it, {without}"
