"""A webhook receiver on a real socket, for the alert webhook tests (in-process and processes).

A stdlib threaded HTTP server, so it serves whatever event loop (or none) the test runs: it
records each POST (its ``Idempotency-Key`` and JSON body) and answers as the test says: 200,
another status, a hang until released, or a reset connection. ``port`` is fixed before it
listens, so a test can give a webhook URL while the receiver is still down.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Mode = Literal["ok", "error", "hang", "reset"]


@dataclass
class Received:
    key: str | None
    body: dict[str, Any]


@dataclass
class Receiver:
    port: int
    mode: Mode = "ok"
    status: int = 500  # answered in "error" mode
    received: list[Received] = field(default_factory=list[Received])
    attempts: int = 0  # every request, whatever it was answered
    _server: ThreadingHTTPServer | None = None
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks/secret-path"

    def ids(self) -> list[str]:
        with self._lock:
            return [r.body["id"] for r in self.received]

    def kinds(self) -> list[str]:
        with self._lock:
            return [r.body["kind"] for r in self.received]

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                with receiver._lock:
                    receiver.attempts += 1
                    mode = receiver.mode
                if mode == "hang":
                    receiver._release.wait()
                    return
                if mode == "reset":
                    self.connection.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                    )
                    self.connection.close()
                    return
                if mode == "ok":
                    with receiver._lock:
                        receiver.received.append(
                            Received(self.headers.get("Idempotency-Key"), json.loads(raw))
                        )
                code = 200 if mode == "ok" else receiver.status
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, format: str, *args: Any) -> None:
                pass  # quiet

        self._release.clear()
        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()

    def release(self) -> None:
        """Let the requests hanging now end (with no answer); later ones follow ``mode``."""
        self._release.set()

    def stop(self) -> None:
        self._release.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
