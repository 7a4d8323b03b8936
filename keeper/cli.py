"""The ``exo-deploy`` command: run a master, a simulated node or a local cluster, and drive the
deployments API from a shell.

Each subcommand parses its arguments here and hands over to the module that does the work
(``keeper.master.server``, ``keeper.node.*``); ``list``, ``deploy``, ``scale`` and ``undeploy``
go through the deployments client the TUI uses too (``keeper.api_client``). Their exit codes are a
contract for scripts: 0 done, 1 refused by the master (its message on stderr), 2 bad usage,
3 master unreachable.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import anyio
from pydantic import BaseModel

from keeper.api_client import Answer, ApiError, DeploymentsClient, FailureKind, master_http
from keeper.api_models import (
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentsResponse,
    DeploymentView,
)
from keeper.arguments import UsageParser, positive_float, positive_int
from keeper.bridge.server import check_exo_urls, run_bridge
from keeper.cluster.local import exit_with_parent, run_cluster
from keeper.httpapi.serving import MasterStartError
from keeper.master.server import run_master
from keeper.node.node_process import run_node_process
from keeper.node.sim_node import NodeConfig
from keeper.state import Backend, InstanceMeta, Sharding

DEFAULT_URL = "http://127.0.0.1:52415"
URL_ENV = "EXO_DEPLOY_URL"
TOKEN_ENV = "EXO_DEPLOY_TOKEN"  # the same variable the master reads
# A deployments call is one small request to a master on the LAN; longer means it is not there.
CLIENT_TIMEOUT_S = 10.0

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

EXIT_CODES_HELP = """exit codes:
  0  done
  1  refused by the master (its message is printed on stderr)
  2  bad usage
  3  the master could not be reached"""


class ClientError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


# --- the deployments commands ---------------------------------------------------------------

# How each way a deployments request fails (keeper.api_client) ends the command.
EXIT_FOR_FAILURE: dict[FailureKind, int] = {
    "usage": EXIT_USAGE,
    "unreachable": EXIT_UNREACHABLE,
    "refused": EXIT_REFUSED,
}

Parsed = TypeVar("Parsed", bound=BaseModel)


def _call(
    args: argparse.Namespace, call: Callable[[DeploymentsClient], Awaitable[Answer[Parsed]]]
) -> Answer[Parsed]:
    """One deployments request to the master ``args`` name; ClientError with its exit code if
    it fails."""

    async def run() -> Answer[Parsed]:
        async with master_http(args.url, args.token, CLIENT_TIMEOUT_S) as http:
            return await call(DeploymentsClient(http, CLIENT_TIMEOUT_S))

    try:
        return anyio.run(run)
    except ApiError as exc:
        raise ClientError(exc.message, EXIT_FOR_FAILURE[exc.kind]) from None


def _print_answer(args: argparse.Namespace, answer: Answer[CommandResponse]) -> None:
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(f"{answer.value.message}: {answer.value.deployment_id}")


def _note(view: DeploymentView) -> str:
    error = view.deployment.placement_error
    if view.detail:  # e.g. the bridge: "exo unreachable since ..."
        return f"{view.detail}; {error}" if error else view.detail
    if error:
        return error
    if view.waiting is not None and view.next_attempt_in_s is not None:
        return f"{view.waiting}: next attempt in {view.next_attempt_in_s:.0f} s"
    if view.waiting is not None:
        return view.waiting
    return ""


def format_deployments(response: DeploymentsResponse) -> str:
    if not response.deployments:
        return "no deployments"
    # READY: how many of the deployment's replicas can serve now, of how many it keeps.
    rows = [("DEPLOYMENT", "MODEL", "STATUS", "READY", "INSTANCE", "NOTE")]
    for view in response.deployments:
        deployment = view.deployment
        rows.append(
            (
                deployment.deployment_id,
                deployment.model_card.model_id,
                view.status,
                f"{view.ready_replicas}/{view.replicas}",
                (deployment.instance_id or "-")[:8],
                _note(view),
            )
        )
    columns = len(rows[0]) - 1  # the note, last, is not padded
    widths = [max(len(row[i]) for row in rows) for i in range(columns)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:columns], widths, strict=True))
        + "  "
        + row[columns]
        for row in rows
    ).rstrip()


def cmd_list(args: argparse.Namespace) -> int:
    answer = _call(args, lambda client: client.list())
    if args.json:
        print(json.dumps(answer.payload, indent=2))
    else:
        print(format_deployments(answer.value))
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    # Not validated here: the master judges the request, and its refusal is the message (a
    # min_nodes over the API's bound is the master's 422, exit 1, as any other refusal).
    request = CreateDeploymentRequest.model_construct(
        model_id=args.model,
        sharding=Sharding(args.sharding),
        instance_meta=InstanceMeta(args.instance_meta),
        min_nodes=args.min_nodes,
        replicas=args.replicas,
    )
    _print_answer(args, _call(args, lambda client: client.create(request)))
    return EXIT_OK


def cmd_scale(args: argparse.Namespace) -> int:
    # As with deploy, the master judges the count (1 to 16): over it is its refusal, exit 1.
    answer = _call(args, lambda client: client.scale(args.deployment_id, args.replicas))
    _print_answer(args, answer)
    return EXIT_OK


def cmd_undeploy(args: argparse.Namespace) -> int:
    _print_answer(args, _call(args, lambda client: client.delete(args.deployment_id)))
    return EXIT_OK


# --- processes ------------------------------------------------------------------------------


def cmd_master(args: argparse.Namespace) -> int:
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    return run_master(
        args.host,
        args.port,
        args.data_dir,
        args.token,
        args.model_cards,
        node_timeout_s=args.node_timeout,
        sweep_interval_s=args.sweep_interval,
        exo_compat=args.exo_compat,
    )


def cmd_log(args: argparse.Namespace) -> int:
    from keeper.runtime import log_repair  # noqa: PLC0415 (only this command needs it)

    report = (
        log_repair.check(args.data_dir)
        if args.action == "check"
        else log_repair.repair(args.data_dir)
    )
    for line in report.lines:
        print(line, file=sys.stdout if report.ok else sys.stderr)
    return report.exit_code


def cmd_node(args: argparse.Namespace) -> int:
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    config = NodeConfig(
        name=args.name,
        memory_gb=args.memory_gb,
        backends=tuple(args.backends),
        load_gb_per_s=args.load_gbps,
    )
    return run_node_process(config, args.master, args.token)


def cmd_cluster(args: argparse.Namespace) -> int:
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="exo-deploy-cluster-"))
    return run_cluster(
        args.nodes,
        args.port,
        data_dir.resolve(),
        node_timeout_s=args.node_timeout,
        sweep_interval_s=args.sweep_interval,
        node_restart_s=None if args.no_node_restart else args.node_restart_delay,
        exo_compat=args.exo_compat,
    )


def cmd_bridge(args: argparse.Namespace) -> int:
    return run_bridge(args.exo, args.host, args.port, args.data_dir, args.token, args.model_cards)


def cmd_soak(args: argparse.Namespace) -> int:
    # Never reached: main() hands `soak` and `soak-sim` their own arguments before parsing
    # (argparse cannot pass leading --options through untouched); the parser entry only lists
    # them in --help.
    raise AssertionError(f"{args.command} is dispatched before parsing")


# --- argument parsing -----------------------------------------------------------------------


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a port number (1-65535): {text}")
    return value


def _backends(text: str) -> list[Backend]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    choices = ", ".join(b.value for b in Backend)
    if not names:
        raise argparse.ArgumentTypeError(f"name at least one backend ({choices})")
    try:
        return [Backend(name) for name in names]
    except ValueError:
        bad = next(n for n in names if n not in {b.value for b in Backend})
        raise argparse.ArgumentTypeError(
            f"unknown backend {bad!r} (choose from {choices})"
        ) from None


def _token_option(parser: argparse.ArgumentParser, what: str) -> None:
    """``--token``, from $EXO_DEPLOY_TOKEN unless given: the one variable every command reads."""
    parser.add_argument(
        "--token", default=os.environ.get(TOKEN_ENV) or None, help=f"{what} (default: ${TOKEN_ENV})"
    )


def _serving_options(
    parser: argparse.ArgumentParser, *, port: int, data_dir: str, token: str, model_cards: str
) -> None:
    """What a service serving the API is told (the master, the bridge): where to listen, where
    to persist, the token it requires and extra model cards; each says what they mean for it."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=port, help=f"API port (default {port})")
    parser.add_argument("--data-dir", type=Path, default=None, help=data_dir)
    _token_option(parser, token)
    parser.add_argument("--model-cards", type=Path, default=None, help=model_cards)


