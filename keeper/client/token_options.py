"""Where a command line takes its bearer token from: ``--token-file PATH``, ``$EXO_DEPLOY_TOKEN``
or ``--token TOKEN``, the same for every command that takes one (the master, the bridge, a node,
the deployments commands and the TUI).

A token on the command line is in the process's arguments, which any user of the machine reads
with ``ps``; a file only its owner can read, or the environment (readable by the process's user
and root only), keep it out of sight, so the help says so and the docs use those. ``--token``
still works. A token file holds the token on one line (a trailing newline is fine); one that
cannot be read, is empty or is not a token is a usage error (exit 2) naming the file, at parse
time, before anything starts.

Here, in the client floor, because the TUI may import nothing above it (docs/design.md §2.1);
``keeper.cli`` gives the same options to the services it starts.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from keeper.model.constants import TOKEN_ENV

# A token is a line of a few dozen characters. A file much larger is not a token file (another
# path given by mistake), and is not read whole.
MAX_TOKEN_FILE_BYTES = 4096


class TokenFileError(Exception):
    """The token file cannot give a token; the message names the file and why."""


def read_token_file(path: str | Path) -> str:
    """The token in the file at ``path``: its content without surrounding whitespace."""
    try:
        with Path(path).open("rb") as file:
            content = file.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise TokenFileError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    if len(content) > MAX_TOKEN_FILE_BYTES:
        raise TokenFileError(
            f"the token file {path} is larger than {MAX_TOKEN_FILE_BYTES} bytes: not a token"
        )
    try:
        token = content.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise TokenFileError(f"the token file {path} is not text") from None
    if not token:
        raise TokenFileError(f"the token file {path} is empty")
    if any(character.isspace() for character in token):
        raise TokenFileError(
            f"the token file {path} holds more than one word; a token is one line without spaces"
        )
    return token


def _token_file(text: str) -> str:
    try:
        return read_token_file(text)
    except TokenFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_token_options(parser: argparse.ArgumentParser, what: str) -> None:
    """``--token-file PATH`` and ``--token TOKEN``, one or the other, both into ``args.token``;
    $EXO_DEPLOY_TOKEN when neither is given, else None. ``what`` says what the token is for."""
    choice = parser.add_mutually_exclusive_group()
    choice.add_argument(
        "--token-file",
        dest="token",
        type=_token_file,
        default=argparse.SUPPRESS,
        metavar="PATH",
        help=f"{what}, read from the file PATH (one line); default: ${TOKEN_ENV}",
    )
    choice.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV) or None,
        metavar="TOKEN",
        help=f"the same, given here: other users of this machine see it in ps, so prefer "
        f"--token-file or ${TOKEN_ENV}",
    )
