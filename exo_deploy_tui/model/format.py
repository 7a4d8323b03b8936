"""How values read on screen: durations, sizes, rates, short ids, times of day, status labels.

Pure functions with no Textual import, shared by the model (timeline text), the widgets (cells)
and the describe screen, so one deployment reads the same everywhere and tests can pin the text.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Final

from keeper.model.api_models import DeploymentStatus

# A compact age (9s, 4m05s, 3h12m, 2d04h): the data model's rule, which the verdicts' words use too.
from keeper.model.durations import compact_duration as duration

# Every status has a word and a symbol as well as a colour, so it reads in 16 colours, with
# NO_COLOR and to colour-blind operators. The symbols are in every common terminal font.
STATUS_SYMBOL: Final[dict[DeploymentStatus, str]] = {
    "serving": "●",
    "starting": "◐",
    "placing": "○",
    "cant_place": "✖",
}
# Named ANSI colours (not RGB), so a 16-colour terminal shows them as they were meant.
STATUS_COLOR: Final[dict[DeploymentStatus, str]] = {
    "serving": "green",
    "starting": "yellow",
    "placing": "cyan",
    "cant_place": "red",
}
# Broken first: the order of "sort by status", which puts what needs attention on top.
STATUS_ORDER: Final[dict[DeploymentStatus, int]] = {
    "cant_place": 0,
    "placing": 1,
    "starting": 2,
    "serving": 3,
}

# exo node ids are libp2p peer ids that all start with this; the part after it tells them apart.
_PEER_ID_PREFIX: Final = "12D3KooW"
# Long enough to be unique in any one cluster, short enough for an 80-column table.
SHORT_ID_LEN: Final = 8


def status_label(status: DeploymentStatus) -> str:
    return f"{STATUS_SYMBOL[status]} {status}"


def short_id(identifier: str | None) -> str:
    if not identifier:
        return "-"
    if identifier.startswith(_PEER_ID_PREFIX) and len(identifier) > len(_PEER_ID_PREFIX):
        identifier = identifier[len(_PEER_ID_PREFIX) :]
    return identifier[:SHORT_ID_LEN]


def short_model(model_id: str) -> str:
    """``mlx-community/Qwen3-0.6B-4bit`` -> ``Qwen3-0.6B-4bit``: the organisation is noise."""
    return model_id.rsplit("/", 1)[-1]


def precise_duration(seconds: float) -> str:
    """A measured interval, to a tenth of a second under a minute: ``37.2 s``."""
    if seconds < 60:
        return f"{max(0.0, seconds):.1f} s"
    return duration(seconds)


def gigabytes(in_bytes: int) -> str:
    gb = in_bytes / 1024**3
    return f"{gb:.0f}G" if gb >= 100 else f"{gb:.1f}G"


# Sizes and rates count as the rest of the dashboard does (and as exo's Memory does): a GB is
# 1024**3 bytes, a MB 1024**2, so a download's total reads as the model's size in describe.
_GB: Final = 1024**3
_MB: Final = 1024**2


def size_gb(in_bytes: int) -> str:
    """A download's size, to a tenth of a GB: ``17.0 GB``."""
    return f"{in_bytes / _GB:.1f} GB"


def sizes_gb(part: int, whole: int) -> str:
    """How much of a whole, in one unit: ``7.3/17.0 GB``."""
    return f"{part / _GB:.1f}/{whole / _GB:.1f} GB"


def rate(bytes_per_s: float) -> str:
    """A download's speed in whole MB per second: ``210 MB/s``."""
    return f"{max(0.0, bytes_per_s) / _MB:.0f} MB/s"


def part_duration(seconds: float) -> str:
    """One part of a measured interval, as precise as its size warrants: ``0.01 s`` under a
    second, ``3.2 s`` under ten, ``31 s`` under a minute, then as ``duration``."""
    s = max(0.0, seconds)
    if s < 1:
        return f"{s:.2f} s"
    if s < 10:
        return f"{s:.1f} s"
    if s < 60:
        return f"{s:.0f} s"
    return duration(s)


_SPARKS: Final = "▁▂▃▄▅▆▇█"


def sparkline(fractions: Sequence[float]) -> str:
    """One block per reading, its height the fraction (0-1) of the whole it was: a GPU busy
    62 % of the time draws ``▅``. Absolute, not scaled to the readings, so an idle node's line
    stays flat and low rather than magnifying noise."""
    top = len(_SPARKS) - 1
    return "".join(_SPARKS[round(max(0.0, min(1.0, f)) * top)] for f in fractions)


def clock_time(epoch_s: float) -> str:
    """Local time of day, as the operator's own clock shows it."""
    return time.strftime("%H:%M:%S", time.localtime(epoch_s))


def clock_minute(epoch_s: float) -> str:
    """Local hour and minute, for a time that needs no seconds ("complete from 11:02")."""
    return time.strftime("%H:%M", time.localtime(epoch_s))


# Below a tenth of a percent's rounding noise: 0.992 is 991.9999... thousandths in floats.
_FLOAT_SLACK: Final = 1e-9


def percent_available(fraction: float | None) -> str:
    """``99.2%``: to a tenth of a percent, rounded down so that only a deployment that never
    stopped reads ``100%``; ``—`` when nothing is known."""
    if fraction is None:
        return "—"
    if fraction >= 1.0:
        return "100%"
    tenths = math.floor(max(0.0, fraction) * 1000 + _FLOAT_SLACK)
    return f"{tenths / 10:.1f}%"


def truncate(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"
