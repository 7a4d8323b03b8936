"""Two calls at once, their exceptions raised as themselves.

anyio's task groups raise what their tasks raise wrapped in an ``ExceptionGroup``, even one
exception alone; a caller that catches by type (the bridge's tick catches the shared store's
``NotActingError`` and ``StoreError``) would no longer catch it. So both calls run to their end,
and the first exception either raised is raised as itself afterwards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


async def side_by_side(
    first: Callable[[], Awaitable[None]], second: Callable[[], Awaitable[None]]
) -> None:
    """Run both at once; once both ended, raise the first exception either raised, as itself
    (not in a group: the tick's callers catch the store's exceptions by type)."""
    raised: list[Exception] = []

    async def run(call: Callable[[], Awaitable[None]]) -> None:
        try:
            await call()
        except Exception as exc:
            raised.append(exc)

    async with anyio.create_task_group() as group:
        group.start_soon(run, first)
        await run(second)
    if raised:
        raise raised[0]
