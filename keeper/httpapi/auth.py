"""Who may change the cluster: loopback-only by default, a bearer token otherwise.

A master bound to 127.0.0.1 is reachable only from its own machine, so it needs no token. Bound
to any other address it could be driven by anyone on the network, so the runtime's ``check_bind``
(``keeper.runtime.starting``) refuses to start it without a token. With a token, every mutating
HTTP call (POST, DELETE) and the node WebSocket need ``Authorization: Bearer <token>``; reads
(GET) stay open so dashboards and monitoring keep working. Tokens are compared with
``hmac.compare_digest`` so response timing says nothing about how much of a guess was right.
There is deliberately no CORS middleware: no browser page from another origin may call the API.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from keeper.model.api_models import error_body

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def bearer_matches(headers: Iterable[tuple[bytes, bytes]], token: str) -> bool:
    """Whether the raw ASGI headers carry ``Authorization: Bearer <token>``; the scheme's name
    is case-insensitive (RFC 7235: ``bearer`` and ``BEARER`` are the same scheme), the token
    is not, and it is compared in constant time."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = value.strip().partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(
                credentials.strip(), token.encode()
            )
    return False


class BearerTokenMiddleware:
    """Answers 401 (exo's error body) to a mutating HTTP request without the right token."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self.token = token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in MUTATING_METHODS
            and not bearer_matches(scope["headers"], self.token)
        ):
            body = json.dumps(
                error_body(
                    "Missing or wrong bearer token: changes here need "
                    "'Authorization: Bearer <token>' (the token this service was started with)",
                    401,
                    "Unauthorized",
                )
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)
