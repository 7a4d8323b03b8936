"""The ``exo-deploy`` command: run a master, a simulated node or a local cluster, and drive the
deployments API from a shell.

Each subcommand parses its arguments here and hands over to the module that does the work
(``keeper.sim.master.server``, ``keeper.sim.node.*``, ``keeper.bridge.server``); ``list``,
``deploy``,
``scale`` and ``undeploy``, which talk to a running master instead of starting a process, live in
``keeper.cli.deployments`` (``whatif`` in ``keeper.cli.whatif``, ``apply`` and ``export`` in
``keeper.cli.apply``) with the exit codes every
subcommand shares: 0 done, 1 refused by the master (its message on stderr), 2 bad usage, 3 master
unreachable (``keeper.cli.exits``). A command that runs a service is parsed by a parser holding
it alone, so the hundreds of masters and nodes a cluster or the suite starts never load the
client commands (docs/design.md §10, "Start-up").
"""

from __future__ import annotations

import argparse
import importlib
import math
import signal
import socket
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

# httpx's package imports its own command line (``httpx._main``: click, rich and pygments) when
# those are installed, as they are beside the TUI: 70 ms of CPU in every process that loads httpx
# (a master, a bridge, a cluster, every client command), for a ``main`` we never call. A None in
# sys.modules makes that import fail, and httpx then defines a stub ``main`` in its place (its own
# ``except ImportError``); nothing else of httpx uses the module (docs/design.md §10, "Start-up").
# Only when httpx is not loaded yet: a process that already has it keeps it whole. A private name,
# with no public way: https://github.com/encode/httpx/pull/3547 would import it in ``__main__``;
# httpx is bounded in pyproject.toml and tests/processes/test_import_canaries.py fails if it moves.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", None)  # pyright: ignore[reportArgumentType]

from keeper.cli.command_groups import grouped_commands, help_width
from keeper.cli.exits import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    ClientError,
)
from keeper.client.token_options import add_token_options
from keeper.client.version_option import add_version_option
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.liveness import (
    DEFAULT_DEAD_AFTER_S,
    DEFAULT_SUSPECT_AFTER_S,
    MIN_DEAD_AFTER_S,
    liveness_flags_refusal,
)
from keeper.model.state import Backend, ModelCard
from keeper.runtime.arguments import (
    UsageParser,
    positive_float,
    positive_int,
    webhook_option,
    whole_number,
)
from keeper.runtime.deployment_limit import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.starting import MasterStartError
from keeper.sim.node.sim_options import DEFAULT_DISK_GB, DEFAULT_DOWNLOAD_MB_PER_S, SIM_FAULTS

if TYPE_CHECKING:
    from keeper.cli.processes import cmd_bridge, cmd_cluster, cmd_log, cmd_master, cmd_node

# The command's interface; the exit codes, its contract for scripts, are importable from here.
__all__ = [
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "SOAK_COMMANDS",
    "ProcessCommand",
    "build_parser",
    "cmd_bridge",
    "cmd_cluster",
    "cmd_log",
    "cmd_master",
    "cmd_node",
    "cmd_soak",
    "main",
]

# --- the process commands, loaded when given -------------------------------------------------

# Where the commands that run a service live; loaded only when one of them is the one given.
_PROCESSES = "keeper.cli.processes"
_PROCESS_COMMANDS = frozenset({"cmd_bridge", "cmd_cluster", "cmd_log", "cmd_master", "cmd_node"})


@dataclass(frozen=True)
class ProcessCommand:
    """The handler of a process command: ``keeper.cli.processes``'s function ``name``, imported
    when it runs, so that a short command (``list``, ``deploy``) never loads a service."""

    name: str

    def __call__(self, args: argparse.Namespace) -> int:
        command: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(_PROCESSES), self.name
        )
        return command(args)


def __getattr__(name: str) -> Any:
    """``from keeper.cli import cmd_master`` (the names of ``__all__``) without loading the
    services when ``keeper.cli`` is imported."""
    if name in _PROCESS_COMMANDS:
        return getattr(importlib.import_module(_PROCESSES), name)
    raise AttributeError(f"module 'keeper.cli' has no attribute {name!r}")


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


