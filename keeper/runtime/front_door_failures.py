"""What the front door says when it ends a chat with an error (docs/design.md §8.6): the words
the client gets, and the line the operator gets in the log, at most once a minute for each kind
of failure.

The client's words name what went wrong in the terms of the flag that bounds it (``--hold-s``,
``--migrations``) or in exo's own words, so a 503 or a 502 says what to do. The log's line is
for whoever runs the service: exo answering garbage or cutting answers past the migrations is
exo's trouble, worth a line, but a burst of chats failing alike must not be a line each (an exo
answering HTML to every chat would fill the log at the chats' rate). So each kind is logged when
it first comes and then at most once per ``LOG_EVERY_S``, with how many came since its last line;
never a traceback, since the words already say all that is known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from keeper.model.request_rule import Fail, FailWhy

log = logging.getLogger(__name__)

# One line per kind of failure at most this often: an operator reading the log during an
# incident sees each kind within a minute of it starting and a count of the rest, not one line
# per chat.
LOG_EVERY_S = 60.0


@dataclass(frozen=True)
class Failed:
    """One chat's failure as the front door knows it, for its words."""

    fail: Fail
    model: str
    state: str  # the deployment's status in words ("no deployment" when it has none)
    held_s: float  # how long it waited without progress
    hold_s: float  # ``--hold-s``
    cuts: int
    migrations: int  # ``--migrations``
    inexact: str | None  # why a continuation could not be exact
    why: str  # the last attempt's words ("" when none)
    status: int  # exo's status, when it refused


def failure_words(failed: Failed) -> str:
    """The error's message for the client."""
    last = f" (last: {failed.why})" if failed.why else ""
    match failed.fail.why:
        case "not_serving":
            return (
                f"{failed.model} is not serving ({failed.state}); held {failed.held_s:.0f} s, "
                f"the most this front door waits (--hold-s {failed.hold_s:g}){last}; "
                "retry shortly"
            )
        case "cuts":
            return (
                f"this answer was cut {failed.cuts} times upstream; no more continuations "
                f"(--migrations {failed.migrations}){last}"
            )
        case "inexact":
            return (
                f"this answer was cut upstream and it cannot be continued exactly "
                f"({failed.inexact}){last}; the answer so far is incomplete"
            )
        case "garbage":
            return f"exo's answer cannot be read: {failed.why}"
        case "refused_mid_stream":
            return f"exo refused to continue this answer: HTTP {failed.status}{last}"


@dataclass
class FailureLog:
    """The log's lines for failed chats, each kind at most once per ``LOG_EVERY_S``."""

    every_s: float = LOG_EVERY_S
    _said_at: dict[FailWhy, float] = field(default_factory=dict[FailWhy, float])
    _unsaid: dict[FailWhy, int] = field(default_factory=dict[FailWhy, int])

    def note(self, why: FailWhy, words: str, now: float) -> bool:
        """Log ``words`` for a chat that failed so, unless that kind was logged in the last
        ``every_s``; whether it was logged."""
        said = self._said_at.get(why)
        if said is not None and now - said < self.every_s:
            self._unsaid[why] = self._unsaid.get(why, 0) + 1
            return False
        unsaid = self._unsaid.pop(why, 0)
        more = f" ({unsaid} more chats failed so since the last such line)" if unsaid else ""
        log.warning("a chat failed: %s%s", words, more)
        self._said_at[why] = now
        return True
