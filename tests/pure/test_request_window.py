"""A deployment's recent chats summed (``keeper.model.request_window``): over the last five
minutes, or over the time its service has counted when that is shorter (never under ten
seconds), so a new service's rate is not read low."""

from __future__ import annotations

import pytest

from keeper.model.request_window import (
    MIN_RATE_SPAN_S,
    WINDOW_S,
    EndedRequest,
    requests_view,
)

T = 10_000.0


def chats(n: int, over_s: float) -> list[EndedRequest]:
    """``n`` chats ended evenly over the last ``over_s`` before T."""
    return [EndedRequest(T - over_s + (i + 1) * over_s / n, "ok", 0.2) for i in range(n)]


def test_the_last_window_summed() -> None:
    view = requests_view([*chats(600, WINDOW_S), EndedRequest(T - WINDOW_S, "failed", None)], T)
    assert view is not None
    assert view.window_s == WINDOW_S and view.rate == pytest.approx(2.0)  # the old one is out
    assert view.errors == 0 and view.outcomes == {"ok": 600}
    assert requests_view([], T) is None


def test_a_service_counting_for_a_minute_has_its_rate_over_that_minute() -> None:
    minute = chats(120, 60.0)
    view = requests_view(minute, T, counted_s=60.0)
    assert view is not None
    assert view.window_s == 60.0 and view.rate == pytest.approx(2.0)  # not 120 / 300
    # longer than the window: the window
    longer = requests_view(minute, T, counted_s=WINDOW_S + 1)
    assert longer is not None and longer.window_s == WINDOW_S
    # just started: its first chats are no burst
    first = requests_view(chats(3, 1.0), T, counted_s=1.0)
    assert first is not None
    assert first.window_s == MIN_RATE_SPAN_S and first.rate == pytest.approx(0.3)
