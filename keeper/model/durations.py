"""An interval the way operators read one at a glance, as k9s shows ages: ``9s``, ``4m05s``,
``3h12m``, ``2d04h``.

One rule for every reader of a compact time: the TUI's ages and the broken-instance verdicts'
words (``keeper.model.instance_health``), which the TUI, ``GET /deployments`` and the webhooks
all show. It lives in the data model because the verdicts do; the TUI's ``format.duration`` is
this function.
"""

from __future__ import annotations

__all__ = ["compact_duration"]


def compact_duration(seconds: float) -> str:
    """Whole seconds under a minute, then minutes and seconds, hours and minutes, days and
    hours: two units at most, the second zero-padded. A negative interval (clocks that
    disagree) reads 0s."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    minutes, s = divmod(s, 60)
    if minutes < 60:
        return f"{minutes}m{s:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"