def _models(text: str) -> list[ModelCard]:
    """``--has``: catalog model ids, comma-separated."""
    catalog = catalog_by_id(BUILTIN_MODEL_CARDS)
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [name for name in names if name not in catalog]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown model {unknown[0]!r} (the catalog's: {', '.join(catalog)})"
        )
    return [catalog[name] for name in dict.fromkeys(names)]


def _disk_options(parser: argparse.ArgumentParser, every: str) -> None:
    """A simulated node's models directory (``keeper.sim.node.downloads``), for ``every`` node."""
    parser.add_argument(
        "--disk-gb",
        type=positive_float,
        default=DEFAULT_DISK_GB,
        help=f"the disk {every} keeps models on, GB (default {DEFAULT_DISK_GB:g})",
    )
    parser.add_argument(
        "--download-mb-s",
        type=positive_float,
        default=DEFAULT_DOWNLOAD_MB_PER_S,
        metavar="MB_S",
        help=f"how fast {every} downloads a model it lacks, MB/s (default "
        f"{DEFAULT_DOWNLOAD_MB_PER_S:g}: about as long as loading it; a real one gets ~100)",
    )
    parser.add_argument(
        "--has",
        type=_models,
        default=[],
        metavar="MODEL[,MODEL...]",
        help=f"catalog models on the disk of {every} from the start: never downloaded",
    )


def _serving_options(
    parser: argparse.ArgumentParser, *, port: int, data_dir: str, token: str, model_cards: str
) -> None:
    """What a service serving the API is told (the master, the bridge): where to listen, where
    to persist, the token it requires and extra model cards; each says what they mean for it."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=_port, default=port, help=f"API port (default {port})")
    parser.add_argument("--data-dir", type=Path, default=None, help=data_dir)
    add_token_options(parser, token)
    parser.add_argument("--model-cards", type=Path, default=None, help=model_cards)
    parser.add_argument(
        "--max-deployments",
        type=positive_int,
        default=DEFAULT_MAX_DEPLOYMENTS,
        metavar="N",
        help=f"keep at most N deployments: one more is refused (default "
        f"{DEFAULT_MAX_DEPLOYMENTS}; those already kept stay if N is lowered)",
    )


# Commands with parsers of their own (keeper.sim.soak): listed here for --help only.
SOAK_COMMANDS = {
    "soak": "faults under load against a local multi-process cluster; writes a JSON report",
    "soak-sim": "the same fault mix against in-process nodes in virtual time",
}


# What --help says first, above the commands.
_ABOUT = "Deployments for exo clusters: a keeper that keeps models running."

# What makes one command's parser: ``command(name, help)`` (build_parser's).
_Command = Callable[..., argparse.ArgumentParser]


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole ``exo-deploy`` parser, or, with ``only`` (one of the service commands), a
    parser with that command alone: the same flags, help and errors for it, without loading the
    client commands' modules."""
    formatter = argparse.RawDescriptionHelpFormatter
    parser = UsageParser(
        prog="exo-deploy",
        epilog=EXIT_CODES_HELP,
        formatter_class=formatter,
    )
    add_version_option(parser)
    commands = parser.add_subparsers(
        dest="command",
        required=True,
        metavar="COMMAND",
        help="one of the commands above; exo-deploy COMMAND --help says what it takes",
    )
    helps: dict[str, str] = {}

    def command(name: str, help_: str, **kwargs: Any) -> argparse.ArgumentParser:
        # No help= here: the description lists the commands, grouped (keeper.cli.command_groups).
        helps[name] = help_
        return commands.add_parser(name, description=help_, formatter_class=formatter, **kwargs)

    for service, define in _COMMANDS:
        if only is None or service == only:
            define(command)
    parser.description = f"{_ABOUT}\n\n{grouped_commands(helps, help_width())}"
    return parser


