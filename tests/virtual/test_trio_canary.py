"""Canary for the private trio names the replayable virtual soak leans on.

``keeper.sim.soak.virtual.deterministic`` seeds ``trio._core._run._r`` and throws
``trio._core._run._ALLOW_DETERMINISTIC_SCHEDULING``, trio's own switch for replayable runs,
because trio offers no public way yet (https://github.com/python-trio/trio/issues/2675). If
trio moves either, ``deterministic`` quietly seeds nothing and soak-sim runs stop replaying:
these tests fail first, naming what to re-check.
"""

from __future__ import annotations

import importlib
import random
from importlib.metadata import version

import trio

from keeper.sim.soak.virtual import deterministic

RECHECK = (
    "trio {version} moved a private name keeper.sim.soak.virtual.deterministic uses; re-check "
    "trio._core._run (the batch shuffle in the run loop) and "
    "https://github.com/python-trio/trio/issues/2675 for a public way, then update "
    "deterministic() and the trio bound in pyproject.toml"
)


def test_trios_deterministic_scheduling_names_are_where_we_use_them() -> None:
    run_module = importlib.import_module("trio._core._run")
    message = RECHECK.format(version=version("trio"))
    assert isinstance(getattr(run_module, "_r", None), random.Random), message
    assert isinstance(getattr(run_module, "_ALLOW_DETERMINISTIC_SCHEDULING", None), bool), message


def test_deterministic_throws_the_switch_and_puts_it_back() -> None:
    run_module = importlib.import_module("trio._core._run")
    before = run_module._ALLOW_DETERMINISTIC_SCHEDULING
    with deterministic(1):
        assert run_module._ALLOW_DETERMINISTIC_SCHEDULING is True
    assert run_module._ALLOW_DETERMINISTIC_SCHEDULING is before


def _scheduling_order(seed: int) -> list[int]:
    """The order in which a batch of tasks, all ready at once, get to run under ``seed``."""

    async def main() -> list[int]:
        order: list[int] = []

        async def task(number: int) -> None:
            await trio.lowlevel.checkpoint()
            order.append(number)

        async with trio.open_nursery() as nursery:
            for number in range(20):
                nursery.start_soon(task, number)
        return order

    with deterministic(seed):
        return trio.run(main)


def test_a_seed_fixes_the_order_of_ready_tasks() -> None:
    message = RECHECK.format(version=version("trio"))
    assert _scheduling_order(5) == _scheduling_order(5), message
    # And the seed is what decides it (two fixed seeds, so this cannot flake).
    assert _scheduling_order(5) != _scheduling_order(6), message
