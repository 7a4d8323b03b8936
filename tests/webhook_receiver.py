"""A webhook receiver on a real socket, for the alert webhook tests (in-process and processes).

A stdlib threaded HTTP server, so it serves whatever event loop (or none) the test runs: it
records each POST (its ``Idempotency-Key``, ``Accept-Encoding`` and JSON body) and answers as the
test says: 200, another status, a hang until released, a reset connection, or a hostile answer:
200 with a body of ``body_bytes`` written until the client stops reading (``huge``, counted in
``bytes_sent``), 200 with a gzip body that inflates to ``body_bytes`` (``gzip``), or a redirect
to ``redirect_to`` (``redirect``), or what ``answer_with`` says (``custom``: a status, a body
size and a claimed Content-Encoding over bytes that are not so encoded). ``port`` is fixed
before it listens, so a test can give a webhook URL while the receiver is still down. Its URL has
a secret path and query, as Slack's and Discord's do, for the tests that look for them in the
log.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import threading
import zlib
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

Mode = Literal["ok", "error", "hang", "reset", "huge", "gzip", "redirect", "custom"]
# The secret parts of the receiver's URL, looked for in the logs.
SECRET_PATH = "hooks/secret-path"
SECRET_QUERY = "k=secret-query"
CHUNK = 64 * 1024


@functools.cache
def gzip_bomb(inflated: int) -> bytes:
    """A gzip body of ``inflated`` zero bytes (about 1,000 times smaller)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1024 * 1024)
    parts = [packer.compress(zeros) for _ in range(inflated // len(zeros))]
    return b"".join([*parts, packer.flush()])


@dataclass
class Received:
    key: str | None
    body: dict[str, Any]
    accept_encoding: str | None = None


@dataclass
class Receiver:
    port: int
    mode: Mode = "ok"
    status: int = 500  # answered in "error" mode
    body_bytes: int = 64 * 1024 * 1024  # the answer's size in "huge" mode, inflated in "gzip"
    redirect_to: str = ""  # where "redirect" mode sends the client
    encoding: str | None = None  # the Content-Encoding "custom" mode claims
    received: list[Received] = field(default_factory=list[Received])
    attempts: int = 0  # every request, whatever it was answered
    accept_encodings: list[str | None] = field(default_factory=list[str | None])
    bytes_sent: int = 0  # of the answer's body, in "huge" mode, before the client hung up
    hostile_done: int = 0  # hostile answers ended (sent whole, or cut by the client)
    _server: ThreadingHTTPServer | None = None
    _release: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/{SECRET_PATH}?{SECRET_QUERY}"

    def answer_with(self, status: int, size: int, encoding: str | None) -> None:
        """Answer every request ``status`` with ``size`` bytes claiming ``encoding``."""
        self.mode, self.status, self.body_bytes, self.encoding = "custom", status, size, encoding

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
                    receiver.accept_encodings.append(self.headers.get("Accept-Encoding"))
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
                if mode == "custom":
                    body = b"line one\n" + bytes(receiver.body_bytes)
                    self.send_response(receiver.status)
                    if receiver.encoding is not None:
                        self.send_header("Content-Encoding", receiver.encoding)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if mode in {"huge", "gzip", "redirect"}:
                    self.hostile(mode, raw)
                    return
                if mode == "ok":
                    self.record(raw)
                code = 200 if mode == "ok" else receiver.status
                self.send_response(code)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def record(self, raw: bytes) -> None:
                with receiver._lock:
                    receiver.received.append(
                        Received(
                            self.headers.get("Idempotency-Key"),
                            json.loads(raw),
                            self.headers.get("Accept-Encoding"),
                        )
                    )

            def hostile(self, mode: Mode, raw: bytes) -> None:
                if mode == "redirect":
                    self.send_response(307)
                    self.send_header("Location", receiver.redirect_to)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.record(raw)
                self.send_response(200)
                if mode == "gzip":
                    bomb = gzip_bomb(receiver.body_bytes)
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(bomb)))
                    self.end_headers()
                    self.wfile.write(bomb)
                    with receiver._lock:
                        receiver.hostile_done += 1
                    return
                self.send_header("Content-Length", str(receiver.body_bytes))
                self.end_headers()
                chunk = bytes(CHUNK)
                try:
                    for _ in range(receiver.body_bytes // CHUNK):
                        self.wfile.write(chunk)
                        with receiver._lock:
                            receiver.bytes_sent += CHUNK
                except OSError:  # the client hung up: what it was sent is counted
                    self.close_connection = True
                finally:
                    with receiver._lock:
                        receiver.hostile_done += 1

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