def _master_command(command: _Command) -> None:
    """``master``: a master with its keeper and HTTP API."""
    master = command("master", "a master with its keeper and HTTP API")
    _serving_options(
        master,
        port=52415,
        data_dir="where the event log and snapshots persist",
        token="require this bearer token for changes and nodes",
        model_cards="a folder of exo model-card .toml files",
    )
    _membership_options(master)
    _failover_options(master)
    _exo_compat_option(master)
    webhook_option(master, "alert notices (incidents, cant_place, drains)")
    _front_door_options(
        master, "the master", "a node lost under it cuts", "; ignored with --exo-compat"
    )
    master.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    master.set_defaults(handler=ProcessCommand("cmd_master"))


def _log_command(command: _Command) -> None:
    """``log check|repair DIR``: a stopped service's data dir."""
    log_ = command("log", "check or repair a stopped master's or bridge's data dir")
    log_.add_argument(
        "action",
        choices=("check", "repair"),
        help="check: read it every way a start could and say what each way drops (exit 0 ok, "
        "1 damaged); repair: say what it will drop, back up, then cut the log at the last good "
        "record and rebuild a damaged snapshot, the way that drops least",
    )
    log_.add_argument("data_dir", type=Path, metavar="DIR", help="the --data-dir to look at")
    log_.set_defaults(handler=ProcessCommand("cmd_log"))


def _node_command(command: _Command) -> None:
    """``node``: a simulated node."""
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
    _disk_options(node, "it")
    node.add_argument(
        "--fault",
        choices=list(SIM_FAULTS),
        default=None,
        help="misbehave: runners stop in RunnerWarmingUp (stall-warmup), die after serving 3 s "
        "with the instance still registered (lose-runner), or fail every chat (fail-chats)",
    )
    node.add_argument(
        "--key-file",
        type=Path,
        default=None,
        metavar="PATH",
        help="its identity: an ed25519 key, created there if absent; its node id is made of it "
        "(default: $XDG_STATE_HOME/exo-deploy/nodes/NAME.key, or ~/.local/state/...)",
    )
    add_token_options(node, "the master's bearer token, if it has one")
    node.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)
    # Where a fault harness (the soak) writes the fault SIGUSR2 turns on
    # (keeper.sim.node.node_process).
    node.add_argument("--fault-file", type=Path, default=None, help=argparse.SUPPRESS)
    node.set_defaults(handler=ProcessCommand("cmd_node"))


def _cluster_command(command: _Command) -> None:
    """``cluster``: a master and N nodes on this machine."""
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
    _failover_options(cluster)
    _exo_compat_option(cluster)
    webhook_option(cluster, "the master's alert notices")
    _disk_options(cluster, "each node")
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
    cluster.set_defaults(handler=ProcessCommand("cmd_cluster"))


