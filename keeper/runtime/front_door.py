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
  and the deployments as a lookup by model, so our master can mount the same door later;
  the bridge passes the exo URL it follows first, then the others.
- *One job a module.* The chat's wire shapes and refusals are ``keeper.runtime.front_door_wire``;
  sending to exo and reading its answer as exo writes it (SSE events, keep-alives, capped bodies,
  exo's words) ``keeper.runtime.front_door_upstream``; one attempt read into the request's
  progress ``keeper.runtime.front_door_attempts``; a continuation's body and the first
  attempt's id on its chunks are pure (``keeper.model.chat_continuation``). This module is the
  loop around the rule, and re-exports the names the routes and the services import.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
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
)
from keeper.runtime.front_door_attempts import Progress, stream_attempt, whole_attempt
from keeper.runtime.front_door_upstream import HEAD_TIMEOUT_S, Attempt
from keeper.runtime.front_door_wire import (
    CHAT_PATH,
    MODELS_PATH,
    SSE,
    ChatDocument,
    ChatRequest,
    RequestError,
    error_json,
    parse_chat,
    sse_event,
)
from keeper.runtime.request_counts import RequestCounts

log = logging.getLogger(__name__)

# How long a request may wait for its deployment to serve (``--hold-s``): a fast failover
# serves again in 6.4-6.6 s on a real cluster, a staged one (a load) in about 40 s; 30 s
# covers the first several times over and a client's usual minute-long timeout still holds.
DEFAULT_HOLD_S = 30.0
# Continuations of one chat at most (``--migrations``): two losses in one answer is already
# rare; more would let a chat that breaks every instance wander the cluster.
DEFAULT_MIGRATIONS = 2
# Requests in the front door at once, held ones included (``--max-inflight``): exo serves a
# few chats at a time per instance; 256 waiting is far more than a cluster drains in a hold,
# and bounds the memory and connections a burst can take.
DEFAULT_MAX_INFLIGHT = 256
# While held, the view is looked at again this often: the bridge's view changes once a second
# (its poll), so half of that sends a held request within half a second of serving.
RECHECK_S = 0.5
# What a 503 or a 429 tells the client to wait: about one fast failover.
RETRY_AFTER_S = 5


@dataclass(frozen=True)
class FrontDoorConfig:
    hold_s: float = DEFAULT_HOLD_S
    migrations: int = DEFAULT_MIGRATIONS
    max_inflight: int = DEFAULT_MAX_INFLIGHT


@dataclass(frozen=True)
class ModelDeployment:
    """What the front door needs of a model's deployment: its id, whether it serves in the
    service's view, and its status in words for a refusal."""

    deployment_id: str
    serving: bool
    words: str


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

    # --- the requests ------------------------------------------------------------------------

    def admit(self) -> None:
        """Take one request in; ``RequestError`` 429 past ``max_inflight``."""
        if self.inflight >= self.config.max_inflight:
            raise RequestError(
                429,
                f"{self.inflight} chat requests in flight here, the most this front door "
                f"takes (--max-inflight {self.config.max_inflight}); retry shortly",
                retry_after=RETRY_AFTER_S,
            )
        self.inflight += 1

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
        raise RequestError(503, f"exo's model list is not available ({why})", retry_after=5)

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
                    await self._sleep(min(RECHECK_S, max(0.0, self.config.hold_s - so_far.held_s)))
                    continue
                if isinstance(action, PassOn):
                    yield attempt.status
                    yield error_json(attempt.status, attempt.why)
                    return
                if isinstance(action, Fail):
                    words = self._failure(action, request.model, found, progress, attempt)
                    if progress.first_token_at is not None:
                        yield sse_event(error_body(words, 502, "Bad Gateway"))
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
                upstream = with_continuation(body, progress.text) if action.continuation else body
                clients = self._upstreams()
                pieces = (
                    stream_attempt(clients, upstream, progress, attempt, self._monotonic)
                    if streamed
                    else whole_attempt(clients, upstream, progress, attempt)
                )
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

    def _failure(
        self,
        fail: Fail,
        model: str,
        found: ModelDeployment | None,
        progress: Progress,
        attempt: Attempt,
    ) -> str:
        last = f" (last: {attempt.why})" if attempt.why else ""
        match fail.why:
            case "not_serving":
                state = found.words if found is not None else "no deployment"
                return (
                    f"{model} is not serving ({state}); held "
                    f"{self._monotonic() - progress.since:.0f} s, the most this front door "
                    f"waits (--hold-s {self.config.hold_s:g}){last}; retry shortly"
                )
            case "cuts":
                return (
                    f"exo cut this answer {progress.cuts} times; no more continuations "
                    f"(--migrations {self.config.migrations}){last}"
                )
            case "inexact":
                return (
                    f"exo cut this answer and it cannot be continued exactly "
                    f"({progress.inexact}){last}; the answer so far is incomplete"
                )
            case "garbage":
                return f"exo's answer cannot be read: {attempt.why}"
            case "refused_mid_stream":
                return f"exo refused to continue this answer: HTTP {attempt.status}{last}"


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
    "ModelDeployment",
    "RequestError",
    "parse_chat",
]
