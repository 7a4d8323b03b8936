"""The commands that run a process of exo-deploy's for as long as it lives: a master, a simulated
node, a local cluster, a bridge, and the offline check or repair of a data dir.

Apart from the parser (``keeper.cli``) because each of them imports the service it runs, most of
a start-up: ``keeper.cli`` loads this module, and so those services, only when one of these
commands is the one given, and each command imports its own service inside its function, so a
node never loads the master or the bridge (docs/design.md §10, "Start-up"). The exit codes are
those every subcommand shares (``keeper.cli.exits``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from keeper.cli.exits import EXIT_USAGE
from keeper.model.liveness import LivenessConfig
from keeper.model.state import Memory
from keeper.runtime.process_exit import exit_with_parent
from keeper.sim.node.downloads import disk_refusal

__all__ = ["cmd_bridge", "cmd_cluster", "cmd_log", "cmd_master", "cmd_node"]


def cmd_master(args: argparse.Namespace) -> int:
    from keeper.runtime.front_door import FrontDoorConfig
    from keeper.sim.master.server import OUR_API, MasterApp, run_master

    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    app: MasterApp = OUR_API
    if args.exo_compat:  # the stand-in's routes and models, loaded only for it
        from keeper.sim.exo_standin.app import STANDIN_API

        app = STANDIN_API
    return run_master(
        args.host,
        args.port,
        args.data_dir,
        args.token,
        args.model_cards,
        node_timeout_s=args.node_timeout,
        sweep_interval_s=args.sweep_interval,
        liveness=LivenessConfig(args.suspect_after_s, args.dead_after_s),
        max_deployments=args.max_deployments,
        app=app,
        webhooks=args.webhook,
        front_door=FrontDoorConfig(args.hold_s, args.migrations, args.max_inflight),
    )


def cmd_log(args: argparse.Namespace) -> int:
    from keeper.runtime import log_repair
    from keeper.runtime.dir_lock import DataDirInUseError

    if args.action == "check":
        report = log_repair.check(args.data_dir)
        for line in report.lines:
            print(line, file=sys.stdout if report.ok else sys.stderr)
        return report.exit_code
    try:
        # Each line as it comes: what the repair will drop is out before it changes a file.
        report = log_repair.repair(args.data_dir, say=lambda line: print(line, flush=True))
    except DataDirInUseError as exc:
        print(f"exo-deploy log repair: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not report.ok:
        print(f"exo-deploy log repair: {args.data_dir} is not repaired", file=sys.stderr)
    return report.exit_code


def cmd_node(args: argparse.Namespace) -> int:
    from keeper.sim.link.identity import KeyFileError, default_key_file, load_or_create_key
    from keeper.sim.node.node_process import run_node_process
    from keeper.sim.node.sim_node import NodeConfig

    if (refused := _disk_refused(args)) is not None:
        return refused
    if args.parent_pid is not None:
        exit_with_parent(args.parent_pid)
    try:
        key = load_or_create_key(args.key_file or default_key_file(args.name))
    except KeyFileError as exc:
        print(f"exo-deploy node: {exc}", file=sys.stderr)
        return EXIT_USAGE
    config = NodeConfig(
        name=args.name,
        key=key,
        memory_gb=args.memory_gb,
        backends=tuple(args.backends),
        load_gb_per_s=args.load_gbps,
        disk_gb=args.disk_gb,
        download_mb_per_s=args.download_mb_s,
        has_models=tuple(args.has),
        fault=args.fault,
    )
    return run_node_process(config, args.master, args.token, args.fault_file)


def cmd_cluster(args: argparse.Namespace) -> int:
    from keeper.runtime.webhooks import WebhookUrlError, webhook_urls
    from keeper.sim.cluster.local import run_cluster

    if (refused := _disk_refused(args)) is not None:
        return refused
    try:
        webhooks = webhook_urls(args.webhook)
    except WebhookUrlError as exc:
        print(f"exo-deploy cluster: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="exo-deploy-cluster-"))
    return run_cluster(
        args.nodes,
        args.port,
        data_dir.resolve(),
        node_timeout_s=args.node_timeout,
        sweep_interval_s=args.sweep_interval,
        liveness=LivenessConfig(args.suspect_after_s, args.dead_after_s),
        node_restart_s=None if args.no_node_restart else args.node_restart_delay,
        exo_compat=args.exo_compat,
        disk_gb=args.disk_gb,
        download_mb_per_s=args.download_mb_s,
        has_models=tuple(card.model_id for card in args.has),
        webhooks=webhooks,
    )


def _disk_refused(args: argparse.Namespace) -> int | None:
    """EXIT_USAGE, said on stderr, when the models of ``--has`` do not fit ``--disk-gb``."""
    refusal = disk_refusal(Memory.from_gb(args.disk_gb).in_bytes, args.has)
    if refusal is None:
        return None
    print(f"exo-deploy {args.command}: error: --has: {refusal}", file=sys.stderr)
    return EXIT_USAGE


def cmd_bridge(args: argparse.Namespace) -> int:
    from keeper.bridge.etcd_access import StoreAccessOptions
    from keeper.bridge.server import run_bridge
    from keeper.runtime.front_door import FrontDoorConfig

    return run_bridge(
        args.exo,
        args.host,
        args.port,
        args.data_dir,
        args.token,
        args.model_cards,
        max_deployments=args.max_deployments,
        webhooks=args.webhook,
        liveness=LivenessConfig(args.suspect_after_s, args.dead_after_s),
        front_door=FrontDoorConfig(args.hold_s, args.migrations, args.max_inflight),
        store=args.store,
        name=args.name,
        lease_s=args.lease_s,
        store_prefix=args.store_prefix,
        store_access=StoreAccessOptions(
            ca=args.store_ca,
            cert=args.store_cert,
            key=args.store_key,
            user=args.store_user,
            password_file=args.store_password_file,
        ),
    )
