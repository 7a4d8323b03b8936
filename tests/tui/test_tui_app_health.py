"""The header names the bridge behind the dashboard and its role, read by the real client from
``GET /healthz`` over httpx's MockTransport: what a bridge sharing a store answers, what today's
bridges and the master answer (nothing of a role: nothing new shown), and answers that cannot be
read (never a crash, nothing shown)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import httpx
import pytest
from recorded_exo import recorded
from test_tui_app import Clock, until

from exo_deploy_tui import app as app_module
from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import MasterClient
from exo_deploy_tui.widgets.panels import HeaderBar
from keeper.model.api_models import ServiceHealthView

# Today's bridge's /healthz: no role, no leader (the fields are absent, or null).
TODAYS_BRIDGE = {
    "status": "ok",
    "exo": {"url": "http://exo:52415", "reachable": True},
    "deployments": 0,
}


@dataclass
class FakeBridge:
    """A bridge over a stock exo's recorded State, no event stream, ``/healthz`` as scripted."""

    health: bytes = b"{}"
    status: int = 200
    content_type: str = "application/json"
    health_reads: list[int] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/healthz":
            self.health_reads.append(1)
            return httpx.Response(
                self.status, headers={"content-type": self.content_type}, content=self.health
            )
        if path == "/state":
            return httpx.Response(200, json=json.loads(recorded("state-instance-ready")))
        if path == "/deployments":
            return httpx.Response(200, json={"deployments": []})
        return httpx.Response(404, json={"detail": "Not Found"})


def client_of(bridge: FakeBridge) -> MasterClient:
    return MasterClient("http://bridge:52416", transport=httpx.MockTransport(bridge))


def body(**fields: object) -> bytes:
    return json.dumps({**TODAYS_BRIDGE, **fields}).encode()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "status", "read"),
    [
        (body(name="b1", role="acting", leader="b1"), 200, ("b1", "acting", "b1")),
        (body(name="b2", role="standby", leader="b1", term=7), 200, ("b2", "standby", "b1")),
        # Degraded: a 503 with the same body, still read.
        (body(name="b2", role="standby", leader="b1"), 503, ("b2", "standby", "b1")),
        (body(role="standby"), 200, (None, "standby", None)),
    ],
)
async def test_the_client_reads_a_bridges_name_and_role(
    answer: bytes, status: int, read: tuple[str | None, str | None, str | None]
) -> None:
    client = client_of(FakeBridge(health=answer, status=status))
    health = await client.service_health()
    await client.aclose()
    assert health is not None
    assert (health.name, health.role, health.leader) == read


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("answer", "status", "content_type"),
    [
        (body(), 200, "application/json"),  # today's bridges and the master: no role
        (body(role=None, leader=None, name=None), 200, "application/json"),
        (body(role="leader", name="b1"), 200, "application/json"),  # not a role we know
        (body(role="acting", leader=3), 200, "application/json"),  # a bad type
        (body(role=["acting"]), 200, "application/json"),
        (b"[1, 2]", 200, "application/json"),  # not an object
        (b"<html>nginx</html>", 200, "text/html"),  # not JSON
        (b'{"detail": "Not Found"}', 404, "application/json"),  # no such route
        (b"{" * 100_000, 200, "application/json"),  # past the cap
    ],
)
async def test_an_answer_without_a_readable_role_is_none(
    answer: bytes, status: int, content_type: str
) -> None:
    client = client_of(FakeBridge(health=answer, status=status, content_type=content_type))
    assert await client.service_health() is None
    await client.aclose()


@pytest.mark.anyio
async def test_no_answer_at_all_is_none() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    client = MasterClient("http://bridge:52416", transport=httpx.MockTransport(refuse))
    assert await client.service_health() is None
    await client.aclose()


def header_of(app: DashboardApp) -> str:
    return str(app.dashboard.query_one(HeaderBar).render())


@pytest.mark.anyio
async def test_the_header_follows_a_standby_that_takes_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """b2 answers as standby, then (b1 gone) as acting, then as a bridge with no store: the
    header says each in turn, within a read of /healthz."""
    monkeypatch.setattr(app_module, "HEALTH_POLL_S", 0.05)
    bridge = FakeBridge(health=body(name="b2", role="standby", leader="b1"))
    app = DashboardApp(client_of(bridge), clock=Clock(), tick=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: "bridge b2 · standby (acting: b1)" in header_of(app))
        assert app.view.service == ServiceHealthView(name="b2", role="standby", leader="b1")
        bridge.health = body(name="b2", role="acting", leader="b2")
        await until(pilot, lambda: "bridge b2 · acting" in header_of(app))
        assert "standby" not in header_of(app)
        bridge.health = body()
        await until(pilot, lambda: "bridge" not in header_of(app))
        assert app.view.service is None
        reads = len(bridge.health_reads)
        await until(pilot, lambda: len(bridge.health_reads) > reads)  # still asking
