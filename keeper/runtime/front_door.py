"""The front door: OpenAI's ``POST /v1/chat/completions`` and ``GET /v1/models``, forwarded to
exo, so that a chat outlives the loss of the instance it was on (docs/design.md §8.6).

On a stock exo a chat sent while a model fails over is a 404, and one whose instance is deleted
under it ends with neither a result nor an error (an empty 200, or a stream that stops without
``finish_reason`` or ``[DONE]``). The front door sits between the client and exo's API and asks
one pure rule (``keeper.model.request_rule``) what to do after each thing that happens: hold the
request while its deployment is not serving, send it again while the client has seen nothing,
continue it after a cut (exo continues a chat whose last message is the assistant's), or end it
with an error the client can read. This module is the shell around that rule: it reads the
clock, the service's view of the deployments and exo's answers, and counts every request.

Shaped so for three reasons:

- *The client's response starts at its first token.* Until then the status can still be a
  503 (held too long), a 502 (exo's answer unreadable) or exo's own refusal; after it, trouble
  can only be an error event on the stream. So a streamed request is one async generator: it
  yields nothing until an attempt brings its first chunk, and the route (``keeper.httpapi.
  front_door_routes``) answers the error instead when the generator ends without one.
- *It belongs to no one service.* It takes exo's API as httpx clients in order of preference
  and the deployments as a lookup by model: the bridge passes the exo URL it follows first,
  then the others; our master, a transport to its own chat routing
  (``keeper.sim.master.chat_upstream``).
- *One job a module.* Its bounds and what it knows of a deployment are
  ``keeper.runtime.front_door_config``; the chat's wire shapes and refusals
  ``keeper.runtime.front_door_wire``; sending to exo and reading its answer as exo writes it
  (SSE events, keep-alives, capped bodies, exo's words, its cancel)
  ``keeper.runtime.front_door_upstream``; one attempt read into the request's progress
  ``keeper.runtime.front_door_attempts``; a failure's words and log line
  ``keeper.runtime.front_door_failures``; a continuation's body, its usage and the first
  attempt's id on its chunks are pure (``keeper.model.chat_continuation``). This module is the
  loop around the rule, and re-exports the names the routes and the services import.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any

import anyio
import httpx
from prometheus_client import CollectorRegistry

from keeper.model.api_models import error_body
from keeper.model.chat_continuation import with_continuation
from keeper.model.request_rule import (
    OUTCOMES,
    Done,
    Fail,
    Hold,
    Outcome,
    PassOn,
    Send,
    SoFar,
    next_action,
    stranded,
)
from keeper.runtime.front_door_attempts import Progress, stream_attempt, whole_attempt
from keeper.runtime.front_door_config import (
    RETRY_AFTER_S,
    FrontDoorConfig,
    ModelDeployment,
)
from keeper.runtime.front_door_failures import Failed, FailureLog, failure_words
from keeper.runtime.front_door_upstream import HEAD_TIMEOUT_S, Attempt
from keeper.runtime.front_door_wire import (
    CHAT_PATH,
    MODELS_PATH,
    SSE,
    ChatDocument,
    ChatRequest,
    LastPiece,
    RequestError,
    error_json,
    parse_chat,
    sse_event,
)
from keeper.runtime.request_counts import RequestCounts

# While held, the view is looked at again this often: the bridge's view changes once a second
# (its poll), so half of that sends a held request within half a second of serving.
RECHECK_S = 0.5
# The shortest wait of a held request: the hold's last remainder can be smaller than the clock
# can add to a large reading (8.9e-16 s at 12.49 s), and a wait that moves no clock would look
# again for ever; 10 ms past the hold is nothing to a client.
MIN_RECHECK_S = 0.01


class FrontDoor:
    """The front door of one service (module doc)."""

    def __init__(
        self,
        upstreams: Callable[[], Sequence[httpx.AsyncClient]],
        deployment_of: Callable[[str], ModelDeployment | None],
        monotonic: Callable[[], float],
        sleep: Callable[[float], Any],
        *,
        config: FrontDoorConfig | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self._upstreams = upstreams
        self._deployment_of = deployment_of
        self._monotonic = monotonic
        self._sleep = sleep
        self.config = config if config is not None else FrontDoorConfig()
        self.counts = RequestCounts(registry)
        self.inflight = 0
        self._failure_log = FailureLog()

    # --- the requests ------------------------------------------------------------------------

    def admit(self, model: str) -> None:
        """Take one chat for ``model`` in; ``RequestError`` 429 past ``max_inflight``, the
        chat counted ``rejected``."""
        if self.inflight >= self.config.max_inflight:
            self.rejected(model)
            raise RequestError(
                429,
                f"{self.inflight} chat requests in flight here, the most this front door "
                f"takes (--max-inflight {self.config.max_inflight}); retry shortly",
                retry_after=RETRY_AFTER_S,
            )
        self.inflight += 1

    def rejected(self, model: str | None) -> None:
        """Count a chat refused before anything went to exo (not a chat, too large, too many):
        under its model's deployment when the model could be read and has one, else ''."""
        found = self._deployment_of(model) if model else None
        deployment = found.deployment_id if found is not None else ""
        self.counts.count(deployment, "rejected", None, self._monotonic())

    def release(self) -> None:
        self.inflight -= 1

    async def models(self) -> tuple[int, bytes]:
        """exo's ``GET /v1/models`` (status, body) from the first exo that answers."""
        why = "no exo URL"
        for client in self._upstreams():
            try:
                with anyio.fail_after(HEAD_TIMEOUT_S):
                    answer = await client.get(MODELS_PATH)
            except (httpx.HTTPError, TimeoutError) as exc:
                why = f"{client.base_url}: {type(exc).__name__} {exc}".strip()
                continue
            if answer.status_code >= 500:
                why = f"{client.base_url}: HTTP {answer.status_code}"
                continue
            return answer.status_code, answer.content
        raise RequestError(
            503, f"exo's model list is not available ({why})", retry_after=RETRY_AFTER_S
        )

    def stream(
        self, request: ChatRequest, body: dict[str, Any]
    ) -> AsyncGenerator[bytes | int, None]:
        """A streamed chat: yields the SSE bytes for the client, or, before any of them, one
        int: the HTTP status of the error the route answers instead (its body in ``failure``)."""
        return self._run(request, body, streamed=True)

    async def answer(self, request: ChatRequest, body: dict[str, Any]) -> tuple[int, bytes]:
        """A non-streamed chat: (status, body) to answer with."""
        chunks = [piece async for piece in self._run(request, body, streamed=False)]
        status = next((piece for piece in chunks if isinstance(piece, int)), 200)
        return status, b"".join(piece for piece in chunks if isinstance(piece, bytes))

    # --- the loop ----------------------------------------------------------------------------

    async def _run(
        self, request: ChatRequest, body: dict[str, Any], *, streamed: bool
    ) -> AsyncGenerator[bytes | int, None]:
        now = self._monotonic()
        progress = Progress(started=now, since=now)
        if (request.n or 1) > 1:
            progress.inexact = f"n = {request.n}"
        elif request.logprobs:
            progress.inexact = "logprobs"
        attempt = Attempt()
        found = self._deployment_of(request.model)
        deployment = found.deployment_id if found is not None else ""
        outcome: Outcome = "failed"
        try:
            while True:
                found = self._deployment_of(request.model)
                so_far = SoFar(
                    last=attempt.happened,
                    deployed=found is not None,
                    serving=found is not None and found.serving,
                    first_token_sent=progress.first_token_at is not None,
                    exact=progress.inexact is None,
                    cuts=progress.cuts,
                    held_s=self._monotonic() - progress.since,
                    hold_s=self.config.hold_s,
                    max_migrations=self.config.migrations,
                    held=progress.held,
                    sends=progress.sends,
                    continuations=progress.continuations,
                    paused=progress.paused,
                )
                action = next_action(so_far)
                if isinstance(action, Done):
                    outcome = action.outcome
                    return
                if isinstance(action, Hold):
                    progress.held = progress.paused = True
                    left_s = self.config.hold_s - so_far.held_s
                    await self._sleep(max(MIN_RECHECK_S, min(RECHECK_S, left_s)))
                    continue
                if isinstance(action, PassOn):
                    # exo refused the request itself (its 4xx): the client's, not the cluster's.
                    outcome = "rejected"
                    yield attempt.status
                    yield error_json(attempt.status, attempt.why)
                    return
                if isinstance(action, Fail):
                    words = self._failed(action, request.model, found, progress, attempt)
                    if progress.first_token_at is not None:
                        yield LastPiece(sse_event(error_body(words, 502, "Bad Gateway")))
                        return
                    status = 503 if action.why == "not_serving" else 502
                    yield status
                    yield error_json(status, words)
                    return
                assert isinstance(action, Send)
                progress.sends += 1
                progress.continuations += action.continuation
                progress.paused = False
                attempt = Attempt()
                progress.sent_on = found.homes if found is not None else frozenset()
                carried = len(progress.text) if action.continuation else 0
                upstream = with_continuation(body, progress.text) if carried else body
                check = partial(self._stranded, request.model, progress, self._monotonic())
                pieces = (
                    stream_attempt(
                        self._upstreams(),
                        upstream,
                        progress,
                        attempt,
                        self._monotonic,
                        carried,
                        check,
                    )
                    if streamed
                    else whole_attempt(self._upstreams(), upstream, progress, attempt, check)
                )
                # Closed here, not left to the collector, when the client leaves mid-attempt:
                # the attempt then asks exo to cancel the chat at once.
                async with aclosing(pieces):
                    async for piece in pieces:
                        if progress.first_token_at is None:
                            progress.first_token_at = self._monotonic()
                        yield piece
                if attempt.happened == "cut":
                    progress.cuts += 1
        except BaseException:
            outcome = "cancelled"  # the client left (the route closes us), or we are stopped
            raise
        finally:
            ended = self._monotonic()
            ttft = (
                progress.first_token_at - progress.started
                if progress.first_token_at is not None
                else None
            )
            self.counts.count(deployment, outcome, ttft, ended)

    def _stranded(self, model: str, progress: Progress, sent_at: float) -> str | None:
        """Why the attempt sent at ``sent_at`` will never be answered (``stranded``), or None."""
        found = self._deployment_of(model)
        homes = found.homes if found is not None else frozenset[str]()
        quiet_s = self._monotonic() - max(progress.since, sent_at)
        return stranded(progress.sent_on, homes, quiet_s)

    def _failed(
        self,
        fail: Fail,
        model: str,
        found: ModelDeployment | None,
        progress: Progress,
        attempt: Attempt,
    ) -> str:
        """The failure's words for the client, logged (at most once a minute for its kind)."""
        now = self._monotonic()
        words = failure_words(
            Failed(
                fail=fail,
                model=model,
                state=found.words if found is not None else "no deployment",
                held_s=now - progress.since,
                hold_s=self.config.hold_s,
                cuts=progress.cuts,
                migrations=self.config.migrations,
                inexact=progress.inexact,
                why=attempt.why,
                status=attempt.status,
            )
        )
        self._failure_log.note(fail.why, f"{model}: {words}", now)
        return words


__all__ = [
    "CHAT_PATH",
    "MODELS_PATH",
    "OUTCOMES",
    "RETRY_AFTER_S",
    "SSE",
    "ChatDocument",
    "ChatRequest",
    "FrontDoor",
    "FrontDoorConfig",
    "LastPiece",
    "ModelDeployment",
    "RequestError",
    "parse_chat",
]
