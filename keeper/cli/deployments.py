"""The deployments commands of ``exo-deploy``: ``list``, ``deploy``, ``scale``, ``set``,
``repair``, ``undeploy`` and ``history``.

``scale ID N`` is the one setting an operator changes most, so it keeps its short form; ``set ID``
changes any of a deployment's settings in place (``--replicas``, ``--standby``, ``--priority``,
``--preempt``/``--no-preempt``, and the placement options ``--sharding``, ``--instance-meta``,
``--min-nodes``: a rolling change, each instance replaced make-before-break; ``--repair
auto|report``) in one ``PATCH /deployments/{id}``. ``repair ID`` has the keeper replace one
instance now, whatever its deployment's ``repair`` and whoever placed it. ``deploy``, ``set`` and
``scale`` take ``--wait [--timeout S]``: return once the deployment serves (``keeper.cli.waiting``).

They are the part of the CLI that talks to a running master (or bridge) rather than starting a
process: each is one request through the deployments client the TUI uses too
(``keeper.client.deployments``), and its exit code is a contract for scripts: 0 done, 1 refused by
the master (its message on stderr), 2 bad usage, 3 master unreachable (``keeper.cli.exits``,
re-exported here for the client commands); ``keeper.cli`` builds the rest of the parser and
dispatches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from pydantic import BaseModel

from keeper.cli.exits import (
    EXIT_CODES_HELP,
    EXIT_NOT_DONE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ClientError,
)
from keeper.cli.waiting import Outcome, add_wait_options, say_on_stderr, wait_until_serving
from keeper.client.deployments import Answer, ApiError, DeploymentsClient, FailureKind, master_http
from keeper.client.token_options import add_token_options
from keeper.model.api_models import (
    DEFAULT_HISTORY_HOURS,
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentHistoryResponse,
    DeploymentsResponse,
    DeploymentView,
)
from keeper.model.incident_chats import chats_words
from keeper.model.notices import phases_words
from keeper.model.state import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    REPAIR_MODES,
    InstanceMeta,
    Sharding,
)
from keeper.runtime.arguments import positive_int, whole_number

DEFAULT_URL = "http://127.0.0.1:52415"
URL_ENV = "EXO_DEPLOY_URL"
# A deployments call is one small request to a master on the LAN; longer means it is not there.
CLIENT_TIMEOUT_S = 10.0

# How each way a deployments request fails (keeper.client.deployments) ends the command.
EXIT_FOR_FAILURE: dict[FailureKind, int] = {
    "usage": EXIT_USAGE,
    "unreachable": EXIT_UNREACHABLE,
    "refused": EXIT_REFUSED,
}

Parsed = TypeVar("Parsed", bound=BaseModel)
Result = TypeVar("Result")


def call_master(
    args: argparse.Namespace, call: Callable[[DeploymentsClient], Awaitable[Result]]
) -> Result:
    """Deployments requests (one, or ``--wait``'s) to the master ``args`` name; ClientError
    with its exit code if one fails."""

    async def run() -> Result:
        async with master_http(args.url, args.token, CLIENT_TIMEOUT_S) as http:
            return await call(DeploymentsClient(http, CLIENT_TIMEOUT_S))

    try:
        return anyio.run(run)
    except ApiError as exc:
        raise ClientError(exc.message, EXIT_FOR_FAILURE[exc.kind]) from None


def answer_line(response: CommandResponse) -> str:
    """A command's answer in one line: its message, then the deployment it names (a repair
    names the instance in its message, and no deployment)."""
    if response.deployment_id is None:
        return response.message
    return f"{response.message}: {response.deployment_id}"


def _print_answer(args: argparse.Namespace, answer: Answer[CommandResponse]) -> None:
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(answer_line(answer.value))


def _timeout_without_wait(args: argparse.Namespace, command: str) -> bool:
    """Whether ``--timeout`` was given without ``--wait`` (said on stderr): before any request,
    so a mistyped wait changes nothing."""
    if args.timeout is None or args.wait:
        return False
    print(f"exo-deploy {command}: --timeout needs --wait", file=sys.stderr)
    return True


def _wait(args: argparse.Namespace, deployment_id: str | None) -> int:
    """With ``--wait``, follow the deployment until it serves, cannot, or ``--timeout`` passes
    (``keeper.cli.waiting``); its exit code. The result goes to stdout when it serves (unless
    ``--json``, whose stdout is the answer alone), to stderr otherwise."""
    if not args.wait:
        return EXIT_OK
    if deployment_id is None:
        print("the master's answer names no deployment to wait for", file=sys.stderr)
        return EXIT_NOT_DONE

    async def wait(client: DeploymentsClient) -> Outcome:
        async def read() -> DeploymentsResponse:
            return (await client.list()).value

        return await wait_until_serving(deployment_id, read, _note, args.timeout, say_on_stderr)

    outcome = call_master(args, wait)
    if outcome.code != EXIT_OK:
        print(outcome.words, file=sys.stderr)
    elif not args.json:
        print(outcome.words)
    return EXIT_NOT_DONE if outcome.code is None else outcome.code


def _note(view: DeploymentView) -> str:
    error = view.deployment.placement_error
    if view.detail:  # e.g. the bridge: "exo unreachable since ..."
        return f"{view.detail}; {error}" if error else view.detail
    if error:
        return error
    update = view.updating
    if update is not None:
        note = f": {update.note}" if update.note else ""
        return f"updating {update.replaced}/{update.replicas}{note}"
    if view.waiting is not None and view.next_attempt_in_s is not None:
        return f"{view.waiting}: next attempt in {view.next_attempt_in_s:.0f} s"
    if view.waiting is not None:
        return view.waiting
    return ""


def _table(rows: list[tuple[str, ...]]) -> str:
    """Rows as aligned columns, two spaces apart; the last column (free text) is not padded."""
    columns = len(rows[0]) - 1
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:columns], widths, strict=True))
        + "  "
        + row[columns]
        for row in rows
    ).rstrip()


def format_deployments(response: DeploymentsResponse) -> str:
    if not response.deployments:
        return "no deployments"
    # READY: how many of the deployment's replicas can serve now, of how many it keeps.
    # PRIORITY: placed before lower ones; "preempts": may delete their instances to be placed.
    rows = [("DEPLOYMENT", "MODEL", "STATUS", "READY", "INSTANCE", "PRIORITY", "NOTE")]
    for view in response.deployments:
        deployment = view.deployment
        preempts = " preempts" if deployment.preempt else ""
        rows.append(
            (
                deployment.deployment_id,
                deployment.model_card.model_id,
                f"{view.status}, at risk" if view.at_risk else view.status,
                f"{view.ready_replicas}/{view.replicas}",
                (deployment.instance_id or "-")[:8],
                f"{deployment.priority}{preempts}",
                _note(view),
            )
        )
    return _table(rows)


def cmd_list(args: argparse.Namespace) -> int:
    answer = call_master(args, lambda client: client.list())
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(format_deployments(answer.value))
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    # Not validated here: the master judges the request, and its refusal is the message (a
    # min_nodes over the API's bound is the master's 422, exit 1, as any other refusal).
    if _timeout_without_wait(args, "deploy"):
        return EXIT_USAGE
    request = CreateDeploymentRequest.model_construct(
        model_id=args.model,
        sharding=Sharding(args.sharding),
        instance_meta=InstanceMeta(args.instance_meta),
        min_nodes=args.min_nodes,
        replicas=args.replicas,
        standby=args.standby,
        priority=args.priority,
        preempt=args.preempt,
        repair=args.repair,
    )
    answer = call_master(args, lambda client: client.create(request))
    _print_answer(args, answer)
    return _wait(args, answer.value.deployment_id)


# The settings ``set`` changes, by option, in the order the request names them.
SETTINGS = (
    "replicas",
    "standby",
    "priority",
    "preempt",
    "sharding",
    "instance_meta",
    "min_nodes",
    "repair",
)


def cmd_set(args: argparse.Namespace) -> int:
    # The master judges each value (its bounds, its type): outside them is its refusal, exit 1.
    settings: dict[str, int | bool | str] = {
        name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None
    }
    if not settings:
        print(
            "exo-deploy set: give one at least of --replicas, --standby, --priority, "
            "--preempt/--no-preempt, --sharding, --instance-meta, --min-nodes and --repair",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if _timeout_without_wait(args, "set"):
        return EXIT_USAGE
    _print_answer(
        args, call_master(args, lambda client: client.update(args.deployment_id, settings))
    )
    return _wait(args, args.deployment_id)


def cmd_scale(args: argparse.Namespace) -> int:
    # As with deploy, the master judges the count (1 to 16): over it is its refusal, exit 1.
    if _timeout_without_wait(args, "scale"):
        return EXIT_USAGE
    answer = call_master(args, lambda client: client.scale(args.deployment_id, args.replicas))
    _print_answer(args, answer)
    return _wait(args, args.deployment_id)


def cmd_repair(args: argparse.Namespace) -> int:
    _print_answer(args, call_master(args, lambda client: client.repair(args.instance_id)))
    return EXIT_OK


def _repair_option(parser: argparse.ArgumentParser, *, default: str | None) -> None:
    """``--repair auto|report`` (docs/design.md §5.19)."""
    shown = f" (default {default})" if default is not None else ""
    parser.add_argument(
        "--repair",
        choices=list(REPAIR_MODES),
        default=default,
        help=f"auto: replace a broken instance of its own; report: only say it{shown}",
    )


def cmd_undeploy(args: argparse.Namespace) -> int:
    _print_answer(args, call_master(args, lambda client: client.delete(args.deployment_id)))
    return EXIT_OK


def format_history(history: DeploymentHistoryResponse) -> str:
    """A deployment's history as an operator reads it: one line of figures, then the incidents,
    newest first, with their cause."""
    hours = f"{history.window_hours:g} h"
    if history.availability is None:
        return f"{history.deployment_id}: has not served in the last {hours}"
    mttr = f", MTTR {history.mttr_s:.1f} s" if history.mttr_s is not None else ""
    lines = [
        f"{history.deployment_id}: last {hours}, available {history.availability:.2%}, "
        f"{len(history.incidents)} incident(s){mttr}"
    ]
    if history.complete_from is not None:
        lines.append(f"(known from {history.complete_from} only)")
    if history.incidents:
        # RECOVERY: where an ended incident's down time went (docs/design.md 3.5), "-" for one
        # under way or with no recovery to tell (a start-up placement explained). CHATS: the
        # chats through the front door that met it (docs/design.md §3.5), "-" when unknown.
        rows = [("START", "END", "DOWN", "RECOVERY", "CHATS", "CAUSE")]
        for incident in reversed(history.incidents):
            phases = incident.phases
            rows.append(
                (
                    incident.start,
                    incident.end or "ongoing",
                    f"{incident.downtime_s:.1f} s",
                    phases_words(phases) if phases is not None else "-",
                    chats_words(incident.chats),
                    incident.cause,
                )
            )
        lines.append(_table(rows))
    return "\n".join(lines)


def cmd_history(args: argparse.Namespace) -> int:
    # The master judges the hours (0 < H <= 720): outside them is its refusal, exit 1.
    answer = call_master(args, lambda client: client.history(args.deployment_id, args.hours))
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(format_history(answer.value))
    return EXIT_OK


def token_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--token-file`` or ``--token``, from $EXO_DEPLOY_TOKEN unless given: the one variable
    every command reads (``keeper.client.token_options``)."""
    add_token_options(parser, what)


