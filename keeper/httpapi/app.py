"""The FastAPI app every API we serve starts from: the master's, exo's stand-in's
(``master --exo-compat``) and the bridge's.

They must fail alike, so each is built here with the same pieces: exo's error bodies for every
way a request can be wrong (``keeper.httpapi.errors``), the request guard (body size, JSON
only), and the bearer-token check when there is a token (``keeper.httpapi.auth``). No docs pages:
an operator's API, not a public one. ``command_json`` is how every command's answer is written.

The OpenAPI document is the contract, fuzzed by the tests: each route declares its own refusals
(``keeper.httpapi.contract.refusals``), and ``ServiceApp`` adds what these shared pieces answer
before a handler runs, so the document lists every status any request can get.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel

from keeper.httpapi.auth import BearerTokenMiddleware
from keeper.httpapi.contract import COMPONENTS, add_component, declare_app_answers
from keeper.httpapi.errors import MAX_BODY_BYTES, RequestGuardMiddleware, install_error_handlers
from keeper.model.api_models import CommandResponse

JSON = "application/json"
# Said in every document: what the paths' operations cannot say for themselves.
METHODS_NOTE = (
    "A method a path does not list answers 405 with an Allow header naming the methods it does;"
    " OPTIONS too (there is no CORS)."
)


class ServiceApp(FastAPI):
    """A FastAPI app whose document also lists the answers of the request guard, the token
    check and validation (``keeper.httpapi.contract.declare_app_answers``)."""

    def __init__(self, *, token: bool, exo_validation: bool, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.has_token = token
        self.exo_validation = exo_validation
        # Models a route reads itself (not as a FastAPI body), named in ``openapi_extra`` by
        # ``body_ref``: their schemas go into the document's components.
        self.raw_body_models: list[type[BaseModel]] = []

    def body_ref(self, model: type[BaseModel]) -> dict[str, Any]:
        """The ``requestBody`` of a route that parses ``model`` from the raw body itself."""
        self.raw_body_models.append(model)
        schema = {"$ref": f"{COMPONENTS}{model.__name__}"}
        return {"required": True, "content": {JSON: {"schema": schema}}}

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            document = super().openapi()
            declare_app_answers(document, token=self.has_token, exo_validation=self.exo_validation)
            for model in self.raw_body_models:
                add_component(document, model)
        assert self.openapi_schema is not None
        return self.openapi_schema


def new_app(
    title: str,
    token: str | None,
    *,
    summary: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    exo_validation: bool = False,
) -> ServiceApp:
    """An app with no routes yet, answering errors in exo's shape and guarding its requests.

    ``exo_validation``: a body or query that fails validation gets FastAPI's own 422
    ``{"detail": [...]}``, as exo answers it, instead of exo's error envelope."""
    app = ServiceApp(
        token=bool(token),
        exo_validation=exo_validation,
        title=title,
        summary=summary,
        description=METHODS_NOTE,
        docs_url=None,
        redoc_url=None,
    )
    install_error_handlers(app, exo_validation=exo_validation)
    # Added innermost first: the token check runs before the body is even looked at.
    app.add_middleware(RequestGuardMiddleware, max_body_bytes=max_body_bytes)
    if token:
        app.add_middleware(BearerTokenMiddleware, token=token)
    return app


def command_json(response: CommandResponse) -> Response:
    # A command's fields that do not apply (a deployment command has no instance_id) are left
    # out rather than sent as null.
    return Response(response.model_dump_json(exclude_none=True), media_type=JSON)
