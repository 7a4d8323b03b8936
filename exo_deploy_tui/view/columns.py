"""The shape of a table's cells and columns, shared by the words that fill them and the widget
that draws them.

``view.cells`` words every cell and ``widgets.table`` draws them; the shapes sit here, below
both, so the words never import a widget (the view layer has no Textual: docs/design.md §9.1).
"""

from __future__ import annotations

from dataclasses import dataclass

# One cell: its text, already cut to the column's width, and a Rich style string.
Cell = tuple[str, str]
Cells = tuple[Cell, ...]


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int
