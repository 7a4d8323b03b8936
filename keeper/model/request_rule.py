"""What the front door does next with one chat request: send it, hold it, continue it, or end it
(docs/design.md §8.6).

The front door (``keeper.runtime.front_door``) forwards an OpenAI chat to exo and must never
leave a client with neither a result nor an error. Whatever happened to the request so far (the
deployment not serving, exo answering 404 for want of an instance, a 5xx, a refused connection, a
stream cut before its ``finish_reason``) goes in as a ``SoFar``; the one next step comes out. One
pure function, so every branch is a unit test and a mutant of any condition is caught
(``tests/pure/test_request_rule.py``); the shell reads the clock and does the I/O.

The rule in words:

- *Before the client has seen a token* the request may be sent again as it is: while the
  deployment is not serving it is held (re-checked on the service's view) up to ``hold_s``,
  then sent; when exo has no instance for it, answers 5xx or cannot be reached, it waits a
  moment (``paused``) and is sent again, until the hold is spent; then it is refused (503
  with Retry-After), never hung. A model with no deployment has nothing coming
  to serve it: exo's 404 is passed on at once (after the first token, when its deployment went
  during the answer, the 404 to a continuation ends the stream with an error event).
- *After the first token* nothing the client has may be repeated or dropped: a cut stream is
  continued (the text so far as a trailing assistant message; exo continues it) at most
  ``max_migrations`` times, and only when a continuation can be exact. Otherwise the stream ends
  with an explicit error event: never a silent truncation.
- A refusal of the request itself (exo's 4xx other than 404 for want of an instance) is passed
  on; an answer that cannot be read is a 502.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# What the last attempt came to (None in ``SoFar.last``: not sent yet).
Happened = Literal[
    "answered",  # ended with its finish_reason (and [DONE] on a stream)
    "no_instance",  # exo's 404 "No instance found for model ..."
    "upstream_error",  # exo answered 5xx
    "unreachable",  # no connection to any exo URL, or no answer in time
    "cut",  # accepted, then ended without a finish_reason or [DONE], or an empty 200
    "refused",  # exo refused the request itself (a 4xx other than no_instance)
    "garbage",  # exo's answer cannot be read (not JSON, not SSE)
    "client_gone",  # the client went away
]
# The troubles that say nothing against the request: worth waiting out, then sending again.
TRANSIENT: frozenset[Happened] = frozenset({"no_instance", "upstream_error", "unreachable"})

# ``rejected``: refused as a request before any answer began, by the front door itself (a body
# that is not a chat, over 1 MiB, or more chats in flight than ``--max-inflight``) or by exo (its
# 4xx passed on: a model it does not know, a field it refuses): the client's or the load's
# doing, counted apart from ``failed`` so that an alert on failed chats is about the cluster.
Outcome = Literal["ok", "held", "retried", "migrated", "failed", "cancelled", "rejected"]
OUTCOMES: tuple[Outcome, ...] = (
    "ok",
    "held",
    "retried",
    "migrated",
    "failed",
    "cancelled",
    "rejected",
)


@dataclass(frozen=True)
class SoFar:
    """One request, as far as it has gone."""

    last: Happened | None  # what the last attempt came to; None before the first send
    deployed: bool  # the model has a deployment (something will come to serve it)
    serving: bool  # that deployment serves, in the service's view
    first_token_sent: bool  # part of the answer reached the client (no resending from scratch)
    exact: bool  # a continuation would be exact: no tool calls, n = 1, no logprobs or reasoning
    cuts: int  # attempts exo accepted and then cut, this one included
    held_s: float  # how long the request has waited without progress
    hold_s: float  # the most it may wait (``--hold-s``; 0: never held)
    max_migrations: int  # the most cut attempts followed by another (``--migrations``)
    held: bool = False  # it was held at least once
    sends: int = 0  # attempts sent so far
    continuations: int = 0  # attempts sent as a continuation of what the client has
    paused: bool = False  # it has waited since its last attempt came to ``last``


@dataclass(frozen=True)
class Send:
    """Send the request now; ``continuation``: with the text so far as a trailing assistant
    message, the client already having part of the answer."""

    continuation: bool


@dataclass(frozen=True)
class Hold:
    """Wait (re-checking the service's view), then ask again."""


@dataclass(frozen=True)
class PassOn:
    """Give the client exo's own answer to the last attempt (a refusal)."""


@dataclass(frozen=True)
class Done:
    """The request has ended: answered, or the client left."""

    outcome: Outcome


FailWhy = Literal["not_serving", "cuts", "inexact", "garbage", "refused_mid_stream"]


@dataclass(frozen=True)
class Fail:
    """End the request with an error: an HTTP error before the first token (503 with
    Retry-After for ``not_serving``, 502 for ``garbage`` and ``cuts``), an error event on the
    stream after it."""

    why: FailWhy


Action = Send | Hold | PassOn | Done | Fail


# An attempt that has brought no token for this long, while none of the instances it may be on
# is left, is stranded (``stranded``). Under the hold (30 s), so the chat is sent again in time;
# over what exo takes to show an instance it has just placed (a second or two), so a chat routed
# to an instance the service's view does not show yet is not taken for a stranded one.
STRANDED_AFTER_S = 5.0


def stranded(sent_on: frozenset[str], homes: frozenset[str], silent_s: float) -> str | None:
    """Why the attempt in flight will never be answered, or None. ``sent_on``: the instances of
    its model it may have been routed to when it was sent; ``homes``: those a chat may be on and
    still be answered now (``keeper.model.readiness.chat_homes``); ``silent_s``: since its last
    token (or its sending). exo keeps such a chat's stream open, with keep-alives, when the
    instance it is on goes without exo deleting it: its node dead before exo's own timeout, or
    exo's master changed and its new State lost the instance. It is then a cut."""
    if not sent_on or sent_on & homes or silent_s < STRANDED_AFTER_S:
        return None
    return (
        f"no token for {silent_s:.0f} s and none of the instances it may be on is left "
        "(node dead or gone, or exo's master changed)"
    )


def outcome(so_far: SoFar) -> Outcome:
    """How an answered request is counted: ``migrated`` when the client's answer was continued,
    ``retried`` when it was sent more than once, ``held`` when it waited, else ``ok``."""
    if so_far.continuations > 0:
        return "migrated"
    if so_far.sends > 1:
        return "retried"
    if so_far.held:
        return "held"
    return "ok"


def next_action(so_far: SoFar) -> Action:
    """The one next step for a request (module doc)."""
    last = so_far.last
    if last == "answered":
        return Done(outcome(so_far))
    if last == "client_gone":
        return Done("cancelled")
    if last == "garbage":
        return Fail("garbage")
    if last == "refused":
        # A continuation exo refuses cannot be shown as exo's answer: the client has a 200.
        return Fail("refused_mid_stream") if so_far.first_token_sent else PassOn()
    if last == "cut":
        if so_far.first_token_sent and not so_far.exact:
            return Fail("inexact")
        if so_far.cuts > so_far.max_migrations:
            return Fail("cuts")
    if last == "no_instance" and not so_far.deployed:
        # Nothing is coming to serve it: exo's 404 as it is; a continuation's, as an error event
        # (its deployment went while the client read the answer, which has a 200).
        return Fail("refused_mid_stream") if so_far.first_token_sent else PassOn()
    past_hold = so_far.held_s >= so_far.hold_s
    if last in TRANSIENT and past_hold:
        return Fail("not_serving")
    # A trouble of exo's is waited on a moment before sending again (the view may say serving
    # while exo, just elected, has no instance yet); a deployment not serving, until it does.
    waiting = (so_far.deployed and not so_far.serving) or (last in TRANSIENT and not so_far.paused)
    if waiting and not past_hold:
        return Hold()
    # Not serving in the service's view, past the hold (or never held): exo may still have an
    # instance the view does not count yet, so it is asked once.
    return Send(continuation=so_far.first_token_sent)
