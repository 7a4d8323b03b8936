"""A master serving its real API on a loopback port from a background thread, and raw sockets to
it, for the tests of what a server does to connections (tests/processes).

The test itself stays synchronous: a raw socket that never reads, or sends half a request, is
plain blocking socket code, and the master's event loop runs beside it in the portal's thread.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from anyio.abc import TaskStatus
from anyio.from_thread import BlockingPortal, start_blocking_portal

from keeper.httpapi.connection_deadlines import DEFAULT_DEADLINES, ConnectionDeadlines
from keeper.httpapi.serving import serve_service
from keeper.sim.master.api import create_app
from keeper.sim.master.service import Master, MasterConfig

HOST = "127.0.0.1"
# One request to a server on loopback; longer means it is not answering.
REQUEST_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Served:
    portal: BlockingPortal
    master: Master
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@contextlib.contextmanager
def served_master(
    config: MasterConfig | None = None, deadlines: ConnectionDeadlines = DEFAULT_DEADLINES
) -> Iterator[Served]:
    master = Master(None, config=config)
    with start_blocking_portal(backend="asyncio") as portal:

        async def run(*, task_status: TaskStatus[int]) -> None:
            await serve_service(
                master,
                create_app(master, None),
                HOST,
                0,
                None,
                announce=lambda _: None,
                before_stop=master.end_streams,
                deadlines=deadlines,
                task_status=task_status,
            )

        future, port = portal.start_task(run)
        try:
            yield Served(portal, master, port)
        finally:
            future.cancel()


def connect(port: int, *, receive_buffer: int | None = None) -> socket.socket:
    """A raw TCP connection to the server; ``receive_buffer`` shrinks its receive window (set
    before connecting, so the window is small from the handshake on)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.settimeout(REQUEST_TIMEOUT_S)
    sock.connect((HOST, port))
    return sock


def request_head(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\n\r\n".encode()


def read_head(sock: socket.socket) -> bytes:
    """The response's status line and headers (what came with them is dropped)."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        if not chunk:
            pytest.fail(f"the server closed the connection mid-head: {received!r}")
        received += chunk
    return received.partition(b"\r\n\r\n")[0]


def read_whole_answer(sock: socket.socket) -> bytes:
    """One whole answer on a connection that stays open: its status line and headers, and its
    body read to its Content-Length, however the two were split across segments (so the next
    request on the connection starts clean). The body is dropped."""
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(4096)
        if not chunk:
            pytest.fail(f"the server closed the connection mid-head: {received!r}")
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    lengths = [
        line.split(b":", 1)[1].strip()
        for line in head.split(b"\r\n")[1:]
        if line.lower().startswith(b"content-length:")
    ]
    if len(lengths) != 1:
        pytest.fail(f"an answer without one Content-Length: {head!r}")
    length = int(lengths[0])
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        if not chunk:
            pytest.fail(f"the server closed the connection mid-body: {len(body)} of {length}")
        body += chunk
    if len(body) != length:
        pytest.fail(f"more than the answer came: {len(body)} bytes for {length}")
    return head


def wait_closed(sock: socket.socket, within_s: float) -> float:
    """Read (and drop) what the server sends until it closes the connection; the seconds it
    took. Fails if it is still open after ``within_s``."""
    started = time.monotonic()
    wait_ended(sock, within_s)
    return time.monotonic() - started


def wait_ended(sock: socket.socket, within_s: float) -> str:
    """Read (and drop) what the server sends until the connection ends: "reset" or "closed".
    Fails if it is still open after ``within_s``."""
    end = time.monotonic() + within_s
    while True:
        left = end - time.monotonic()
        if left <= 0:
            pytest.fail(f"the server did not end the connection within {within_s:g} s")
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return "closed"
        except ConnectionResetError:
            return "reset"
        except TimeoutError:
            continue


def still_open_after(sock: socket.socket, seconds: float) -> bool:
    """Whether the connection stays open for ``seconds`` (what arrives meanwhile is dropped)."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return False
        except ConnectionResetError:
            return False
        except TimeoutError:
            return True
    return True


def events_status(served: Served) -> httpx.Response:
    """``GET /events`` opened and closed at once: its status and, for a refusal, its body."""
    with (
        httpx.Client(timeout=REQUEST_TIMEOUT_S, trust_env=False) as client,
        client.stream("GET", f"{served.url}/events") as response,
    ):
        if response.status_code != 200:
            response.read()
        return response