def client_options(parser: argparse.ArgumentParser, *, json_option: bool = True) -> None:
    """``--url`` and the token options, and ``--json`` for a command that prints an answer."""
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the master's API (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    if json_option:
        parser.add_argument("--json", action="store_true", help="print the master's JSON answer")
    token_option(parser, "bearer token for a master that requires one")


def _priority_options(parser: argparse.ArgumentParser, *, default: int | None) -> None:
    """``--priority N`` and ``--preempt``/``--no-preempt`` (docs/design.md §5.13); unset, each
    is ``default`` (deploy: the API's default; set: left as it is)."""
    shown = f", default {default}" if default is not None else ""
    parser.add_argument(
        "--priority",
        type=whole_number,
        default=default,
        help=f"placed before lower priorities ({MIN_PRIORITY}-{MAX_PRIORITY}{shown})",
    )
    flag = parser.add_mutually_exclusive_group()
    flag.add_argument(
        "--preempt",
        dest="preempt",
        action="store_const",
        const=True,
        default=False if default is not None else None,
        help="when it cannot be placed, delete instances of lower priorities to make room",
    )
    flag.add_argument(
        "--no-preempt",
        dest="preempt",
        action="store_const",
        const=False,
        help="never delete another deployment's instances (the default)",
    )


def add_deployments_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """``list``, ``deploy``, ``scale``, ``set``, ``undeploy`` and ``history``, each made by
    ``command(name, help)``."""
    list_ = command("list", "list deployments with their status", epilog=EXIT_CODES_HELP)
    client_options(list_)
    list_.set_defaults(handler=cmd_list)

    deploy = command("deploy", "create a deployment of MODEL", epilog=EXIT_CODES_HELP)
    deploy.add_argument("model", metavar="MODEL", help="a model id from GET /models")
    deploy.add_argument(
        "--min-nodes", type=positive_int, default=1, help="place on at least N nodes (default 1)"
    )
    deploy.add_argument(
        "--sharding",
        choices=[s.value for s in Sharding],
        default=Sharding.PIPELINE.value,
        help="default Pipeline",
    )
    deploy.add_argument(
        "--instance-meta",
        choices=[m.value for m in InstanceMeta],
        default=InstanceMeta.MLX_RING.value,
        help="default MlxRing",
    )
    deploy.add_argument(
        "--replicas",
        type=positive_int,
        default=1,
        help="keep N instances of the model, each on nodes apart (1-16, default 1)",
    )
    deploy.add_argument(
        "--standby",
        type=int,
        default=1,
        help="keep the model downloaded on N more node sets, where it would fail over to "
        "(0-4, default 1)",
    )
    _priority_options(deploy, default=DEFAULT_PRIORITY)
    _repair_option(deploy, default="auto")
    add_wait_options(deploy)
    client_options(deploy)
    deploy.set_defaults(handler=cmd_deploy)

    scale = command(
        "scale", "keep N instances of deployment ID's model (1-16)", epilog=EXIT_CODES_HELP
    )
    scale.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    scale.add_argument(
        "replicas", metavar="N", type=positive_int, help="how many instances to keep, apart"
    )
    add_wait_options(scale)
    client_options(scale)
    scale.set_defaults(handler=cmd_scale)

    set_ = command(
        "set",
        "change deployment ID's replicas, standby, priority, preemption or placement options",
        epilog=EXIT_CODES_HELP,
    )
    set_.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    set_.add_argument(
        "--replicas", type=whole_number, help="keep N instances of the model, apart (1-16)"
    )
    set_.add_argument(
        "--standby", type=whole_number, help="keep the model on N more node sets (0-4)"
    )
    _priority_options(set_, default=None)
    set_.add_argument(
        "--sharding",
        choices=[s.value for s in Sharding],
        help="a rolling change: each instance replaced, one at a time, make-before-break",
    )
    set_.add_argument(
        "--instance-meta", choices=[m.value for m in InstanceMeta], help="a rolling change too"
    )
    set_.add_argument("--min-nodes", type=whole_number, help="a rolling change too (at least 1)")
    _repair_option(set_, default=None)
    add_wait_options(set_)
    client_options(set_)
    set_.set_defaults(handler=cmd_set)

    repair = command(
        "repair",
        "replace instance ID now, then delete it once its replacement is ready",
        epilog=EXIT_CODES_HELP,
    )
    repair.add_argument("instance_id", metavar="ID", help="an instance id from GET /state")
    client_options(repair)
    repair.set_defaults(handler=cmd_repair)

    undeploy = command("undeploy", "delete the deployment ID", epilog=EXIT_CODES_HELP)
    undeploy.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    client_options(undeploy)
    undeploy.set_defaults(handler=cmd_undeploy)

    history = command(
        "history",
        "availability and incidents of deployment ID, with their causes",
        epilog=EXIT_CODES_HELP,
    )
    history.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    history.add_argument(
        "--hours",
        type=float,
        default=DEFAULT_HISTORY_HOURS,
        help=f"how far back (at most 720; default {DEFAULT_HISTORY_HOURS:g})",
    )
    client_options(history)
    history.set_defaults(handler=cmd_history)
