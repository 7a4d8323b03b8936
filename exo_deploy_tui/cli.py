"""``exo-deploy-tui``: the operator dashboard's command line.

    exo-deploy-tui [--url URL] [--token-file PATH | --token T] [--demo] [--readonly] [--no-mouse]
    exo-deploy-tui --version

Bad arguments get one clear line and exit status 2, never a traceback. ``--demo`` starts an
embedded cluster (``keeper.sim.cluster.demo``) in this process and connects to it over HTTP, as to
any
master. On a terminal with 16 colours or fewer (TERM=screen, TERM=xterm) the dashboard uses the
terminal's own ANSI palette; NO_COLOR turns colour off altogether (Textual honours it).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from urllib.parse import urlparse

from rich.console import Console

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import DEFAULT_URL, MasterClient
from exo_deploy_tui.view.faults import FaultInjector
from keeper.client.token_options import add_token_options
from keeper.client.version_option import add_version_option


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="exo-deploy-tui",
        description="Watch and manage the deployments of an exo cluster.",
    )
    parser.add_argument(
        "--url", default=None, help=f"the master's HTTP address (default {DEFAULT_URL})"
    )
    add_token_options(parser, "bearer token for create and delete")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="start an embedded simulated cluster (master, keeper, 3 nodes) and watch it",
    )
    parser.add_argument("--readonly", action="store_true", help="hide and refuse create and delete")
    parser.add_argument("--no-mouse", action="store_true", help="do not capture the mouse")
    add_version_option(parser)
    return parser


def check_url(url: str) -> str | None:
    """None if ``url`` is a usable master address, else what is wrong with it."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https"):
        return f"--url must start with http:// or https:// (got {url!r})"
    if not parsed.hostname:
        return f"--url has no host (got {url!r})"
    try:
        _ = parsed.port
    except ValueError:
        return f"--url has a bad port (got {url!r})"
    return None


def few_colors() -> bool:
    """True on terminals of 16 colours or fewer, judged as Rich judges them (TERM, COLORTERM)."""
    return Console(file=sys.__stdout__).color_system in ("standard", "windows")


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.demo and args.url is not None:
        parser.error("--demo starts its own master; leave out --url")
    url = args.url or DEFAULT_URL
    problem = check_url(url)
    if problem:
        parser.error(problem)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        print("exo-deploy-tui: needs a terminal (stdin and stdout must be a TTY)", file=sys.stderr)
        sys.exit(2)

    cluster = None
    if args.demo:
        # Imported only for --demo: it brings the whole master and its web server along.
        from keeper.sim.cluster.demo import EmbeddedCluster  # noqa: PLC0415

        print("exo-deploy-tui: starting the demo cluster…", file=sys.stderr)
        cluster = EmbeddedCluster()
        try:
            url = cluster.start()
        except Exception as exc:
            print(f"exo-deploy-tui: the demo cluster did not start: {exc}", file=sys.stderr)
            sys.exit(1)
    try:
        run(url, args.token, readonly=args.readonly, mouse=not args.no_mouse, faults=cluster)
    finally:
        if cluster is not None:
            cluster.stop()


def run(
    url: str,
    token: str | None,
    *,
    readonly: bool,
    mouse: bool,
    faults: FaultInjector | None,
) -> None:
    client = MasterClient(url, token)
    app = DashboardApp(client, readonly=readonly, faults=faults, ansi_colors=few_colors())
    app.run(mouse=mouse)
