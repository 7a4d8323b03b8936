"""A stock-exo stand-in with simulated nodes, and a bridge following it, all in one process.

``master --exo-compat`` (a ``Master`` with its keeper off, behind exo's API) runs with
``InProcessCluster`` nodes on memory channels; the bridge reaches its API through ``ExoLink``, an
httpx transport into the ASGI app that can also fail the way a network and exo do: go down,
refuse instances with exo's 400, accept an instance and apply it only later (exo answers a
command before it applies it), hold commands through an election (answering and applying them
only when it ends, even if the caller gave up waiting), or answer ``GET /state`` with a State
changed on the way, or with any response the test makes (one streaming its body, say). Routes
can be scripted with exo's recorded answers (``ExoLink.answers``). Every exo node serves exo's
API, so the link can also stand for a node's own URL (``ExoLink.node_hosts``): ``GET /node_id``
there answers that node's id, as exo does, until the host is down (``down_hosts``: its port
refuses connections, as a killed exo's does) or hung (``hung_hosts``: it never answers, as a
frozen or powered-off Mac's API); the rest of that API is the stand-in's. The bridge may follow
one node's own URL first (``exo_with_bridge``'s ``follow``). Everything runs under trio's
MockClock.
"""

from __future__ import annotations

import errno
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.abc import TaskGroup
from model_ids import QWEN
from waiting import wait_until

from keeper.bridge.api import create_bridge_app
from keeper.bridge.exo_client import ExoClient
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.placement_choice import ExoPlacement
from keeper.bridge.placing import where_to_place
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.model.api_models import error_body
from keeper.model.constants import STARTUP_GRACE
from keeper.model.state import Deployment, State
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import NodeConfig, SimFault

EXO_URL = "http://exo.test"


