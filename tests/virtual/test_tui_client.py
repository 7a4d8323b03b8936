"""The dashboard's HTTP client against scripted masters, in virtual time.

httpx's MockTransport stands in for the master, so these tests cover what the client does with
what a master says (stream, polling fallback, outages, refusals) without sockets, and trio's
MockClock makes the reconnect backoff and the silence deadline instant.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from itertools import pairwise

import anyio
import httpx
import pytest
from model_ids import QWEN
from recorded_exo import recorded, recorded_content_type

from exo_deploy_tui.feed.client import (
    RECONNECT_FIRST_S,
    RECONNECT_MAX_S,
    STOCK_EXO,
    STREAM_SILENCE_S,
    ApiError,
    MasterClient,
    events_kind,
)
from exo_deploy_tui.model.updates import (
    ConnectionUpdate,
    DeploymentsUpdate,
    EventUpdate,
    HeardUpdate,
    SnapshotUpdate,
    Update,
)
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder
from keeper.model.api_models import CreateDeploymentRequest, DeploymentsResponse, StreamSnapshot
from keeper.model.events import IndexedEvent, NodeTimedOut


def cluster() -> ClusterBuilder:
    return ClusterBuilder().node("studio").deployment(QWEN, on=["studio"])


# What exo-deploy's master answers /events with (Starlette adds the charset).
SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8"}


def sse(event: str, data: str) -> bytes:
    return f"event: {event}\ndata: {data}\n\n".encode()


def snapshot_message(builder: ClusterBuilder) -> bytes:
    snap = builder.snapshot()
    body = StreamSnapshot(state=snap.state, deployments=list(snap.deployments or ()))
    return sse("snapshot", body.model_dump_json(by_alias=True))


class Stream(httpx.AsyncByteStream):
    """A response body sent in chunks, optionally left open afterwards like a live stream."""

    def __init__(self, chunks: list[bytes], hang: bool) -> None:
        self.chunks = chunks
        self.hang = hang

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.hang:
            await anyio.sleep_forever()


async def watch(
    client: MasterClient, until: Callable[[list[Update]], bool], limit_s: float = 300
) -> list[Update]:
    """Run the client until ``until(updates)`` holds, failing after ``limit_s`` virtual seconds."""
    seen: list[Update] = []
    async with anyio.create_task_group() as group:
        group.start_soon(client.run, seen.append)
        with anyio.fail_after(limit_s):
            while not until(seen):
                await anyio.sleep(0.01)  # virtual time: costs nothing
        group.cancel_scope.cancel()
    await client.aclose()
    return seen


def modes(updates: list[Update]) -> list[str]:
    return [u.mode for u in updates if isinstance(u, ConnectionUpdate)]


@pytest.mark.anyio
async def test_the_event_stream_feeds_snapshot_events_and_timers() -> None:
    builder = cluster()
    event = IndexedEvent(idx=0, event=NodeTimedOut(node_id="12D3KooWstudio"))
    timers = DeploymentsResponse(deployments=list(builder.snapshot().deployments or ()))
    body = [
        b": keepalive\n\n",
        snapshot_message(builder),
        sse("event", event.model_dump_json(by_alias=True)),
        sse("deployments", timers.model_dump_json()),
    ]
    requests: list[httpx.Request] = []

    def master(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        assert request.url.path == "/events"
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream(body, hang=True))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: any(isinstance(u, DeploymentsUpdate) for u in s))
    assert [type(u).__name__ for u in seen] == [
        "ConnectionUpdate",
        "HeardUpdate",  # the keepalive: the master is alive, with nothing to say
        "SnapshotUpdate",
        "ConnectionUpdate",
        "EventUpdate",
        "DeploymentsUpdate",
    ]
    assert modes(seen) == ["connecting", "live"]
    snapshot = seen[2]
    assert isinstance(snapshot, SnapshotUpdate)
    assert snapshot.state == builder.state
    assert isinstance(seen[4], EventUpdate) and seen[4].indexed == event
    assert len(requests) == 1


@pytest.mark.anyio
async def test_without_a_stream_it_polls_state_and_deployments() -> None:
    builder = cluster()
    snap = builder.snapshot()
    polls: list[str] = []

    def master(request: httpx.Request) -> httpx.Response:
        polls.append(request.url.path)
        if request.url.path == "/state":
            return httpx.Response(
                200,
                content=snap.state.model_dump_json(by_alias=True),
                headers={"date": "Mon, 30 Nov 2026 12:00:30 GMT"},
            )
        if request.url.path == "/deployments":
            body = DeploymentsResponse(deployments=list(snap.deployments or ()))
            return httpx.Response(200, content=body.model_dump_json())
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient(
        "http://master", transport=httpx.MockTransport(master), clock=lambda: FROZEN_NOW
    )
    seen = await watch(client, lambda s: len(polls) >= 7)
    snapshots = [u for u in seen if isinstance(u, SnapshotUpdate)]
    assert len(snapshots) == 1  # three polls, one change: the same answer is not re-sent
    # ...but an unchanged answer is still the master speaking, and says so.
    assert any(isinstance(u, HeardUpdate) for u in seen[seen.index(snapshots[0]) :])
    assert snapshots[0].state == builder.state
    assert snapshots[0].deployments == snap.deployments
    assert snapshots[0].master_clock_offset_s == 30
    assert modes(seen) == ["connecting", "polling"]
    assert polls[0] == "/events" and sorted(polls[1:7]) == ["/deployments"] * 3 + ["/state"] * 3


@pytest.mark.anyio
async def test_a_stock_exo_master_without_deployments_is_still_shown() -> None:
    state_json = cluster().state.model_dump_json(by_alias=True)

    def master(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/state":
            return httpx.Response(200, content=state_json)
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: any(isinstance(u, SnapshotUpdate) for u in s))
    (snapshot,) = [u for u in seen if isinstance(u, SnapshotUpdate)]
    assert snapshot.deployments is None


@pytest.mark.anyio
async def test_a_master_that_is_down_is_retried_with_capped_backoff() -> None:
    attempts: list[float] = []

    def master(request: httpx.Request) -> httpx.Response:
        attempts.append(anyio.current_time())
        raise httpx.ConnectError("connection refused", request=request)

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: len(modes(s)) >= 9)
    downs = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "down"]
    assert [d.retry_in_s for d in downs] == [0.5, 1, 2, 4, 8, 8, 8, 8]
    assert all(d.detail == "cannot connect" for d in downs)
    gaps = [b - a for a, b in pairwise(attempts)]
    assert gaps[:5] == pytest.approx([0.5, 1, 2, 4, 8])
    assert RECONNECT_FIRST_S == 0.5 and RECONNECT_MAX_S == 8


@pytest.mark.anyio
async def test_a_silent_stream_is_abandoned_and_reopened() -> None:
    builder = cluster()
    opened: list[float] = []

    def master(request: httpx.Request) -> httpx.Response:
        opened.append(anyio.current_time())
        return httpx.Response(
            200, headers=SSE_HEADERS, stream=Stream([snapshot_message(builder)], hang=True)
        )

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: len(opened) >= 2 and modes(s)[-1] == "live")
    assert modes(seen) == ["connecting", "live", "down", "live"]
    assert opened[1] - opened[0] == pytest.approx(STREAM_SILENCE_S + RECONNECT_FIRST_S)
    assert sum(isinstance(u, SnapshotUpdate) for u in seen) == 2


@pytest.mark.anyio
async def test_resync_ends_the_stream_and_starts_again_from_a_snapshot() -> None:
    builder = cluster()
    opened: list[float] = []

    def master(request: httpx.Request) -> httpx.Response:
        opened.append(anyio.current_time())
        body = [b": keepalive\n\n", snapshot_message(builder)]
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream(body, hang=True))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen: list[Update] = []

    def snapshots() -> int:
        return sum(isinstance(u, SnapshotUpdate) for u in seen)

    async with anyio.create_task_group() as group:
        group.start_soon(client.run, seen.append)
        with anyio.fail_after(30):
            while snapshots() < 1:
                await anyio.sleep(0.01)
            client.resync()
            while snapshots() < 2:
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    await client.aclose()
    assert modes(seen) == ["connecting", "live", "down", "live"]
    (down,) = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "down"]
    assert down.detail == "events were missed: starting again from a snapshot"
    assert len(opened) == 2 and opened[1] - opened[0] < STREAM_SILENCE_S


@pytest.mark.anyio
async def test_an_unreadable_event_forces_a_fresh_snapshot() -> None:
    builder = cluster()
    streams = [
        [snapshot_message(builder), sse("event", json.dumps({"idx": 1, "event": {"Bogus": {}}}))],
        [snapshot_message(builder)],
    ]

    def master(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream(streams.pop(0), hang=True))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: sum(isinstance(u, SnapshotUpdate) for u in s) == 2)
    (unreadable,) = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "unreadable"]
    assert unreadable.detail == "event message: event: unknown tag Bogus"
    assert not any(isinstance(u, EventUpdate) for u in seen)


@pytest.mark.anyio
async def test_a_stream_the_master_ends_with_an_error_is_followed_again() -> None:
    builder = cluster()
    lagged = json.dumps(
        {"error": {"message": "subscriber lagged", "type": "x", "param": None, "code": 503}}
    )
    streams = [[snapshot_message(builder), sse("error", lagged)], [snapshot_message(builder)]]

    def master(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream(streams.pop(0), hang=True))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: sum(isinstance(u, SnapshotUpdate) for u in s) == 2)
    (down,) = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "down"]
    assert down.detail == "the master ended the stream: subscriber lagged"


@pytest.mark.anyio
async def test_a_master_answering_500_is_retried_not_fatal() -> None:
    calls = 0

    def master(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(500, text="boom")

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: modes(s).count("unreadable") >= 2)
    assert modes(seen) == ["connecting", "unreadable", "unreadable"]
    assert [u.detail for u in seen if isinstance(u, ConnectionUpdate)][1:] == [
        "GET /events: HTTP 500",
        "GET /events: HTTP 500",
    ]


@pytest.mark.anyio
async def test_create_sends_the_token_and_returns_the_answer() -> None:
    seen: list[httpx.Request] = []

    def master(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            json={"message": "ok", "command_id": "c1", "deployment_id": "d1", "extra": 1},
        )

    client = MasterClient("http://master", token="s3cret", transport=httpx.MockTransport(master))
    answer = await client.create_deployment(CreateDeploymentRequest(model_id=QWEN, min_nodes=2))
    await client.aclose()
    assert answer.deployment_id == "d1"
    (request,) = seen
    assert request.headers["authorization"] == "Bearer s3cret"
    assert json.loads(request.content) == {
        "model_id": QWEN,
        "sharding": "Pipeline",
        "instance_meta": "MlxRing",
        "min_nodes": 2,
        "replicas": 1,
        "standby": 1,
        "priority": 500,
        "preempt": False,
    }


@pytest.mark.anyio
async def test_scale_patches_the_deployment_and_reads_a_refusal() -> None:
    seen: list[httpx.Request] = []

    def master(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/deployments/gone":
            body = {"error": {"message": "no deployment gone", "type": "Not Found", "code": 404}}
            return httpx.Response(404, json=body)
        if request.url.path == "/deployments/old":  # a master from before scaling
            return httpx.Response(405, json={"detail": "Method Not Allowed"})
        return httpx.Response(
            200, json={"message": "scaled", "command_id": "c2", "deployment_id": "d1"}
        )

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    answer = await client.scale_deployment("d1", 3)
    with pytest.raises(ApiError) as refused:
        await client.scale_deployment("gone", 2)
    with pytest.raises(ApiError, match="this master cannot scale deployments"):
        await client.scale_deployment("old", 2)
    await client.aclose()
    assert answer.deployment_id == "d1"
    assert [(r.method, r.url.path) for r in seen] == [
        ("PATCH", "/deployments/d1"),
        ("PATCH", "/deployments/gone"),
        ("PATCH", "/deployments/old"),
    ]
    assert json.loads(seen[0].content) == {"replicas": 3}
    assert (refused.value.status, refused.value.message) == (404, "no deployment gone")


@pytest.mark.anyio
async def test_delete_instance_uses_exos_route() -> None:
    seen: list[httpx.Request] = []

    def master(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/instance/i-gone":
            return httpx.Response(404, json={"detail": "Instance i-gone not found"})
        return httpx.Response(200, json={"message": "deleted", "command_id": "c3"})

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    await client.delete_instance("i-1")
    with pytest.raises(ApiError) as refused:
        await client.delete_instance("i-gone")
    await client.aclose()
    assert [(r.method, r.url.path) for r in seen] == [
        ("DELETE", "/instance/i-1"),
        ("DELETE", "/instance/i-gone"),
    ]
    assert refused.value.message == "Instance i-gone not found"


@pytest.mark.anyio
async def test_a_refusal_carries_the_masters_message() -> None:
    def master(request: httpx.Request) -> httpx.Response:
        body = {
            "error": {
                "message": "model already deployed as dep-1",
                "type": "Conflict",
                "param": None,
                "code": 409,
            }
        }
        return httpx.Response(409, json=body)

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    with pytest.raises(ApiError) as refused:
        await client.delete_deployment("dep-1")
    await client.aclose()
    assert refused.value.message == "model already deployed as dep-1"
    assert refused.value.status == 409


@pytest.mark.anyio
async def test_a_master_without_deployments_says_so_when_asked_to_create() -> None:
    def master(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    with pytest.raises(ApiError, match="this master has no deployments API"):
        await client.create_deployment(CreateDeploymentRequest(model_id=QWEN))
    await client.aclose()


@pytest.mark.anyio
async def test_an_unreachable_master_is_a_clear_error() -> None:
    def master(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = MasterClient("http://master:1", transport=httpx.MockTransport(master))
    with pytest.raises(ApiError, match=r"cannot reach the master at http://master:1"):
        await client.models()
    await client.aclose()


@pytest.mark.anyio
async def test_a_hung_master_times_out_a_request() -> None:
    async def master(request: httpx.Request) -> httpx.Response:
        await anyio.sleep_forever()
        raise AssertionError

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    with pytest.raises(ApiError, match="did not answer in time"):
        await client.models()
    await client.aclose()


@pytest.mark.anyio
async def test_the_masters_retry_sets_where_the_reconnect_backoff_starts() -> None:
    builder = cluster()
    opened: list[float] = []
    snapshot = snapshot_message(builder).replace(
        b"event: snapshot", b"retry: 2000\nevent: snapshot"
    )

    def master(request: httpx.Request) -> httpx.Response:
        opened.append(anyio.current_time())
        # Multi-line data, an id and comments are framing the reader must take in its stride.
        body = [b": keepalive\n\n", snapshot, b"id: 7\nevent: other\ndata: {\ndata: }\n\n"]
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream(body, hang=False))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: len(opened) >= 3)
    assert modes(seen)[:4] == ["connecting", "live", "down", "live"]
    # The stream ended at once each time: the reconnect waits the master's 2 s, not our 0.5 s.
    assert opened[1] - opened[0] == pytest.approx(2.0)
    assert opened[2] - opened[1] == pytest.approx(2.0)


# --- a stock exo master ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "content_type", "kind"),
    [
        (200, "text/event-stream; charset=utf-8", "stream"),
        (200, "Text/Event-Stream", "stream"),
        (200, recorded_content_type("events"), "exo-log"),
        (200, "application/json; charset=utf-8", "exo-log"),
        (404, "application/json", "none"),
        (405, None, "none"),
    ],
)
def test_the_kind_of_master_is_told_from_the_events_headers(
    status: int, content_type: str | None, kind: str
) -> None:
    assert events_kind(status, content_type) == kind


@pytest.mark.parametrize(
    ("status", "content_type", "reason"),
    [
        (200, "text/html", "GET /events: text/html, not a stream or exo's log"),
        (200, None, "GET /events: no Content-Type, not a stream or exo's log"),
        (500, "application/json", "GET /events: HTTP 500"),
    ],
)
def test_an_events_answer_of_no_known_kind_is_a_reason_not_a_guess(
    status: int, content_type: str | None, reason: str
) -> None:
    assert events_kind(status, content_type) == reason


class Log(httpx.AsyncByteStream):
    """exo's one-shot event log as a body that records whether anyone read it."""

    def __init__(self) -> None:
        self.read = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.read = True
        yield recorded("events")


