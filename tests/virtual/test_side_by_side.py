"""``keeper.runtime.side_by_side``: two calls at once, an exception raised as itself."""

from __future__ import annotations

import anyio
import pytest

from keeper.runtime.side_by_side import side_by_side


class StoreLikeError(Exception):
    pass


@pytest.mark.anyio
async def test_both_run_at_once_and_an_exception_comes_out_as_itself() -> None:
    ended: list[str] = []

    async def slow() -> None:
        await anyio.sleep(2.0)
        ended.append("slow")

    async def failing() -> None:
        await anyio.sleep(1.0)
        ended.append("failing")
        raise StoreLikeError("not acting")

    started = anyio.current_time()
    with pytest.raises(StoreLikeError, match="not acting"):  # not an ExceptionGroup
        await side_by_side(slow, failing)
    assert ended == ["failing", "slow"]  # the other ran to its end
    assert anyio.current_time() - started == pytest.approx(2.0, abs=0.01)  # at once, not 3 s
    with pytest.raises(StoreLikeError):
        await side_by_side(failing, slow)