class ExoLink(httpx.AsyncBaseTransport):
    """The bridge's way to the stand-in's API, with faults, recording every call but state reads."""

    def __init__(self, app: Any) -> None:
        self._inner = httpx.ASGITransport(app=app)
        self.down = False
        self.refuse_instances: str | None = None  # exo's 400 message for POST /instance
        self.hold_instances = False  # answer POST /instance at once, apply on release()
        self.state_answer: tuple[int, Any] | None = None  # what GET /state answers instead
        # Or a whole response, made anew for each GET /state (e.g. one streaming its body).
        self.state_response: Callable[[], httpx.Response] | None = None
        self.state_edit: Callable[[dict[str, Any]], dict[str, Any]] | None = None
        # The same for the State one host serves (a node's own URL): its copy alone differs.
        self.state_edit_at: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        # exo holds commands until its election ends (anyio time; None: ended), then applies them,
        # whether or not the caller still waits for the answer (needs ``group``).
        self.election_until: float | None = None
        self.group: TaskGroup | None = None
        self.held: list[httpx.Request] = []
        self.calls: list[tuple[str, str, Any]] = []
        # What exo answers instead of the stand-in, by (method, path): a function of the query
        # giving (status, JSON body). The stand-in has no GET /instance/placement or /previews.
        self.answers: dict[tuple[str, str], Callable[[dict[str, str]], tuple[int, Any]]] = {}
        self.queries: list[tuple[str, dict[str, str]]] = []  # (path, query) of every scripted GET
        # A node's own API: host -> the node id its GET /node_id answers; and the hosts down.
        self.node_hosts: dict[str, str] = {}
        self.down_hosts: set[str] = set()  # refused at once, as a port nobody listens on
        self.hung_hosts: set[str] = set()  # never answered: the caller's deadline ends it
        self.slow_s = 0.0  # every answer waits this long first: an exo on a loaded machine
        self.slow_deletes_s = 0.0  # DELETE /instance/{id} answers this long after it came
        self.node_id_asked: list[str] = []  # the host of every GET /node_id
        # What exo answers the next chats instead, in order: each is given the chat's body and a
        # way to get the stand-in's own answer (cut it, empty it, replace it).
        self.chat_scripts: list[ChatScript] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.host in self.hung_hosts:
            await anyio.sleep_forever()
        if self.slow_s:
            await anyio.sleep(self.slow_s)
        if request.url.host in self.down_hosts:
            # As httpx raises it for a port nobody listens on: the OS's refusal is its cause.
            refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
            raise httpx.ConnectError("All connection attempts failed", request=request) from refused
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        method, path = request.method, request.url.path
        if (method, path) == ("GET", "/node_id"):
            self.node_id_asked.append(request.url.host)
            node_id = self.node_hosts.get(request.url.host)
            if node_id is not None:
                return httpx.Response(200, json=node_id)
        if (method, path) == ("GET", "/state") and self.state_response is not None:
            return self.state_response()
        if (method, path) == ("GET", "/state") and self.state_answer is not None:
            status, body = self.state_answer
            content = body if isinstance(body, bytes) else json.dumps(body).encode()
            return httpx.Response(status, content=content)
        edit = self.state_edit_at.get(request.url.host, self.state_edit)
        if (method, path) == ("GET", "/state") and edit is not None:
            response = await self._inner.handle_async_request(request)
            edited = edit(json.loads(await response.aread()))
            return httpx.Response(response.status_code, json=edited)
        if (method, path) != ("GET", "/state"):
            body = json.loads(request.content) if request.content else None
            self.calls.append((method, path, body))
        if method == "DELETE" and path.startswith("/instance/") and self.slow_deletes_s:
            await anyio.sleep(self.slow_deletes_s)
        if (method, path) == ("POST", "/v1/chat/completions") and self.chat_scripts:
            script = self.chat_scripts.pop(0)

            async def real() -> httpx.Response:
                response = await self._inner.handle_async_request(request)
                await response.aread()
                return response

            return await script(json.loads(request.content), real)
        answer = self.answers.get((method, path))
        if answer is not None:
            query = dict(request.url.params)
            self.queries.append((path, query))
            status, body = answer(query)
            return httpx.Response(status, json=body)
        if method != "GET" and self.election_until is not None:
            return await self._after_election(request)
        if (method, path) == ("POST", "/instance"):
            if self.refuse_instances is not None:
                return httpx.Response(
                    400, json=error_body(self.refuse_instances, 400, "Bad Request")
                )
            if self.hold_instances:
                self.held.append(request)
                return httpx.Response(200, json={"message": "Command received."})
        return await self._inner.handle_async_request(request)

    async def _after_election(self, request: httpx.Request) -> httpx.Response:
        assert self.group is not None
        answer: list[httpx.Response] = []
        done = anyio.Event()

        async def apply_when_elected() -> None:  # not cancelled when the caller gives up
            # The election's end may be moved while it runs: read it as it is now.
            while self.election_until is not None and anyio.current_time() < self.election_until:
                await anyio.sleep(0.05)
            answer.append(await self._inner.handle_async_request(request))
            done.set()

        self.group.start_soon(apply_when_elected)
        await done.wait()
        return answer[0]

    async def release(self, instance_id: str | None = None) -> None:
        """exo applies the instances it accepted and held back (only this one's, if given)."""
        held = [r for r in self.held if instance_id is None or _posted_id(r) == instance_id]
        self.held = [r for r in self.held if r not in held]
        for request in held:
            response = await self._inner.handle_async_request(request)
            assert response.status_code == 200, response.status_code

    def posted_instances(self) -> list[str]:
        """The ids of every instance POSTed, in order."""
        return [
            next(iter(body["instance"].values()))["instanceId"]
            for method, path, body in self.calls
            if (method, path) == ("POST", "/instance")
        ]

    def deleted_instances(self) -> list[str]:
        return [
            path.removeprefix("/instance/")
            for method, path, _ in self.calls
            if method == "DELETE" and path.startswith("/instance/")
        ]


ChatScript = Callable[
    [dict[str, Any], Callable[[], Awaitable[httpx.Response]]], Awaitable[httpx.Response]
]


def sse_events(body: bytes) -> list[str]:
    """The ``data:`` of each event in an SSE body, in order."""
    return [
        block.removeprefix("data: ")
        for block in body.decode().split("\n\n")
        if block.startswith("data: ")
    ]


