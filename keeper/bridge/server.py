"""Running the bridge for real: its HTTP API under uvicorn beside ``Bridge.run``.

Run the way the master is (``keeper.httpapi.serving``, ``keeper.runtime.entry``): the socket is
bound first (a port in use is a clear error; ``port=0`` picks one and reports it through
``task_status``), the bridge starts, then uvicorn on that socket in the same event loop;
SIGINT/SIGTERM stop both cleanly and the log is closed with a snapshot. What is the bridge's own
is here: checking exo's URLs, exo's card files, and the exo clients' lifetime. Port 52416 by
default: beside exo's 52415 on the same machine.

``--exo`` takes one URL or several, comma-separated (``http://studio:52415,http://mini:52415``):
every exo node serves the API, so when the node in use leaves, the bridge follows the next one
that answers (``keeper.bridge.service``). A bad item is named in a usage error (exit code 2)
before anything starts.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import anyio
import httpx
from anyio.abc import TaskStatus

from keeper.bridge.api import create_bridge_app
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.exo_wire import camel_keys, file_card
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.httpapi.serving import DEFAULT_HOST, MasterStartError, serve_service, shown_host
from keeper.model.wire import JsonObject
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.entry import Serve, check_listen, load_catalog, run_service, service_token
from keeper.runtime.model_cards import ModelCardError
from keeper.runtime.webhooks import WebhookConfig, webhook_urls

log = logging.getLogger(__name__)

DEFAULT_PORT = 52416  # exo's API port + 1, so both fit on exo's master machine


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
            _followed(bridge),
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


def _followed(bridge: Bridge) -> str:
    first, *rest = (api.url for api in bridge.exo_apis)
    return f"{first} (then {', '.join(rest)})" if rest else first


def check_exo_url(url: str) -> str:
    """The exo URL without a trailing slash; MasterStartError if it is not http(s)://HOST."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise MasterStartError(f"--exo {url!r} is not a URL ({exc})") from None
    if parsed.scheme not in {"http", "https"} or not parsed.host:
        raise MasterStartError(f"--exo {url!r} is not exo's API URL (expected http://HOST:PORT)")
    return url.rstrip("/")


def check_exo_urls(urls: str | Sequence[str]) -> tuple[str, ...]:
    """``--exo URL[,URL...]`` as checked URLs, in order; MasterStartError naming the bad item."""
    items = [item.strip() for item in urls.split(",")] if isinstance(urls, str) else list(urls)
    if not any(items):
        raise MasterStartError("--exo: no URL given (expected http://HOST:PORT[,http://...])")
    checked: list[str] = []
    for position, item in enumerate(items, start=1):
        if not item:
            raise MasterStartError(
                f"--exo {','.join(items)!r}: item {position} is empty (a stray comma?)"
            )
        url = check_exo_url(item)
        if url in checked:
            raise MasterStartError(f"--exo lists {url} twice")
        checked.append(url)
    return tuple(checked)


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
    exo_url: str | Sequence[str],
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | None = None,
    token: str | None = None,
    model_cards_dir: Path | None = None,
    *,
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS,
    webhooks: Sequence[str] = (),
) -> int:
    """``exo-deploy bridge``: serve until SIGINT/SIGTERM. Returns the process exit code.

    ``exo_url`` is one URL, several comma-separated, or a sequence of them (in order)."""
    token = service_token(token)

    def prepare() -> Serve:
        # httpx logs every request at INFO: once a second for ever, drowning what matters.
        logging.getLogger("httpx").setLevel(logging.WARNING)
        urls = check_exo_urls(exo_url)
        bound_port = check_listen(host, port, token)
        cards = load_catalog(model_cards_dir)
        card_files = exo_card_files(model_cards_dir) if model_cards_dir is not None else {}
        if data_dir is None:
            log.warning("no --data-dir: deployments are kept in memory and lost when it stops")
        config = BridgeConfig(
            model_cards=cards,
            exo_card_files=card_files,
            max_deployments=max_deployments,
            metrics_in_thread=True,
            webhooks=WebhookConfig(urls=webhook_urls(webhooks)),
        )

        async def serve() -> None:
            clients = [ExoClient(url) for url in urls]
            try:
                bridge = Bridge(clients, data_dir, config=config)
                await serve_bridge(bridge, host, bound_port, token)
            finally:
                with anyio.CancelScope(shield=True):
                    for client in clients:
                        await client.aclose()

        return serve

    return run_service("bridge", prepare)
