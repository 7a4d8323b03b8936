"""What the OpenAPI document says about errors: every status a route can answer, with its body.

The document (``GET /openapi.json``) is the API's contract, and tests fuzz each app against it
(``tests/virtual/test_openapi_contract.py``), so it must list every code a route answers, not
only 200 and FastAPI's 422. Codes come from two places, declared in two ways:

- a route's own refusals (an unknown id, a conflict, the service not running), declared on the
  route with ``refusals(...)``, each with the description that says when;
- what the app answers before any handler runs, the same for every route of its kind, added to
  the generated document by ``declare_app_answers`` (``keeper.httpapi.app`` calls it): the
  request guard's 413/415 and malformed JSON's 400 on routes with a body, the token's 401 on
  changes when there is a token (and the bearer scheme they need), and the validation 422 in
  the app's own shape (exo's envelope, or FastAPI's ``{"detail": [...]}`` on exo's stand-in,
  which answers as exo does).

A method a path does not serve answers 405 with ``Allow`` listing the methods it does serve,
as the document lists them (``allowed_methods``; Starlette's own names only the first route at
the path), a concrete path before templated ones, as OpenAPI matches them. OPTIONS is
one of those methods: there is no CORS (``keeper.httpapi.auth``), so nothing needs a preflight
answer, and OPTIONS is a 405 with the real ``Allow`` like any other method.
"""

from __future__ import annotations

import re
from typing import Any, cast

from fastapi import FastAPI
from fastapi.openapi.utils import (
    validation_error_definition,  # pyright: ignore[reportUnknownVariableType] (an untyped dict)
    validation_error_response_definition,  # pyright: ignore[reportUnknownVariableType]
)
from pydantic import BaseModel

from keeper.httpapi.auth import MUTATING_METHODS
from keeper.model.api_models import ErrorResponse

Responses = dict[int | str, dict[str, Any]]

# What each refusal means, said once; a route may say it more precisely (``refusals``).
DESCRIPTIONS: dict[int, str] = {
    400: "A request that cannot work: malformed JSON, or refused (the message says why)",
    401: "Missing or wrong bearer token (this server was started with a token)",
    404: "Not found (the message names what)",
    409: "Conflicts with what exists (the message names it)",
    413: "Request body too large",
    415: "Request body is not application/json",
    422: "The body or query does not match the schema (the message names the field)",
    503: "The service cannot act now: not running, or cannot record the change",
}
# The methods whose body the request guard checks (``keeper.httpapi.errors``).
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
# Where a document's ``$ref`` finds a named schema (OpenAPI's components).
COMPONENTS = "#/components/schemas/"
# The name of the token check in the document (``keeper.httpapi.auth``): changes need it.
BEARER = "bearer"
# The only media type a body or an error is written in.
JSON = "application/json"


def ok_body(model: type[BaseModel]) -> Responses:
    """The ``responses`` entry of a route whose 200 body is ``model`` (the handler writes the
    JSON itself, so FastAPI cannot see it)."""
    return {200: {"model": model, "description": "OK"}}


def refusals(*codes: int | tuple[int, str]) -> Responses:
    """The ``responses`` of a route that may answer these codes in exo's error envelope, each
    with the default description or, given as ``(code, description)``, its own."""
    answers: Responses = {}
    for item in codes:
        code, description = item if isinstance(item, tuple) else (item, DESCRIPTIONS[item])
        answers[code] = {"model": ErrorResponse, "description": description}
    return answers


def declare_app_answers(document: dict[str, Any], *, token: bool, exo_validation: bool) -> None:
    """Add to a generated OpenAPI ``document`` what the app answers before a handler runs, on
    every operation it applies to (an operation's own declaration of a code is kept, but for
    FastAPI's 422 where the app answers 422 in exo's envelope)."""
    error = {"content": {JSON: {"schema": {"$ref": f"{COMPONENTS}ErrorResponse"}}}}
    fastapi_422 = {
        "description": "Validation Error",
        "content": {JSON: {"schema": {"$ref": f"{COMPONENTS}HTTPValidationError"}}},
    }
    used = False
    for path_item in document.get("paths", {}).values():
        for method, operation in path_item.items():
            codes: list[int] = []
            has_body = "requestBody" in operation
            if has_body and method.upper() in _BODY_METHODS:
                # 400: a body that is not JSON at all (FastAPI's "error parsing the body"), or,
                # answered in exo's envelope, malformed JSON.
                codes += [400, 413, 415]
            if token and method.upper() in MUTATING_METHODS:
                codes.append(401)
                operation.setdefault("security", [{BEARER: []}])
            responses: dict[str, Any] = operation.setdefault("responses", {})
            takes_input = has_body or bool(operation.get("parameters"))
            if takes_input and not exo_validation:
                if responses.get("422", {}).get("description") == fastapi_422["description"]:
                    del responses["422"]  # FastAPI's {"detail": [...]}: not what is sent
                codes.append(422)  # (a route's own 422, declared with its reason, is kept)
            elif takes_input:
                # A route that parses its raw body itself has no 422 from FastAPI to show.
                responses.setdefault("422", fastapi_422)
            for code in codes:
                used = True
                responses.setdefault(str(code), {"description": DESCRIPTIONS[code], **error})
    components: dict[str, Any] = document.setdefault("components", {})
    if token:
        components.setdefault("securitySchemes", {})[BEARER] = {"type": "http", "scheme": "bearer"}
    schemas: dict[str, Any] = components.setdefault("schemas", {})
    if exo_validation:
        schemas.setdefault("ValidationError", cast(object, validation_error_definition))
        schemas.setdefault(
            "HTTPValidationError", cast(object, validation_error_response_definition)
        )
    if used:
        add_component(document, ErrorResponse)


def add_component(document: dict[str, Any], model: type[BaseModel]) -> None:
    """``model``'s schema (and those it refers to) in the document's components."""
    schema = model.model_json_schema(ref_template=COMPONENTS + "{model}")
    schemas: dict[str, Any] = document.setdefault("components", {}).setdefault("schemas", {})
    for name, definition in schema.pop("$defs", {}).items():
        schemas.setdefault(name, definition)
    schemas.setdefault(model.__name__, schema)


def allowed_methods(app: FastAPI, path: str) -> str | None:
    """The ``Allow`` header for a request to ``path``: every method the document lists at the
    path, a concrete path before templated ones (as OpenAPI matches them, so GET-only
    ``/instance/placement`` does not advertise ``DELETE /instance/{instance_id}``'s method).
    None for a path the document does not show (``/openapi.json`` itself)."""
    paths: dict[str, dict[str, Any]] = app.openapi().get("paths", {})
    item = paths.get(path)
    if item is None:
        matching = [item for template, item in paths.items() if _pattern(template).match(path)]
        item = {method: None for found in matching for method in found}
    return ", ".join(sorted(method.upper() for method in item)) or None


def _pattern(template: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]*\})", template)
    return re.compile(
        "".join("[^/]+" if part.startswith("{") else re.escape(part) for part in parts) + "$"
    )