def cut_after(events: int) -> ChatScript:
    """exo's stream cut after its first ``events`` data events (as when the instance is
    deleted under it): no finish_reason, no [DONE]."""

    async def script(_: dict[str, Any], real: Callable[[], Awaitable[httpx.Response]]) -> Any:
        answer = await real()
        kept = sse_events(answer.content)[:events]
        content = ": keep-alive\n\n" + "".join(f"data: {event}\n\n" for event in kept)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=content)

    return script


def exo_answers(status: int, content: bytes, content_type: str = "application/json") -> ChatScript:
    """exo answering ``status`` with ``content`` instead of the chat."""

    async def script(_: dict[str, Any], __: Callable[[], Awaitable[httpx.Response]]) -> Any:
        return httpx.Response(status, headers={"content-type": content_type}, content=content)

    return script


def no_instance(model_id: str = QWEN) -> ChatScript:
    """exo's answer to a chat for a model it has no instance of."""
    body = error_body(f"No instance found for model {model_id}", 404, "Not Found")
    return exo_answers(404, json.dumps(body).encode())


def _posted_id(request: httpx.Request) -> str:
    return next(iter(json.loads(request.content)["instance"].values()))["instanceId"]


@dataclass
class ExoWithBridge:
    master: Master
    nodes: InProcessCluster
    link: ExoLink
    bridge: Bridge
    group: TaskGroup
    bridge_scope: anyio.CancelScope
    node_urls: tuple[str, ...] = ()  # the nodes' own URLs the bridge was given after EXO_URL
    follow: str | None = None  # the node whose own URL the bridge was given first, if any

    def exo_instances(self, model_id: str = QWEN) -> list[str]:
        return sorted(
            instance_id
            for instance_id, instance in self.master.state.instances.items()
            if instance.shard_assignments.model_id == model_id
        )

    def status(self) -> str | None:
        views = self.bridge.deployments_view().deployments
        return views[0].status if views else None

    def serving(self) -> bool:
        return self.status() == "serving" and bool(self.exo_instances())

    async def serve_qwen(self) -> tuple[str | None, str]:
        """Deploy Qwen through the bridge and wait (past the startup grace) until it serves;
        (its deployment id, its one instance in exo)."""
        created = await self.bridge.create_deployment(QWEN)
        await wait_until(self.serving, STARTUP_GRACE + 10, "the deployment serving")
        (instance_id,) = self.exo_instances()
        return created.deployment_id, instance_id

    async def exo_api(self, method: str, path: str, body: Any = None) -> httpx.Response:
        """Call exo's API as an operator would, past the bridge."""
        transport = httpx.ASGITransport(app=create_exo_compat_app(self.master))
        async with httpx.AsyncClient(transport=transport, base_url=EXO_URL) as client:
            return await client.request(method, path, json=body)

    async def restart_bridge(self, data_dir: Path | None) -> Bridge:
        """Stop this bridge and start a new one on the same data dir and link."""
        self.bridge_scope.cancel()
        await anyio.sleep(0)
        self.bridge = new_bridge(self.link, data_dir, node_urls=self.node_urls, follow=self.follow)
        self.bridge_scope = await self.group.start(_run_cancellable, self.bridge)
        return self.bridge


@asynccontextmanager
async def bridge_api(bridge: Bridge) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``bridge``'s HTTP API, in process."""
    transport = httpx.ASGITransport(app=create_bridge_app(bridge))
    async with httpx.AsyncClient(transport=transport, base_url="http://bridge") as client:
        yield client


def new_bridge(
    link: ExoLink,
    data_dir: Path | None,
    config: BridgeConfig | None = None,
    node_urls: tuple[str, ...] = (),
    follow: str | None = None,
) -> Bridge:
    """A bridge following EXO_URL (then ``node_urls``, each a node's own API) over ``link``;
    or, given ``follow``, that node's own URL first, then the other nodes', then EXO_URL."""
    urls = (EXO_URL, *node_urls)
    if follow is not None:
        first = node_url(follow)
        urls = (first, *(url for url in node_urls if url != first), EXO_URL)
    apis = [ExoClient(url, transport=link) for url in urls]
    return Bridge(apis, data_dir, config=config or BridgeConfig())


