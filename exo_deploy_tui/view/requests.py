"""A deployment's chats through the service's front door, in the dashboard's words: the REQ/S
and ERR cells of the deployments table and describe's ``chats`` lines (docs/design.md §8.6,
§9.7).

The service sums the chats (``keeper.model.request_window``: the last five minutes' rate,
failures, outcomes and 95th percentile of time to first token); this module only words the
sum, apart from ``cells.py`` so the table's two cells and describe's lines share one rate and
one set of outcome words. A deployment with no sum (none ended in the window, or a service
without a front door: our master before it has one, a stock exo) reads ``—``, as AVAIL does
without records: nothing known, not zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType

from rich.text import Text

from exo_deploy_tui.model.format import duration
from keeper.model.api_models import RequestsView
from keeper.model.request_rule import OUTCOMES, Outcome
from keeper.model.request_window import WINDOW_S

NONE_MARK = "—"
DIM = "dim"
# Failed chats: clients got an error, the error colour; held, retried and continued ones were
# answered late or after a cut, a caution.
ERROR_STYLE = "bold red"
CAUTION_STYLE = "yellow"
# Below this many per second a rate would read ``0.0`` though chats came (fewer than 15 in
# five minutes): it reads ``<0.1`` instead, and describe gives the count.
RATE_SHOWN_FROM = 0.05
# From here a rate is a whole number (``12``): a tenth no longer matters, and the column has
# four characters.
RATE_WHOLE_FROM = 9.95
# From here a count is in thousands (``12k``), to keep within ERR's three characters.
THOUSANDS_FROM = 1000
# The outcomes describe always counts, zero included: a zero there is news at 3 a.m. ("0
# failed"). The others (sent again, client left, refused at the door) only when they happened.
ALWAYS_COUNTED: tuple[Outcome, ...] = ("ok", "held", "migrated", "failed")
# What each outcome other than ``ok`` means, said under the counts of those that happened.
MEANING: Mapping[Outcome, str] = MappingProxyType(
    {
        "held": "waited for it to serve, then answered",
        "retried": "sent again before its first token",
        "migrated": "cut mid-answer, then continued",
        "failed": "the client got an error",
        "cancelled": "the client left",
        "rejected": "refused at the door (a bad request, or too many at once)",
    }
)


def rate_text(rate: float) -> str:
    """Chats per second in at most four characters: ``12``, ``0.4``, ``<0.1``, ``12k``."""
    if rate < RATE_SHOWN_FROM:
        return "<0.1"
    if rate < RATE_WHOLE_FROM:
        return f"{rate:.1f}"
    return _count(round(rate))


def _count(value: int) -> str:
    return str(value) if value < THOUSANDS_FROM else f"{value // THOUSANDS_FROM}k"


def rate_cell(requests: RequestsView | None) -> tuple[str, str]:
    """REQ/S: the window's rate; a dim ``—`` with no sum."""
    if requests is None:
        return NONE_MARK, DIM
    return rate_text(requests.rate), ""


def errors_cell(requests: RequestsView | None) -> tuple[str, str]:
    """ERR: the chats that failed in the window, in the error colour; ``0`` dim; ``—`` with
    no sum."""
    if requests is None:
        return NONE_MARK, DIM
    if requests.errors == 0:
        return "0", DIM
    return _count(requests.errors), ERROR_STYLE


def window_text(seconds: float) -> str:
    """The service's window: ``5 min``; one of no whole minutes as a duration."""
    minutes, rest = divmod(seconds, 60)
    return f"{minutes:.0f} min" if minutes and not rest else duration(seconds)


def seconds_text(seconds: float) -> str:
    """A time to first token: ``0.42 s``, ``12.3 s``, ``2m05s``."""
    if seconds < 10:
        return f"{seconds:.2f} s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    return duration(seconds)


def _outcome_style(outcome: Outcome, count: int) -> str:
    if count == 0:
        return DIM
    if outcome == "failed":
        return ERROR_STYLE
    if outcome in ("held", "retried", "migrated"):
        return CAUTION_STYLE
    return ""


def chats_lines(requests: RequestsView | None, room: int) -> list[Text]:
    """Describe's lines on the deployment's chats, each at most ``room`` wide (parts that do
    not fit go to the next line): how many in the window, the rate and the 95th percentile to
    the first token; each outcome's count; what the outcomes that happened mean."""
    if requests is None:
        # Where they are counted, so that chats sent to exo itself, past the front door, are
        # not taken for no chats at all.
        window = window_text(WINDOW_S)
        return [Text(f"none in the last {window} via /v1/chat/completions here", style=DIM)]
    outcomes = requests.outcomes
    ended = round(requests.rate * requests.window_s)
    p95 = NONE_MARK if requests.p95_ttft_s is None else seconds_text(requests.p95_ttft_s)
    head = [
        Text(f"{ended} in the last {window_text(requests.window_s)}", style="bold"),
        Text(f"{rate_text(requests.rate)}/s"),
        Text(f"p95 first token {p95}"),
    ]
    counted: list[Outcome] = [o for o in OUTCOMES if o in ALWAYS_COUNTED or outcomes.get(o, 0)]
    counts = [
        Text(f"{outcomes.get(o, 0)} {o}", style=_outcome_style(o, outcomes.get(o, 0)))
        for o in counted
    ]
    meanings = [
        Text(f"{o}: {MEANING[o]}", style=DIM)
        for o in OUTCOMES
        if o in MEANING and outcomes.get(o, 0)
    ]
    return _wrapped(head, room) + _wrapped(counts, room) + _wrapped(meanings, room)


def _wrapped(parts: Sequence[Text], room: int) -> list[Text]:
    """``parts`` joined by `` · `` into lines of at most ``room`` cells, a part never cut (one
    longer than ``room`` has a line of its own)."""
    between = " · "
    lines: list[Text] = []
    line = Text()
    for part in parts:
        if line.cell_len and line.cell_len + len(between) + part.cell_len > room:
            lines.append(line)
            line = Text()
        if line.cell_len:
            line.append(between, style=DIM)
        line.append_text(part)
    if line.cell_len:
        lines.append(line)
    return lines
