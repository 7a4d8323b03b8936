"""The front door's connections to exo on real sockets (docs/design.md §8.6): chat after chat,
streamed or whole, answered or refused, goes over one kept-alive connection, because the door
reads each of exo's answers to its end (a stream past its ``[DONE]``); and an exo that keeps a
stream open after its ``[DONE]`` still has the door's answer end within its bound for that
read, its connection then closed; through the route the client's answer ends with its last
bytes, before the door has even given up on that stream (and the chat is counted ``ok``).

The upstream is a few lines of asyncio beside the door (exo's shapes, HTTP/1.1 by hand, a
stream written chunked as exo's uvicorn writes it), counting the connections it accepts: httpx's
pool keeps a connection only when its response was read to its end, so the count is what the
test asserts, on the door's own exo client (``keeper.bridge.exo_client``'s limits).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
import pytest
from fastapi import FastAPI
from front_door_harness import chat_scope, one_request
from starlette.types import Message

from keeper.bridge.exo_client import KEPT_CHAT_LINKS
from keeper.httpapi.front_door_routes import front_door_router
from keeper.runtime.front_door import FrontDoor, parse_chat
from keeper.runtime.front_door_upstream import AFTER_DONE_S

pytestmark = pytest.mark.anyio

MODEL = "mlx-community/Qwen3-0.6B-4bit"
# A chat whose last message says this is refused as exo refuses a model with no instance.
REFUSE = "links: refuse"
# A chat whose last message says this is streamed whole, then held open after its [DONE].
LINGER = "links: linger after [DONE]"
# Chats of each kind sent one after another: more than one, so a second connection would show.
CHATS = 4
# How long past the door's bound a lingering stream's end may come on two cores the parallel
# suite shares; far below the 30 s of silence the door would otherwise wait.
SLACK_S = 5.0
# The longest a test waits for anything else (a connection seen closed, a chat answered).
DEADLINE_S = 10.0


def _chunk(delta: dict[str, str], finish: str | None) -> bytes:
    body = {
        "id": "chatcmpl-links",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return _framed(f"data: {json.dumps(body)}\n\n".encode())


def _framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _head(status: str, length: int | None, kind: str) -> bytes:
    framing = f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    return f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\n{framing}\r\n\r\n".encode()


@dataclass
class Upstream:
    """exo's chat route, its connections counted (module doc)."""

    port: int = 0
    connections: int = 0
    closed: anyio.Event = field(default_factory=anyio.Event)  # a connection was closed

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                length = next(
                    int(line.split(":", 1)[1])
                    for line in head.split("\r\n")
                    if line.lower().startswith("content-length:")
                )
                chat = json.loads(await reader.readexactly(length))
                if not await self._answer(chat, reader, writer):
                    break
        writer.close()
        self.closed.set()

    async def _answer(
        self, chat: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """Answer one chat; whether the connection may carry another."""
        last = chat["messages"][-1]["content"]
        if last == REFUSE:
            body = json.dumps({"detail": f"No instance found for model {MODEL}"}).encode()
            writer.write(_head("404 Not Found", len(body), "application/json") + body)
        elif not chat.get("stream"):
            answer = {
                "id": "chatcmpl-links",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "Hi."},
                        "finish_reason": "stop",
                    }
                ],
            }
            body = json.dumps(answer).encode()
            writer.write(_head("200 OK", len(body), "application/json") + body)
        else:
            writer.write(_head("200 OK", None, "text/event-stream; charset=utf-8"))
            writer.write(_framed(b": keep-alive\n\n"))
            writer.write(_chunk({"role": "assistant", "content": "Hi."}, None))
            writer.write(_chunk({}, "stop"))
            writer.write(_framed(b"data: [DONE]\n\n"))
            await writer.drain()
            if last == LINGER:
                await reader.read()  # held open, the end never written, until the door leaves
                return False
            writer.write(b"0\r\n\r\n")  # the stream's end, after its [DONE], as exo's uvicorn
        await writer.drain()
        return True


@asynccontextmanager
async def upstream_and_door() -> AsyncIterator[tuple[Upstream, FrontDoor]]:
    """The upstream on a loopback port and a front door in front of it on an exo client with
    the bridge's limits for chats, for a model with no deployment (sent to exo at once)."""
    upstream = Upstream()
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=KEPT_CHAT_LINKS)
    async with (
        server,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{upstream.port}", limits=limits, trust_env=False
        ) as client,
    ):
        yield upstream, FrontDoor(lambda: [client], lambda _: None, anyio.current_time, anyio.sleep)


