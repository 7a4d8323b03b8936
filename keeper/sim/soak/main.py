"""The soak's commands: ``exo-deploy soak`` (processes) and ``exo-deploy soak-sim`` (virtual time).

Both parse their arguments, run the soak, write the JSON report, print the table, each model's
outcomes (also by the fault they were sent under) and the recovery figures, and exit 0 only if
the run kept every promise: no request lost, no model ever with more instances than its
replicas, every deployment serving with all its replicas ready at the end.
Exit codes: 0 kept, 1 a promise broken or the run could not start (the reason on stderr), 2 bad
usage, 130 interrupted (Ctrl-C; every process the run started is stopped first).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import anyio

from keeper.model.liveness import (
    DEFAULT_DEAD_AFTER_S,
    DEFAULT_SUSPECT_AFTER_S,
    MIN_DEAD_AFTER_S,
    LivenessConfig,
    liveness_flags_refusal,
)
from keeper.runtime.arguments import EXIT_USAGE, UsageParser, positive_float, whole_number
from keeper.runtime.entry import expected_failure, run_until_signal
from keeper.sim.cluster.local import ClusterError
from keeper.sim.soak.harness import layout_summary, run_processes
from keeper.sim.soak.report import (
    SoakReport,
    format_by_fault,
    format_models,
    format_recovery,
    format_table,
)
from keeper.sim.soak.run import SoakError, SoakSettings
from keeper.sim.soak.virtual import deterministic, run_virtual, temporary_data_dir, virtual_settings

EXIT_KEPT = 0
EXIT_BROKEN = 1
EXIT_INTERRUPTED = 128 + signal.SIGINT
DEFAULT_NODES = 4
DEFAULT_SEED = 1
# Node faults keep two nodes healthy (the pipeline model needs two), so a third is the least
# that lets a node be faulted at all.
MIN_NODES = 3

T = TypeVar("T")


def _node_count(text: str) -> int:
    value = whole_number(text)
    if value < MIN_NODES:
        raise argparse.ArgumentTypeError(
            f"a soak needs at least {MIN_NODES} nodes (node faults keep two healthy), got {text}"
        )
    return value


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nodes",
        type=_node_count,
        default=DEFAULT_NODES,
        help=f"simulated nodes (default {DEFAULT_NODES}, at least {MIN_NODES})",
    )
    parser.add_argument(
        "--seed",
        type=whole_number,
        default=DEFAULT_SEED,
        help=f"chooses the faults: same seed, same schedule (default {DEFAULT_SEED})",
    )
    parser.add_argument(
        "--report", type=Path, required=True, metavar="FILE", help="where to write the JSON report"
    )
    parser.add_argument(
        "--suspect-after-s",
        type=_seconds,
        default=DEFAULT_SUSPECT_AFTER_S,
        metavar="S",
        help="the master's fast failover: a node silent this long is suspect (default "
        f"{DEFAULT_SUSPECT_AFTER_S:g}; 0 = off, exo's timeout only)",
    )
    parser.add_argument(
        "--dead-after-s",
        type=_seconds,
        default=DEFAULT_DEAD_AFTER_S,
        metavar="S",
        help="... and dead this long (default "
        f"{DEFAULT_DEAD_AFTER_S:g}, at least {MIN_DEAD_AFTER_S:g}; 0 = never by silence alone)",
    )


def _seconds(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse, then check the two failover flags together as the master does (exit 2 naming the
    flag)."""
    args = parser.parse_args(argv)
    refusal = liveness_flags_refusal(args.suspect_after_s, args.dead_after_s)
    if refusal is not None:
        parser.error(refusal)
    return args


def _liveness(args: argparse.Namespace) -> LivenessConfig:
    return LivenessConfig(args.suspect_after_s, args.dead_after_s)


def soak_parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="exo-deploy soak",
        description="Faults under load against a local multi-process cluster (master + N nodes):"
        " 12 chat clients, a fault every 20-60 s, then a JSON report.",
    )
    parser.add_argument(
        "--minutes", type=positive_float, required=True, help="how long to inject faults"
    )
    _common(parser)
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="logs, cluster.json and the master's event log (default: a new temporary dir)",
    )
    return parser


def soak_sim_parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="exo-deploy soak-sim",
        description="The soak in virtual time (trio's MockClock): in-process master and nodes, "
        "seeded and replayable.",
    )
    parser.add_argument(
        "--hours", type=positive_float, required=True, help="simulated hours of faults"
    )
    _common(parser)
    return parser


def _write_report(report: SoakReport, path: Path) -> str | None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(report.model_dump_json(indent=2) + "\n")
    except OSError as exc:
        return f"cannot write the report to {path}: {exc.strerror or exc}"
    return None


