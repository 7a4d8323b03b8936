"""The argument types and parser every ``exo-deploy`` command line shares.

``keeper.cli`` parses most commands, but the soak parses its own (argparse cannot pass leading
``--options`` through a subcommand untouched) and sits below the CLI, so it may not import it.
Both take their parser and argument types from here, so a bad number reads the same everywhere
and every usage error exits with the same code. Nothing here knows about the cluster.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

# The usage exit code of every ``exo-deploy`` command (argparse's own is also 2).
EXIT_USAGE = 2
# The environment variable that lists webhooks beside (and before) ``--webhook URL``: several,
# separated by commas or whitespace, so a unit file or a shell profile can hold them. Here, not
# in ``keeper.runtime.webhooks`` (which reads it), because ``--webhook``'s help names it and the
# webhooks' module is too heavy to load for a parser (docs/design.md §10, "Start-up").
WEBHOOKS_ENV = "EXO_DEPLOY_WEBHOOKS"


class UsageParser(argparse.ArgumentParser):
    """argparse with the usage exit code spelled out."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def positive_int(text: str) -> int:
    value = whole_number(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text}")
    return value


def webhook_url(text: str) -> str:
    # Imported here, not above: the webhooks' module loads the alerts and the State's models,
    # which a node, parsing its flags with these types, never needs (docs/design.md §10).
    from keeper.runtime.webhooks import WebhookUrlError, check_webhook_url  # noqa: PLC0415

    try:
        return check_webhook_url(text)
    except WebhookUrlError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def webhook_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--webhook URL``, repeatable: where ``what`` POSTs its alert notices."""
    parser.add_argument(
        "--webhook",
        action="append",
        type=webhook_url,
        default=[],
        metavar="URL",
        # Each webhook is sent every notice, on its own queue (docs/design.md §6.9): the help
        # says so, lest "several" read as a list of fallbacks tried in order.
        help=f"POST {what} to URL (repeat for several: each is sent every notice; also those "
        f"in ${WEBHOOKS_ENV}, separated by commas or spaces)",
    )