def _chat(content: str, stream: bool) -> bytes:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "stream": stream}
    return json.dumps(body).encode()


async def streamed(door: FrontDoor, content: str) -> bytes:
    """A streamed chat through ``door``, read to its end: the bytes the client got."""
    request, body = parse_chat(_chat(content, True))
    pieces = [piece async for piece in door.stream(request, body)]
    assert all(isinstance(piece, bytes) for piece in pieces), pieces
    return b"".join(piece for piece in pieces if isinstance(piece, bytes))


async def whole(door: FrontDoor, content: str) -> tuple[int, bytes]:
    return await door.answer(*parse_chat(_chat(content, False)))


async def test_streamed_chats_share_one_connection() -> None:
    async with upstream_and_door() as (upstream, door):
        with anyio.fail_after(DEADLINE_S):
            for _ in range(CHATS):
                answer = await streamed(door, "hello")
                assert answer.endswith(b"data: [DONE]\n\n"), answer
                assert b'"Hi."' in answer
        assert upstream.connections == 1


async def test_whole_and_refused_chats_share_the_connection_too() -> None:
    async with upstream_and_door() as (upstream, door):
        with anyio.fail_after(DEADLINE_S):
            for _ in range(CHATS):
                status, answer = await whole(door, "hello")
                assert status == 200
                assert json.loads(answer)["choices"][0]["finish_reason"] == "stop"
                status, answer = await whole(door, REFUSE)
                assert status == 404
                assert "No instance found" in json.loads(answer)["error"]["message"]
                assert (await streamed(door, "hello")).endswith(b"data: [DONE]\n\n")
        assert upstream.connections == 1


async def test_a_stream_held_open_after_its_done_ends_within_the_bound() -> None:
    async with upstream_and_door() as (upstream, door):
        with anyio.fail_after(AFTER_DONE_S + SLACK_S):
            answer = await streamed(door, LINGER)
        assert answer.endswith(b"data: [DONE]\n\n"), answer
        with anyio.fail_after(DEADLINE_S):
            await upstream.closed.wait()  # the door closed the held connection
        with anyio.fail_after(DEADLINE_S):
            assert (await streamed(door, "hello")).endswith(b"data: [DONE]\n\n")
        assert upstream.connections == 2  # the held one could not carry another chat


@dataclass
class Answered:
    """A streamed chat's answer as the route wrote it, and the door as it was at its end."""

    read: bytearray = field(default_factory=bytearray)
    counted_at_end: float | None = None  # the door's ``ok`` count when the answer ended
    held_at_end: bool | None = None  # whether exo still held its stream then


async def through_the_route(door: FrontDoor, upstream: Upstream, content: str) -> Answered:
    """A streamed chat through the door's route, driven as a server drives an ASGI app."""
    app = FastAPI()
    app.include_router(front_door_router(door, {}))
    body = _chat(content, True)
    scope = chat_scope(body)
    answered = Answered()
    ended = anyio.Event()
    receive = one_request(body, ended)  # disconnected as uvicorn does, once the response is whole

    async def send(message: Message) -> None:
        if message["type"] != "http.response.body":
            return
        answered.read += message.get("body", b"")
        if not message.get("more_body", False):
            answered.counted_at_end = door.counts.total("", "ok")
            answered.held_at_end = not upstream.closed.is_set()
            ended.set()

    await app(scope, receive, send)
    return answered


async def test_through_the_route_the_answer_ends_with_its_last_bytes() -> None:
    async with upstream_and_door() as (upstream, door):
        with anyio.fail_after(AFTER_DONE_S + SLACK_S):
            answered = await through_the_route(door, upstream, LINGER)
        assert answered.read.endswith(b"data: [DONE]\n\n"), answered.read
        # The client's answer ended while the door still read exo's stream after its [DONE]
        # (it gives up only after AFTER_DONE_S), before it counted the chat...
        assert answered.held_at_end is True
        assert answered.counted_at_end == 0
        # ...which it then did, as answered: the response's end did not cancel it.
        assert door.counts.total("", "ok") == 1
        assert door.counts.total("", "cancelled") == 0
        assert door.inflight == 0
        with anyio.fail_after(DEADLINE_S):
            await upstream.closed.wait()


async def test_through_the_route_chats_share_one_connection() -> None:
    async with upstream_and_door() as (upstream, door):
        with anyio.fail_after(DEADLINE_S):
            for _ in range(CHATS):
                answered = await through_the_route(door, upstream, "hello")
                assert answered.read.endswith(b"data: [DONE]\n\n"), answered.read
        assert door.counts.total("", "ok") == CHATS
        assert upstream.connections == 1
