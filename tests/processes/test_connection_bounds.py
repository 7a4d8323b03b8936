"""Every connection's bounds (keeper.httpapi.connection_deadlines) on a real uvicorn: a request
head past 64 KiB is answered 431 with the error envelope and the connection closed before the
rest is read, on a connection's first request or a later one; a head just under it is served; and
past the server's cap on open connections a request is answered 503, served again once
connections close."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator

import pytest
from process_helpers import wait_for
from threaded_master import (
    connect,
    read_head,
    read_whole_answer,
    request_head,
    served_master,
    wait_closed,
)

from keeper.httpapi.connection_deadlines import MAX_HEAD_BYTES, ConnectionDeadlines

# What a closing may take on two cores the whole parallel suite shares (5 s was seen to pass
# there); under the head's own 10 s deadline (HEAD_TIMEOUT_S), so a close still says which
# bound acted.
SLACK_S = 9.0
MAX_CONNECTIONS = 4


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with served_master() as served:
        yield served.port


def head_with(filler: int, path: str = "/healthz") -> bytes:
    """A request head with one header of ``filler`` bytes."""
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: {'x' * filler}\r\n\r\n".encode()


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """The status line and the body of an answer whose connection then closes."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0], body


def test_a_head_past_64_kib_is_answered_431_and_closed(port: int) -> None:
    with connect(port) as sock:
        with contextlib.suppress(OSError):  # the server may close before it is all sent
            sock.sendall(head_with(MAX_HEAD_BYTES + 1024))
        status, body = read_answer(sock)
    assert status == b"HTTP/1.1 431 Request Header Fields Too Large"
    error = json.loads(body)["error"]
    assert error["code"] == 431
    assert error["message"] == f"the request head is larger than {MAX_HEAD_BYTES} bytes"


def test_a_head_streamed_for_ever_is_cut_at_the_bound(port: int) -> None:
    """A head that never ends (a header of 200 MB, sent as fast as the socket takes it): the
    server answers and closes after 64 KiB and a read, so the sender fails long before 200 MB."""
    sent = 0
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: ")
        chunk = b"x" * 65536
        with contextlib.suppress(OSError):
            while sent < 200 * 1024 * 1024:
                sock.sendall(chunk)
                sent += len(chunk)
        status, _ = read_answer(sock) if sent < 200 * 1024 * 1024 else (b"", b"")
    # What the kernel buffers took before the close was seen: a few MiB, not 200.
    assert sent < 32 * 1024 * 1024
    assert status in {b"HTTP/1.1 431 Request Header Fields Too Large", b""}


def test_a_head_just_under_the_bound_is_served(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(head_with(MAX_HEAD_BYTES - 1024))
        assert read_head(sock).startswith(b"HTTP/1.1 200")


def test_a_later_request_on_the_connection_is_bounded_too(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(request_head("/healthz"))
        assert read_whole_answer(sock).startswith(b"HTTP/1.1 200")
        with contextlib.suppress(OSError):
            sock.sendall(head_with(2 * MAX_HEAD_BYTES))
        took = wait_closed(sock, SLACK_S)
    assert took < SLACK_S


def test_past_the_connection_cap_a_request_is_answered_503() -> None:
    with served_master(deadlines=ConnectionDeadlines(max_connections=MAX_CONNECTIONS)) as served:
        held = [connect(served.port) for _ in range(MAX_CONNECTIONS)]
        try:
            with connect(served.port) as extra:
                extra.sendall(request_head("/healthz"))
                assert read_head(extra).startswith(b"HTTP/1.1 503")
        finally:
            for sock in held:
                sock.close()

        def served_again() -> bool:
            with connect(served.port) as sock:
                sock.sendall(request_head("/healthz"))
                return read_head(sock).startswith(b"HTTP/1.1 200")

        wait_for("a request served once the others closed", SLACK_S, lambda: served_again() or None)
