"""The bridge's only way to reach exo: seven calls of exo's public HTTP API.

- ``GET /state``: exo's State, read strictly where the keeper decides (``keeper.model.exo_state``)
and   kept as raw JSON too, for the model cards exo wrote and for serving exo's State on with the
  deployments merged in;
- ``GET /models``: exo's model list;
- ``POST /instance`` ``{"instance": ...}``: create exactly this instance (exo accepts the command
  and applies it shortly after);
- ``DELETE /instance/{id}``: delete one (likewise accepted, then applied);
- ``GET /instance/placement`` and ``GET /instance/previews``: where exo itself would place a
  model (``keeper.bridge.placement_choice`` reads the answers). exo's refusal is a 4xx like any
  other (its reason becomes the placement error); an exo without these endpoints answers 404 or
  405, and the bridge then places by itself (docs/bridge.md, "Placement");
- ``GET /node_id``: the id of the node whose API this is (a JSON string), with a deadline of
  the caller's: which ``--exo`` URL is which node, and whether a suspect node's own API still
  answers (``keeper.bridge.node_probes``, docs/design.md §5.18).

Every call has a deadline on anyio's clock (so tests run it in virtual time) and ends in one of
three ways the service can act on: an answer; ``ExoRefusedError`` (exo said no, with its message:
a 4xx); or ``ExoUnavailableError`` (no answer, a 5xx, or an answer that cannot be read). A
refusal is about the request; unavailability is about exo, and means nothing may be decided on
what the bridge last saw. ``ExoStateUnreadableError`` is the unavailability of a State that came
back whole as JSON but lacks, or garbles, what everything hangs on; an entry of it that does not
read (one instance, one runner, one node's report) is left out and named instead
(``ExoState.unreadable``).

Every answer is read within bounds (``keeper.bridge.exo_bounds``): its body streamed and read no
further than a cap for what it is (exo's State 16 MiB, listings 4 MiB, the rest 1 MiB), and
parsed only if nested no deeper than 64 levels. A State over either is unreadable
(``ExoStateUnreadableError``, saying which); any other answer over them is unreadable as that
answer's own rule says (exo's model list unavailable, a placement answer refused, a command's
answer taken as empty). The deadline covers reading the body too.

Reads and commands have different deadlines. exo answers ``GET /state`` from its API's own copy
of the State, at once, even during an election, so a State read has the shortest deadline
(``STATE_TIMEOUT_S``), after which the bridge reads the next URL; but exo holds every command
(``POST /instance``, ``DELETE /instance``) until an election is over, which takes seconds. A
command that outlives its deadline has not failed: exo may still apply it (the service's
in-flight rules).

A connection the node's OS refused (``ExoConnectionRefusedError``: every address tried answered
ECONNREFUSED) is told apart from other unavailability: nobody listens on that port, which a
killed exo leaves and a frozen one or a slow network never does (docs/design.md §5.18).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol, cast
from urllib.parse import urlencode

import anyio
import httpx

from keeper.bridge.exo_bounds import (
    COMMAND_MAX_BYTES,
    LISTING_MAX_BYTES,
    STATE_MAX_BYTES,
    OverBoundsError,
    parse_json,
    too_large,
)
from keeper.bridge.exo_wire import ExoListedModel, cards_in_state, listed_models
from keeper.bridge.state_deadline import FLOOR_S
from keeper.model.exo_state import (
    Unreadable,
    UnreadablePart,
    read_exo_state,
    unreadable_instances,
)
from keeper.model.state import State
from keeper.model.wire import JsonObject

# exo answers GET /state from its API's own copy of the State, in memory, in milliseconds on a
# LAN; a read that has taken this long is from an exo that is frozen, gone or too loaded to act
# on, and the bridge moves to its next URL in the same tick (keeper.bridge.following). The
# follower lengthens it for a slow exo (keeper.bridge.state_deadline); this is a quick exo's.
STATE_TIMEOUT_S = FLOOR_S
# exo's other reads (its model list, where it would place a model) are worked out, not read from
# memory: a little more room than the State's, still short of a poll's overlapping the next one
# by much.
REQUEST_TIMEOUT_S = 5.0
# exo's API holds commands while its nodes elect a master (measured: ~3 s, up to 6 s). Longer
# than that, so a command sent during an election normally gets its answer (one that does not may
# still be applied, and is resent with the same instance id: keeper.bridge.in_flight); short
# enough that a deployments call waiting behind it still answers within a client's 10 s.
COMMAND_TIMEOUT_S = 8.0


# Idle connections to one exo API kept for the next chat: a few clients chatting back to back
# reuse theirs; a burst's connections beyond these are closed once idle.
KEPT_CHAT_LINKS = 32


class ExoUnavailableError(Exception):
    """exo did not answer usefully; ``str()`` says how, for the operator."""


class ExoConnectionRefusedError(ExoUnavailableError):
    """The connection was refused on every address tried: no process listens on exo's port."""


