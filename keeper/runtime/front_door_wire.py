"""The front door's side of the wire with its client (docs/design.md §8.6): the paths, the chat
as the front door reads it and as the API's document shows it, the refusal it answers before
anything goes to exo, and the bytes it writes back (an SSE event, an error envelope).

Apart from ``keeper.runtime.front_door`` (what happens to a chat) because the routes
(``keeper.httpapi.front_door_routes``) and the services' documents need these shapes without
the machinery: a body is parsed and refused here, and only a chat that parses reaches the door.
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from keeper.model.api_models import error_body

CHAT_PATH = "/v1/chat/completions"
MODELS_PATH = "/v1/models"
SSE = "text/event-stream"


class ChatRequest(BaseModel):
    """The fields of an OpenAI chat the front door reads; every other is passed on as sent."""

    model_config = ConfigDict(extra="allow")

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    n: int | None = None
    logprobs: bool | None = None


class ChatDocumentMessage(BaseModel):
    """A message as the API's document shows it: what every exo reads (exo reads more: content
    as parts, tool calls; the front door passes on whatever is sent)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(min_length=1, max_length=64)
    content: str


class ChatDocument(BaseModel):
    """A chat as the API's document shows it (``ChatRequest`` is what is checked)."""

    model_config = ConfigDict(extra="allow", title="ChatCompletionRequest")

    model: str = Field(min_length=1, max_length=512)
    messages: list[ChatDocumentMessage] = Field(min_length=1)
    stream: bool = False


class RequestError(Exception):
    """A request the front door answers with an error before anything is sent upstream;
    ``model``: the model it names, when that much of it could be read (it is counted under the
    model's deployment)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        retry_after: int | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.retry_after = retry_after
        self.model = model


def parse_chat(raw: bytes) -> tuple[ChatRequest, dict[str, Any]]:
    """The request and its JSON as sent; ``RequestError`` 400 naming the field otherwise."""
    try:
        body: Any = json.loads(raw)
    except ValueError as exc:
        raise RequestError(400, f"Malformed JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object")
    body = cast(dict[str, Any], body)
    try:
        request = ChatRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        named = body.get("model")
        model = named if isinstance(named, str) and named else None
        raise RequestError(400, f"{where}: {first['msg']}", where or None, model=model) from None
    return request, body


class LastPiece(bytes):
    """A stream's last bytes for its client: nothing follows them (its ``[DONE]``, or the
    error event that ends it), so the route ends the response with them, in one write, while
    the door closes exo's stream and counts the chat (``keeper.httpapi.front_door_routes``)."""


def sse_event(payload: dict[str, Any]) -> bytes:
    """One SSE event carrying ``payload`` as its data."""
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


def error_json(status: int, message: str) -> bytes:
    """The error envelope's JSON (``keeper.httpapi.errors``' shape, OpenAI's keys)."""
    return json.dumps(error_body(message, status, HTTPStatus(status).phrase)).encode()
