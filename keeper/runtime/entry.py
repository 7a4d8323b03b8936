"""The blocking process entry shared by ``exo-deploy master`` (and its ``--exo-compat``
stand-in) and ``exo-deploy bridge``.

Each command differs only in what it checks and what it serves, so those come in as
``prepare``; everything around them is the same and lives here once: logging, the usage errors
that exit 2 with one line on stderr, SIGINT/SIGTERM as a clean stop, anyio's asyncio backend
(uvicorn needs it), and the failures that exit 1 with their reason (an address in use, a damaged
event log, a disk error) however deep in task groups they were raised. The soak's commands run
their own event loop the same way, so ``run_until_signal`` and ``expected_failure`` are public.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio

from keeper.model.catalog import BUILTIN_MODEL_CARDS
from keeper.model.constants import TOKEN_ENV
from keeper.model.state import ModelCard
from keeper.runtime.dir_lock import DataDirInUseError
from keeper.runtime.event_log import EventLogCorruptError
from keeper.runtime.model_cards import ModelCardError, load_model_cards, merge_catalogs
from keeper.runtime.process_exit import EXIT_FAILED, EXIT_STOPPED
from keeper.runtime.starting import InsecureBindError, MasterStartError, check_bind

log = logging.getLogger(__name__)

# The usage exit code, beside 0 and 1 (``keeper.runtime.process_exit``): the same contract as the
# rest of ``exo-deploy`` (see keeper.cli).
EXIT_USAGE = 2  # the arguments cannot work (public address without a token, bad card file...)

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# Raised by ``prepare`` when the arguments cannot work: exit 2 before anything starts.
USAGE_ERRORS = (InsecureBindError, ModelCardError, MasterStartError)
# Raised while running when the service cannot go on; anything else is a bug with its trace.
RUN_FAILURES = (MasterStartError, EventLogCorruptError, OSError)

Serve = Callable[[], Awaitable[None]]
T = TypeVar("T")


def service_token(token: str | None) -> str | None:
    """The bearer token given, else the one in the environment; None for none (an empty one)."""
    return token or os.environ.get(TOKEN_ENV) or None


def check_listen(host: str, port: int | str, token: str | None) -> int:
    """The port as a number, after checking it and that ``host`` may be served with ``token``."""
    number = _port_number(port)
    check_bind(host, token)
    return number


def load_catalog(model_cards_dir: Path | None) -> tuple[ModelCard, ...]:
    """The built-in model cards, with those of the folder's exo card files over them."""
    if model_cards_dir is None:
        return BUILTIN_MODEL_CARDS
    return merge_catalogs(BUILTIN_MODEL_CARDS, load_model_cards(Path(model_cards_dir)))


def run_service(command: str, prepare: Callable[[], Serve]) -> int:
    """Check and build with ``prepare``, then run what it returns until SIGINT/SIGTERM.

    Returns the process exit code; ``command`` names the process in its messages
    (``exo-deploy master: ...``)."""
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        serve = prepare()
    except USAGE_ERRORS as exc:
        print(f"exo-deploy {command}: {exc}", file=sys.stderr)
        return EXIT_USAGE

    def on_signal(name: str) -> None:
        log.info("%s: shutting down", name)

    try:
        run_until_signal(serve, on_signal, backend="asyncio")
    except Exception as exc:
        in_use = expected_failure(exc, (DataDirInUseError,))
        if in_use is not None:  # another process owns the data dir: the arguments cannot work
            print(f"exo-deploy {command}: {in_use}", file=sys.stderr)
            return EXIT_USAGE
        failure = expected_failure(exc, RUN_FAILURES)
        if failure is None:
            raise
        print(f"exo-deploy {command}: {failure}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_STOPPED


def run_until_signal(
    main: Callable[[], Awaitable[T]], on_signal: Callable[[str], None], **run_options: Any
) -> T | None:
    """Run ``main`` in a new event loop (``run_options`` go to ``anyio.run``) until it returns
    or SIGINT/SIGTERM cancels it; ``on_signal`` hears the signal's name. None when cancelled."""
    result: list[T] = []

    async def until_signal() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(_cancel_on_signal, group.cancel_scope, on_signal)
            result.append(await main())
            group.cancel_scope.cancel()

    anyio.run(until_signal, **run_options)
    return result[0] if result else None


def expected_failure(
    exc: BaseException, kinds: tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of ``kinds`` in ``exc``, however deep in task-group wrapping."""
    if isinstance(exc, kinds):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
            found = expected_failure(inner, kinds)  # pyright: ignore[reportUnknownArgumentType]
            if found is not None:
                return found
    return None


async def _cancel_on_signal(scope: anyio.CancelScope, on_signal: Callable[[str], None]) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for received in signals:
            on_signal(signal.Signals(received).name)
            scope.cancel()
            return


def _port_number(port: int | str) -> int:
    # A caller passing argv straight through must get a message, not a TypeError from bind().
    try:
        number = int(port)
    except ValueError:
        raise MasterStartError(f"the port must be a number, got {port!r}") from None
    if not 0 <= number <= 65535:
        raise MasterStartError(f"the port must be between 0 and 65535, got {number}")
    return number
