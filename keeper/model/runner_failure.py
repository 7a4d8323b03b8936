"""A failed runner in a few words (docs/design.md §5.19, "Seen").

exo's ``RunnerFailed`` carries ``errorMessage``, often a whole Python traceback of the runner
process ("Terminated (exitcode=1\\nRunner error: ...\\nTraceback (most recent call last):\\n  File
..." and on for sixty lines), and ``diagnostics``, what exo recognised in the runner's output
(a Metal GPU timeout, a ring socket error). The operator reads them in one line: the deployment's
health ``why``, an incident's cause, a webhook's body, the TUI's rows and timeline. So every one
of them calls ``failure_words`` here, and says the same thing.

A traceback's last unindented line says the error ("ImportError: apply_chat_template requires
jinja2 ..."); the frames above it are for exo's log, where the whole message stays. A message
with no traceback is kept, its lines joined. What a diagnostic says follows, and the whole is
capped. Pure text in, text out: the data model, so that the TUI shares it.
"""

from __future__ import annotations

import json
from typing import Any, cast

from keeper.model.state import RunnerFailed

# The longest a failure's words get: one line of a chat message or a TUI row, past an
# exception's own line (usually well under 150 characters); the rest is in exo's log.
MAX_FAILURE_CHARS = 200
TRACEBACK = "Traceback (most recent call last):"
NO_MESSAGE = "no message"


def failure_words(status: RunnerFailed) -> str:
    """``status`` in one line of at most ``MAX_FAILURE_CHARS`` (module doc)."""
    said = [error_words(status.error_message or "")]
    said += [diagnostic_words(entry) for entry in status.diagnostics]
    words = "; ".join(part for part in said if part) or NO_MESSAGE
    if len(words) > MAX_FAILURE_CHARS:
        return words[: MAX_FAILURE_CHARS - 1].rstrip() + "…"
    return words


def error_words(message: str) -> str:
    """The error a message says: after a traceback, its last unindented line that is more
    than punctuation (exo closes its "Terminated (" with a ")" of its own); else the
    message's lines joined."""
    lines = message.splitlines()
    if TRACEBACK in lines:
        after = lines[len(lines) - lines[::-1].index(TRACEBACK) :]
        said = [line.strip() for line in after if line[:1].strip() and _says(line)]
        if said:
            return said[-1]
    return " ".join(line.strip() for line in lines if _says(line))


def diagnostic_words(entry: str) -> str:
    """A diagnostic as exo sent it (``{"RunnerMetalGpuTimeout": {"message": ...}}``, kept as
    JSON text): its message; any other text as it is."""
    try:
        value: Any = json.loads(entry)
    except ValueError:
        return " ".join(entry.split())
    if isinstance(value, dict) and len(cast(dict[str, Any], value)) == 1:
        (inner,) = cast(dict[str, Any], value).values()  # pragma: no mutate
        if isinstance(inner, dict):
            message = cast(dict[str, Any], inner).get("message")  # pragma: no mutate
            if isinstance(message, str) and message.strip():
                return " ".join(message.split())
    return " ".join(entry.split())


def _says(line: str) -> bool:
    """Whether a line holds a word, not only brackets and punctuation."""
    return any(char.isalnum() for char in line)
