"""The services' listening socket (keeper.httpapi.serving.bind_socket): its connections send
small answers at once (docs/design.md §7.1)."""

from __future__ import annotations

import socket

from keeper.httpapi.serving import bind_socket


def test_the_listening_socket_says_tcp_so_its_connections_get_no_delay() -> None:
    # asyncio sets TCP_NODELAY on accepted connections only when the listening socket's
    # protocol says TCP; without it each small answer waited ~40 ms (Nagle and delayed ACK).
    listening = bind_socket("127.0.0.1", 0)
    try:
        assert listening.proto == socket.IPPROTO_TCP
    finally:
        listening.close()
