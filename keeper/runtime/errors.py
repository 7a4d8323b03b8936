"""The master's refusals, each carrying the HTTP status the API answers with.

Commands raise these instead of returning error values so the service reads as the happy path;
``keeper.master.api`` maps every ``MasterError`` to exo's error body with its status, so a
refusal can never surface as a 500. The message is written for the operator: it names what was
wrong (the model, the id, the existing deployment).
"""

from __future__ import annotations


class MasterError(Exception):
    status_code = 400

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequestError(MasterError):
    status_code = 400


class NotFoundError(MasterError):
    status_code = 404


class ConflictError(MasterError):
    status_code = 409


class NoInstanceError(NotFoundError):
    """The model has no instance whose every runner is ready, so nothing can serve a chat."""


class ChatFailedError(MasterError):
    """A chat request started but could not finish: its node or instance went away, or it fell
    silent. Not the client's fault, hence 503."""

    status_code = 503


class NotRunningError(MasterError):
    """The master's loops are not running (before ``run`` or after it ended)."""

    status_code = 503
