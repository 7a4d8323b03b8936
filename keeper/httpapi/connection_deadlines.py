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
  handler ends and frees what it held (a dashboard stream's slot, keeper.sim.master.subscriptions).

And two bounds, which uvicorn's httptools protocol does not set either (h11's does: 16 KiB):

- *a request head's size*: at most ``head_bytes`` (64 KiB) from a request's first byte to the end
  of its head; past it the request is answered ``431 Request Header Fields Too Large`` (the error
  envelope) and the connection closed, before the rest is held in memory. Four connections
  streaming 200 MB heads took the master from 72 to 341 MB; now each holds at most 64 KiB and a
  read's worth (asyncio reads up to 256 KiB at a time).
- *open connections*: ``max_connections`` for the whole server, uvicorn's ``limit_concurrency``:
  a request on a connection past it is answered ``503`` (``keeper.httpapi.serving``).

Both deadlines and the head bound are a subclass of uvicorn's httptools protocol, the one uvicorn
serves with when httptools is installed (it is a dependency). The asyncio ``Protocol`` methods it
extends are public; four names are uvicorn's own, not documented: the protocol's
``on_response_complete`` (called as a response ends), ``on_message_begin`` and
``on_headers_complete`` (httptools' callbacks, as a request starts and as its head ends) and its
``cycle`` with ``response_complete`` (the request being served). They are unchanged from uvicorn
0.30 to 0.54; tests/processes/test_connection_deadlines.py fails if they move.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import struct
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from keeper.model.api_models import error_body

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
# The largest request head: our clients' are under 1 KiB (a bearer token, a few headers), and a
# browser's with cookies a few KiB; 64 KiB is many times any head these services are sent, and
# four times h11's default (16 KiB).
MAX_HEAD_BYTES = 64 * 1024
# The most connections a service holds open at once, WebSockets (nodes, which are tens) and
# dashboard streams included. Each costs a file descriptor and at most a head and its buffers:
# 512 keeps that to tens of MB and under the 1,024 descriptors a default ``ulimit -n`` allows,
# where it was unbounded.
MAX_CONNECTIONS = 512
_HEAD_TOO_LARGE = 431


@dataclass(frozen=True)
class ConnectionDeadlines:
    """Every connection's deadlines, and its bounds: a head's size, how many are open at once."""

    head_s: float = HEAD_TIMEOUT_S
    send_stall_s: float = SEND_STALL_TIMEOUT_S
    head_bytes: int = MAX_HEAD_BYTES
    max_connections: int = MAX_CONNECTIONS


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
        # A head is being received (from the connection's start, and from each request's first
        # byte, to its blank line), and how many bytes of it so far.
        self._in_head = True
        self._head_received = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_received += len(data)
            if self._head_received > self.deadlines.head_bytes:
                self._refuse_head()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_received = 0
        super().on_headers_complete()

    def _refuse_head(self) -> None:
        """Answer 431 with the error envelope and close: nothing more of this head is read."""
        self._in_head = False
        if self.transport.is_closing():
            return
        message = f"the request head is larger than {self.deadlines.head_bytes} bytes"
        body = json.dumps(error_body(message, _HEAD_TOO_LARGE, "Request Header Fields Too Large"))
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
            b"content-type: application/json\r\n"
            + f"content-length: {len(body)}\r\n".encode()
            + b"connection: close\r\n\r\n"
            + body.encode()
        )
        self.transport.close()
        log.info("refused a request head of over %d bytes (431)", self.deadlines.head_bytes)

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
