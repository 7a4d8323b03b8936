"""A DataTable that is handed whole lists of rows and changes only what differs.

The dashboard redraws from the model after every batch of updates and every second; rebuilding
a 500-row table each time would cost a frame and lose the operator's place. ``KeyedTable.sync``
updates the cells that changed, removes rows that went, and only rebuilds when rows were added
or reordered, putting the cursor back on the same row key (the same deployment) every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widgets import DataTable

Cells = tuple[Text, ...]


@dataclass(frozen=True)
class Column:
    key: str
    label: str
    width: int


class KeyedTable(DataTable[Text]):
    """Rows identified by string keys; the highlighted key survives every sync."""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(
            id=id,
            classes=classes,
            cursor_type="row",
            cell_padding=0,
            zebra_stripes=False,
        )
        self._columns: tuple[Column, ...] = ()
        self._rows: list[tuple[str, Cells]] = []

    def set_columns(self, columns: Sequence[Column]) -> None:
        if tuple(columns) == self._columns:
            return
        keep = self.selected_key
        self._columns = tuple(columns)
        self.clear(columns=True)
        for column in columns:
            self.add_column(Text(column.label, style="bold"), width=column.width, key=column.key)
        # Same rows, blank until the owner shows them again in the new columns; every cell then
        # differs from the empty tuple kept here, so the next sync fills them all.
        blank = tuple(Text() for _ in columns)
        for key, _ in self._rows:
            self.add_row(*blank, key=key)
        self._rows = [(key, ()) for key, _ in self._rows]
        if keep is not None:
            self.select_key(keep)

    @property
    def selected_key(self) -> str | None:
        """The key of the row under the cursor, read from the cursor itself (not from the
        highlight messages, which arrive later than the keys that moved it)."""
        row = self.cursor_row
        return self._rows[row][0] if 0 <= row < len(self._rows) else None

    def sync(self, rows: Sequence[tuple[str, Cells]]) -> None:
        keep = self.selected_key
        wanted = [key for key, _ in rows]
        current = [key for key, _ in self._rows]
        if wanted == current:
            self._update_cells(rows)
            self._rows = list(rows)
            return
        if _is_subsequence(wanted, current):
            for key in set(current) - set(wanted):
                self.remove_row(key)
            self._update_cells(rows)
        else:
            self._rebuild(rows)
        self._rows = list(rows)
        self._reselect(keep, wanted, current)

    def _update_cells(self, rows: Sequence[tuple[str, Cells]]) -> None:
        old = dict(self._rows)
        keys = [c.key for c in self._columns]
        for key, cells in rows:
            before = old.get(key, ())
            for index, (column, value) in enumerate(zip(keys, cells, strict=False)):
                if index >= len(before) or before[index] != value:
                    self.update_cell(key, column, value)

    def _rebuild(self, rows: Sequence[tuple[str, Cells]]) -> None:
        scroll_y = self.scroll_y
        self.clear()
        for key, cells in rows:
            self.add_row(*cells, key=key)
        self.scroll_to(y=scroll_y, animate=False, immediate=True)

    def _reselect(self, keep: str | None, wanted: list[str], previous: list[str]) -> None:
        if not wanted:
            return
        if keep in wanted:
            row = wanted.index(keep)
        else:
            # The selected row went: stay at the same height, on the row that took its place.
            old = previous.index(keep) if keep in previous else 0
            row = min(old, len(wanted) - 1)
        self.move_cursor(row=row, animate=False)

    def select_key(self, key: str) -> None:
        keys = self.keys
        if key in keys:
            self.move_cursor(row=keys.index(key), animate=False)

    @property
    def keys(self) -> list[str]:
        return [k for k, _ in self._rows]


def _is_subsequence(short: list[str], long: list[str]) -> bool:
    it = iter(long)
    return len(short) <= len(long) and all(key in it for key in short)