def _client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--url",
        default=os.environ.get(URL_ENV, DEFAULT_URL),
        help=f"the master's API (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    parser.add_argument("--json", action="store_true", help="print the master's JSON answer")
    _token_option(parser, "bearer token for a master that requires one")


# Commands with parsers of their own (keeper.soak): listed here for --help only.
SOAK_COMMANDS = {
    "soak": "faults under load against a local multi-process cluster; writes a JSON report",
    "soak-sim": "the same fault mix against in-process nodes in virtual time",
}


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = UsageParser(
        prog="exo-deploy",
        description="Deployments for exo clusters: a keeper that keeps models running.",
        epilog=EXIT_CODES_HELP,
        formatter_class=formatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_: str, **kwargs: Any) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help_, description=help_, formatter_class=formatter, **kwargs
        )

    master = command("master", "a master with its keeper and HTTP API")
    _serving_options(
        master,
        port=52415,
        data_dir="where the event log and snapshots persist",
        token="require this bearer token for changes and nodes",
        model_cards="a folder of exo model-card .toml files",
    )
    _membership_options(master)
    _exo_compat_option(master)
    master.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    master.set_defaults(handler=cmd_master)

    log_ = command("log", "check or repair a stopped master's or bridge's data dir")
    log_.add_argument(
        "action",
        choices=("check", "repair"),
        help="check: read it as a start would (exit 0 ok, 1 damaged); repair: back the log up "
        "and cut it at the last good record",
    )
    log_.add_argument("data_dir", type=Path, metavar="DIR", help="the --data-dir to look at")
    log_.set_defaults(handler=cmd_log)

    node = command("node", "a simulated node that joins a master, runs runners, serves tokens")
    node.add_argument("--master", required=True, metavar="URL", help="the master, http://HOST:PORT")
    node.add_argument(
        "--name", default=socket.gethostname(), help="its friendlyName (default: hostname)"
    )
    node.add_argument(
        "--memory-gb", type=positive_float, default=32.0, help="its RAM in GB (default 32)"
    )
    node.add_argument(
        "--backends",
        type=_backends,
        default=[Backend.MLX_METAL],
        help="comma-separated: MlxMetal,MlxCuda,MlxCpu (default MlxMetal)",
    )
    node.add_argument(
        "--load-gbps",
        type=positive_float,
        default=2.0,
        help="how fast its runners load weights, GB/s (default 2)",
    )
    _token_option(node, "the master's bearer token, if it has one")
    node.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    node.set_defaults(handler=cmd_node)

    cluster = command(
        "cluster",
        "a master and N node processes on this machine, in the foreground; Ctrl-C stops all",
    )
    cluster.add_argument("--nodes", type=positive_int, default=3, help="how many nodes (default 3)")
    cluster.add_argument(
        "--port", type=_port, default=52415, help="master API port (default 52415)"
    )
    cluster.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="state, logs and cluster.json (default: a new temporary directory)",
    )
    _membership_options(cluster)
    _exo_compat_option(cluster)
    restart = cluster.add_mutually_exclusive_group()
    restart.add_argument(
        "--node-restart-delay",
        type=positive_float,
        default=60.0,
        metavar="S",
        help="restart a node that died after S seconds (default 60: after the keeper recovered)",
    )
    restart.add_argument(
        "--no-node-restart", action="store_true", help="never restart a node that died"
    )
    cluster.set_defaults(handler=cmd_cluster)

    list_ = command("list", "list deployments with their status", epilog=EXIT_CODES_HELP)
    _client_options(list_)
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
    _client_options(deploy)
    deploy.set_defaults(handler=cmd_deploy)

    scale = command(
        "scale", "keep N instances of deployment ID's model (1-16)", epilog=EXIT_CODES_HELP
    )
    scale.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    scale.add_argument(
        "replicas", metavar="N", type=positive_int, help="how many instances to keep, apart"
    )
    _client_options(scale)
    scale.set_defaults(handler=cmd_scale)

    undeploy = command("undeploy", "delete the deployment ID", epilog=EXIT_CODES_HELP)
    undeploy.add_argument("deployment_id", metavar="ID", help="a deployment id from `list`")
    _client_options(undeploy)
    undeploy.set_defaults(handler=cmd_undeploy)

    bridge = command(
        "bridge",
        "the keeper beside a stock exo master, acting through exo's HTTP API; serves the "
        "deployments API",
    )
    bridge.add_argument(
        "--exo",
        required=True,
        type=_exo_urls,
        metavar="URL[,URL...]",
        help="exo's API, e.g. http://127.0.0.1:52415 (the master's, or any node's); several, "
        "comma-separated, are followed in order: the next when the one in use stops answering",
    )
    _serving_options(
        bridge,
        port=52416,
        data_dir="where the deployments persist (event log)",
        token="require this bearer token for changes",
        model_cards="a folder of exo model-card .toml files, for models exo lists without layer "
        "counts",
    )
    bridge.set_defaults(handler=cmd_bridge)

    for name, help_ in SOAK_COMMANDS.items():
        command(name, help_, add_help=False).set_defaults(handler=cmd_soak)
    return parser


