"""The dashboard's connection to a master: HTTP only, no Textual.

``MasterClient.run(emit)`` keeps the dashboard fed for as long as it runs. Each connection
starts by asking ``GET /events`` and telling the kind of master from the answer's headers alone
(``events_kind``):

- ``text/event-stream``: exo-deploy's master. Its stream is followed, which makes every change
  instant.
- ``application/json``: a stock exo master, whose ``/events`` is a one-shot array of its whole
  event log (it grows for as long as the cluster runs). The body is never read: the response is
  closed on its headers, ``/events`` is not asked again on this connection, and ``/state`` is
  polled once a second instead.
- 404/405: a master without events (the bridge); ``/state`` is polled, and the stream is asked
  for again now and then in case the master was upgraded in place.

While polling, ``/deployments`` is read beside ``/state`` until it answers 404 (no deployments
API: a stock exo); from then on the connection polls ``/state`` alone. Every read has a deadline,
and a failure never escapes: it becomes a ``ConnectionUpdate("down")`` and a retry with backoff
(which detects the master afresh), so a master that is down, slow or restarting can neither
crash nor freeze the UI. An answer we cannot read (``reading``: an error status, not JSON, not a
State, too large, nested too deep) becomes ``ConnectionUpdate("unreadable", why)`` and the same
retry, every time it comes, never an empty cluster: an unchanged poll is skipped only when it
equals the last one that was read.

The stream is read with httpx-sse, which frames events and keeps ``id`` and ``retry``; the
master's ``retry`` sets where the reconnect backoff starts. Deadlines use anyio's clock rather
than httpx's socket timeouts so the same code runs under trio's virtual clock in tests; the
stream's silence deadline watches bytes, since the keepalive is a comment no event shows.
Mutations (create, scale, delete, deleting an instance with exo's own ``DELETE /instance/{id}``,
cordon, uncordon and drain) and the reads of ``GET /nodes`` (a drain's progress, read by the app
while one is under way) and ``GET /whatif`` (what losing a node would do, asked with ``w``) go
through the clients the CLI uses too (``keeper.client.deployments``, ``keeper.client.whatif``),
which raise ``ApiError`` carrying the master's own message. Editing a deployment sends only
the settings that changed (``PATCH /deployments/{id}``). ``GET /healthz`` is read for what the
service says of itself (``service_health``: a bridge's name and role), never raising: what
cannot be read is None.
"""

from __future__ import annotations

import contextlib
import email.utils
import math
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
import httpx
from httpx_sse import EventSource, ServerSentEvent, aconnect_sse
from pydantic import ValidationError

from exo_deploy_tui.feed.reading import (
    UnreadableAnswerError,
    media_type,
    read_capped,
    read_deployments,
    read_message,
    read_state,
)
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    DeploymentsUpdate,
    EventUpdate,
    HeardUpdate,
    SnapshotUpdate,
    Update,
)
from keeper.client.deployments import ApiError, DeploymentsClient, master_http, validation_summary
from keeper.client.whatif import what_if
from keeper.model.api_models import (
    CommandResponse,
    CreateDeploymentRequest,
    DeploymentsResponse,
    ErrorResponse,
    ModelList,
    ModelListEntry,
    NodesResponse,
    ServiceHealthView,
    StreamSnapshot,
    WhatIfResponse,
)
from keeper.model.events import IndexedEvent

DEFAULT_URL = "http://127.0.0.1:52415"

