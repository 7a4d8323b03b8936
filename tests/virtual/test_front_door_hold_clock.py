"""A held chat ends at its hold on any clock: the last remainder of a hold can be smaller than
a large clock reading can grow by (docs/design.md §8.6)."""

from __future__ import annotations

import pytest

from keeper.runtime.front_door import FrontDoor, FrontDoorConfig, ModelDeployment, parse_chat

# Found by the rule's property tests: at 8.744... s a hold of this length leaves a remainder of
# 8.9e-16 s that adding to the clock does not change, one step short of the hold.
SINCE_S = 8.744202642574138
HOLD_S = 3.7442026425741384
# More waits than a hold of a few seconds at the recheck's half second could take: a loop that
# never ends is cut here instead of hanging the suite.
MOST_WAITS = 100


@pytest.mark.anyio
async def test_a_held_chat_ends_at_its_hold_on_a_clock_far_from_zero() -> None:
    now = [SINCE_S]
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        assert len(waits) < MOST_WAITS, f"held for ever: the last waits {waits[-3:]}"
        now[0] += seconds

    door = FrontDoor(
        lambda: [],
        lambda _model: ModelDeployment("d1", serving=False, words="placing"),
        lambda: now[0],
        sleep,
        config=FrontDoorConfig(hold_s=HOLD_S),
    )
    chat, body = parse_chat(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    status, _ = await door.answer(chat, body)
    assert status == 503
    assert now[0] - SINCE_S >= HOLD_S
