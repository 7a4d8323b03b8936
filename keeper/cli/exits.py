"""The exit codes every ``exo-deploy`` subcommand shares, and the error that carries one.

Apart from the client commands (``keeper.cli.deployments``), which raise it most, because the
process commands share them too and must not load the client to name them: a node started by a
cluster parses its flags and runs without the deployments client (docs/design.md §10,
"Start-up").
"""

from __future__ import annotations

from keeper.runtime.arguments import EXIT_USAGE

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_UNREACHABLE = 3
# What ``--wait`` waited for cannot happen (a deployment cannot be placed, a drain is stuck) or
# did not by ``--timeout``: 1, as a refusal, since a script's question (is it done?) has the
# same answer, no; the reason is on stderr as a refusal's is.
EXIT_NOT_DONE = 1

__all__ = [
    "EXIT_CODES_HELP",
    "EXIT_NOT_DONE",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "ClientError",
]

EXIT_CODES_HELP = """exit codes:
  0  done
  1  refused by the master (its message is printed on stderr), or, with --wait, what it
     waits for cannot happen or did not by --timeout (why, on stderr)
  2  bad usage
  3  the master could not be reached"""


class ClientError(Exception):
    """A command that ends with ``exit_code``, ``message`` said on stderr."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
