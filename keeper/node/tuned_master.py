"""``exo-deploy master --node-timeout S --sweep-interval S``: a master with membership timings
other than exo's 30 s / 10 s.

A local cluster on one machine (the end-to-end test, a demo that should recover in seconds)
wants a dead node noticed sooner than a real cluster can afford. ``run_master`` serves exo's
defaults and takes no configuration, so this runs the same ``serve`` with a ``MasterConfig``
that differs only in those two timings; the keeper's own constants (SPEC §3) are untouched.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

import anyio

from keeper.catalog import BUILTIN_MODEL_CARDS
from keeper.master.auth import TOKEN_ENV, InsecureBindError, check_bind
from keeper.master.event_log import EventLogCorruptError
from keeper.master.model_cards import ModelCardError, load_model_cards, merge_catalogs
from keeper.master.server import MasterStartError, serve
from keeper.master.service import Master, MasterConfig

log = logging.getLogger(__name__)


def run_tuned_master(
    host: str,
    port: int,
    data_dir: Path | None,
    token: str | None,
    model_cards_dir: Path | None,
    *,
    node_timeout_s: float | None,
    sweep_interval_s: float | None,
) -> int:
    """Serve until SIGINT/SIGTERM, like ``run_master``. Returns the process exit code."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    token = token or os.environ.get(TOKEN_ENV) or None
    try:
        check_bind(host, token)
        cards = BUILTIN_MODEL_CARDS
        if model_cards_dir is not None:
            cards = merge_catalogs(cards, load_model_cards(model_cards_dir))
    except (InsecureBindError, ModelCardError) as exc:
        print(f"exo-deploy master: {exc}", file=sys.stderr)
        return 2
    config = MasterConfig(model_cards=cards)
    if node_timeout_s is not None:
        config = replace(config, node_timeout_s=node_timeout_s)
    if sweep_interval_s is not None:
        config = replace(config, sweep_interval_s=sweep_interval_s)
    log.info(
        "membership: node timeout %g s, sweep every %g s",
        config.node_timeout_s,
        config.sweep_interval_s,
    )
    master = Master(data_dir, config=config)

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

    failures: list[str] = []
    try:
        anyio.run(main, backend="asyncio")
    except* (MasterStartError, EventLogCorruptError, OSError) as errors:
        failures = [str(exc) for exc in errors.exceptions]
    for failure in failures:
        print(f"exo-deploy master: {failure}", file=sys.stderr)
    return 1 if failures else 0
