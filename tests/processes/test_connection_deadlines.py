"""Every connection's deadlines (keeper.httpapi.connection_deadlines) on a real uvicorn: a
connection that does not send a whole request head in time is closed, whether it sent part of one,
nothing at all, or had a response already; a request being served and a WebSocket are not cut.
Also the canary for the uvicorn names the deadlines rely on."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator

import pytest
import uvicorn
from threaded_master import (
    connect,
    read_head,
    request_head,
    served_master,
    still_open_after,
    wait_closed,
)
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from websockets.sync.client import connect as ws_connect

from keeper.httpapi.connection_deadlines import (
    ConnectionDeadlines,
    DeadlineProtocol,
    protocol_with,
)
from keeper.model.state import Backend, Memory, MemoryUsage, NodeIdentity, NodeNetwork
from keeper.sim.link.identity import NodeKey
from keeper.sim.link.protocol import MASTER_MESSAGE, NODE_MESSAGE, Challenge, Hello, NodeInfo

HEAD_S = 0.5
DEADLINES = ConnectionDeadlines(head_s=HEAD_S)
# What a closing may lag the deadline by on a loaded two-core machine.
SLACK_S = 5.0


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    with served_master(deadlines=DEADLINES) as served:
        yield served.port


def test_a_connection_that_sends_half_a_request_line_is_closed(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HT")
        took = wait_closed(sock, HEAD_S + SLACK_S)
    assert took >= HEAD_S * 0.9  # closed by the deadline, not refused at once


def test_a_connection_that_sends_nothing_is_closed(port: int) -> None:
    with connect(port) as sock:
        wait_closed(sock, HEAD_S + SLACK_S)


def test_a_head_that_stops_before_its_blank_line_is_closed(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        wait_closed(sock, HEAD_S + SLACK_S)


def test_after_a_response_the_next_head_is_due_within_the_deadline_too(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(request_head("/healthz"))
        assert read_head(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /heal")
        wait_closed(sock, HEAD_S + SLACK_S)


def test_a_whole_head_in_time_is_served(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        sock.sendall(b"Host: 127.0.0.1\r\n\r\n")
        assert read_head(sock).startswith(b"HTTP/1.1 200")


def test_a_request_being_served_is_not_cut_by_the_head_deadline(port: int) -> None:
    with connect(port) as sock:
        sock.sendall(request_head("/events"))
        assert read_head(sock).startswith(b"HTTP/1.1 200")
        assert still_open_after(sock, 3 * HEAD_S)


def test_a_websocket_is_not_cut_by_the_head_deadline(port: int) -> None:
    memory = Memory.from_gb(16)
    with ws_connect(f"ws://127.0.0.1:{port}/node/ws") as ws:
        challenge = MASTER_MESSAGE.validate_json(ws.recv(timeout=SLACK_S))
        assert isinstance(challenge, Challenge)
        key = NodeKey.for_name("steady")
        hello = Hello(node_id=key.node_id, name="steady", signature=key.sign_hello(challenge.nonce))
        ws.send(NODE_MESSAGE.dump_json(hello).decode())
        info = NodeInfo(
            memory=MemoryUsage(ram_total=memory, ram_available=memory),
            backends=[Backend.MLX_METAL],
            identity=NodeIdentity(friendly_name="steady"),
            network=NodeNetwork(),
        )
        ws.send(NODE_MESSAGE.dump_json(info).decode())
        ws.recv(timeout=SLACK_S)  # the master's Welcome: it is joined
        # Three head deadlines pass (a closed connection would raise ConnectionClosed here)...
        end = time.monotonic() + 3 * HEAD_S
        while (left := end - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                ws.recv(timeout=left)
        # ...and it still answers.
        assert ws.ping().wait(SLACK_S)


def test_the_uvicorn_names_the_deadlines_rely_on_are_still_there() -> None:
    # Canary: the module docstring of keeper.httpapi.connection_deadlines names them; a uvicorn
    # that renames or drops one fails here, beside the behaviour tests above.
    assert callable(HttpToolsProtocol.on_response_complete)
    # httptools' callbacks the head bound relies on (test_connection_bounds.py checks it works).
    assert callable(HttpToolsProtocol.on_message_begin)
    assert callable(HttpToolsProtocol.on_headers_complete)
    assert "on_response=self.on_response_complete" in inspect.getsource(HttpToolsProtocol)
    assert "self.cycle" in inspect.getsource(HttpToolsProtocol.__init__)
    assert "self.response_complete = False" in inspect.getsource(RequestResponseCycle.__init__)
    config = uvicorn.Config(lambda: None, http=protocol_with(DEADLINES))
    config.load()
    assert issubclass(config.http_protocol_class, DeadlineProtocol)
    assert config.http_protocol_class.deadlines == DEADLINES
