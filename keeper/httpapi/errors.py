"""Every HTTP error leaves the master in exo's shape, whatever raised it.

``{"error": {"message", "type": <HTTP reason phrase>, "param", "code"}}`` for validation
failures, malformed JSON, unknown routes, the master's own refusals and, as a last resort, for
a bug (500 with a fixed message: the stack trace goes to the log, never to the client). The
validation message names the field and says why, e.g. ``min_nodes: Input should be greater than
or equal to 1``, because a client reading a bare 422 cannot tell which of its fields was wrong.

``RequestGuardMiddleware`` rejects what should never reach a handler: bodies over
``MAX_BODY_BYTES`` (413, by Content-Length and by the bytes actually streamed, since a chunked
upload has no Content-Length) and request bodies that are not JSON (415).

A 405 carries ``Allow`` with every method served at the path (``keeper.httpapi.contract``).
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keeper.httpapi.contract import allowed_methods
from keeper.model.api_models import error_body
from keeper.model.refusals import RefusalError

log = logging.getLogger(__name__)

# The largest body any endpoint takes is a chat conversation; 1 MiB holds a long one (about
# 250k tokens of text) while a client cannot make the master buffer arbitrary uploads. Every
# other body is well under a kilobyte.
MAX_BODY_BYTES = 1024 * 1024
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def error_response(
    status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        error_body(message, status, phrase(status), param), status_code=status, headers=headers
    )


def _field(loc: tuple[int | str, ...] | list[int | str]) -> str:
    parts = [str(part) for part in loc]
    if parts and parts[0] in {"body", "query", "path", "header"}:
        parts = parts[1:]
    return ".".join(parts)


def describe_validation(errors: list[Any]) -> tuple[int, str, str | None]:
    """(status, message, param) for a list of pydantic/FastAPI validation errors."""
    for error in errors:
        if error.get("type") == "json_invalid":
            ctx: dict[str, Any] = error.get("ctx") or {}
            detail = str(ctx.get("error", error.get("msg", "invalid JSON")))
            loc = list(error.get("loc", ()))
            where = f" at character {loc[-1]}" if loc and isinstance(loc[-1], int) else ""
            return 400, f"Malformed JSON body: {detail}{where}", None
    messages: list[str] = []
    first_param: str | None = None
    for error in errors:
        field = _field(error.get("loc", ()))
        message = str(error.get("msg", "invalid value"))
        if error.get("type") == "missing" and not field:
            message = "Request body required (a JSON object)"
        elif error.get("type") == "model_attributes_type" and not field:
            message = "Request body must be a JSON object"
        messages.append(f"{field}: {message}" if field else message)
        if first_param is None and field:
            first_param = field
    return 422, "; ".join(messages) or "Invalid request", first_param


def install_error_handlers(app: FastAPI, *, exo_validation: bool = False) -> None:
    """``exo_validation``: validation failures answered as exo answers them, with FastAPI's own
    422 ``{"detail": [...]}`` (malformed JSON included), not exo's envelope."""

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        if exo_validation:
            return await request_validation_exception_handler(request, exc)
        status, message, param = describe_validation(list(exc.errors()))
        return error_response(status, message, param)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        message = exc.detail or phrase(exc.status_code)
        headers = dict(exc.headers) if exc.headers else None
        allow = allowed_methods(app, request.url.path) if exc.status_code == 405 else None
        if allow is not None:
            # Starlette's Allow names the first route at the path only, not every method served.
            headers = {**(headers or {}), "Allow": allow}
        return error_response(exc.status_code, message, headers=headers)

    async def on_master(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RefusalError)
        return error_response(exc.status_code, exc.message, exc.param)

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "Internal error; the details are in this service's log")

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(RefusalError, on_master)
    app.add_exception_handler(Exception, on_bug)


class RequestGuardMiddleware:
    """413 for oversized bodies and 415 for non-JSON bodies, before any handler runs."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        headers = {name.lower(): value for name, value in scope["headers"]}
        length = headers.get(b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _send_error(send, 400, "Content-Length is not a number")
                return
            if declared > self.max_body_bytes:
                await _send_error(send, 413, self._too_large())
                return
        has_body = (length is not None and length != b"0") or b"transfer-encoding" in headers
        content_type = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if has_body and content_type != b"application/json":
            shown = content_type.decode(errors="replace") or "none"
            await _send_error(
                send, 415, f"Content-Type must be application/json (got {shown})", "content-type"
            )
            return

        received = 0

        async def limited_receive() -> Message:
            # Raised while the handler reads its body, before any response: the exception
            # handlers turn it into the 413 error body.
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise StarletteHTTPException(413, detail=self._too_large())
            return message

        await self.app(scope, limited_receive, send)

    def _too_large(self) -> str:
        return f"Request body is larger than the {self.max_body_bytes} bytes accepted here"


async def _send_error(send: Send, status: int, message: str, param: str | None = None) -> None:
    body = json.dumps(error_body(message, status, phrase(status), param)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
