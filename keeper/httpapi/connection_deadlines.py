"""Two deadlines on every HTTP connection a service accepts, which uvicorn does not set itself.

uvicorn closes a connection that stays idle between requests (``timeout_keep_alive``), but not
one that never finishes its request head: a client may connect and then send nothing, or a byte
now and then, and hold a connection and its socket for ever. Nor does it drop a client that stops
reading: what is written to it waits in the transport's buffer and the kernel's (measured: 3.5 MB
for a dashboard stream that was never read) for as long as the peer keeps the connection open,
which a peer that acknowledges and never reads does for ever. So each connection here has:

- *a head deadline*: ``head_s`` from being accepted, and again from the end of each response, to
  send the next request's whole head. A connection with no request in flight when it passes is
  closed. A request being served is not timed (a dashboard stream lasts for hours), nor is a
  connection upgraded to a WebSocket (its own protocol has it then).
- *a send deadline*: while writing is paused (the transport's buffer is over its high-water mark
  because the kernel's is full, so the application's ``send`` waits), the client must read
  enough for writing to resume within ``send_stall_s``. Past it the connection is reset, not
  closed: a close waits for the buffers to drain, which a client that does not read never lets
  happen. The waiting ``send`` then returns, ``receive`` says the client disconnected, and the
  handler ends and frees what it held (a dashboard stream's slot, keeper.master.subscriptions).

Both are a subclass of uvicorn's httptools protocol, the one uvicorn serves with when httptools
is installed (it is a dependency). The asyncio ``Protocol`` methods it extends are public; two
names are uvicorn's own, not documented: the protocol's ``on_response_complete`` (called as a
response ends) and its ``cycle`` with ``response_complete`` (the request being served). They are
unchanged from uvicorn 0.30 to 0.54; tests/processes/test_connection_deadlines.py fails if they
move.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

log = logging.getLogger(__name__)

# A request head is a few hundred bytes, sent in one packet by every client we have (the CLI, the
# TUI, curl, a node's WebSocket upgrade); ten seconds is that on the worst link anyone would use
# and still frees a connection that is only being held open well before it matters.
HEAD_TIMEOUT_S = 10.0
# A client that reads keeps the buffer draining: writing resumes once it has read about 48 kB
# (uvicorn's high-water mark less its low-water one), half a second at 100 kB/s. Thirty seconds
# without that is a client that is gone or not reading (a frozen process, a closed laptop lid);
# a dashboard dropped so reconnects and starts from a new snapshot.
SEND_STALL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ConnectionDeadlines:
    head_s: float = HEAD_TIMEOUT_S
    send_stall_s: float = SEND_STALL_TIMEOUT_S


DEFAULT_DEADLINES = ConnectionDeadlines()
# SO_LINGER on, for 0 s: closing the socket resets the connection and drops its buffers.
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the module's two deadlines; ``deadlines`` is set on a
    subclass per server (``protocol_with``)."""

    deadlines: ClassVar[ConnectionDeadlines] = DEFAULT_DEADLINES

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None
        self._stall_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stall_timer is None:
            self._stall_timer = self.loop.call_later(self.deadlines.send_stall_s, self._stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stall_timer = _cancelled(self._stall_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self._head_timer = _cancelled(self._head_timer)
        self._stall_timer = _cancelled(self._stall_timer)
        super().connection_lost(exc)

    def _await_head(self) -> None:
        self._head_timer = _cancelled(self._head_timer)
        self._head_timer = self.loop.call_later(
            self.deadlines.head_s, self._head_overdue, self._current_cycle()
        )

    def _current_cycle(self) -> RequestResponseCycle | None:
        cycle: RequestResponseCycle | None = self.cycle
        return cycle

    def _ours(self) -> bool:
        # Not ours once upgraded: the WebSocket protocol has the transport then.
        return self.transport.get_protocol() is self

    def _head_overdue(self, waited_after: RequestResponseCycle | None) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._ours():
            return
        cycle = self._current_cycle()
        if cycle is not waited_after or (cycle is not None and not cycle.response_complete):
            return  # a request head came in time (this one, or a pipelined one, is served)
        log.debug(
            "closing a connection that sent no whole request head in %g s", self.deadlines.head_s
        )
        self.transport.close()

    def _stalled(self) -> None:
        self._stall_timer = None
        if not self._ours():
            return
        log.info(
            "dropping a connection whose client read nothing for %g s",
            self.deadlines.send_stall_s,
        )
        # Reset, not closed: a closed socket would keep trying to deliver what its kernel
        # buffer holds, for minutes, to a peer that does not read; a reset frees it now.
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
        self.transport.abort()


def protocol_with(deadlines: ConnectionDeadlines) -> type[DeadlineProtocol]:
    """The protocol class for a uvicorn ``Config(http=...)``, with these deadlines."""

    class Configured(DeadlineProtocol):
        pass

    Configured.deadlines = deadlines
    return Configured


def _cancelled(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()
