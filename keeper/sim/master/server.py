"""Running a master for real: its HTTP API under uvicorn beside ``Master.run``, and the blocking
``exo-deploy master`` entry.

``serve`` is ``keeper.httpapi.serving.serve_service`` for a master: the API it is given (ours by
default), the dashboard streams ended first on shutdown so they do not hold it up, then the
master stops and writes a snapshot. ``run_master`` is the process around it
(``keeper.runtime.entry``: checks, logging, SIGINT/SIGTERM, exit codes), with the few settings a
command line may change: exo's membership timings, the front door's hold, continuations and
bound, and which API is served (a ``MasterApp``:
ours, or the exo stand-in's, which ``keeper.sim.exo_standin`` builds on this master and hands in, so
the master never imports the layer above it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import anyio
from anyio.abc import TaskStatus
from fastapi import FastAPI

from keeper.httpapi.serving import DEFAULT_HOST, serve_service, shown_host
from keeper.model.liveness import OFF, LivenessConfig
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.runtime.entry import Serve, check_listen, load_catalog, run_service, service_token
from keeper.runtime.front_door import FrontDoorConfig
from keeper.runtime.webhooks import WebhookConfig, webhook_urls
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig

log = logging.getLogger(__name__)

DEFAULT_PORT = 52415  # exo's API port

AppFactory = Callable[[Master, str | None], FastAPI]


@dataclass(frozen=True)
class MasterApp:
    """An HTTP API a master process serves, and what the master runs beneath it."""

    factory: AppFactory
    # The stand-in for a stock exo runs no keeper: deployments belong to a bridge beside it.
    keeper_enabled: bool = True
    # The stand-in routes and ends chats as a stock exo does (``MasterConfig.exo_chats``).
    exo_chats: bool = False
    # A line logged at start, saying what is served when it is not our own API.
    banner: str | None = None


OUR_API = MasterApp(create_app)


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

    def announce(bound_port: int) -> None:
        log.info("exo-deploy master listening on http://%s:%d", shown_host(host), bound_port)

    await serve_service(
        master,
        app_factory(master, token),
        host,
        port,
        token,
        announce=announce,
        before_stop=master.end_streams,
        task_status=task_status,
    )


def run_master(
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    data_dir: Path | None = None,
    token: str | None = None,
    model_cards_dir: Path | None = None,
    *,
    node_timeout_s: float | None = None,
    sweep_interval_s: float | None = None,
    liveness: LivenessConfig | None = None,
    max_deployments: int = DEFAULT_MAX_DEPLOYMENTS,
    app: MasterApp = OUR_API,
    webhooks: Sequence[str] = (),
    front_door: FrontDoorConfig | None = None,
) -> int:
    """``exo-deploy master``: serve until SIGINT/SIGTERM. Returns the process exit code.

    ``node_timeout_s`` and ``sweep_interval_s`` replace exo's 30 s / 10 s (a cluster on one
    machine wants a dead node noticed sooner; the keeper's own constants are untouched).
    ``app`` is the API to serve: ours, or ``keeper.sim.exo_standin.STANDIN_API``. ``webhooks``
    (``--webhook``) are joined by those of ``EXO_DEPLOY_WEBHOOKS``; a bad one exits 2.
    ``liveness`` is ``--suspect-after-s`` / ``--dead-after-s`` (docs/design.md §5.18; the
    defaults 3 / 8 when not given, fast failover on). ``front_door`` is ``--hold-s``,
    ``--migrations`` and ``--max-inflight`` (docs/design.md §8.6; our API only)."""
    token = service_token(token)

    def prepare() -> Serve:
        bound_port = check_listen(host, port, token)
        config = MasterConfig(
            model_cards=load_catalog(model_cards_dir),
            log_io_in_thread=True,
            metrics_in_thread=True,
            keeper_enabled=app.keeper_enabled,
            exo_chats=app.exo_chats,
            max_deployments=max_deployments,
            webhooks=WebhookConfig(urls=webhook_urls(webhooks)),
            # The stand-in for a stock exo keeps exo's rules only: fast failover is ours.
            liveness=(liveness or LivenessConfig()) if app.keeper_enabled else OFF,
            front_door=front_door if front_door is not None else FrontDoorConfig(),
        )
        if node_timeout_s is not None:
            config = replace(config, node_timeout_s=node_timeout_s)
        if sweep_interval_s is not None:
            config = replace(config, sweep_interval_s=sweep_interval_s)
        if node_timeout_s is not None or sweep_interval_s is not None:
            log.info(
                "membership: node timeout %g s, sweep every %g s",
                config.node_timeout_s,
                config.sweep_interval_s,
            )
        master = Master(data_dir, config=config)
        if app.banner is not None:
            log.info("%s", app.banner)

        async def serve_master() -> None:
            await serve(master, host, bound_port, token, app_factory=app.factory)

        return serve_master

    return run_service("master", prepare)
