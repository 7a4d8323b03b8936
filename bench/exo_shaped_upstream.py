"""A minimal exo-shaped upstream for ``python -m bench requests``: exo's chat answered at once,
and a recorded exo State for the bridge to follow (docs/design.md §8.6).

The front door's own cost per chat is a millisecond or two; the stand-in's simulated nodes
write a token every 50 ms through a master, a websocket and a node process, and their jitter on
two shared cores is larger than that cost. So the bench also runs the bridge against this:
a chat answered as soon as its request is read, in exo's shapes (streamed: the keep-alive
comment exo opens with, a few ``chat.completion.chunk`` events, one with a ``finish_reason``,
then ``[DONE]``; not streamed: one ``chat.completion``), so what the bench times through the
bridge is the bridge.

Shaped so:

- *Raw asyncio, HTTP/1.1 by hand.* No framework: the upstream's own cost is in both the straight
  and the through figure, and the smaller it is the less noise it adds to their difference. It
  reads only what the bridge and the bench send (a request line, headers, a ``Content-Length``
  body, keep-alive) and writes streams chunked, as exo's uvicorn does.
- *A recorded State, kept alive.* The bridge needs exo's State at ``GET /state`` to follow exo
  and to see a deployment's instance ready. The bench records the stand-in's (with the instance
  the bridge placed there) and this serves it, with every node's ``lastSeen`` set to now at each
  read: a State whose nodes are never heard again would have the bridge judge them.
- *Held streams on request.* A chat whose last message is ``HOLD`` is answered with its first
  token and then held open, a token every ``HELD_TOKEN_S`` (a slow model) and never a
  ``finish_reason``, until the client goes: the streams-held-at-once figure needs streams that
  stay open. One whose last message is ``SILENT`` is held the same way with nothing but exo's
  keep-alive comment every 10 s, as exo holds a stream before a long prompt's first token.
- *Counts for the bench.* Anything else the bridge sends (``POST /instance``, a download) is
  answered as exo acknowledges a command and listed; with the connections accepted and the
  chats answered, at ``GET /bench/counts``: the bench prints how many connections the bridge
  opened for its chats (a connection kept alive is a connect and a close saved a chat), and any
  command (a bridge acting on this State would mean it was not read as meant).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from datetime import UTC, datetime
from multiprocessing.queues import Queue
from typing import Any

# A chat whose last message says this is held open after its first token (module doc)...
HOLD = "bench: hold this stream open"
# ...a token this often: a slow model's pace, and well within any read timeout on the way.
HELD_TOKEN_S = 5.0
# A chat whose last message says this is held open with keep-alives only (module doc).
SILENT = "bench: hold this stream open, silent"
# exo writes a keep-alive comment on a stream every 10 s while it has nothing else to write.
KEEPALIVE_S = 10.0
# Tokens of an answer: a few, so a stream is several events as exo writes them.
TOKENS = ("The", " answer", " is", " here", ".")
# The longest request head read: the bridge's and the bench's are a few hundred bytes.
MAX_HEAD_BYTES = 64 * 1024
# Where the bench reads the connections, chats and commands counted (module doc).
COUNTS_PATH = "/bench/counts"

_KEEPALIVE = b": keep-alive\n\n"


def _chunk(completion_id: str, model: str, delta: dict[str, str], finish: str | None) -> bytes:
    body = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def _completion(completion_id: str, model: str) -> bytes:
    return json.dumps(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(TOKENS)},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": len(TOKENS), "total_tokens": 6},
        }
    ).encode()


def _head(status: str, kind: str, length: int | None) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n{framing}\r\n\r\n".encode()


def _framed(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


class Upstream:
    """The upstream's answers (module doc); one per process."""

    def __init__(self, state: dict[str, Any], models: bytes, node_id: bytes) -> None:
        self._state = state
        self._models = models
        self._node_id = node_id
        self.chats = 0
        self.connections = 0
        self.commands: list[str] = []

    def state_body(self) -> bytes:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
        seen: dict[str, str] = self._state.get("lastSeen") or {}
        self._state["lastSeen"] = dict.fromkeys(seen, now)
        return json.dumps(self._state).encode()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError, ValueError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if len(head) > MAX_HEAD_BYTES:
                    return
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {
                    name.strip().lower(): value.strip()
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", "0"))
                body = await reader.readexactly(length) if length else b""
                if not await self._answer(method, path.split("?", 1)[0], body, reader, writer):
                    return
                if headers.get("connection", "").lower() == "close":
                    return
        with contextlib.suppress(ConnectionError):
            writer.close()

    async def _answer(
        self,
        method: str,
        path: str,
        body: bytes,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> bool:
        """Answer one request; whether the connection may carry another."""
        json_kind = "application/json"
        if method == "POST" and path == "/v1/chat/completions":
            return await self._chat(json.loads(body), reader, writer)
        if method == "GET" and path == "/state":
            answer = self.state_body()
        elif method == "GET" and path in ("/models", "/v1/models"):
            answer = self._models
        elif method == "GET" and path == "/node_id":
            answer = self._node_id
        elif method == "GET" and path == COUNTS_PATH:
            counts = {"connections": self.connections, "chats": self.chats}
            answer = json.dumps({**counts, "commands": self.commands}).encode()
        elif method == "GET":
            answer = b'{"detail":"Not Found"}'
            writer.write(_head("404 Not Found", json_kind, len(answer)) + answer)
            await writer.drain()
            return True
        else:
            self.commands.append(f"{method} {path}")
            answer = b'{"message":"Command received."}'
        writer.write(_head("200 OK", json_kind, len(answer)) + answer)
        await writer.drain()
        return True

    async def _chat(
        self, chat: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        self.chats += 1
        completion_id = f"chatcmpl-bench-{self.chats}"
        model = str(chat.get("model", ""))
        if not chat.get("stream"):
            answer = _completion(completion_id, model)
            writer.write(_head("200 OK", "application/json", len(answer)) + answer)
            await writer.drain()
            return True
        writer.write(_head("200 OK", "text/event-stream; charset=utf-8", None))
        writer.write(_framed(_KEEPALIVE))
        messages: list[dict[str, Any]] = chat.get("messages") or [{}]
        last = messages[-1].get("content")
        if last in (HOLD, SILENT):
            delta = {"role": "assistant", "content": TOKENS[0]}
            token = _framed(_chunk(completion_id, model, delta, None))
            writer.write(token)
            await writer.drain()
            if last == HOLD:
                await _hold(reader, writer, HELD_TOKEN_S, token)
            else:
                await _hold(reader, writer, KEEPALIVE_S, _framed(_KEEPALIVE))
            return False
        for token in TOKENS:
            delta = {"role": "assistant", "content": token}
            writer.write(_framed(_chunk(completion_id, model, delta, None)))
        writer.write(_framed(_chunk(completion_id, model, {}, "stop")))
        writer.write(_framed(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()
        return True


async def _hold(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, every_s: float, piece: bytes
) -> None:
    """Keep a stream open, writing ``piece`` every ``every_s``, until the client closes it."""
    while True:
        try:
            left = await asyncio.wait_for(reader.read(1), every_s)
        except TimeoutError:
            writer.write(piece)
            await writer.drain()
            continue
        if not left:
            return


def serve(port_queue: Queue[int], state: dict[str, Any], models: bytes, node_id: bytes) -> None:
    """Serve on a loopback port the kernel picks (put on ``port_queue``) until terminated."""
    upstream = Upstream(state, models, node_id)

    async def main() -> None:
        server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0, backlog=1024)
        port_queue.put(server.sockets[0].getsockname()[1])
        async with server:
            await server.serve_forever()

    asyncio.run(main())
