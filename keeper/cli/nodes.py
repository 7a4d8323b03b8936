"""The node commands of ``exo-deploy``: ``nodes``, ``cordon``, ``uncordon`` and ``drain``.

Planned change from a shell (docs/design.md §5.15): cordon a Mac before its update, drain it
and wait until it is empty, uncordon it once it is back. Each is one request through the client
the deployments commands use, with their exit codes; ``drain --wait`` then follows ``GET
/nodes`` until the node is empty (0) or the drain is stuck (1, with the reason), so a script can
reboot the machine only when nothing of the keeper's runs there.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

from keeper.cli.deployments import (
    EXIT_CODES_HELP,
    EXIT_OK,
    call_master,
    client_options,
)
from keeper.cli.exits import EXIT_NOT_DONE
from keeper.model.api_models import CommandResponse, NodesResponse, NodeView

# How often `drain --wait` looks again: a move takes a model's load time, seconds to minutes.
WAIT_POLL_S = 1.0


def format_nodes(response: NodesResponse) -> str:
    if not response.nodes:
        return "no nodes"
    lines = ["NODE".ljust(16) + "  " + "STATE".ljust(10) + "  NOTE"]
    for node in response.nodes:
        lines.append(node.name.ljust(16) + "  " + _state(node).ljust(10) + "  " + _note(node))
    return "\n".join(line.rstrip() for line in lines)


def _state(node: NodeView) -> str:
    if node.drain is not None:
        return "draining"
    if node.cordoned:
        return "cordoned"
    return "away" if not node.node_ids else "ready"


def _note(node: NodeView) -> str:
    drain = node.drain
    if drain is None:
        return "" if node.node_ids else "not in the cluster"
    parts = [f"{len(drain.moving)} moving", f"{len(drain.to_move)} to move"]
    if drain.unmanaged:
        parts.append(f"{len(drain.unmanaged)} not the keeper's (left alone)")
    if drain.stuck:
        parts.append(f"stuck: {drain.stuck}")
    return ", ".join(parts)


def _print_command(args: argparse.Namespace, payload: object, answer: CommandResponse) -> None:
    print(json.dumps(payload, indent=2) if args.json else answer.message)


def cmd_nodes(args: argparse.Namespace) -> int:
    answer = call_master(args, lambda client: client.nodes())
    print(json.dumps(answer.payload, indent=2) if args.json else format_nodes(answer.value))
    return EXIT_OK


def cmd_cordon(args: argparse.Namespace) -> int:
    answer = call_master(args, lambda client: client.cordon(args.node))
    _print_command(args, answer.payload, answer.value)
    return EXIT_OK


def cmd_uncordon(args: argparse.Namespace) -> int:
    answer = call_master(args, lambda client: client.uncordon(args.node))
    _print_command(args, answer.payload, answer.value)
    return EXIT_OK


def cmd_drain(args: argparse.Namespace, sleep: Callable[[float], None] = time.sleep) -> int:
    answer = call_master(args, lambda client: client.drain(args.node, args.force))
    _print_command(args, answer.payload, answer.value)
    if not args.wait:
        return EXIT_OK
    while True:
        nodes = call_master(args, lambda client: client.nodes()).value
        node = next((n for n in nodes.nodes if args.node in (n.name, *n.node_ids)), None)
        if node is None or node.drain is None:
            print(f"node {args.node} is drained")
            return EXIT_OK
        if node.drain.stuck:
            print(f"node {args.node}: drain stuck: {node.drain.stuck}", file=sys.stderr)
            return EXIT_NOT_DONE
        sleep(WAIT_POLL_S)


def add_node_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """``nodes``, ``cordon``, ``uncordon`` and ``drain``, each made by ``command(name, help)``."""
    nodes = command("nodes", "list nodes with their cordons and drains", epilog=EXIT_CODES_HELP)
    client_options(nodes)
    nodes.set_defaults(handler=cmd_nodes)
    for name, help_, handler in (
        ("cordon", "no new placement on NODE; what runs there keeps running", cmd_cordon),
        ("uncordon", "let NODE be placed on again (ends its drain)", cmd_uncordon),
    ):
        parser = command(name, help_, epilog=EXIT_CODES_HELP)
        parser.add_argument("node", metavar="NODE", help="a friendly name or a node id")
        client_options(parser)
        parser.set_defaults(handler=handler)
    drain = command(
        "drain",
        "cordon NODE and move the keeper's instances off it, each replacement ready before "
        "the old instance goes",
        epilog=EXIT_CODES_HELP,
    )
    drain.add_argument("node", metavar="NODE", help="a friendly name or a node id")
    drain.add_argument(
        "--wait",
        action="store_true",
        help="return when the node is empty (exit 0) or the drain is stuck (exit 1, the reason)",
    )
    drain.add_argument(
        "--force",
        action="store_true",
        help="delete what cannot be moved, and instances the keeper did not place",
    )
    client_options(drain)
    drain.set_defaults(handler=cmd_drain)
