"""Running the bridge for real: its HTTP API under uvicorn beside ``Bridge.run``.

The same shape as ``keeper.master.server``: the socket is bound first (a port in use is a clear
error; ``port=0`` picks one and reports it through ``task_status``), the bridge starts, then
uvicorn on that socket in the same event loop; SIGINT/SIGTERM stop both cleanly and the log is
closed with a snapshot. Port 52416 by default: beside exo's 52415 on the same machine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Generator
from pathlib import Path
from typing import cast

import anyio
import httpx
import uvicorn
from anyio.abc import TaskStatus

from keeper.bridge.api import create_bridge_app
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.exo_wire import JsonObject, camel_keys
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.catalog import BUILTIN_MODEL_CARDS
from keeper.master.auth import TOKEN_ENV, InsecureBindError, check_bind
from keeper.master.event_log import EventLogCorruptError
from keeper.master.model_cards import ModelCardError, load_model_cards, merge_catalogs
from keeper.master.server import (
    GRACEFUL_SHUTDOWN_S,
    STARTUP_DEADLINE_S,
    MasterStartError,
    bind_socket,
)

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 52416  # exo's API port + 1, so both fit on exo's master machine
DEFAULT_EXO_URL = "http://127.0.0.1:52415"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # Signals are run_bridge's to handle (see keeper.master.server).
        yield


async def serve_bridge(
    bridge: Bridge,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the bridge and its HTTP API until cancelled; reports the bound port when ready."""
    check_bind(host, token)
    sock = bind_socket(host, port)
    bound_port: int = sock.getsockname()[1]
    config = uvicorn.Config(
        create_bridge_app(bridge, token),
        lifespan="off",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
    )
    server = _Server(config)
    server_done = anyio.Event()

    async def run_server() -> None:
        try:
            with anyio.CancelScope(shield=True):
                await server.serve(sockets=[sock])
        finally:
            server_done.set()

    try:
        async with anyio.create_task_group() as group:
            await group.start(bridge.run)
            group.start_soon(run_server)
            with anyio.fail_after(STARTUP_DEADLINE_S):
                while not server.started and not server_done.is_set():
                    await anyio.sleep(0.01)
            if not server.started:
                raise MasterStartError("the HTTP server stopped while starting")
            shown = f"[{host}]" if ":" in host else host
            log.info(
                "exo-deploy bridge listening on http://%s:%d, following exo at %s",
                shown,
                bound_port,
                bridge.exo.url,
            )
            task_status.started(bound_port)
            try:
                await server_done.wait()
            finally:
                server.should_exit = True
                with anyio.CancelScope(shield=True), anyio.move_on_after(GRACEFUL_SHUTDOWN_S + 2):
                    await server_done.wait()
                group.cancel_scope.cancel()
    finally:
        sock.close()


def check_exo_url(url: str) -> str:
    """The exo URL without a trailing slash; MasterStartError if it is not http(s)://HOST."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise MasterStartError(f"--exo {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise MasterStartError(f"--exo {url!r} is not exo's API URL (expected http://HOST:PORT)")
    return url.rstrip("/")


def exo_card_files(directory: Path) -> dict[str, JsonObject]:
    """exo's card files in ``directory`` (already checked by ``load_model_cards``), as exo's
    JSON spells a card, by model id."""
    found: dict[str, JsonObject] = {}
    for path in sorted(directory.glob("*.toml")):
        card = camel_keys(tomllib.loads(path.read_text(encoding="utf-8")))
        if isinstance(card, dict) and isinstance(card.get("modelId"), str):  # pyright: ignore[reportUnknownMemberType]
            typed = cast(JsonObject, card)
            found[typed["modelId"]] = typed
    return found


def run_bridge(
    exo_url: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | None = None,
    token: str | None = None,
    model_cards_dir: Path | None = None,
) -> int:
    """``exo-deploy bridge``: serve until SIGINT/SIGTERM. Returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every request at INFO: once a second for ever, drowning what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        exo_url = check_exo_url(exo_url)
        check_bind(host, token)
        cards = BUILTIN_MODEL_CARDS
        card_files: dict[str, JsonObject] = {}
        if model_cards_dir is not None:
            cards = merge_catalogs(cards, load_model_cards(model_cards_dir))
            card_files = exo_card_files(model_cards_dir)
    except (InsecureBindError, ModelCardError, MasterStartError) as exc:
        print(f"exo-deploy bridge: {exc}", file=sys.stderr)
        return 2
    if data_dir is None:
        log.warning("no --data-dir: deployments are kept in memory and lost when it stops")

    async def main() -> None:
        exo = ExoClient(exo_url)
        config = BridgeConfig(model_cards=cards, exo_card_files=card_files)
        bridge = Bridge(exo, data_dir, config=config)
        try:
            async with anyio.create_task_group() as group:

                async def stop_on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for received in signals:
                            log.info("%s: shutting down", signal.Signals(received).name)
                            group.cancel_scope.cancel()
                            return

                group.start_soon(stop_on_signal)
                await serve_bridge(bridge, host, port, token)
                group.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await exo.aclose()

    failures: list[str] = []
    try:
        anyio.run(main, backend="asyncio")
    except* (MasterStartError, EventLogCorruptError, OSError) as errors:
        failures = [str(exc) for exc in errors.exceptions]
    for failure in failures:
        print(f"exo-deploy bridge: {failure}", file=sys.stderr)
    return 1 if failures else 0