def node_url(name: str) -> str:
    """The URL of node ``name``'s own exo API through the link (``ExoLink.node_hosts``)."""
    return f"http://{name}.node.test"


async def where_exo_places(
    bridge: Bridge, deployment: Deployment, state: State
) -> ExoPlacement | str:
    """Where the bridge's exo would place a new instance of ``deployment`` on ``state``, or why
    not, as a step's answers ask it (``keeper.bridge.placing``), with the cards a new bridge has."""
    cards = ExoCards(
        lambda: bridge.exo,
        lambda: 0.0,
        catalog=bridge.catalog,
        card_files=bridge.config.exo_card_files,
        models_max_age_s=bridge.config.models_max_age_s,
    )
    return await where_to_place(bridge.exo, cards, deployment, state)


async def _run_cancellable(bridge: Bridge, *, task_status: Any) -> None:
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            await group.start(bridge.run)
            task_status.started(scope)


@asynccontextmanager
async def exo_with_bridge(
    data_dir: Path | None = None,
    nodes: tuple[tuple[str, float], ...] = (("a", 32.0), ("b", 32.0)),
    bridge_config: BridgeConfig | None = None,
    node_apis: bool = False,
    faults: Mapping[str, SimFault] | None = None,
    follow: str | None = None,
) -> AsyncIterator[ExoWithBridge]:
    """The stand-in, its nodes and a bridge; each node misbehaving as ``faults`` says (by name);
    ``node_apis``: the bridge is also given each node's own URL (``node_url``), whose GET
    /node_id answers that node's id; ``follow``: and follows that node's own URL first."""
    node_apis = node_apis or follow is not None
    config = MasterConfig(keeper_enabled=False, exo_chats=True)
    master = Master(None, config=config)
    faulty = faults or {}
    configs = [NodeConfig(name, gb, fault=faulty.get(name)) for name, gb in nodes]
    cluster = InProcessCluster(master, configs)
    link = ExoLink(create_exo_compat_app(master))
    async with anyio.create_task_group() as group:
        link.group = group
        await group.start(master.run)
        await group.start(cluster.run)
        await wait_until(
            lambda: len(master.state.node_memory) == len(nodes), 10, "the nodes joined exo"
        )
        node_urls: tuple[str, ...] = ()
        if node_apis:
            await wait_until(
                lambda: len(master.state.node_identities) == len(nodes), 10, "the nodes named"
            )
            ids = {i.friendly_name: n for n, i in master.state.node_identities.items()}
            link.node_hosts = {httpx.URL(node_url(name)).host: ids[name] for name, _ in nodes}
            node_urls = tuple(node_url(name) for name, _ in nodes)
        bridge = new_bridge(link, data_dir, bridge_config, node_urls, follow)
        scope = await group.start(_run_cancellable, bridge)
        # Its first read of exo's State over (a State, or an outage): what a test does next
        # meets a bridge that has seen exo, not one still reading.
        await wait_until(
            lambda: bridge.health().exo.reachable or bridge.outage is not None,
            10,
            "the bridge's first read of exo",
        )
        yield ExoWithBridge(master, cluster, link, bridge, group, scope, node_urls, follow)
        group.cancel_scope.cancel()


RECORDINGS = Path(__file__).parent / "fixtures" / "exo_recordings"


def recorded(name: str) -> Any:
    """One of exo's recorded answers (``tests/fixtures/exo_recordings``)."""
    return json.loads((RECORDINGS / name).read_text())


def recorded_card() -> dict[str, Any]:
    """exo's full card of Qwen3-0.6B, as exo's placement answer carries it."""
    (ring,) = recorded("instance-placement-ok.json").values()
    (shard,) = next(iter(ring["shardAssignments"]["runnerToShard"].values())).values()
    return shard["modelCard"]


def exo_refusal(message: str, status: int = 400) -> tuple[int, Any]:
    return status, error_body(message, status, "Bad Request")