class ExoStateUnreadableError(ExoUnavailableError):
    """exo answered ``GET /state`` with a State the keeper cannot act on
    (``keeper.model.exo_state``), or one larger or deeper than the bridge reads."""


class ExoRefusedError(Exception):
    """exo refused a request (4xx); ``message`` is exo's own reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ExoAnswer:
    """One of exo's answers, its body read no further than its cap."""

    status_code: int
    reason_phrase: str
    what: str  # "exo's /state": the answer, as its reasons name it
    content: bytes  # the body; only its start when ``over`` is set
    over: str | None = None  # why the body was not read to its end (too large), in words

    def json(self) -> Any:
        """The body as JSON; ``OverBoundsError`` if it was too large or is nested too deeply,
        ``ValueError`` if it is not JSON."""
        if self.over is not None:
            raise OverBoundsError(self.over)
        return parse_json(self.content, self.what)


@dataclass(frozen=True)
class ExoState:
    """One read of exo's ``GET /state``."""

    state: State  # what read of it: each entry that did not is left out, and named below
    raw: JsonObject  # exo's JSON as it came, every key kept
    cards: dict[str, JsonObject]  # the model cards exo's instances carry, by model id
    # The entries of exo's State that did not read (keeper.model.exo_state): the deployments
    # they concern are neither placed nor deleted for while they last.
    unreadable: tuple[UnreadablePart, ...] = ()

    @property
    def unreadable_instances(self) -> frozenset[str]:
        """Instances exo runs that did not read: there, though not in ``state``."""
        return unreadable_instances(self.unreadable)


@dataclass(frozen=True)
class ExoModels:
    """One read of exo's ``GET /models``."""

    listed: dict[str, ExoListedModel]
    body: bytes  # exo's answer as it came, to pass on


class ExoApi(Protocol):
    """What the bridge needs of exo (``ExoClient``; tests may script another)."""

    url: str

    async def state(self, timeout_s: float | None = None) -> ExoState: ...
    async def models(self) -> ExoModels: ...
    async def create_instance(self, body: JsonObject) -> JsonObject: ...
    async def delete_instance(self, instance_id: str) -> bool: ...
    async def placement(
        self, model_id: str, sharding: str, instance_meta: str, min_nodes: int
    ) -> Any: ...
    async def previews(self, model_id: str) -> Any: ...
    async def start_download(self, node_id: str, shard: JsonObject) -> None: ...
    async def delete_download(self, node_id: str, model_id: str) -> None: ...
    async def node_id(self, timeout_s: float) -> str: ...
    @property
    def http(self) -> httpx.AsyncClient: ...


