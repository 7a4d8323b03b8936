"""Refusals: a command the master or the bridge will not carry out, each with the HTTP status
the API answers with.

Commands raise these instead of returning error values so the service reads as the happy path;
``keeper.httpapi.errors`` maps every ``RefusalError`` to exo's error body with its status, so a
refusal can never surface as a 500. They live in the data model because every floor raises or
reads them (the runtime, both services, the HTTP layer, the TUI's forms) and none may import
upward to reach them. The message is written for the operator: it names what was
wrong (the model, the id, the existing deployment).
"""

from __future__ import annotations


class RefusalError(Exception):
    status_code = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequestError(RefusalError):
    status_code = 400


class NotFoundError(RefusalError):
    status_code = 404


class ConflictError(RefusalError):
    status_code = 409


class NoInstanceError(NotFoundError):
    """The model has no instance whose every runner is ready, so nothing can serve a chat."""


class ChatFailedError(RefusalError):
    """A chat request started but could not finish: its node or instance went away, or it fell
    silent. Not the client's fault, hence 503."""

    status_code = 503


class NotRunningError(RefusalError):
    """The master's loops are not running (before ``run`` or after it ended)."""

    status_code = 503


class UnprocessableError(RefusalError):
    """A request whose form is right but whose content cannot be acted on as given (an empty
    list of nodes), hence 422, naming what was wrong."""

    status_code = 422
