"""The ``exo-deploy-tui`` command (stub)."""

import sys


def main() -> None:
    print("exo-deploy-tui: not yet available", file=sys.stderr)
    sys.exit(2)
