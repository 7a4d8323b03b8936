"""A table that is handed whole lists of rows and draws only the lines on screen.

The dashboard redraws from the model after every batch of updates and every second, on
clusters of hundreds of deployments whose rows come, go and re-sort. Textual's DataTable keeps
a row object per row and re-sorts all of them on every removal (a node lost with 60 instances
cost 300 ms); this table keeps a plain list of ``(key, cells)`` and renders lines on demand
(Textual's line API), so a sync costs a list copy and a frame costs the visible lines, however
many rows there are or however they changed.

Cells are ``(text, style)`` pairs already cut to their column's width. The cursor follows its
row key: when rows come, go or re-sort it stays on the same row (the same deployment), and when
that row goes it stays at the same height.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from exo_deploy_tui.view.columns import Cells, Column


class KeyedTable(ScrollView, can_focus=True):
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "keyed-table--header",
        "keyed-table--cursor",
        "keyed-table--cursor-blurred",
    }
    DEFAULT_CSS = """
    KeyedTable {
        background: $surface;
        color: $foreground;
        overflow-x: hidden;
        overflow-y: auto;
        scrollbar-size-vertical: 1;
    }
    KeyedTable > .keyed-table--header {
        text-style: bold;
        background: $panel;
    }
    KeyedTable > .keyed-table--cursor {
        background: $block-cursor-background;
        color: $block-cursor-foreground;
        text-style: bold;
    }
    KeyedTable > .keyed-table--cursor-blurred {
        background: $block-cursor-blurred-background;
        color: $block-cursor-blurred-foreground;
    }
    KeyedTable:ansi > .keyed-table--header {
        background: ansi_bright_black;
        color: ansi_default;
    }
    KeyedTable:ansi > .keyed-table--cursor {
        background: ansi_blue;
        color: ansi_bright_white;
    }
    KeyedTable:ansi > .keyed-table--cursor-blurred {
        background: ansi_bright_black;
        color: ansi_default;
    }
    """
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k_up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("pageup", "page_up", "Page up", show=False),
        Binding("pagedown", "page_down", "Page down", show=False),
        Binding("home", "first", "First", show=False),
        Binding("end", "last", "Last", show=False),
        Binding("enter", "select", "Select", show=False),
    ]

    class CursorMoved(Message):
        """The cursor is on another row (``key`` is None when the table is empty)."""

        def __init__(self, table: KeyedTable, key: str | None) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> KeyedTable:
            return self.table

    class RowSelected(Message):
        """Enter (or a double click) on a row."""

        def __init__(self, table: KeyedTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> KeyedTable:
            return self.table

    def __init__(
        self,
        *,
        id: str | None = None,
        classes: str | None = None,
        cursor_when_blurred: bool = True,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.cursor_row = 0
        # A secondary panel's cursor shows only while it has focus: on a screen of several
        # panels a highlighted row in an unfocused one reads as if it meant something.
        self.cursor_when_blurred = cursor_when_blurred
        self._columns: tuple[Column, ...] = ()
        self._rows: list[tuple[str, Cells]] = []
        self._styles: dict[str, Style] = {}

    # -- data -------------------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[Column, ...]:
        return self._columns

    def set_columns(self, columns: Sequence[Column]) -> None:
        if tuple(columns) != self._columns:
            self._columns = tuple(columns)
            self._resize_virtual()
            self.refresh()

    @property
    def keys(self) -> list[str]:
        return [key for key, _ in self._rows]

    def row(self, key: str) -> Cells:
        for row_key, cells in self._rows:
            if row_key == key:
                return cells
        raise KeyError(key)

    def row_at(self, index: int) -> Cells:
        return self._rows[index][1]

    @property
    def selected_key(self) -> str | None:
        row = self.cursor_row
        return self._rows[row][0] if 0 <= row < len(self._rows) else None

    def sync(self, rows: Sequence[tuple[str, Cells]]) -> None:
        if len(rows) == len(self._rows) and all(
            new[0] == old[0] for new, old in zip(rows, self._rows, strict=True)
        ):
            # Same rows in the same order: redraw only the lines on screen that changed, so
            # the terminal is sent those lines and nothing else.
            pairs = zip(rows, self._rows, strict=True)
            changed = [i for i, (new, old) in enumerate(pairs) if new != old]
            self._rows = list(rows)
            top = int(self.scroll_y)
            for index in changed:
                if top <= index < top + self._page:
                    self.refresh_line(index + 1)  # +1: the header is line 0
            return
        keep = self.selected_key
        previous = self.keys
        self._rows = list(rows)
        wanted = self.keys
        self._resize_virtual()
        if wanted != previous:
            if keep in wanted:
                row = wanted.index(keep)
            else:
                # The selected row went: stay at the same height, on the row that took its place.
                row = previous.index(keep) if keep in previous else self.cursor_row
            self._move_to(min(max(row, 0), max(len(wanted) - 1, 0)), announce=keep not in wanted)
        self.refresh()

    def select_key(self, key: str) -> None:
        keys = self.keys
        if key in keys:
            self._move_to(keys.index(key))

    # -- cursor -----------------------------------------------------------------------------------

    @property
    def _page(self) -> int:
        return max(1, self.size.height - 1)  # rows on screen under the header

    def _move_to(self, row: int, *, announce: bool = True) -> None:
        row = min(max(row, 0), max(len(self._rows) - 1, 0))
        moved = row != self.cursor_row
        self.refresh_line(self.cursor_row + 1)
        self.cursor_row = row
        self.refresh_line(row + 1)
        top = int(self.scroll_y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif row >= top + self._page:
            self.scroll_to(y=row - self._page + 1, animate=False, immediate=True)
        if moved or announce:
            self.post_message(self.CursorMoved(self, self.selected_key))

    def action_cursor_up(self) -> None:
        self._move_to(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._move_to(self.cursor_row + 1)

    def action_page_up(self) -> None:
        self._move_to(self.cursor_row - self._page)

    def action_page_down(self) -> None:
        self._move_to(self.cursor_row + self._page)

    def action_first(self) -> None:
        self._move_to(0)

    def action_last(self) -> None:
        self._move_to(len(self._rows) - 1)

    def action_select(self) -> None:
        key = self.selected_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        if event.y < 1:
            return
        row = int(self.scroll_y) + event.y - 1
        if 0 <= row < len(self._rows):
            self._move_to(row)
            if event.chain >= 2:
                self.action_select()

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()

    # -- drawing ----------------------------------------------------------------------------------

    def _resize_virtual(self) -> None:
        width = sum(c.width for c in self._columns)
        self.virtual_size = Size(width, len(self._rows) + 1)

    def _style(self, spec: str) -> Style:
        style = self._styles.get(spec)
        if style is None:
            style = self._styles[spec] = Style.parse(spec) if spec else Style()
        return style

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles.clear()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        if y == 0:
            header = base + self.get_component_rich_style("keyed-table--header")
            cells = tuple((c.label, "") for c in self._columns)
            return self._strip(cells, header, None, width)
        index = int(self.scroll_y) + y - 1
        if index >= len(self._rows):
            return Strip.blank(width, base)
        cursor: Style | None = None
        if index == self.cursor_row:
            if self.has_focus:
                cursor = self.get_component_rich_style("keyed-table--cursor")
            elif self.cursor_when_blurred:
                cursor = self.get_component_rich_style("keyed-table--cursor-blurred")
        return self._strip(self._rows[index][1], base, cursor, width)

    def _strip(self, cells: Cells, base: Style, cursor: Style | None, width: int) -> Strip:
        segments: list[Segment] = []
        for column, (text, spec) in zip(self._columns, cells, strict=False):
            pad = column.width - cell_len(text)
            style = base + self._style(spec)
            if cursor is not None:
                style += cursor
            segments.append(Segment(text + " " * pad if pad > 0 else text, style))
        fill = base + cursor if cursor is not None else base
        return Strip(segments).adjust_cell_length(width, fill)
