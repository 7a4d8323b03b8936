"""A bare HTTP/1.1 keep-alive chat client for ``python -m bench requests``: one chat at a time on
one connection, timed to its first token and to its end.

The bench compares chats sent straight to an upstream with the same chats sent through the
bridge's front door (docs/design.md §8.6); the client's own cost is in both, so the less of it
the less noise in their difference (as ``bench.master_bench``'s bare GET client, for the same
reason: the client shares the machine's two cores). It reads what uvicorn and the bench's own
upstream write: a ``Content-Length`` body or a chunked one.

Timed as the front door counts a chat's time to first token: for a stream, until the first
``data:`` event arrives (a keep-alive comment is not a token); for a whole answer, until the
answer is read. A chat is good when it ends as a whole answer ends: a 200 with a
``finish_reason``, and for a stream one ``[DONE]``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from anyio.abc import SocketStream

CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Timed:
    """One chat: seconds to its first token and to its end, and whether it ended whole."""

    ttft: float
    total: float
    good: bool
    status: int


def chat_body(model: str, content: str, stream: bool, max_tokens: int) -> bytes:
    """A chat's JSON, as a client sends it."""
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": content}],
            "stream": stream,
            "max_tokens": max_tokens,
        }
    ).encode()


class ChatConnection:
    """One keep-alive connection to one server; chats on it one after another."""

    def __init__(self, stream: SocketStream) -> None:
        self._stream = stream
        self._buffer = b""

    @classmethod
    async def open(cls, port: int) -> ChatConnection:
        return cls(await anyio.connect_tcp("127.0.0.1", port))

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def chat(self, body: bytes) -> Timed:
        """Send one chat and read its whole answer."""
        started = time.perf_counter()
        status, chunked, length = await self.send(body)
        first: float | None = None
        seen = bytearray()
        async for piece in self._body(chunked, length):
            seen += piece
            if first is None and b"data:" in seen:
                first = time.perf_counter()
        ended = time.perf_counter()
        text = bytes(seen)
        if chunked:
            good = status == 200 and text.count(b"data: [DONE]") == 1
            good = good and b'"finish_reason":"' in text.replace(b'": "', b'":"')
        else:
            first = ended
            good = status == 200 and b'"finish_reason":"' in text.replace(b'": "', b'":"')
        return Timed((first or ended) - started, ended - started, good, status)

    async def send(self, body: bytes) -> tuple[int, bool, int]:
        """Send a chat and read the head of its answer: (status, chunked, Content-Length)."""
        await self._stream.send(
            b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (CHAT_PATH.encode(), len(body), body)
        )
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = dict(line.lower().split(b":", 1) for line in lines[1:])
        chunked = headers.get(b"transfer-encoding", b"").strip() == b"chunked"
        return status, chunked, int(headers.get(b"content-length", b"0"))

    async def first_data(self) -> bool:
        """After ``send`` of a stream: read until its first ``data:`` event (a token); whether
        one came before the stream ended."""
        while b"data:" not in self._buffer:
            if self._buffer.endswith(b"0\r\n\r\n"):
                return False
            self._buffer += await self._stream.receive()
        return True

    async def rest(self) -> bytes:
        """After ``send`` of a stream: the rest of its body, to its end."""
        return b"".join([piece async for piece in self._body(True, 0)])

    async def _body(self, chunked: bool, length: int) -> AsyncIterator[bytes]:
        if not chunked:
            while len(self._buffer) < length:
                self._buffer += await self._stream.receive()
            body, self._buffer = self._buffer[:length], self._buffer[length:]
            yield body
            return
        while True:
            while b"\r\n" not in self._buffer:
                self._buffer += await self._stream.receive()
            size_line, rest = self._buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";", 1)[0], 16)
            while len(rest) < size + 2:
                rest += await self._stream.receive()
            self._buffer = rest[size + 2 :]
            if size == 0:
                return
            yield rest[:size]
