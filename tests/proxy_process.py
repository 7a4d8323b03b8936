"""A TCP proxy (``keeper.sim.cluster.proxy``) as a process of its own, for the end-to-end tests:
``python tests/proxy_process.py TARGET_PORT LISTEN_PORT``, printing ``ready`` once it listens;
SIGUSR1 cuts every link and refuses
new ones, SIGHUP forwards requests and drops the answers (printing ``swallowed N`` for each
chunk dropped, so a test knows a request reached the target), SIGUSR2 heals. A process, so a
test can cut a bridge from etcd without an event loop of its own."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from keeper.sim.cluster.proxy import TcpProxy


async def main(target_port: int, listen_port: int) -> None:
    proxy = TcpProxy("127.0.0.1", target_port, listen_port=listen_port)
    proxy.on_swallowed = lambda size: print(f"swallowed {size}", flush=True)
    async with anyio.create_task_group() as group:
        # "ready" only once it listens: a bridge started on it at once must find it there.
        await group.start(proxy.run)
        with anyio.open_signal_receiver(
            signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP, signal.SIGTERM
        ) as signals:
            print("ready", flush=True)
            async for received in signals:
                if received == signal.SIGUSR1:
                    proxy.partition()
                    print("cut", flush=True)
                elif received == signal.SIGHUP:
                    proxy.swallow_answers()
                    print("swallowing", flush=True)
                elif received == signal.SIGUSR2:
                    proxy.heal()
                    print("healed", flush=True)
                else:
                    group.cancel_scope.cancel()
                    return


if __name__ == "__main__":
    anyio.run(main, int(sys.argv[1]), int(sys.argv[2]))
