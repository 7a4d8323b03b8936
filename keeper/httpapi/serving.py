"""A service's HTTP API under uvicorn beside the service's own loops, in one event loop.

The master and the bridge are run the same way, so it is written once here: the socket is
bound first (a port in use is a clear error, not uvicorn's ``sys.exit``, and ``port=0`` picks a
free port whose number is reported through ``task_status``), the service starts, then uvicorn
on that socket. uvicorn needs asyncio; the services themselves are backend-neutral.

Shutdown is graceful: uvicorn is told to exit (it is shielded from plain cancellation so it can
close connections, with ``GRACEFUL_SHUTDOWN_S`` to do it), then the service is cancelled and
writes its snapshot. Signals are the process entry's (``keeper.runtime.entry``): uvicorn's own
handlers are disabled, because they would re-raise a signal after shutdown and kill the process
mid-cleanup.

Every connection has a deadline for its request head and one for a client that stops reading, a
bound on its head's size, and the server a bound on open connections
(``keeper.httpapi.connection_deadlines``): uvicorn sets none of them.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable, Generator
from typing import Protocol

import anyio
import uvicorn
from anyio.abc import TaskStatus
from fastapi import FastAPI

from keeper.httpapi.connection_deadlines import (
    DEFAULT_DEADLINES,
    ConnectionDeadlines,
    protocol_with,
)
from keeper.runtime.starting import MasterStartError, check_bind

# Loopback unless told otherwise (docs/design.md §6.7): anything wider needs a token
# (keeper.httpapi.auth).
DEFAULT_HOST = "127.0.0.1"
# Long enough for in-flight requests to finish, short enough that Ctrl-C feels immediate.
GRACEFUL_SHUTDOWN_S = 3.0
# The largest WebSocket message a peer (a node, on /node/ws) may send; a larger one closes its
# connection with 1009 before it is held in memory. A node's largest message is its NodeInfo
# (a few kB: memory, backends, interfaces, disk, vitals); 1 MiB leaves room for a node with
# hundreds of interfaces and none for a 16 MB frame that would cost the master 600 MB.
MAX_WS_FRAME_BYTES = 1024 * 1024
# uvicorn starts in milliseconds; this only bounds a wait that should never be long.
STARTUP_DEADLINE_S = 30.0
# How many connections the kernel queues before the server accepts them (uvicorn's default).
LISTEN_BACKLOG = 2048


class Service(Protocol):
    """What ``serve_service`` runs beside uvicorn: the master, the bridge."""

    async def run(self, *, task_status: TaskStatus[None] = ...) -> None: ...


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Signals are the process entry's to handle (see the module docstring).
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose protocol
    # says TCP, and without it Nagle's algorithm meets the client's delayed ACK and every small
    # answer waits ~40 ms (measured: the front door's added p50 47 ms, 7 ms with it).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise MasterStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(LISTEN_BACKLOG)
    sock.setblocking(False)
    return sock


def shown_host(host: str) -> str:
    """``host`` as it stands in a URL (an IPv6 address in brackets)."""
    return f"[{host}]" if ":" in host else host


async def serve_service(
    service: Service,
    app: FastAPI,
    host: str,
    port: int,
    token: str | None,
    *,
    announce: Callable[[int], None],
    before_stop: Callable[[], None] | None = None,
    deadlines: ConnectionDeadlines = DEFAULT_DEADLINES,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``service`` and ``app`` on ``host:port`` until cancelled.

    ``announce`` gets the bound port once the server listens (the caller logs it as its own);
    ``before_stop`` runs as shutdown begins (the master ends its dashboard streams there, so
    they do not hold uvicorn's graceful shutdown up); ``deadlines`` are every connection's."""
    check_bind(host, token)
    sock = bind_socket(host, port)
    bound_port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        ws_max_size=MAX_WS_FRAME_BYTES,
        http=protocol_with(deadlines),
        # Past it, a request is answered 503 (keeper.httpapi.connection_deadlines).
        limit_concurrency=deadlines.max_connections,
    )
    server = _Server(config)
    server_done = anyio.Event()

    async def run_server() -> None:
        try:
            # Shielded: only should_exit stops it, so it always gets to close its connections.
            with anyio.CancelScope(shield=True):
                await server.serve(sockets=[sock])
        finally:
            server_done.set()

    try:
        async with anyio.create_task_group() as group:
            await group.start(service.run)
            group.start_soon(run_server)
            with anyio.fail_after(STARTUP_DEADLINE_S):
                while not server.started and not server_done.is_set():
                    await anyio.sleep(0.01)
            if not server.started:
                raise MasterStartError("the HTTP server stopped while starting")
            announce(bound_port)
            task_status.started(bound_port)
            try:
                await server_done.wait()
            finally:
                if before_stop is not None:
                    before_stop()
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(GRACEFUL_SHUTDOWN_S + 2):
                    await server_done.wait()
                group.cancel_scope.cancel()
    finally:
        sock.close()
