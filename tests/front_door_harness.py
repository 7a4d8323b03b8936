"""The bridge's front door on the stock-exo stand-in, for the front door's virtual tests
(docs/design.md §8.6): a deployment serving behind the door, the chats as a client sends and
reads them, the chats exo was sent, the door's counts, and a client that leaves mid-answer.

httpx's ASGI transport hands a response over only once the app has written all of it, and
never tells the app its client went away; a test drives the app as a server does
instead (``stream_chat``), reading each piece as it is written and saying ``http.disconnect``
once the client has what it wanted.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx
from bridge_harness import ExoWithBridge, bridge_api, exo_with_bridge, sse_events
from model_ids import QWEN
from starlette.types import ASGIApp, Message

from keeper.bridge.service import BridgeConfig
from keeper.model.request_rule import Outcome

CHAT = "/v1/chat/completions"
ASK = [{"role": "user", "content": "hello"}]
NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))


def chat(stream: bool, **extra: Any) -> dict[str, Any]:
    return {"model": QWEN, "messages": ASK, "stream": stream, "max_tokens": 8, **extra}


@asynccontextmanager
async def serving(
    config: BridgeConfig | None = None, nodes: tuple[tuple[str, float], ...] = NODES
) -> AsyncIterator[tuple[ExoWithBridge, httpx.AsyncClient]]:
    """Qwen deployed and serving through a bridge, and a client of the bridge's API."""
    async with exo_with_bridge(nodes=nodes, bridge_config=config) as h:
        await h.serve_qwen()
        async with bridge_api(h.bridge) as api:
            yield h, api


def deployment_of(h: ExoWithBridge) -> str:
    (view,) = h.bridge.deployments_view().deployments
    return view.deployment.deployment_id


def counted(h: ExoWithBridge, outcome: Outcome, deployment: str | None = None) -> float:
    """The door's count of ``outcome`` under ``deployment`` (Qwen's when not given)."""
    return h.bridge.front_door.counts.total(
        deployment_of(h) if deployment is None else deployment, outcome
    )


def chats_sent(h: ExoWithBridge) -> list[dict[str, Any]]:
    return [body for method, path, body in h.link.calls if (method, path) == ("POST", CHAT)]


def text_of(events: list[str]) -> str:
    return "".join(
        choice.get("delta", {}).get("content") or ""
        for event in events
        if event != "[DONE]"
        for choice in json.loads(event).get("choices", [])
    )


@dataclass
class Streamed:
    """A chat's answer as a client on a socket read it."""

    status: int = 0
    read: bytearray = field(default_factory=bytearray)
    ended: bool = False  # the server ended the response (else the client left first)

    @property
    def events(self) -> list[str]:
        return sse_events(bytes(self.read))


def chat_scope(content: bytes) -> dict[str, Any]:
    """The ASGI scope of ``POST /v1/chat/completions`` with ``content`` as uvicorn gives it."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},  # as uvicorn serves
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT,
        "raw_path": CHAT.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("test", 80),
    }


def one_request(content: bytes, until: anyio.Event) -> Callable[[], Awaitable[Message]]:
    """An ASGI ``receive`` as a server gives one: the request's whole body once, then a
    disconnect once ``until`` is set (the client gone, or the response whole)."""
    asked = False

    async def receive() -> Message:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": content, "more_body": False}
        await until.wait()
        return {"type": "http.disconnect"}

    return receive


async def stream_chat(
    app: ASGIApp, body: dict[str, Any], leave_after: int | None = None, into: Streamed | None = None
) -> Streamed:
    """POST ``body`` to the app's chat route as a client on a socket would, reading the answer
    as it is written (into ``into``, to watch it meanwhile), and go away once ``leave_after``
    data events have come (None: read to the end)."""
    content = json.dumps(body).encode()
    scope = chat_scope(content)
    answer = into if into is not None else Streamed()
    gone = anyio.Event()
    receive = one_request(content, gone)

    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            answer.status = message["status"]
        elif message["type"] == "http.response.body" and not gone.is_set():
            answer.read.extend(message.get("body", b""))
            answer.ended = not message.get("more_body", False)
            if leave_after is not None and len(answer.events) >= leave_after:
                gone.set()

    await app(scope, receive, send)
    return answer
