"""``--version`` for every command line (``exo-deploy`` and ``exo-deploy-tui``), one way.

The version is the installed package's, read from its metadata (``importlib.metadata``), so it
is the one ``pyproject.toml`` declares and pip installed, never a second copy in the code to
forget. A checkout run without installing has no metadata: it says so rather than guess.

Here, in the client floor, because the TUI may import nothing above it (docs/design.md §2.1),
beside the token options both commands share for the same reason.
"""

from __future__ import annotations

import argparse
from importlib.metadata import PackageNotFoundError, version

# The distribution's name, as pyproject.toml's [project] gives it.
PACKAGE = "exo-deploy"


def package_version() -> str:
    """The installed package's version, or why there is none."""
    try:
        return version(PACKAGE)
    except PackageNotFoundError:
        return f"unknown ({PACKAGE} is not installed)"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``PROG VERSION`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
