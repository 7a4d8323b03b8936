"""A bounded log of lines that wraps them at the width it is drawn with (design §9.1).

Textual's ``RichLog`` renders and wraps each line once, when it is written, at the width the
widget has then. A panel that is hidden (another tab shown, ``display: none``) has no region, so
every line written while it is hidden is wrapped at width 1, one character per row, and stays so.
A line wrapped at 80 columns is cut off in the narrower panel of the wide layout too.

So this log keeps what it was told, not how it was drawn: each line as rich ``Text``, and the
rows they wrap to at one width beside them. The rows are made again whenever the width it is
drawn with changes (a resize, being shown again), and new lines are wrapped on arrival only when
the log is on screen; while hidden they wait for the next width. It follows the end as lines
arrive unless the operator scrolled up, and then keeps the line they were reading at the top
through a re-wrap and while old lines fall off the front.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from rich.text import Text
from textual import events
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip


class WrappedLog(ScrollView, can_focus=True):
    """The last ``max_lines`` lines, each wrapped at the width the log is drawn with."""

    # RichLog's own look, so the panel reads as before: always a vertical scrollbar, which
    # also keeps the width the lines are wrapped at from changing as the log fills.
    DEFAULT_CSS = """
    WrappedLog {
        background: $surface;
        color: $foreground;
        overflow-y: scroll;
        &:focus {
            background-tint: $foreground 5%;
        }
    }
    """

    def __init__(self, *, max_lines: int, id: str | None = None) -> None:
        super().__init__(id=id)
        self._texts: deque[Text] = deque(maxlen=max_lines)
        # The rows of the oldest ``len(_rows)`` kept lines, wrapped at ``_width``; the lines
        # after them arrived while the log was hidden and are wrapped when it is next drawn.
        self._rows: deque[list[Strip]] = deque()
        self._strips: list[Strip] = []  # the rows, flat, as drawn
        self._width = 0
        self._following = True

    @property
    def texts(self) -> tuple[Text, ...]:
        """The lines kept, oldest first, as they were written."""
        return tuple(self._texts)

    @property
    def lines(self) -> tuple[Strip, ...]:
        """The rows drawn: the kept lines wrapped at the width the log is drawn with."""
        return tuple(self._strips)

    def _drawn_width(self) -> int:
        """The width lines wrap at now; 0 while the log is not on screen."""
        return self.scrollable_content_region.width

    def _wrap(self, text: Text, width: int) -> list[Strip]:
        # Text.wrap and Text.render rather than Console.render: the same rows, and two to four
        # times faster (most lines fit and need no wrapping at all), which a re-wrap of every
        # kept line on a resize adds up.
        console = self.app.console
        if text.cell_len <= width:
            return [Strip(list(text.render(console, "")), text.cell_len)]
        lines = text.wrap(console, width)
        return [Strip(list(line.render(console, "")), line.cell_len) for line in lines] or [
            Strip.blank(width)
        ]

    def _wrap_waiting(self, width: int) -> bool:
        """Wrap the lines not wrapped yet (``_rows`` is a prefix of the lines); whether any was."""
        waiting = list(self._texts)[len(self._rows) :]
        for text in waiting:
            rows = self._wrap(text, width)
            self._rows.append(rows)
            self._strips.extend(rows)
        return bool(waiting)

    def append(self, texts: Iterable[Text]) -> None:
        """Add lines at the end, dropping the oldest past ``max_lines``."""
        new = list(texts)
        if not new:
            return
        limit = self._texts.maxlen or len(new)
        dropped = max(0, len(self._texts) + len(new) - limit)
        self._texts.extend(new)
        # The oldest lines go with their rows; what they leave is still a prefix of the lines.
        dropped_rows = 0
        for _ in range(min(dropped, len(self._rows))):
            dropped_rows += len(self._rows.popleft())
        del self._strips[:dropped_rows]
        width = self._drawn_width()
        # Hidden, or drawn at another width than the rows were made for: the new lines wait
        # for the next time it is drawn (``_rewrap``: ``on_resize``, ``on_show``).
        wrapped = bool(width) and width == self._width and self._wrap_waiting(width)
        if wrapped or dropped_rows:
            top = None if self._following else max(0, self.scroll_offset.y - dropped_rows)
            self._laid_out(top=top)

    def _rewrap(self) -> None:
        """Drawn at ``width``: the lines that waited are wrapped, and every line again if the
        width is not the one the rows were made for."""
        width = self._drawn_width()
        if not width or (width == self._width and len(self._rows) == len(self._texts)):
            return
        top = None if self._following else self._line_at_top()
        if width != self._width:
            self._width = width
            self._rows.clear()
            self._strips.clear()
        self._wrap_waiting(width)
        self._laid_out(top=None if top is None else self._first_row_of(top))

    def _line_at_top(self) -> int:
        """The kept line whose rows include the top row shown (counted from the oldest kept)."""
        row = 0
        for index, rows in enumerate(self._rows):
            row += len(rows)
            if row > self.scroll_offset.y:
                return index
        return max(0, len(self._rows) - 1)

    def _first_row_of(self, line: int) -> int:
        return sum(len(rows) for rows in list(self._rows)[:line])

    def _laid_out(self, *, top: int | None) -> None:
        """The rows changed: size the scrolling to them, then show the end (following) or the
        row ``top`` at the top."""
        self.virtual_size = Size(self._width, len(self._strips))
        # At once, not after the next refresh: a scroll left pending would land after whatever
        # the operator does meanwhile (scroll up, resize) and undo it.
        if top is None:
            self.scroll_end(animate=False, immediate=True, x_axis=False)
        else:
            self.scroll_to(y=top, animate=False, immediate=True)
        self.refresh()

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # The operator's scrolling decides whether new lines pull the view to the end: at the
        # end it follows, anywhere above it stays put.
        self._following = new_value >= self.max_scroll_y

    def on_resize(self, event: events.Resize) -> None:
        self._rewrap()

    def on_show(self, event: events.Show) -> None:
        self._rewrap()

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        index = scroll_y + y
        style = self.rich_style
        if index >= len(self._strips):
            return Strip.blank(width, style)
        return self._strips[index].crop_extend(scroll_x, scroll_x + width, style).apply_style(style)
