"""The FastAPI app every API we serve starts from: the master's, exo's stand-in's
(``master --exo-compat``) and the bridge's.

They must fail alike, so each is built here with the same pieces: exo's error bodies for every
way a request can be wrong (``keeper.httpapi.errors``), the request guard (body size, JSON
only), and the bearer-token check when there is a token (``keeper.httpapi.auth``). No docs pages:
an operator's API, not a public one. ``command_json`` is how every command's answer is written.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response

from keeper.api_models import CommandResponse
from keeper.httpapi.auth import BearerTokenMiddleware
from keeper.httpapi.errors import MAX_BODY_BYTES, RequestGuardMiddleware, install_error_handlers

JSON = "application/json"


def new_app(
    title: str,
    token: str | None,
    *,
    summary: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """An app with no routes yet, answering errors in exo's shape and guarding its requests."""
    app = FastAPI(title=title, summary=summary, docs_url=None, redoc_url=None)
    install_error_handlers(app)
    # Added innermost first: the token check runs before the body is even looked at.
    app.add_middleware(RequestGuardMiddleware, max_body_bytes=max_body_bytes)
    if token:
        app.add_middleware(BearerTokenMiddleware, token=token)
    return app


def command_json(response: CommandResponse) -> Response:
    # A command's fields that do not apply (a deployment command has no instance_id) are left
    # out rather than sent as null.
    return Response(response.model_dump_json(exclude_none=True), media_type=JSON)