def _exo_http(
    url: str,
    transport: httpx.AsyncBaseTransport | None,
    timeout: httpx.Timeout,
    limits: httpx.Limits,
) -> httpx.AsyncClient:
    """An HTTP client on exo's API at ``url``."""
    return httpx.AsyncClient(
        base_url=url,
        transport=transport,
        timeout=timeout,
        trust_env=False,  # exo is on the LAN: never through an HTTP proxy from the env
        # Bodies as sent: a compressed one would be inflated a chunk at a time, each chunk
        # whole, before its size could be counted against the cap.
        headers={"Accept-Encoding": "identity"},
        limits=limits,
    )


class ExoClient:
    """exo's HTTP API at ``url`` (e.g. ``http://127.0.0.1:52415``)."""

    def __init__(
        self,
        url: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        state_timeout_s: float = STATE_TIMEOUT_S,
    ) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._command_timeout_s = command_timeout_s
        self._state_timeout_s = state_timeout_s
        timeout = httpx.Timeout(max(timeout_s, command_timeout_s))
        self._http = _exo_http(self.url, transport, timeout, httpx.Limits())
        # The front door's chats on a client of their own: a chat's stream holds its connection
        # for the whole answer, and on the one above httpx's pool of 100 held streams would keep
        # the State poll waiting (measured: past 100 streams the bridge stopped reading exo's
        # State). Its connections are bounded by the door's --max-inflight, not by a pool.
        self._passed = _exo_http(
            self.url,
            transport,
            timeout,
            httpx.Limits(max_connections=None, max_keepalive_connections=KEPT_CHAT_LINKS),
        )

    @property
    def http(self) -> httpx.AsyncClient:
        """The HTTP client on exo's URL for what is passed through to exo as it is (the front
        door's chats, keeper.runtime.front_door): apart from the bridge's own reads."""
        return self._passed

    async def aclose(self) -> None:
        await self._http.aclose()
        await self._passed.aclose()

    async def state(self, timeout_s: float | None = None) -> ExoState:
        """exo's State, read within ``timeout_s`` (None: ``STATE_TIMEOUT_S`` or what this
        client was given)."""
        answer = await self._get("/state", STATE_MAX_BYTES, timeout_s=timeout_s)
        try:
            raw = _json_object(answer, "GET /state")
        except OverBoundsError as exc:
            # exo answers, with a State the bridge will not read: unreadable, as one that lacks
            # what the keeper decides on.
            raise ExoStateUnreadableError(str(exc)) from None
        read = read_exo_state(raw)
        if isinstance(read, Unreadable):
            raise ExoStateUnreadableError(read.reason)
        return ExoState(
            state=read.state, raw=raw, cards=cards_in_state(raw), unreadable=read.unreadable
        )

    async def models(self) -> ExoModels:
        answer = await self._get("/models", LISTING_MAX_BYTES)
        try:
            payload = _json_object(answer, "GET /models")
        except OverBoundsError as exc:
            raise ExoUnavailableError(f"GET /models: {exc}") from None
        return ExoModels(listed=listed_models(payload), body=answer.content)

    async def create_instance(self, body: JsonObject) -> JsonObject:
        """exo's answer (``model_card`` in it is exo's full card); {} if it is not an object."""
        response = await self._call("POST", "/instance", body)
        try:
            answer: Any = response.json()
        except ValueError:  # not JSON, too large or too deep: exo took it, its card unknown
            return {}
        return cast(JsonObject, answer) if isinstance(answer, dict) else {}

    async def delete_instance(self, instance_id: str) -> bool:
        """True if exo accepted the deletion, False if it does not know the instance."""
        try:
            await self._call("DELETE", f"/instance/{instance_id}")
        except ExoRefusedError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def start_download(self, node_id: str, shard: JsonObject) -> None:
        """Ask exo to download a model onto a node without running it (exo's
        ``POST /download/start``; ``shard`` as in an instance, with exo's card)."""
        await self._call(
            "POST", "/download/start", {"target_node_id": node_id, "shard_metadata": shard}
        )

    async def delete_download(self, node_id: str, model_id: str) -> None:
        """Ask exo to delete a model's files on a node (``DELETE /download/{node}/{model}``;
        the model id goes in the path as is, slashes and all, as exo's route reads it)."""
        await self._call("DELETE", f"/download/{node_id}/{model_id}")

    async def node_id(self, timeout_s: float) -> str:
        """exo's ``GET /node_id``: the id of the node serving this API, within ``timeout_s``;
        ExoUnavailableError if it does not answer in time, or not with a JSON string."""
        answer = await self._get("/node_id", COMMAND_MAX_BYTES, timeout_s=timeout_s)
        try:
            node_id: Any = answer.json()
        except ValueError:  # not JSON, too large or too deep
            raise ExoUnavailableError(f"GET /node_id: exo at {self.url} answered no JSON") from None
        if not isinstance(node_id, str) or not node_id:
            raise ExoUnavailableError(f"GET /node_id: exo at {self.url} answered no node id")
        return node_id

    async def _get(self, path: str, max_bytes: int, *, timeout_s: float | None = None) -> ExoAnswer:
        # A read exo refuses (a 4xx to a plain GET) means this is not an exo the bridge can
        # follow (a wrong URL, a proxy in the way): unavailable, not a refusal of a request.
        if timeout_s is None and path == "/state":
            timeout_s = self._state_timeout_s  # read from memory: short (STATE_TIMEOUT_S)
        try:
            return await self._call("GET", path, max_bytes=max_bytes, timeout_s=timeout_s)
        except ExoRefusedError as exc:
            raise ExoUnavailableError(
                f"GET {path}: exo at {self.url} answered HTTP {exc.status}: {exc.message}"
            ) from None

    async def _call(
        self,
        method: str,
        path: str,
        body: JsonObject | None = None,
        *,
        max_bytes: int = COMMAND_MAX_BYTES,
        timeout_s: float | None = None,
    ) -> ExoAnswer:
        what = f"{method} {path}"
        if timeout_s is None:
            timeout_s = self._timeout_s if method == "GET" else self._command_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                async with self._http.stream(method, path, json=body) as streamed:
                    # An error's reason is in its first words: no error needs a listing's room.
                    cap = max_bytes if streamed.status_code < 400 else COMMAND_MAX_BYTES
                    response = await _read(streamed, cap, f"exo's {path.partition('?')[0]}")
        except TimeoutError:
            raise ExoUnavailableError(
                f"{what}: no answer from exo at {self.url} within {timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            if isinstance(exc, httpx.ConnectError) and refused(exc):
                raise ExoConnectionRefusedError(
                    f"{what}: exo at {self.url} refused the connection"
                ) from None
            reason = str(exc) or type(exc).__name__
            raise ExoUnavailableError(
                f"{what}: cannot reach exo at {self.url} ({reason})"
            ) from None
        if response.status_code >= 500:
            raise ExoUnavailableError(
                f"{what}: exo answered HTTP {response.status_code}: {error_message(response)}"
            )
        if response.status_code >= 400:
            raise ExoRefusedError(response.status_code, error_message(response))
        return response

    async def placement(
        self, model_id: str, sharding: str, instance_meta: str, min_nodes: int
    ) -> Any:
        """exo's ``GET /instance/placement``: the instance exo would create, as JSON.
        ExoRefusedError carries exo's reason it would not (or 404/405 from an exo without the
        endpoint); ValueError if the answer is not JSON."""
        query = urlencode(
            {
                "model_id": model_id,
                "sharding": sharding,
                "instance_meta": instance_meta,
                "min_nodes": min_nodes,
            }
        )
        answer = await self._call(
            "GET", f"/instance/placement?{query}", max_bytes=LISTING_MAX_BYTES
        )
        return _json_answer(answer)

    async def previews(self, model_id: str) -> Any:
        """exo's ``GET /instance/previews``: every placement exo would make of the model, as
        JSON; refusals and unreadable answers as for ``placement``."""
        query = urlencode({"model_id": model_id})
        answer = await self._call("GET", f"/instance/previews?{query}", max_bytes=LISTING_MAX_BYTES)
        return _json_answer(answer)


def refused(exc: BaseException) -> bool:
    """Whether a failed connection was refused on every address it tried: the OS errors under
    ``exc`` (httpx -> httpcore -> anyio's "all attempts failed" -> one per address, or a group
    of them) are all ECONNREFUSED. A timeout, an unreachable host or a name that does not
    resolve is not a refusal."""
    causes = _os_errors(exc, set())
    return bool(causes) and all(isinstance(cause, ConnectionRefusedError) for cause in causes)


def _os_errors(exc: BaseException | None, seen: set[int]) -> list[OSError]:
    """The OS errors (those with an errno) ``exc`` was caused by, through its causes, contexts
    and exception groups."""
    if exc is None or id(exc) in seen:
        return []
    seen.add(id(exc))
    if isinstance(exc, OSError) and exc.errno is not None:
        return [exc]
    found: list[OSError] = []
    if isinstance(exc, BaseExceptionGroup):
        for sub in cast(BaseExceptionGroup[BaseException], exc).exceptions:
            found += _os_errors(sub, seen)
    return found + _os_errors(exc.__cause__, seen) + _os_errors(exc.__context__, seen)


async def _read(response: httpx.Response, cap: int, what: str) -> ExoAnswer:
    """``response`` with its body read no further than ``cap`` bytes (a chunk at a time, so no
    more than the cap is ever held); over it, only the start is kept and ``over`` says why."""

    def answer(content: bytes, over: str | None = None) -> ExoAnswer:
        return ExoAnswer(response.status_code, response.reason_phrase, what, content, over)

    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > cap:
        return answer(b"", too_large(what, cap, int(length)))  # said up front: nothing read
    body = bytearray()
    async for chunk in response.aiter_bytes():
        if len(body) + len(chunk) > cap:
            body += chunk[: cap - len(body)]
            return answer(bytes(body), too_large(what, cap))
        body += chunk
    return answer(bytes(body))


def error_message(response: ExoAnswer) -> str:
    """exo's reason from an error answer: ``{"error": {"message"}}`` (exo's handler), FastAPI's
    ``{"detail": ...}``, or the start of the text."""
    try:
        payload: Any = parse_json(response.content, response.what)
    except ValueError:
        payload = None
    if isinstance(payload, dict):
        body = cast(dict[str, Any], payload)
        error = body.get("error")
        if isinstance(error, dict):
            message = cast(dict[str, Any], error).get("message")
            if isinstance(message, str):
                return message
        detail = body.get("detail")
        if isinstance(detail, str):
            return detail
        if detail is not None:
            return json.dumps(detail)[:300]
    text = response.content.decode("utf-8", errors="replace")
    return text.strip()[:300] or response.reason_phrase


def _json_object(response: ExoAnswer, what: str) -> JsonObject:
    """The answer's JSON object; ``OverBoundsError`` as it is, for the caller to say what it
    means; ``ExoUnavailableError`` if it is not a JSON object."""
    try:
        payload: Any = response.json()
    except OverBoundsError:
        raise
    except ValueError:
        raise ExoUnavailableError(f"{what}: exo's answer is not JSON") from None
    if not isinstance(payload, dict):
        raise ExoUnavailableError(f"{what}: exo's answer is not a JSON object")
    return cast(JsonObject, payload)


def _json_answer(response: ExoAnswer) -> Any:
    try:
        return response.json()
    except OverBoundsError:
        raise
    except ValueError:
        raise ValueError("exo's answer is not JSON") from None


# What an exo without an endpoint answers: 404 (no such route, or the route of
# ``GET /instance/{id}`` taking "placement" for an instance id), or 405 (a route with that path
# but not that method).
NO_SUCH_ENDPOINT = frozenset({404, 405})