def _exo_urls(text: str) -> tuple[str, ...]:
    try:
        return check_exo_urls(text)
    except MasterStartError as exc:
        message = str(exc).removeprefix("--exo: ").removeprefix("--exo ")
        raise argparse.ArgumentTypeError(message) from None


def _exo_compat_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--exo-compat",
        action="store_true",
        help="serve a stand-in for a stock exo master: exo's API, no keeper, no deployments "
        "(run exo-deploy bridge beside it)",
    )


def _membership_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--node-timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="a node silent this long is gone (default 30, exo's)",
    )
    parser.add_argument(
        "--sweep-interval",
        type=positive_float,
        default=None,
        metavar="S",
        help="how often instances on departed nodes are deleted (default 10, exo's)",
    )


def main(argv: Sequence[str] | None = None) -> NoReturn:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["soak"] or given[:1] == ["soak-sim"]:
        from keeper.soak import soak_main, soak_sim_main  # noqa: PLC0415 (heavy; only here)

        run = soak_main if given[0] == "soak" else soak_sim_main
        sys.exit(run(given[1:]))
    parser = build_parser()
    args = parser.parse_args(given)
    try:
        code = args.handler(args)
    except ClientError as exc:
        print(f"exo-deploy {args.command}: {exc.message}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    sys.exit(code)


if __name__ == "__main__":
    main()