def _bridge_command(command: _Command) -> None:
    """``bridge``: the keeper beside a stock exo."""
    bridge = command(
        "bridge",
        "the keeper beside a stock exo master, acting through exo's HTTP API; serves the "
        "deployments API",
    )
    _failover_options(bridge)
    bridge.add_argument(
        "--exo",
        required=True,
        type=_exo_urls,
        action=_MoreUrls,
        metavar="URL[,URL...]",
        help="exo's API, e.g. http://127.0.0.1:52415 (the master's, or any node's); several, "
        "comma-separated or --exo repeated, are followed in order: the next when the one in use "
        "stops answering. Give every node's: a node whose own API stops answering is dead",
    )
    _serving_options(
        bridge,
        port=52416,
        data_dir="where the deployments persist (event log)",
        token="require this bearer token for changes",
        model_cards="a folder of exo model-card .toml files, for models exo lists without layer "
        "counts",
    )
    webhook_option(bridge, "alert notices (incidents, cant_place, drains)")
    _front_door_options(bridge, "the bridge", "exo cuts")
    bridge.add_argument(
        "--store",
        metavar="etcd[s]://HOST:PORT[,HOST:PORT...]",
        help="keep the deployments and every record in etcd instead of --data-dir, shared by "
        "every bridge of this exo cluster: one acts, the others stand by and serve the API; "
        "etcds:// speaks TLS (no credentials in the URL: the flags below)",
    )
    bridge.add_argument(
        "--store-ca",
        type=Path,
        metavar="FILE",
        help="the CA (PEM) etcd's certificate is checked with (default: the system's)",
    )
    bridge.add_argument(
        "--store-cert",
        type=Path,
        metavar="FILE",
        help="this bridge's client certificate (PEM), for an etcd with --client-cert-auth",
    )
    bridge.add_argument("--store-key", type=Path, metavar="FILE", help="its private key (PEM)")
    bridge.add_argument(
        "--store-user", metavar="NAME", help="etcd's user (auth enabled), with a role on the prefix"
    )
    bridge.add_argument(
        "--store-password-file",
        type=Path,
        metavar="FILE",
        help="the file holding that user's password (one line; chmod 600)",
    )
    bridge.add_argument(
        "--name",
        help="this bridge's name in the store (default HOSTNAME:PORT); /healthz says who leads",
    )
    bridge.add_argument(
        "--lease-s",
        type=float,
        default=5.0,
        metavar="S",
        help="the acting bridge's lease in the store: a standby takes over this long after "
        "the acting one stops renewing it (default 5)",
    )
    bridge.add_argument(
        "--store-prefix",
        default="/exo-deploy/",
        metavar="/PREFIX/",
        help="the keys' prefix in the store; one per exo cluster (default /exo-deploy/)",
    )
    bridge.set_defaults(handler=ProcessCommand("cmd_bridge"))


def _client_commands(command: _Command) -> None:
    """The commands that talk to a running master or bridge, with the client they load: only
    when the whole parser is built (``_COMMANDS`` says why)."""
    from keeper.cli.apply import add_apply_commands  # noqa: PLC0415
    from keeper.cli.deployments import add_deployments_commands  # noqa: PLC0415
    from keeper.cli.nodes import add_node_commands  # noqa: PLC0415
    from keeper.cli.whatif import add_whatif_command  # noqa: PLC0415

    add_deployments_commands(command)
    add_apply_commands(command)
    add_node_commands(command)
    add_whatif_command(command)


def _webhook_and_soak_commands(command: _Command) -> None:
    """``webhooks test``, and the soaks, listed for --help only (``cmd_soak``)."""
    from keeper.cli.webhooks import add_webhooks_command  # noqa: PLC0415 (as the client's)

    add_webhooks_command(command)
    for name, help_ in SOAK_COMMANDS.items():
        command(name, help_, add_help=False).set_defaults(handler=cmd_soak)


# Every command, each group by the service command it is, or None for those in the whole
# parser only (--help lists them by keeper.cli.command_groups, not in this order). A service
# command is parsed by a parser holding it alone (build_parser's ``only``): a cluster starts its
# master and nodes as such commands, the suite hundreds of them, and the client commands'
# parsers load the deployments client, about 0.3 s of CPU a process.
_COMMANDS: tuple[tuple[str | None, Callable[[_Command], None]], ...] = (
    ("master", _master_command),
    ("log", _log_command),
    ("node", _node_command),
    ("cluster", _cluster_command),
    (None, _client_commands),
    ("bridge", _bridge_command),
    (None, _webhook_and_soak_commands),
)
_SERVICE_COMMANDS = frozenset(service for service, _ in _COMMANDS if service is not None)


