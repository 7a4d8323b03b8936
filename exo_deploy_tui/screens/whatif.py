"""What-if (``w`` on the nodes tab): what losing the selected node now would do, before an
operator reboots it.

The master's (or the bridge's) answer to ``GET /whatif`` (``WhatIfResponse``), as the app
received it, per deployment in the keeper's placement order: it stays, moves (from which nodes
to which, and whether the model is on disk there), loses a replica (how many are left of how
many) or cannot be placed, with the keeper's reason for what it could not place. Every line is
wrapped to the dialog's width, so the answer reads whole at 80 columns; a long one scrolls.
The screen only shows what it was handed (it asks nothing itself) and changes nothing;
Escape closes it.
"""

from __future__ import annotations

import textwrap
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Static

from exo_deploy_tui.cells import DRAINING_SYMBOL
from exo_deploy_tui.format import short_model, truncate
from keeper.model.api_models import (
    WhatIfDeployment,
    WhatIfNode,
    WhatIfOutcome,
    WhatIfPlacement,
    WhatIfResponse,
)

# The text's width: the dialog (78 columns at 80) less its border and padding.
WHATIF_WIDTH = 74
# Under a deployment's line: where its instances were, and why no more could be placed.
INDENT = "    "
# Room for the model on its line, leaving the outcome some beside it.
MODEL_WIDTH = 34

# Each outcome's symbol and colour, as the statuses have theirs.
OUTCOME_MARK: dict[WhatIfOutcome, tuple[str, str]] = {
    "stays": ("●", "green"),
    "moves": (DRAINING_SYMBOL, "magenta"),
    "loses_replica": ("!", "yellow"),
    "cannot_place": ("✖", "red"),
}


def _names(nodes: list[WhatIfNode]) -> str:
    """An instance's nodes: ``a+b``."""
    return "+".join(node.name for node in nodes)


def _places(placed: list[WhatIfPlacement]) -> str:
    return ", ".join(
        f"{_names(p.nodes)} ({'on disk' if p.model_on_disk else 'downloads first'})" for p in placed
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'s' if count != 1 else ''}"


def outcome_words(deployment: WhatIfDeployment) -> str:
    """What happens to the deployment, in a phrase: ``moves from mini-a to mini-b (on
    disk)``, ``loses a replica: 1 of 2 left``."""
    left = f"{deployment.after} of {deployment.replicas} left"
    lost = ", ".join(_names(i.nodes) for i in deployment.lost)
    if deployment.outcome == "stays":
        return "stays"
    if deployment.outcome == "moves":
        return f"moves from {lost or 'the node'} to {_places(deployment.placed)}"
    if deployment.outcome == "loses_replica":
        gone = max(deployment.before - deployment.after, 1)
        replicas = "a replica" if gone == 1 else f"{gone} replicas"
        return f"loses {replicas}: {left}"
    return f"cannot be placed: {left}"


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


def _details(deployment: WhatIfDeployment, width: int) -> list[tuple[str, str]]:
    """The lines under a deployment's: where it was and where its other replacements go (what
    its line did not say), and the keeper's reason; each ``(label, words)``."""
    details: list[tuple[str, str]] = []
    if deployment.outcome in ("loses_replica", "cannot_place"):
        if deployment.lost:
            details.append(("was on:", ", ".join(_names(i.nodes) for i in deployment.lost)))
        if deployment.placed:
            details.append(("goes to:", _places(deployment.placed)))
    if deployment.reason is not None:
        details.append(("why:", deployment.reason))
    return details


def _summary(answer: WhatIfResponse) -> str:
    counts: dict[WhatIfOutcome, int] = {}
    for deployment in answer.deployments:
        counts[deployment.outcome] = counts.get(deployment.outcome, 0) + 1
    words: dict[WhatIfOutcome, str] = {
        "moves": f"{counts.get('moves', 0)} moving",
        "loses_replica": f"{counts.get('loses_replica', 0)} short",
        "cannot_place": f"{counts.get('cannot_place', 0)} not placed",
        "stays": f"{counts.get('stays', 0)} staying",
    }
    return ", ".join(text for outcome, text in words.items() if counts.get(outcome))


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
        symbol, style = OUTCOME_MARK[deployment.outcome]
        model = truncate(short_model(deployment.model_id), MODEL_WIDTH)
        words = _hanging(len(model) + 4, outcome_words(deployment), width, INDENT)
        first = Text()
        first.append(f"{symbol} ", style=f"bold {style}")
        first.append(model, style="bold")
        first.append(f"  {words[0]}", style="dim" if deployment.outcome == "stays" else style)
        lines.append(first)
        lines += [Text(line, style=style) for line in words[1:]]
        for label, detail in _details(deployment, width):
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