@pytest.mark.anyio
async def test_a_stock_exo_is_polled_and_its_event_log_never_downloaded() -> None:
    """A scripted stock exo that fails twice mid-run: every connection asks /events once, reads
    only its headers, asks /deployments once, then polls /state alone."""
    stages = [
        "state-instance-ready",
        "state-node-timed-out",
        "state-node-timed-out-instance-deleted",
    ]
    requests: list[str] = []
    logs: list[Log] = []
    state_polls = 0

    def exo(request: httpx.Request) -> httpx.Response:
        nonlocal state_polls
        path = request.url.path
        requests.append(path)
        if path == "/events":
            logs.append(Log())
            return httpx.Response(
                200, headers={"content-type": recorded_content_type("events")}, stream=logs[-1]
            )
        if path == "/state":
            state_polls += 1
            if state_polls in (3, 6):  # the master restarts, twice
                raise httpx.ConnectError("connection refused", request=request)
            stage = stages[min(state_polls // 3, len(stages) - 1)]
            return httpx.Response(200, content=recorded(stage))
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient("http://exo", transport=httpx.MockTransport(exo))
    seen = await watch(client, lambda s: state_polls >= 12)

    assert modes(seen) == ["connecting", "polling", "down", "polling", "down", "polling"]
    polling = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "polling"]
    assert {u.detail for u in polling} == {STOCK_EXO}
    # Split the requests at each reconnect: each connection starts with one /events and one
    # /deployments, and asks neither again.
    connections: list[list[str]] = [[]]
    for path in requests:
        if path == "/events" and connections[-1]:
            connections.append([])
        connections[-1].append(path)
    assert len(connections) == 3
    for connection in connections:
        assert connection[0] == "/events"
        assert connection.count("/events") == 1
        assert connection.count("/deployments") == 1
    assert len(logs) == 3 and not any(log.read for log in logs)
    snapshots = [u for u in seen if isinstance(u, SnapshotUpdate)]
    assert [len(u.state.topology.nodes) for u in snapshots] == [3, 2, 2]
    assert all(u.deployments is None for u in snapshots)
    assert [len(u.state.instances) for u in snapshots] == [1, 1, 0]


@pytest.mark.anyio
async def test_an_exo_state_we_cannot_read_is_reported_not_shown_empty() -> None:
    def exo(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/events":
            return httpx.Response(200, headers={"content-type": "application/json"}, content=b"[]")
        if request.url.path == "/state":
            return httpx.Response(200, content=b'{"topology": {"nodes": 7}}')
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient("http://exo", transport=httpx.MockTransport(exo))
    seen = await watch(client, lambda s: "unreadable" in modes(s))
    assert not any(isinstance(u, SnapshotUpdate) for u in seen)
    (unreadable,) = [u for u in seen if isinstance(u, ConnectionUpdate) and u.mode == "unreadable"]
    assert unreadable.detail == "not exo's State: topology.nodes: expected an array"


# --- answers we cannot read --------------------------------------------------------------

HTML = {"content-type": "text/html; charset=utf-8"}
JSON = {"content-type": "application/json"}


class Huge(httpx.AsyncByteStream):
    """A 64 MiB body in 1 MiB chunks, as a wrong URL streaming a huge file would send; it ends,
    so a client without a cap fails a test rather than the machine."""

    def __init__(self) -> None:
        self.sent = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while self.sent < 64 << 20:
            self.sent += 1 << 20
            yield b" " * (1 << 20)


def stock_exo(state: Callable[[], httpx.Response]) -> httpx.MockTransport:
    """A stock exo whose /state answers what ``state`` makes, and with no deployments API."""

    def exo(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/events":
            return httpx.Response(200, headers=JSON, content=b"[]")
        if request.url.path == "/state":
            return state()
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(exo)


def unreadable_details(updates: list[Update]) -> list[str]:
    return [u.detail for u in updates if isinstance(u, ConnectionUpdate) and u.mode == "unreadable"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (
            lambda: httpx.Response(200, headers=HTML, content=b"<html>exo?</html>"),
            "not JSON (text/html)",
        ),
        (lambda: httpx.Response(200, content=b"<html>"), "not JSON"),
        (lambda: httpx.Response(502, headers=HTML, content=b"<h1>Bad Gateway</h1>"), "HTTP 502"),
        (
            lambda: httpx.Response(200, headers=JSON, content=b"[]"),
            "not exo's State: expected an object",
        ),
        (
            lambda: httpx.Response(200, headers=JSON, content=b'{"nodeProfiles": {}}'),
            'not exo\'s State: no "topology"',
        ),
        (
            lambda: httpx.Response(
                200, headers=JSON, content=b'{"topology": {}, "instances": {}, "nodeMemory": []}'
            ),
            "not exo's State: nodeMemory: expected an object",
        ),
        (lambda: httpx.Response(200, headers=JSON, content=b"[" * 100_000), "nested too deep"),
        (lambda: httpx.Response(200, headers=JSON, stream=Huge()), "larger than 32 MiB"),
    ],
    ids=["html", "untyped", "502", "array", "no-topology", "wrong-field", "deep", "huge"],
)
async def test_an_unreadable_state_says_why_on_every_poll_and_never_polling(
    answer: Callable[[], httpx.Response], why: str
) -> None:
    client = MasterClient("http://exo", transport=stock_exo(answer))
    seen = await watch(client, lambda s: len(unreadable_details(s)) >= 3)
    assert modes(seen) == ["connecting", "unreadable", "unreadable", "unreadable"]
    assert unreadable_details(seen) == [why] * 3
    assert not any(isinstance(u, SnapshotUpdate) for u in seen)


@pytest.mark.anyio
async def test_a_huge_state_is_read_no_further_than_the_cap() -> None:
    huge = Huge()
    client = MasterClient(
        "http://exo",
        transport=stock_exo(lambda: httpx.Response(200, headers=JSON, stream=huge)),
    )
    seen = await watch(client, lambda s: len(unreadable_details(s)) >= 1)
    assert unreadable_details(seen) == ["larger than 32 MiB"]
    assert huge.sent <= 33 << 20  # stopped at the first chunk past 32 MiB


@pytest.mark.anyio
async def test_a_good_state_then_html_then_the_good_state_again() -> None:
    """The HTML is reported each time it comes, though it is the same page; the good State
    after it is polling again, and (unchanged) not sent again."""
    good = cluster().state.model_dump_json(by_alias=True).encode()
    answers = [good, b"<html>", b"<html>", good, good]

    def state() -> httpx.Response:
        body = answers.pop(0) if len(answers) > 1 else answers[0]
        return httpx.Response(200, headers=HTML if body == b"<html>" else JSON, content=body)

    client = MasterClient("http://exo", transport=stock_exo(state))
    seen = await watch(client, lambda s: not answers[1:] and modes(s)[-1] == "polling")
    assert modes(seen) == ["connecting", "polling", "unreadable", "unreadable", "polling"]
    assert unreadable_details(seen) == ["not JSON (text/html)"] * 2
    snapshots = [u for u in seen if isinstance(u, SnapshotUpdate)]
    assert len(snapshots) == 1 and snapshots[0].state == cluster().state


@pytest.mark.anyio
async def test_unreadable_deployments_are_named() -> None:
    state_json = cluster().state.model_dump_json(by_alias=True)

    def master(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/state":
            return httpx.Response(200, headers=JSON, content=state_json)
        if request.url.path == "/deployments":
            return httpx.Response(200, headers=HTML, content=b"<html>")
        return httpx.Response(404, json={"detail": "Not Found"})

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: len(unreadable_details(s)) >= 2)
    assert unreadable_details(seen) == ["/deployments: not JSON (text/html)"] * 2
    assert not any(isinstance(u, SnapshotUpdate) for u in seen)


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("message", "why"),
    [
        (sse("snapshot", "<html>"), "snapshot message: not JSON"),
        (sse("snapshot", "[" * 100_000), "snapshot message: nested too deep"),
        (
            sse("deployments", '{"deployments": {}}'),
            "deployments message: deployments: expected an array",
        ),
    ],
    ids=["html", "deep", "wrong-field"],
)
async def test_an_unreadable_stream_message_is_reported(message: bytes, why: str) -> None:
    def master(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=SSE_HEADERS, stream=Stream([message], hang=True))

    client = MasterClient("http://master", transport=httpx.MockTransport(master))
    seen = await watch(client, lambda s: len(unreadable_details(s)) >= 2)
    assert unreadable_details(seen)[:2] == [why] * 2
    assert "live" not in modes(seen)
