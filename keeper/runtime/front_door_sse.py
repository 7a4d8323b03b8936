"""exo's SSE bytes read into events as they come off the socket, for the front door
(docs/design.md §8.6).

Fed what each read brought, the decoder answers every event that read completed, and the door
passes them on in one piece (one write, rather than one an event). httpx hands a chunked body
over one HTTP chunk at a time, and exo writes an event a chunk, so on exo's socket a read is
mostly one event; a body that comes whole (an in-process transport, a proxy that buffers) is
many. It splits lines itself, on the bytes, as the SSE format says (``\\n``, ``\\r\\n`` or
``\\r``; httpx's ``aiter_lines`` decodes the text first and splits on every Unicode line break,
a generator layer more per line), decoding each line whole (so a character split between two
reads is read right), and stops at the first line that is not SSE or an event over its bound,
saying which in ``trouble``. Pure, apart from the reading (``keeper.runtime.
front_door_upstream``), so each case is a unit test.
"""

from __future__ import annotations

# What ends a line, as SSE has it; a ``\r`` at the end of a read may be the first half of a
# ``\r\n``, so such a line waits for the next read (or the stream's end).
_BREAKS = (b"\n", b"\r")
# The fields an SSE line may carry besides ``data``: read and ignored.
_IGNORED = ("event:", "id:", "retry:")


class SseDecoder:
    """One stream's events, fed its bytes as they come (module doc)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes  # the most of one event, its lines together
        self._rest = bytearray()  # the start of a line not ended yet
        self._data: list[str] = []  # the current event's data lines
        self._size = 0  # their bytes
        self.trouble: str | None = None  # why the stream is not read further, in words

    def feed(self, chunk: bytes) -> list[str | None]:
        """The events ``chunk`` completes, in order: each one's data, None for a comment. After
        a trouble (``trouble``), none."""
        if self.trouble is not None:
            return []
        if not any(byte in chunk for byte in _BREAKS):
            self._rest += chunk  # no line ends here: the usual case of a long line
            self._bounded()
            return []
        self._rest += chunk
        lines = self._rest.splitlines(keepends=True)
        self._rest = bytearray()
        last = lines[-1]
        if not last.endswith(_BREAKS) or last.endswith(b"\r"):
            self._rest += lines.pop()  # unended, or perhaps half a ``\r\n``
        events: list[str | None] = []
        for line in lines:
            self._line(line.rstrip(b"\r\n"), events)
            if self.trouble is not None:
                break
        else:
            self._bounded()
        return events

    def end(self) -> list[str | None]:
        """The stream has ended: its last line read even if unended (an event needs the blank
        line after it, so it brings one only if that line is one)."""
        if self.trouble is not None or not self._rest:
            return []
        events: list[str | None] = []
        self._line(self._rest.rstrip(b"\r\n"), events)
        self._rest = bytearray()
        return events

    def _line(self, raw: bytes | bytearray, events: list[str | None]) -> None:
        self._size += len(raw)
        if self._size > self._max_bytes:
            self.trouble = f"an event of exo's stream is over {self._max_bytes // 2**20} MiB"
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            events.append(None)
        elif line.startswith("data:"):
            self._data.append(line[5:].removeprefix(" "))
        elif not line:
            if self._data:
                events.append("\n".join(self._data))
            self._data, self._size = [], 0
        elif not line.startswith(_IGNORED):
            self.trouble = f"exo's stream is not SSE: {line[:80]!r}"

    def _bounded(self) -> None:
        if self._size + len(self._rest) > self._max_bytes:
            self.trouble = f"an event of exo's stream is over {self._max_bytes // 2**20} MiB"
