"""``deploy --wait``, ``set --wait`` and ``scale --wait``: return when the deployment serves.

As ``kubectl rollout status``: after its one request, the command follows ``GET /deployments``
until the deployment is done (exit 0: serving with every replica ready and no rolling change
under way), cannot be done (exit 1: ``cant_place``, with the keeper's placement error, or the
deployment was deleted meanwhile), or ``--timeout`` passes (exit 1, saying what it is still
doing). A failed read ends it as any request does (3 unreachable, 1 refused). Each new state
it reads is said on stderr as it goes, so a script's stdout holds the answer and the result.

``judge`` is the rule, pure; ``wait_until_serving`` is the loop, on anyio's clock, so the
timeout also bounds a read that hangs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio

from keeper.cli.exits import EXIT_NOT_DONE, EXIT_OK
from keeper.model.api_models import DeploymentsResponse, DeploymentView
from keeper.runtime.arguments import positive_float

# How often the deployments are read again: a model loads in seconds to minutes, and one small
# GET a second is nothing to a master.
WAIT_POLL_S = 1.0


@dataclass(frozen=True)
class Outcome:
    """Where a deployment waited for stands: ``code`` is the exit code once settled, None while
    under way; ``words`` says it (the result, or what it is doing)."""

    code: int | None
    words: str


def judge(deployment_id: str, view: DeploymentView | None, note: str) -> Outcome:
    """The deployment's ``view`` (None: not listed) as a wait's outcome; ``note`` is the list's
    NOTE for it (the keeper's error, a rolling change, what it waits for)."""
    if view is None:
        return Outcome(EXIT_NOT_DONE, f"deployment {deployment_id} is gone (deleted)")
    ready = f"{view.ready_replicas}/{view.replicas} ready"
    if view.status == "cant_place":
        why = view.deployment.placement_error or note or "the keeper gives no reason"
        return Outcome(EXIT_NOT_DONE, f"deployment {deployment_id} cannot be placed: {why}")
    if view.status == "serving" and view.ready_replicas >= view.replicas and not view.updating:
        return Outcome(EXIT_OK, f"deployment {deployment_id} is serving ({ready})")
    return Outcome(None, f"{view.status}, {ready}" + (f": {note}" if note else ""))


async def wait_until_serving(
    deployment_id: str,
    read: Callable[[], Awaitable[DeploymentsResponse]],
    note: Callable[[DeploymentView], str],
    timeout_s: float | None,
    say: Callable[[str], None],
) -> Outcome:
    """Read the deployments until ``judge`` settles, or ``timeout_s`` (None: no limit) passes;
    ``say`` gets each new state under way."""
    doing = "not read yet"
    with anyio.move_on_after(timeout_s):
        while True:
            listed = await read()
            view = next(
                (v for v in listed.deployments if v.deployment.deployment_id == deployment_id),
                None,
            )
            outcome = judge(deployment_id, view, note(view) if view is not None else "")
            if outcome.code is not None:
                return outcome
            if outcome.words != doing:
                doing = outcome.words
                say(f"deployment {deployment_id}: {doing}")
            await anyio.sleep(WAIT_POLL_S)
    return Outcome(
        EXIT_NOT_DONE, f"deployment {deployment_id}: still {doing} after {timeout_s:g} s"
    )


def add_wait_options(parser: argparse.ArgumentParser) -> None:
    """``--wait`` and ``--timeout S``."""
    parser.add_argument(
        "--wait",
        action="store_true",
        help="return when it serves with every replica ready (exit 0), or when it cannot be "
        "placed (exit 1, the reason)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=None,
        metavar="S",
        help="with --wait: give up after S seconds (exit 1, saying what it is still doing); "
        "default: no limit",
    )


def say_on_stderr(words: str) -> None:
    print(words, file=sys.stderr, flush=True)
