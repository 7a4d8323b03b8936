"""Running a master for real: uvicorn beside ``Master.run``, and the blocking CLI entry.

``serve`` binds the socket itself (so a port in use is a clear error, not uvicorn's
``sys.exit``, and ``port=0`` picks a free port whose number it reports through
``task_status``), starts the master, then uvicorn on that socket in the same event loop.
uvicorn needs asyncio, so ``run_master`` runs on anyio's asyncio backend; the master itself is
backend-neutral. Shutdown is graceful: uvicorn is told to exit (it is shielded from plain
cancellation so it can close connections, with ``GRACEFUL_SHUTDOWN_S`` to do it), dashboard
streams are ended first so they do not hold it up, then the master stops and writes a snapshot.
``run_master`` owns SIGINT/SIGTERM (uvicorn's own handlers are disabled) so both stop it cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable, Generator
from pathlib import Path

import anyio
import uvicorn
from anyio.abc import TaskStatus
from fastapi import FastAPI

from keeper.catalog import BUILTIN_MODEL_CARDS
from keeper.master.api import create_app
from keeper.master.auth import TOKEN_ENV, InsecureBindError, check_bind
from keeper.master.event_log import EventLogCorruptError
from keeper.master.model_cards import ModelCardError, load_model_cards, merge_catalogs
from keeper.master.service import Master, MasterConfig

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 52415  # exo's API port
# Long enough for in-flight requests to finish, short enough that Ctrl-C feels immediate.
GRACEFUL_SHUTDOWN_S = 3.0
# uvicorn starts in milliseconds; this only bounds a wait that should never be long.
STARTUP_DEADLINE_S = 30.0


class MasterStartError(Exception):
    """The master cannot start (address in use, bad data dir...); the message says why."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Signals are the caller's (run_master's) to handle; uvicorn's handlers would re-raise
        # them after shutdown and kill the process mid-cleanup.
        yield


def bind_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise MasterStartError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


AppFactory = Callable[[Master, str | None], FastAPI]


async def serve(
    master: Master,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    app_factory: AppFactory = create_app,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the master and its HTTP API until cancelled; reports the bound port when ready.

    ``app_factory`` builds the HTTP API (``master --exo-compat`` serves exo's instead)."""
    check_bind(host, token)
    sock = bind_socket(host, port)
    bound_port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        app_factory(master, token),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
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
            await group.start(master.run)
            group.start_soon(run_server)
            with anyio.fail_after(STARTUP_DEADLINE_S):
                while not server.started and not server_done.is_set():
                    await anyio.sleep(0.01)
            if not server.started:
                raise MasterStartError("the HTTP server stopped while starting")
            shown = f"[{host}]" if ":" in host else host
            log.info("exo-deploy master listening on http://%s:%d", shown, bound_port)
            task_status.started(bound_port)
            try:
                await server_done.wait()
            finally:
                master.end_streams()
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(GRACEFUL_SHUTDOWN_S + 2):
                    await server_done.wait()
                group.cancel_scope.cancel()
    finally:
        sock.close()


def run_master(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | None = None,
    token: str | None = None,
    model_cards_dir: Path | None = None,
) -> int:
    """``exo-deploy master``: serve until SIGINT/SIGTERM. Returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        port = _port_number(port)
        check_bind(host, token)
        cards = BUILTIN_MODEL_CARDS
        if model_cards_dir is not None:
            cards = merge_catalogs(cards, load_model_cards(Path(model_cards_dir)))
    except (InsecureBindError, ModelCardError, MasterStartError) as exc:
        print(f"exo-deploy master: {exc}", file=sys.stderr)
        return 2
    master = Master(data_dir, config=MasterConfig(model_cards=cards, log_io_in_thread=True))

    async def main() -> None:
        async with anyio.create_task_group() as group:

            async def stop_on_signal() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for received in signals:
                        log.info("%s: shutting down", signal.Signals(received).name)
                        group.cancel_scope.cancel()
                        return

            group.start_soon(stop_on_signal)
            await serve(master, host, port, token)
            group.cancel_scope.cancel()

    try:
        anyio.run(main, backend="asyncio")
    except Exception as exc:
        reason = _start_failure(exc)
        if reason is None:
            raise
        print(f"exo-deploy master: {reason}", file=sys.stderr)
        return 1
    return 0


def _port_number(port: int | str) -> int:
    # A caller passing argv straight through must get a message, not a TypeError from bind().
    try:
        number = int(port)
    except ValueError:
        raise MasterStartError(f"the port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise MasterStartError(f"the port must be between 0 and 65535, got {number}")
    return number


def _start_failure(exc: BaseException) -> BaseException | None:
    """The expected failure (bad address, damaged log, disk error) inside task-group wrapping."""
    if isinstance(exc, (MasterStartError, EventLogCorruptError, OSError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
            found = _start_failure(inner)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    return None