def _conclude(report: SoakReport, path: Path, prog: str, extra: Sequence[str] = ()) -> int:
    print()
    print(format_table([report]))
    print()
    print(format_models(report))
    print()
    print("answered by the fault a request was in flight under (its injection until it settled):")
    print(format_by_fault(report))
    print()
    print(format_recovery(report))
    for line in extra:
        print(line)
    failure = _write_report(report, path)
    if failure is not None:
        print(f"{prog}: {failure}", file=sys.stderr)
        return EXIT_BROKEN
    print(f"report written to {path}")
    broken: list[str] = []
    if report.lost:
        broken.append(f"{report.lost} request(s) lost")
    if report.duplicates:
        broken.append(
            f"{report.duplicates} moment(s) with more instances of a model than its replicas"
        )
    if not report.serving_at_end:
        broken.append("not every deployment served again at the end")
    if not report.replicas_at_end:
        broken.append("not every deployment had all its replicas ready again at the end")
    if broken:
        print(f"{prog}: " + "; ".join(broken), file=sys.stderr)
        return EXIT_BROKEN
    return EXIT_KEPT


def _run_interruptible(main: Callable[[], Awaitable[T]], **run_options: Any) -> T | None:
    """Run ``main`` in a new event loop; SIGINT/SIGTERM cancel it (None is returned then)."""

    def on_signal(name: str) -> None:
        print(f"{name}: stopping", flush=True)

    return run_until_signal(main, on_signal, **run_options)


def _failure(exc: BaseException) -> str | None:
    """The message of an expected failure inside task-group wrapping, else None."""
    found = expected_failure(exc, (SoakError, ClusterError))
    return None if found is None else str(found)


# What soak-sim says when trio is missing: it is the `sim` extra's, not a base dependency.
NEEDS_TRIO = "exo-deploy soak-sim needs trio: pip install 'exo-deploy[sim]'"


def _mock_clock() -> Any:
    """trio's MockClock jumping whenever every task waits (trio comes with the ``sim`` extra,
    so it is looked up only when a virtual run is asked for)."""
    testing = importlib.import_module("trio.testing")
    return testing.MockClock(autojump_threshold=0)


def _stamped(start: float) -> Callable[[str], None]:
    def say(message: str) -> None:
        elapsed = int(time.monotonic() - start)
        print(f"[{elapsed // 60:02d}:{elapsed % 60:02d}] {message}", flush=True)

    return say


def soak_main(argv: Sequence[str] | None = None) -> int:
    """``exo-deploy soak --minutes M [--nodes N] [--seed S] [--suspect-after-s S]
    [--dead-after-s S] --report FILE``; the exit code."""
    args = _parse(soak_parser(), argv)
    data_dir: Path = (args.data_dir or Path(tempfile.mkdtemp(prefix="exo-deploy-soak-"))).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    settings = SoakSettings(
        minutes=args.minutes, seed=args.seed, nodes=args.nodes, liveness=_liveness(args)
    )
    say = _stamped(time.monotonic())
    say(f"soak: {args.nodes} nodes, seed {args.seed}, {args.minutes:g} min of faults")
    with (data_dir / "cluster.out").open("w") as cluster_out:
        try:
            report = _run_interruptible(
                lambda: run_processes(settings, data_dir, say, cluster_out), backend="asyncio"
            )
        except Exception as exc:
            reason = _failure(exc)
            if reason is None:
                raise
            print(f"exo-deploy soak: {reason} (logs in {data_dir / 'logs'})", file=sys.stderr)
            return EXIT_BROKEN
    if report is None:
        print(f"exo-deploy soak: interrupted; every process stopped; logs in {data_dir}")
        return EXIT_INTERRUPTED
    summary = layout_summary(data_dir)
    return _conclude(report, args.report, "exo-deploy soak", [summary, f"data dir: {data_dir}"])


def soak_sim_main(argv: Sequence[str] | None = None) -> int:
    """``exo-deploy soak-sim --hours H [--seed S] --report FILE``; the exit code."""
    args = _parse(soak_sim_parser(), argv)
    try:
        clock = _mock_clock()
    except ImportError:
        print(NEEDS_TRIO, file=sys.stderr)
        return EXIT_USAGE
    settings: SoakSettings = virtual_settings(args.hours, args.seed, args.nodes, _liveness(args))

    def say(message: str) -> None:
        simulated = int(anyio.current_time())
        hours, rest = divmod(simulated, 3600)
        print(f"[sim {hours:02d}:{rest // 60:02d}:{rest % 60:02d}] {message}", flush=True)

    # The in-process master and nodes log what real ones would (a node that reconnects while
    # frozen, say); in a day of faults that is thousands of lines around the soak's own.
    logging.getLogger("keeper").setLevel(logging.ERROR)
    started = time.monotonic()
    say_start = f"soak-sim: {args.nodes} nodes, seed {args.seed}, {args.hours:g} h of faults"
    print(say_start, flush=True)
    with temporary_data_dir() as data_dir, deterministic(args.seed):
        try:
            report = _run_interruptible(
                lambda: run_virtual(settings, Path(data_dir), say),
                backend="trio",
                backend_options={"clock": clock},
            )
        except Exception as exc:
            reason = _failure(exc)
            if reason is None:
                raise
            print(f"exo-deploy soak-sim: {reason}", file=sys.stderr)
            return EXIT_BROKEN
    if report is None:
        print("exo-deploy soak-sim: interrupted")
        return EXIT_INTERRUPTED
    wall = time.monotonic() - started
    extra = [f"simulated {args.hours:g} h in {wall:.0f} s of wall time"]
    return _conclude(report, args.report, "exo-deploy soak-sim", extra)