class _MoreUrls(argparse.Action):
    """``--exo`` given again adds its URLs after those given before (each once, in order)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        before: tuple[str, ...] = getattr(namespace, self.dest, None) or ()
        setattr(namespace, self.dest, tuple(dict.fromkeys((*before, *values))))


def _exo_urls(text: str) -> tuple[str, ...]:
    from keeper.bridge.exo_urls import check_exo_urls  # noqa: PLC0415 (httpx: the bridge's only)

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


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _front_door_options(
    parser: argparse.ArgumentParser, through: str, cut: str, only: str = ""
) -> None:
    """The front door's ``--hold-s``, ``--migrations`` and ``--max-inflight`` (docs/design.md
    §8.6), alike on every service that mounts it; ``only`` says when they do nothing."""
    parser.add_argument(
        "--hold-s",
        type=_hold_seconds,
        default=30.0,
        metavar="S",
        help=f"a chat through {through} (POST /v1/chat/completions) waits up to S for its model "
        f"to serve, then is a 503 (default 30; 0 = never held{only})",
    )
    parser.add_argument(
        "--migrations",
        type=_count,
        default=2,
        metavar="N",
        help=f"a chat {cut} is continued on another instance at most N times (default 2; "
        f"0 = a cut is an error event{only})",
    )
    parser.add_argument(
        "--max-inflight",
        type=positive_int,
        default=256,
        metavar="N",
        help=f"chats through {through} at once, held ones included; one more is a 429 "
        f"(default 256{only})",
    )


def _hold_seconds(text: str) -> float:
    value = _seconds(text)
    # A hold without end would keep a chat for a deployment that never serves for ever: the
    # client's own timeout would be its only end, and it would count as neither failed nor done.
    if not 0 <= value < math.inf:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, 0 or more, got {text}")
    return value


def _count(text: str) -> int:
    value = whole_number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _failover_options(parser: argparse.ArgumentParser) -> None:
    """``--suspect-after-s`` / ``--dead-after-s`` (docs/design.md §5.18), checked together after
    parsing (``_failover_refused``)."""
    parser.add_argument(
        "--suspect-after-s",
        type=_seconds,
        default=DEFAULT_SUSPECT_AFTER_S,
        metavar="S",
        help="a node silent this long is suspect and its instances get a replacement on other "
        f"nodes, nothing deleted (default {DEFAULT_SUSPECT_AFTER_S:g}; 0 = off: exo's timeout "
        "only)",
    )
    parser.add_argument(
        "--dead-after-s",
        type=_seconds,
        default=DEFAULT_DEAD_AFTER_S,
        metavar="S",
        help="a suspect node silent this long while the others are heard is dead and its "
        f"instances are deleted (default {DEFAULT_DEAD_AFTER_S:g}, at least "
        f"{MIN_DEAD_AFTER_S:g}; 0 = never by silence alone)",
    )


def _failover_refused(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming the flag when the two failover flags do not make sense together."""
    suspect = getattr(args, "suspect_after_s", None)
    dead = getattr(args, "dead_after_s", None)
    if isinstance(suspect, float) and isinstance(dead, float):
        refusal = liveness_flags_refusal(suspect, dead)
        if refusal is not None:
            parser.error(refusal)


def _without_trio() -> None:
    """Every command but the soaks runs on asyncio; yet httpcore, under httpx, imports trio
    wherever it is installed (beside the soak's, the suite's), to tell which loop it runs on:
    60-110 ms of CPU in every process that sends a request (a master's webhooks, a bridge, a
    cluster, each client command). A None in sys.modules makes that import fail, as httpcore
    expects where trio is absent (docs/design.md §10, "Start-up"). Only for a process's own
    command (``main()`` without ``argv``): a test calling ``main([...])`` in its own process
    keeps trio for its other tests. httpcore offers no public way (upstream:
    https://github.com/encode/httpcore/issues/946); it is bounded in pyproject.toml and
    tests/processes/test_import_canaries.py fails if it moves."""
    sys.modules.setdefault("trio", None)  # pyright: ignore[reportArgumentType]


def main(argv: Sequence[str] | None = None) -> NoReturn:
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["soak"] or given[:1] == ["soak-sim"]:
        from keeper.sim.soak import soak_main, soak_sim_main  # noqa: PLC0415 (heavy; only here)

        run = soak_main if given[0] == "soak" else soak_sim_main
        sys.exit(run(given[1:]))
    if argv is None:  # this process's own command line: the exo-deploy script, python -m
        _without_trio()
    parser = build_parser(given[0] if given[:1] and given[0] in _SERVICE_COMMANDS else None)
    args = parser.parse_args(given)
    _failover_refused(parser, args)
    try:
        code = args.handler(args)
    except ClientError as exc:
        print(f"exo-deploy {args.command}: {exc.message}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
    sys.exit(code)
