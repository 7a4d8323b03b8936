"""``exo-deploy whatif NODE[,NODE...]``: what losing those nodes now would do (design §5.14).

One request (``GET /whatif``, ``keeper.client.whatif``) to a master or a bridge, and its answer
as an operator reads it before rebooting a machine: per deployment, its model, what happens to
it (in the words ``keeper.model.whatif_words`` makes for the TUI too) and how many of its
replicas are left (LEFT), then where its lost instances would go, each on its own line with
when it would serve again (``serving again in ~4 s (suspect 3 s, load ~1 s at an assumed
2 GB/s)``), or why they cannot, each line within 80 columns. ``--json`` prints the answer as
the service sent it. The exit codes are every deployments command's
(``keeper.cli.deployments``): an unknown node is the service's refusal, exit 1.
"""

from __future__ import annotations

import argparse
import json
import textwrap
from collections.abc import Callable

from keeper.cli.deployments import EXIT_CODES_HELP, EXIT_OK, call_master, client_options
from keeper.client.whatif import what_if
from keeper.core.whatif import node_list
from keeper.model.api_models import WhatIfDeployment, WhatIfResponse, WhatIfThresholds
from keeper.model.whatif_words import (
    VERDICT_LABELS,
    node_names,
    placement_words,
    places_words,
    verdict,
)

# The terminal an operator may read this on over SSH: every line fits it.
WIDTH = 80
# The model column: the longest model ids run past 40 characters, cut there to leave room.
MODEL_COLUMN = 40
INDENT = "  "


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _wrapped(label: str, text: str) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=f"{INDENT}{label} ",
        subsequent_indent=INDENT * 2,
        break_on_hyphens=False,
    )


def _details(deployment: WhatIfDeployment, thresholds: WhatIfThresholds | None) -> list[str]:
    lines: list[str] = []
    if deployment.lost:
        lines += _wrapped("was on:", ", ".join(node_names(i.nodes) for i in deployment.lost))
    if thresholds is None and deployment.placed:  # an older service: where, all on one line
        lines += _wrapped("goes to:", places_words(deployment.placed))
    for placement in deployment.placed if thresholds is not None else ():
        lines += _wrapped("goes to:", placement_words(placement, thresholds))
    if deployment.reason is not None:
        lines += _wrapped("why:", deployment.reason)
    return lines


def format_whatif(answer: WhatIfResponse) -> str:
    """The answer as a table of deployments, each followed by where it goes or why not."""
    lost = ", ".join(node.name for node in answer.nodes)
    header = f"If {lost} went now:"
    if not answer.deployments:
        return "\n".join([*textwrap.wrap(header, WIDTH), "no deployments: nothing to move"])
    models = [_cut(d.model_id, MODEL_COLUMN) for d in answer.deployments]
    width = max(len("MODEL"), *(len(model) for model in models))
    # As wide as the longest words any answer may hold, so the table keeps its shape.
    outcome_width = max(len(label) for label in VERDICT_LABELS.values())

    def row(model: str, outcome: str, left: str) -> str:
        return f"{model.ljust(width)}  {outcome.ljust(outcome_width)}  {left}".rstrip()

    lines = [*textwrap.wrap(header, WIDTH), row("MODEL", "OUTCOME", "LEFT")]
    for model, deployment in zip(models, answer.deployments, strict=True):
        left = f"{deployment.after} of {deployment.replicas}"
        lines.append(row(model, VERDICT_LABELS[verdict(deployment)], left))
        lines += _details(deployment, answer.thresholds)
    return "\n".join(lines)


def _nodes(text: str) -> list[str]:
    nodes = node_list(text)
    if not nodes:
        raise argparse.ArgumentTypeError("name at least one node (its friendly name or its id)")
    return nodes


def cmd_whatif(args: argparse.Namespace) -> int:
    nodes: list[str] = args.nodes
    answer = call_master(args, lambda client: what_if(client, nodes))
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(format_whatif(answer.value))
    return EXIT_OK


def add_whatif_command(command: Callable[..., argparse.ArgumentParser]) -> None:
    """``whatif``, made by ``command(name, help)``."""
    whatif = command(
        "whatif",
        "what each deployment would do if NODE[,NODE...] went now (changes nothing)",
        epilog=EXIT_CODES_HELP,
    )
    whatif.add_argument(
        "nodes",
        metavar="NODE[,NODE...]",
        type=_nodes,
        help="the nodes to suppose lost: each a friendly name or a node id, comma-separated",
    )
    client_options(whatif)
    whatif.set_defaults(handler=cmd_whatif)