# A master on the same LAN connects in milliseconds; three seconds tolerates a loaded one
# without leaving the operator staring at "connecting" when it is simply down.
CONNECT_TIMEOUT_S = 3.0
# A whole /state or /deployments read, or a create/delete, must finish within this.
REQUEST_TIMEOUT_S = 5.0
# The master's stream sends a keepalive comment every second
# (keeper.sim.master.dashboard_stream.KEEPALIVE_S); ten missed mean the connection is dead even if
# the
# socket has not noticed (a frozen master, a cut link). The header and the timeline say the master
# is quiet well before (exo_deploy_tui.model.master_quiet.QUIET_AFTER_S); this only ends the wait.
STREAM_SILENCE_S = 10.0
# Polling once a second: a change shows within a second, and a master sees one request a second.
POLL_INTERVAL_S = 1.0
# Reconnect quickly at first (a master restart takes about a second), then back off so a master
# that stays down costs nothing, yet is noticed within this long once it is back.
RECONNECT_FIRST_S = 0.5
RECONNECT_MAX_S = 8.0
# After a master says it has no event stream, poll this long before asking again, so a master
# upgraded in place is eventually followed live.
STREAM_RETRY_S = 60.0
# A /healthz body is a few hundred bytes; more than this is not a health answer, and is not read.
HEALTH_MAX_BYTES = 64 * 1024
# What the connection says while it polls a stock exo master, so the header can tell the kinds
# of master apart.
STOCK_EXO = "stock exo"


class ClusterClient(Protocol):
    """What the app needs from a master; the real one is ``MasterClient``."""

    url: str

    async def run(self, emit: Callable[[Update], None]) -> None: ...
    def resync(self) -> None:
        """Start again from a snapshot: the model found a hole in the events."""
        ...

    async def models(self) -> list[ModelListEntry]: ...
    async def create_deployment(self, request: CreateDeploymentRequest) -> CommandResponse: ...
    async def delete_deployment(self, deployment_id: str) -> CommandResponse: ...
    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse: ...
    async def update_deployment(
        self, deployment_id: str, changes: Mapping[str, int | bool | str]
    ) -> CommandResponse: ...
    async def delete_instance(self, instance_id: str) -> None: ...
    async def nodes(self) -> NodesResponse: ...
    async def cordon(self, node: str) -> CommandResponse: ...
    async def uncordon(self, node: str) -> CommandResponse: ...
    async def drain(self, node: str, force: bool) -> CommandResponse: ...
    async def what_if(self, node: str) -> WhatIfResponse: ...
    async def service_health(self) -> ServiceHealthView | None:
        """What ``GET /healthz`` says of the service (a bridge's name and role); None when it
        cannot be read or says nothing of the kind."""
        ...

    async def aclose(self) -> None: ...


class _NoStreamError(Exception):
    """The master has no event stream; poll instead."""


class _StockExoError(Exception):
    """``/events`` is a stock exo's one-shot event log, not a stream: poll ``/state``."""


class _BadResponseError(Exception):
    """The connection cannot go on (the master ended the stream, events were missed); reconnect
    and start from a snapshot. An answer we cannot read is an ``UnreadableAnswerError`` instead."""


@dataclass(frozen=True)
class _Answer:
    """One polled answer: its status, headers and (for a 200) its body, read within the cap."""

    status: int
    headers: httpx.Headers
    body: bytes

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")


@dataclass(frozen=True)
class _Poll:
    """One poll's answers: /state, and /deployments unless the master has none."""

    state: _Answer
    deployments: _Answer | None

    @property
    def bodies(self) -> tuple[bytes, bytes | None]:
        return self.state.body, None if self.deployments is None else self.deployments.body


class _SilenceDeadline(httpx.AsyncByteStream):
    """A response body that fails with ``TimeoutError`` after ``silence_s`` without a byte, and
    calls ``on_comment`` for each chunk that is only an SSE comment.

    The master's keepalive is an SSE comment, which an SSE reader rightly never hands on, so
    the deadline watches the bytes under the reader rather than the events it yields, and the
    keepalive is told from here: the model dates the master's last word by it."""

    def __init__(
        self, inner: httpx.AsyncByteStream, silence_s: float, on_comment: Callable[[], None]
    ) -> None:
        self._inner = inner
        self._silence_s = silence_s
        self._on_comment = on_comment

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        while True:
            with anyio.fail_after(self._silence_s):
                chunk = await anext(chunks, None)
            if chunk is None:
                return
            if chunk.startswith(b":"):
                self._on_comment()  # a chunk with an event in it is a word by its event
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


# What ``GET /events`` says the master is: exo-deploy's stream, a stock exo's one-shot log, or no
# such route; any other answer is the reason it cannot be used.
EventsKind = Literal["stream", "exo-log", "none"]


