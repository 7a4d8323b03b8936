"""``exo-deploy webhooks test [--webhook URL ...]``: send a sample notice to each webhook now.

Straight to each URL (no master or bridge in between), so an operator sees whether the endpoint
takes our notices before an incident says so: what each answered, one line per webhook. The URLs
are those of ``EXO_DEPLOY_WEBHOOKS`` and ``--webhook``, as the services read them. Exit 0 when
every webhook answered 2xx, 1 when one answered something else, 3 when one did not answer (the
worst wins), 2 for a bad or missing URL.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

import anyio

from keeper.cli.exits import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from keeper.runtime.arguments import WEBHOOKS_ENV, webhook_option


def cmd_webhooks_test(args: argparse.Namespace) -> int:
    # Imported here: every command's parser holds this one, and the webhooks' module loads the
    # alerts, the State's models and httpx (docs/design.md §10, "Start-up").
    from keeper.runtime.outbox import endpoint_label  # noqa: PLC0415
    from keeper.runtime.webhooks import WebhookUrlError, send_test, webhook_urls  # noqa: PLC0415

    try:
        urls = webhook_urls(args.webhook)
    except WebhookUrlError as exc:
        print(f"exo-deploy webhooks test: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not urls:
        print(
            f"exo-deploy webhooks test: no webhook: give --webhook URL or set {WEBHOOKS_ENV}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    answers = anyio.run(send_test, urls, time.time())
    code = EXIT_OK
    for answer in answers:
        shown = endpoint_label(answer.url)
        if answer.status is None:
            print(f"{shown}: no answer: {answer.detail}")
            code = EXIT_UNREACHABLE
            continue
        detail = f" {answer.detail}" if answer.detail else ""
        print(f"{shown}: {answer.status}{detail}")
        if not 200 <= answer.status < 300 and code == EXIT_OK:
            code = EXIT_REFUSED
    return code


def add_webhooks_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    """``webhooks test``, made by ``command(name, help)``."""
    webhooks = command("webhooks", "alert webhooks: send a test notice to each")
    actions = webhooks.add_subparsers(dest="action", required=True, metavar="ACTION")
    test = actions.add_parser(
        "test",
        help="POST a sample notice (kind 'test') to each webhook and print what each answered",
        description="POST a sample notice (kind 'test') to each webhook and print what each "
        "answered: exit 0 all 2xx, 1 otherwise, 3 unreachable",
    )
    webhook_option(test, "the sample notice")
    test.set_defaults(handler=cmd_webhooks_test)
