"""Running the bridge for real: its HTTP API under uvicorn beside ``Bridge.run``.

Run the way the master is (``keeper.master.serving``, ``keeper.master.entry``): the socket is
bound first (a port in use is a clear error; ``port=0`` picks one and reports it through
``task_status``), the bridge starts, then uvicorn on that socket in the same event loop;
SIGINT/SIGTERM stop both cleanly and the log is closed with a snapshot. What is the bridge's own
is here: checking exo's URL, exo's card files, and the exo client's lifetime. Port 52416 by
default: beside exo's 52415 on the same machine.
"""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import cast

import anyio
import httpx
from anyio.abc import TaskStatus

from keeper.bridge.api import create_bridge_app
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.exo_wire import JsonObject, camel_keys, file_card
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.master.entry import Serve, check_listen, load_catalog, run_service, service_token
from keeper.master.model_cards import ModelCardError
from keeper.master.serving import DEFAULT_HOST, MasterStartError, serve_service, shown_host

log = logging.getLogger(__name__)

DEFAULT_PORT = 52416  # exo's API port + 1, so both fit on exo's master machine
DEFAULT_EXO_URL = "http://127.0.0.1:52415"


async def serve_bridge(
    bridge: Bridge,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    *,
    task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the bridge and its HTTP API until cancelled; reports the bound port when ready."""

    def announce(bound_port: int) -> None:
        log.info(
            "exo-deploy bridge listening on http://%s:%d, following exo at %s",
            shown_host(host),
            bound_port,
            bridge.exo.url,
        )

    await serve_service(
        bridge,
        create_bridge_app(bridge, token),
        host,
        port,
        token,
        announce=announce,
        task_status=task_status,
    )


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
    """exo's card files in ``directory`` (already checked by ``load_model_cards``), each as
    exo's JSON spells the card exo loads from it (``file_card``), by model id."""
    found: dict[str, JsonObject] = {}
    for path in sorted(directory.glob("*.toml")):
        card = camel_keys(tomllib.loads(path.read_text(encoding="utf-8")))
        if isinstance(card, dict) and isinstance(card.get("modelId"), str):  # pyright: ignore[reportUnknownMemberType]
            try:
                full = file_card(cast(JsonObject, card))
            except ValueError as exc:
                raise ModelCardError(f"{path}: {exc}") from None
            found[full["modelId"]] = full
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
    token = service_token(token)

    def prepare() -> Serve:
        # httpx logs every request at INFO: once a second for ever, drowning what matters.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        url = check_exo_url(exo_url)
        bound_port = check_listen(host, port, token)
        cards = load_catalog(model_cards_dir)
        card_files = exo_card_files(model_cards_dir) if model_cards_dir is not None else {}
        if data_dir is None:
            log.warning("no --data-dir: deployments are kept in memory and lost when it stops")
        config = BridgeConfig(model_cards=cards, exo_card_files=card_files)

        async def serve() -> None:
            exo = ExoClient(url)
            try:
                await serve_bridge(Bridge(exo, data_dir, config=config), host, bound_port, token)
            finally:
                with anyio.CancelScope(shield=True):
                    await exo.aclose()

        return serve

    return run_service("bridge", prepare)
