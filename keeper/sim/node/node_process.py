"""``exo-deploy node``: one simulated node as its own process, joined to a master over WebSocket.

The process owns its signals (SIGINT/SIGTERM end it cleanly, exit code 0; SIGUSR1 kills its
runners, the soak's runner-kill fault; SIGUSR2 makes it misbehave as its fault file now says,
the soak's broken-instance faults, see ``read_fault_file``) and turns the only unrecoverable
failure, a master refusing its token, into exit code 1 with the master's reason.
Everything else (master down, restarting, link cut) is retried for as long as the process lives.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path

import anyio

from keeper.runtime.clock import AnyioClock
from keeper.runtime.process_exit import run_reporting
from keeper.runtime.service_logging import configure_service_logging
from keeper.sim.node.sim_node import NodeConfig, SimNode
from keeper.sim.node.sim_options import SIM_FAULTS, SimFault
from keeper.sim.node.ws_client import NodeRejectedError, node_ws_url, run_node_forever

log = logging.getLogger(__name__)

# A fault harness's "runner kill" (exo's runner is a process of its own that can die alone):
# on this signal every runner of the node fails, and is retried with exo's backoff.
RUNNER_KILL_SIGNAL = signal.SIGUSR1
# A fault harness's broken-instance faults: on this signal the node reads its fault file (one of
# SIM_FAULTS, or empty to heal) and misbehaves so from then on. A file and a signal rather than a
# signal per fault: one signal is portable (macOS has no real-time signals) and the file says
# which fault, and stays there to be read in the node's log directory afterwards.
SET_FAULT_SIGNAL = signal.SIGUSR2


def read_fault_file(path: Path) -> SimFault | None:
    """The fault the file names (stripped), None for an empty or missing file; ValueError naming
    the file for anything else."""
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    if not text:
        return None
    for fault in SIM_FAULTS:
        if text == fault:
            return fault
    raise ValueError(f"{path}: not a fault ({', '.join(SIM_FAULTS)} or empty): {text[:40]!r}")


def write_fault_file(path: Path, fault: SimFault | None) -> None:
    """What ``read_fault_file`` reads back (written whole, then renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text((fault or "") + "\n")
    partial.replace(path)


def run_node_process(
    config: NodeConfig, master_url: str, token: str | None, fault_file: Path | None = None
) -> int:
    """Run the node until SIGINT/SIGTERM. Returns the process exit code. ``fault_file``: what
    SET_FAULT_SIGNAL reads (None: the signal is ignored)."""
    configure_service_logging()
    try:
        node_ws_url(master_url)
    except ValueError as exc:
        print(f"exo-deploy node: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        clock = AnyioClock()
        node = SimNode(config, clock)
        log.info(
            "node %s (%s): %g GB, %s, loading at %g GB/s; a %g GB disk downloading at %g MB/s, "
            "holding %s; master %s",
            config.name,
            node.node_id,
            config.memory_gb,
            ",".join(b.value for b in config.backends),
            config.load_gb_per_s,
            config.disk_gb,
            config.download_mb_per_s,
            ", ".join(card.model_id for card in config.has_models) or "no model",
            master_url,
        )
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for received in signals:
                        log.info("%s: node %s stopping", signal.Signals(received).name, node.name)
                        group.cancel_scope.cancel()
                        return

            async def kill_runners_on_signal() -> None:
                with anyio.open_signal_receiver(RUNNER_KILL_SIGNAL) as signals:
                    async for _ in signals:
                        log.info(
                            "%s: %d runner(s) killed", RUNNER_KILL_SIGNAL.name, node.kill_runner()
                        )

            async def set_fault_on_signal(path: Path) -> None:
                with anyio.open_signal_receiver(SET_FAULT_SIGNAL) as signals:
                    async for _ in signals:
                        try:
                            fault = read_fault_file(path)
                        except (ValueError, OSError) as exc:
                            log.warning("%s: fault unchanged: %s", SET_FAULT_SIGNAL.name, exc)
                            continue
                        node.set_fault(fault)
                        log.info("%s: fault now %s", SET_FAULT_SIGNAL.name, fault or "none")

            group.start_soon(stop_on_signal)
            group.start_soon(kill_runners_on_signal)
            if fault_file is not None:
                group.start_soon(set_fault_on_signal, fault_file)
            await run_node_forever(node, master_url, clock, token)

    return run_reporting("node", main, NodeRejectedError)
