"""``exo-deploy node``: one simulated node as its own process, joined to a master over WebSocket.

The process owns its signals (SIGINT/SIGTERM end it cleanly, exit code 0; SIGUSR1 kills its
runners, the soak's runner-kill fault) and turns the only unrecoverable failure, a master
refusing its token, into exit code 1 with the master's reason.
Everything else (master down, restarting, link cut) is retried for as long as the process lives.
"""

from __future__ import annotations

import logging
import signal
import sys

import anyio

from keeper.node.sim_node import NodeConfig, SimNode
from keeper.node.ws_client import NodeRejectedError, node_ws_url, run_node_forever
from keeper.runtime.clock import AnyioClock
from keeper.runtime.process_exit import run_reporting
from keeper.runtime.service_logging import configure_service_logging

log = logging.getLogger(__name__)

# A fault harness's "runner kill" (exo's runner is a process of its own that can die alone):
# on this signal every runner of the node fails, and is retried with exo's backoff.
RUNNER_KILL_SIGNAL = signal.SIGUSR1


def run_node_process(config: NodeConfig, master_url: str, token: str | None) -> int:
    """Run the node until SIGINT/SIGTERM. Returns the process exit code."""
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

            group.start_soon(stop_on_signal)
            group.start_soon(kill_runners_on_signal)
            await run_node_forever(node, master_url, clock, token)

    return run_reporting("node", main, NodeRejectedError)
