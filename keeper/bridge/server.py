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
import socket
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import anyio
import httpx
from anyio.abc import TaskStatus

from keeper.bridge.api import create_bridge_app
from keeper.bridge.etcd_access import StoreAccessOptions, load_access
from keeper.bridge.etcd_store import (
    DEFAULT_LEASE_S,
    DEFAULT_PREFIX,
    EtcdStore,
    check_prefix,
    parse_store_url,
)
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.exo_urls import check_exo_urls
from keeper.bridge.exo_wire import camel_keys, file_card
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.httpapi.serving import DEFAULT_HOST, serve_service, shown_host
from keeper.model.liveness import LivenessConfig
from keeper.model.wire import JsonObject
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.entry import Serve, check_listen, load_catalog, run_service, service_token
from keeper.runtime.front_door import FrontDoorConfig
from keeper.runtime.model_cards import ModelCardError
from keeper.runtime.starting import MasterStartError
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
    liveness: LivenessConfig | None = None,
    front_door: FrontDoorConfig | None = None,
    store: str | None = None,
    name: str | None = None,
    lease_s: float = DEFAULT_LEASE_S,
    store_prefix: str = DEFAULT_PREFIX,
    store_access: StoreAccessOptions | None = None,
) -> int:
    """``exo-deploy bridge``: serve until SIGINT/SIGTERM. Returns the process exit code.

    ``exo_url`` is one URL, several comma-separated, or a sequence of them (in order).
    ``store`` (``etcd://HOST:PORT[,...]``) keeps the records in etcd instead of ``data_dir``,
    shared by every bridge of the exo cluster, one of them acting (``keeper.bridge.etcd_store``);
    ``name`` is this bridge's name there (default ``HOSTNAME:PORT``); ``store_access`` the TLS
    files and etcd's user (``keeper.bridge.etcd_access``); ``front_door`` the chats' hold,
    continuations and bound (``keeper.runtime.front_door``)."""
    token = service_token(token)

    def prepare() -> Serve:
        urls = check_exo_urls(exo_url)
        bound_port = check_listen(host, port, token)
        cards = load_catalog(model_cards_dir)
        card_files = exo_card_files(model_cards_dir) if model_cards_dir is not None else {}
        shared = (
            _open_store(
                store,
                name,
                bound_port,
                lease_s,
                store_prefix,
                data_dir,
                urls,
                store_access or StoreAccessOptions(),
            )
            if store is not None
            else None
        )
        if data_dir is None and shared is None:
            log.warning("no --data-dir: deployments are kept in memory and lost when it stops")
        config = BridgeConfig(
            model_cards=cards,
            exo_card_files=card_files,
            max_deployments=max_deployments,
            metrics_in_thread=True,
            webhooks=WebhookConfig(urls=webhook_urls(webhooks)),
            liveness=liveness if liveness is not None else LivenessConfig(),
            front_door=front_door if front_door is not None else FrontDoorConfig(),
        )

        async def serve() -> None:
            clients = [ExoClient(url) for url in urls]
            try:
                bridge = Bridge(
                    clients,
                    data_dir,
                    config=config,
                    store=shared,
                    name=shared.name
                    if shared is not None
                    else f"{socket.gethostname()}:{bound_port}",
                )
                await serve_bridge(bridge, host, bound_port, token)
            finally:
                with anyio.CancelScope(shield=True):
                    for client in clients:
                        await client.aclose()

        return serve

    return run_service("bridge", prepare)


# The shortest lease etcd grants with its default election timeout (1 s) is about 2 s; shorter
# ones would also leave no room between renewals.
MIN_LEASE_S = 1.0


def _open_store(
    url: str,
    name: str | None,
    port: int,
    lease_s: float,
    prefix: str,
    data_dir: Path | None,
    exo_urls: Sequence[str],
    access: StoreAccessOptions,
) -> EtcdStore:
    """The shared store, read up to date; MasterStartError (exit 2) for what cannot work: a bad
    URL or prefix, ``--data-dir`` beside it, a bad TLS or password file, etcd unreachable or
    refusing this bridge's certificate or password, a prefix of another exo cluster."""
    if data_dir is not None:
        raise MasterStartError("--store and --data-dir: give one (--store keeps everything)")
    if lease_s < MIN_LEASE_S:
        raise MasterStartError(f"--lease-s {lease_s:g}: at least {MIN_LEASE_S:g} s")
    address = parse_store_url(url)
    store = EtcdStore(
        address,
        name or f"{socket.gethostname()}:{port}",
        prefix=check_prefix(prefix),
        lease_s=lease_s,
        access=load_access(address, access),
    )
    store.open(_exo_nodes(exo_urls))
    return store


def _exo_nodes(exo_urls: Sequence[str]) -> list[str]:
    """exo's node ids, from the first URL that answers ``GET /state`` now; none if none does
    (then the bridge checks at its first read of exo's State)."""
    for url in exo_urls:
        try:
            answer = httpx.get(f"{url}/state", timeout=2.0, trust_env=False)
            nodes: Any = answer.json()["topology"]["nodes"]
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            continue
        if isinstance(nodes, list):
            return [str(node) for node in cast(list[Any], nodes)]
    return []
