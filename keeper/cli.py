"""The ``exo-deploy`` command (stub; subcommands arrive with the master)."""

import sys


def main() -> None:
    print("exo-deploy: not yet available", file=sys.stderr)
    sys.exit(2)
