"""What-if (``w`` on the nodes tab): what losing the selected node now would do, before an
operator reboots it.

The master's (or the bridge's) answer to ``GET /whatif`` (``WhatIfResponse``), as the app
received it, per deployment in the keeper's placement order, in the words
``keeper.model.whatif_words`` makes for ``exo-deploy whatif`` too: unaffected, moves (from which
nodes to which, and whether the model is on disk there), loses a replica (how many are left of
how many), cannot be placed, or still cannot be placed (it has no instance now), with when each
replacement would serve again (by the thresholds the service runs with) and the keeper's reason
for what it could not place. Every line is
wrapped to the dialog's width, so the answer reads whole at 80 columns; a long one scrolls.
The screen only shows what it was handed (it asks nothing itself) and changes nothing;
Escape closes it.
"""

from __future__ import annotations

import re
import textwrap
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from exo_deploy_tui.model.format import short_model, truncate
from exo_deploy_tui.view.cells import DRAINING_SYMBOL
from keeper.model.api_models import WhatIfDeployment, WhatIfResponse, WhatIfThresholds
from keeper.model.whatif_words import (
    Verdict,
    node_names,
    outcome_words,
    places_words,
    seconds_words,
    verdict,
    why_words,
)

# The text's width: the dialog (78 columns at 80) less its border and padding.
WHATIF_WIDTH = 74
# Under a deployment's line: where its instances were, and why no more could be placed.
INDENT = "    "
# Room for the model on its line, leaving the outcome some beside it.
MODEL_WIDTH = 34

# Each verdict's symbol and colour, as the statuses have theirs.
VERDICT_MARK: dict[Verdict, tuple[str, str]] = {
    "unaffected": ("●", "green"),
    "moves": (DRAINING_SYMBOL, "magenta"),
    "loses_replica": ("!", "yellow"),
    "cannot_place": ("✖", "red"),
    "still_cannot_place": ("✖", "red"),
}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def _hanging(first: int, words: str, width: int, indent: str) -> list[str]:
    """``words`` wrapped to ``width``, the first line ``first`` columns in (after what leads
    it), the others ``indent``."""
    lines = textwrap.wrap(
        words,
        width,
        initial_indent=" " * first,
        subsequent_indent=indent,
        break_on_hyphens=False,
    )
    return [lines[0][first:], *lines[1:]] if lines else [""]


# A number and its unit (``4 s``, ``2 GB/s``): joined by a no-break space, a wrapped line never
# leaves a number without its unit.
NUMBER_AND_UNIT = re.compile(r"(\d) (s|GB/s)\b")


def _units_kept(words: str) -> str:
    return NUMBER_AND_UNIT.sub("\\1\u00a0\\2", words)


def _details(
    deployment: WhatIfDeployment, thresholds: WhatIfThresholds | None
) -> list[tuple[str, str]]:
    """The lines under a deployment's: where it was and where its other replacements go (what
    its line did not say), when each replacement serves again (from a service that says), and
    the keeper's reason; each ``(label, words)``."""
    details: list[tuple[str, str]] = []
    if deployment.outcome in ("loses_replica", "cannot_place"):
        if deployment.lost:
            details.append(("was on:", ", ".join(node_names(i.nodes) for i in deployment.lost)))
        if deployment.placed:
            details.append(("goes to:", places_words(deployment.placed)))
    for placement in deployment.placed:
        if placement.estimate is not None and thresholds is not None:
            label = f"{node_names(placement.nodes)}:"
            details.append((label, _units_kept(seconds_words(placement.estimate, thresholds))))
    why = why_words(deployment)
    if why is not None:
        details.append(("why:", why))
    return details


# The summary's words for each verdict's count, in the order it lists them.
SUMMARY_WORDS: dict[Verdict, str] = {
    "moves": "moving",
    "loses_replica": "short",
    "cannot_place": "not placed",
    "still_cannot_place": "still not placed",
    "unaffected": "unaffected",
}


def _summary(answer: WhatIfResponse) -> str:
    counts: dict[Verdict, int] = {}
    for deployment in answer.deployments:
        said = verdict(deployment)
        counts[said] = counts.get(said, 0) + 1
    # A no-break space in each count: a wrapped summary never leaves a number without its word.
    return ", ".join(
        f"{counts[said]}\u00a0{word}" for said, word in SUMMARY_WORDS.items() if said in counts
    )


def whatif_text(answer: WhatIfResponse, width: int = WHATIF_WIDTH) -> Text:
    """The answer as the screen shows it, every line within ``width``. Built a line at a time,
    no style running across a line's end, so each line's leading spaces draw as written."""
    lines: list[Text] = []
    lost = ", ".join(node.name for node in answer.nodes) or "these nodes"
    deployments = answer.deployments
    summary = _summary(answer) if deployments else "no deployments, nothing moves"
    lines += [
        Text(line, style="bold") for line in textwrap.wrap(f"If {lost} went now: {summary}", width)
    ]
    count = _plural(len(deployments), "deployment")
    lines.append(Text(f"{count}, highest priority first; asking changes nothing.", style="dim"))
    lines.append(Text())
    for deployment in deployments:
        said = verdict(deployment)
        symbol, style = VERDICT_MARK[said]
        model = truncate(short_model(deployment.model_id), MODEL_WIDTH)
        words = _hanging(len(model) + 4, outcome_words(deployment), width, INDENT)
        first = Text()
        first.append(f"{symbol} ", style=f"bold {style}")
        first.append(model, style="bold")
        first.append(f"  {words[0]}", style="dim" if said == "unaffected" else style)
        lines.append(first)
        lines += [Text(line, style=style) for line in words[1:]]
        for label, detail in _details(deployment, answer.thresholds):
            head = f"{INDENT}{label} "
            wrapped = _hanging(len(head), detail, width, INDENT * 2)
            line = Text(head, style="dim")
            line.append(wrapped[0])
            lines.append(line)
            lines += [Text(line) for line in wrapped[1:]]
    return Text("\n").join(lines)


class WhatIfScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q", "close", "Close"),
    ]

    def __init__(self, node: str, answer: WhatIfResponse) -> None:
        super().__init__()
        self.node = node
        self.answer = answer

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="dialog", classes="whatif") as dialog:
            dialog.border_title = f"What if {self.node} went?"
            dialog.border_subtitle = "esc close"
            yield Static(whatif_text(self.answer), id="whatif", markup=False)
        yield Footer(compact=True)

    def action_close(self) -> None:
        self.dismiss(None)