def events_kind(status: int, content_type: str | None) -> EventsKind | str:
    """The kind of master behind an answer to ``GET /events``, from its status and
    Content-Type alone (the body of a stock exo's answer is its whole log: never read it)."""
    if status in (404, 405):
        return "none"
    if status != 200:
        return f"GET /events: HTTP {status}"
    media = media_type(content_type)
    if media == "text/event-stream":
        return "stream"
    if media == "application/json":
        return "exo-log"
    return f"GET /events: {media or 'no Content-Type'}, not a stream or exo's log"


def describe_failure(exc: BaseException) -> str:
    """A one-line reason an operator can act on."""
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, httpx.ConnectError):
        return "cannot connect"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "connection dropped"
    if isinstance(exc, httpx.HTTPError):
        return f"{type(exc).__name__}: {exc}".rstrip(": ")
    return str(exc) or type(exc).__name__


class MasterClient:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        timeout = httpx.Timeout(REQUEST_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        self._http = master_http(self.url, token, timeout, transport)
        self._deployments = DeploymentsClient(self._http, REQUEST_TIMEOUT_S)
        self._clock = clock
        # Where the reconnect backoff starts: ours, until the master's stream says (``retry``).
        self._reconnect_first = RECONNECT_FIRST_S
        self._backoff = RECONNECT_FIRST_S
        # The last answers polled and read, so an unchanged cluster costs no parsing and no
        # redraw. Only answers that were read: an unreadable one is read (and reported) again.
        self._last_poll: tuple[bytes, bytes | None] | None = None
        # False once the master answered 404 to /deployments, until it is detected afresh.
        self._deployments_api = True
        # The stream being followed, so ``resync`` can end it; None while polling.
        self._stream_scope: anyio.CancelScope | None = None
        self._resync_wanted = False

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the live feed ------------------------------------------------------------------------

    async def run(self, emit: Callable[[Update], None]) -> None:
        """Feed ``emit`` until cancelled; never raises for anything the master does."""
        emit(ConnectionUpdate("connecting", self.url))
        stream_after = 0.0  # on anyio's clock: when the event stream is worth asking for again
        while True:
            try:
                if anyio.current_time() >= stream_after:
                    self._deployments_api = True  # a new detection asks again
                    try:
                        await self._follow_stream(emit)
                        raise _BadResponseError("the master closed the event stream")
                    except _NoStreamError:
                        stream_after = anyio.current_time() + STREAM_RETRY_S
                    except _StockExoError:
                        # Polled until the connection fails, then detected afresh.
                        await self._poll_until(emit, math.inf, STOCK_EXO)
                else:
                    await self._poll_until(emit, stream_after)
                continue
            except UnreadableAnswerError as exc:
                # The master answered: not "down", but nothing it said can be shown.
                emit(ConnectionUpdate("unreadable", str(exc), self._backoff))
            except (httpx.HTTPError, _BadResponseError, TimeoutError, OSError) as exc:
                emit(ConnectionUpdate("down", describe_failure(exc), self._backoff))
            stream_after = 0.0  # whatever answers next is detected afresh
            await anyio.sleep(self._backoff)
            self._backoff = min(self._backoff * 2, RECONNECT_MAX_S)

    def resync(self) -> None:
        """End the stream being followed, so the next connection starts from a snapshot.
        While polling there is nothing to do: every poll is a snapshot."""
        if self._stream_scope is not None:
            self._resync_wanted = True
            self._stream_scope.cancel()

    async def _follow_stream(self, emit: Callable[[Update], None]) -> None:
        self._resync_wanted = False
        with anyio.CancelScope() as scope:
            self._stream_scope = scope
            try:
                await self._read_stream(emit)
            finally:
                self._stream_scope = None
        if scope.cancelled_caught and self._resync_wanted:
            self._resync_wanted = False
            raise _BadResponseError("events were missed: starting again from a snapshot")

    async def _read_stream(self, emit: Callable[[Update], None]) -> None:
        timeout = httpx.Timeout(None, connect=CONNECT_TIMEOUT_S)
        async with contextlib.AsyncExitStack() as stack:
            with anyio.fail_after(CONNECT_TIMEOUT_S + REQUEST_TIMEOUT_S):
                source = await stack.enter_async_context(
                    aconnect_sse(self._http, "GET", "/events", timeout=timeout)
                )
            response = source.response
            kind = events_kind(response.status_code, response.headers.get("content-type"))
            if kind == "none":
                raise _NoStreamError
            if kind == "exo-log":
                raise _StockExoError  # closed on leaving, without reading a byte of the log
            if kind != "stream":
                raise UnreadableAnswerError(kind)
            offset = self._clock_offset(response.headers)
            if not isinstance(response.stream, httpx.AsyncByteStream):
                raise _BadResponseError("the event stream is not readable asynchronously")
            response.stream = _SilenceDeadline(
                response.stream, STREAM_SILENCE_S, lambda: emit(HeardUpdate())
            )
            async for message in EventSource(response).aiter_sse():
                self._on_stream_message(message, offset=offset, emit=emit)

    def _on_stream_message(
        self, message: ServerSentEvent, *, offset: float | None, emit: Callable[[Update], None]
    ) -> None:
        name, data = message.event, message.data
        if message.retry is not None:
            # The master says how soon to come back; the backoff still doubles from there.
            self._reconnect_first = min(max(message.retry / 1000, 0.0), RECONNECT_MAX_S)
        # A message we cannot read raises UnreadableAnswerError: one event lost would leave our
        # State wrong for good, so the connection starts again from a snapshot. A message of a
        # kind we do not know is a newer master's, and skipped.
        if name == "snapshot":
            snapshot = read_message(StreamSnapshot, data, name)
            emit(SnapshotUpdate(snapshot.state, tuple(snapshot.deployments), offset))
            self._last_poll = None  # the stream moved the model on from any earlier poll
            emit(ConnectionUpdate("live"))
            self._backoff = self._reconnect_first
        elif name == "event":
            emit(EventUpdate(read_message(IndexedEvent, data, name)))
        elif name == "deployments":
            response = read_message(DeploymentsResponse, data, name)
            emit(DeploymentsUpdate(tuple(response.deployments)))
        elif name == "error":
            # The master drops a follower that fell too far behind; start over.
            error = read_message(ErrorResponse, data, name).error.message
            raise _BadResponseError(f"the master ended the stream: {error}")

    async def _poll_until(
        self, emit: Callable[[Update], None], until: float, detail: str = ""
    ) -> None:
        announced = False
        while anyio.current_time() < until:
            started = anyio.current_time()
            poll = await self._fetch_once()
            if poll.bodies != self._last_poll:
                emit(self._parse_poll(poll))  # raises UnreadableAnswerError before anything is kept
                self._last_poll = poll.bodies
            else:
                emit(HeardUpdate())  # nothing changed, but the master answered: it is alive
            if not announced:
                emit(ConnectionUpdate("polling", detail))
                announced = True
            self._backoff = self._reconnect_first
            await anyio.sleep(max(0.0, POLL_INTERVAL_S - (anyio.current_time() - started)))

    async def _fetch_once(self) -> _Poll:
        results: dict[str, _Answer] = {}
        failures: list[httpx.HTTPError | UnreadableAnswerError] = []

        async def fetch(path: str, what: str) -> None:
            # Caught here, not around the task group: a failure would come out of the group
            # wrapped in an ExceptionGroup, which the reconnect loop does not take for a lost
            # connection.
            try:
                async with self._http.stream("GET", path) as response:
                    ok = response.status_code == 200
                    body = await read_capped(response) if ok else b""
                    results[path] = _Answer(response.status_code, response.headers, body)
            except httpx.HTTPError as exc:
                failures.append(exc)
            except UnreadableAnswerError as exc:
                failures.append(UnreadableAnswerError(f"{what}{exc}"))

        with anyio.fail_after(REQUEST_TIMEOUT_S):
            async with anyio.create_task_group() as group:
                group.start_soon(fetch, "/state", "")
                if self._deployments_api:
                    group.start_soon(fetch, "/deployments", "/deployments: ")
        if failures:
            raise failures[0]
        state = results["/state"]
        if state.status != 200:
            raise UnreadableAnswerError(f"HTTP {state.status}")
        deployments = results.get("/deployments")
        if deployments is not None and deployments.status in (404, 405):
            # A master without deployments (a stock exo): show the State alone, and stop asking
            # until the master is detected afresh.
            self._deployments_api = False
            deployments = None
        elif deployments is not None and deployments.status != 200:
            raise UnreadableAnswerError(f"/deployments: HTTP {deployments.status}")
        return _Poll(state, deployments)

    def _parse_poll(self, poll: _Poll) -> SnapshotUpdate:
        read = read_state(poll.state.body, poll.state.content_type)
        deployments = poll.deployments
        views = (
            None
            if deployments is None
            else tuple(read_deployments(deployments.body, deployments.content_type).deployments)
        )
        offset = self._clock_offset(poll.state.headers)
        return SnapshotUpdate(read.state, views, offset, read.unreadable)

    def _clock_offset(self, headers: httpx.Headers) -> float | None:
        date = headers.get("date")
        if not date:
            return None
        try:
            return email.utils.parsedate_to_datetime(date).timestamp() - self._clock()
        except (TypeError, ValueError):
            return None

    # -- one-off requests ---------------------------------------------------------------------

    async def models(self) -> list[ModelListEntry]:
        response = await self._deployments.request("GET", "/models")
        try:
            return list(ModelList.model_validate_json(response.content).data)
        except ValidationError as exc:
            raise ApiError(f"unreadable model list: {validation_summary(exc.errors())}") from exc

    async def create_deployment(self, request: CreateDeploymentRequest) -> CommandResponse:
        return (await self._deployments.create(request)).value

    async def delete_deployment(self, deployment_id: str) -> CommandResponse:
        return (await self._deployments.delete(deployment_id)).value

    async def scale_deployment(self, deployment_id: str, replicas: int) -> CommandResponse:
        return (await self._deployments.scale(deployment_id, replicas)).value

    async def update_deployment(
        self, deployment_id: str, changes: Mapping[str, int | bool | str]
    ) -> CommandResponse:
        """Change only ``changes`` of the deployment (``PATCH /deployments/{id}``)."""
        return (await self._deployments.update(deployment_id, changes)).value

    async def delete_instance(self, instance_id: str) -> None:
        """exo's route, answered alike by our master, the bridge and a stock exo; the answer's
        body says nothing the dashboard needs (the State shows the instance go)."""
        await self._deployments.request("DELETE", f"/instance/{instance_id}")

    async def nodes(self) -> NodesResponse:
        """Every node by name with its cordon and drain (``GET /nodes``): only there does the
        keeper say why a drain's move is stuck."""
        return (await self._deployments.nodes()).value

    async def cordon(self, node: str) -> CommandResponse:
        return (await self._deployments.cordon(node)).value

    async def uncordon(self, node: str) -> CommandResponse:
        return (await self._deployments.uncordon(node)).value

    async def drain(self, node: str, force: bool) -> CommandResponse:
        return (await self._deployments.drain(node, force)).value

    async def what_if(self, node: str) -> WhatIfResponse:
        """What losing ``node`` now would do (``GET /whatif``), changing nothing."""
        return (await what_if(self._deployments, [node])).value

    async def service_health(self) -> ServiceHealthView | None:
        """``GET /healthz`` read for what it says of the service: a bridge answers 503 with the
        same body while degraded, so any status with a JSON object is read. An answer with
        none of the fields, or any it cannot read (not JSON, a bad type, no such route, no
        answer), is None: the header then shows nothing of it."""
        try:
            with anyio.fail_after(REQUEST_TIMEOUT_S):
                async with self._http.stream("GET", "/healthz") as response:
                    body = await read_capped(response, HEALTH_MAX_BYTES)
            health = ServiceHealthView.model_validate_json(body)
        except (httpx.HTTPError, UnreadableAnswerError, ValidationError, TimeoutError, OSError):
            return None
        return health if health.role is not None else None
