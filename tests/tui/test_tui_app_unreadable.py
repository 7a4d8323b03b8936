"""The dashboard on the real client against a fake stock exo whose ``/state`` can turn unreadable.

Unlike the scripted client of ``test_tui_app``, these run ``MasterClient`` over httpx's
MockTransport on real time (the client polls once a second and backs off from 0.5 s), so what
is checked is the header an operator would read when the answer is an HTML page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx
import pytest
from recorded_exo import recorded, recorded_content_type
from test_tui_app import Clock, until

from exo_deploy_tui.app import DashboardApp
from exo_deploy_tui.feed.client import RECONNECT_FIRST_S, MasterClient
from exo_deploy_tui.testing import FROZEN_NOW
from exo_deploy_tui.widgets.panels import HeaderBar, NodesTable

HTML_PAGE = b"<!doctype html><html><body>Welcome to nginx!</body></html>"
# What recording state-instance-ready holds: three nodes, one of them running an instance.
RECORDED_NODES = 3


@dataclass
class FakeExo:
    """A stock exo whose ``/state`` is whatever ``state`` holds now: exo's recorded State, or an
    HTML page, as a wrong port or a proxy in front of exo would answer."""

    state: bytes = field(default_factory=lambda: recorded("state-instance-ready"))
    state_polls: int = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/events":
            return httpx.Response(
                200, headers={"content-type": recorded_content_type("events")}, content=b"[]"
            )
        if request.url.path == "/state":
            self.state_polls += 1
            html = self.state.startswith(b"<")
            content_type = "text/html; charset=utf-8" if html else "application/json"
            return httpx.Response(200, headers={"content-type": content_type}, content=self.state)
        return httpx.Response(404, json={"detail": "Not Found"})


def dashboard_on(exo: FakeExo, clock: Clock) -> DashboardApp:
    client = MasterClient("http://exo:52415", transport=httpx.MockTransport(exo))
    return DashboardApp(client, clock=clock, tick=False)


def header_of(app: DashboardApp) -> str:
    return str(app.dashboard.query_one(HeaderBar).render())


def nodes_shown(app: DashboardApp) -> int:
    return len(app.dashboard.query_one(NodesTable).keys)


@pytest.mark.anyio
async def test_an_exo_answering_html_is_unreadable_on_every_poll_never_polling() -> None:
    exo = FakeExo(state=HTML_PAGE)
    app = dashboard_on(exo, Clock())
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "unreadable: not JSON (text/html)" in header_of(app))
        # The same page again, on the retry after the first: still unreadable, not skipped as
        # an unchanged answer (its retry, twice the first, tells it from the first one).
        second = 2 * RECONNECT_FIRST_S
        await until(pilot, lambda: app.model.connection.retry_in_s == second)
        header = header_of(app)
        assert exo.state_polls >= 2
        assert "unreadable: not JSON (text/html)" in header, header
        assert "polling" not in header, header


@pytest.mark.anyio
async def test_an_html_answer_after_a_good_state_keeps_the_nodes_marked_stale() -> None:
    exo = FakeExo()
    clock = Clock()
    app = dashboard_on(exo, clock)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: "polling" in header_of(app))
        await pilot.press("2")  # the nodes tab
        await until(pilot, lambda: nodes_shown(app) == RECORDED_NODES)
        clock.now = FROZEN_NOW + 7
        exo.state = HTML_PAGE
        await until(pilot, lambda: "unreadable: not JSON (text/html)" in header_of(app))
        header = header_of(app)
        assert "stale since 12:00:07" in header, header
        assert "polling" not in header, header
        # What was read last stays on screen, not an empty cluster.
        assert nodes_shown(app) == RECORDED_NODES
        assert len(app.model.state.instances) == 1
        # exo answers its State again: polling, fresh, with the same nodes.
        clock.now = FROZEN_NOW + 9
        exo.state = recorded("state-instance-ready")
        await until(pilot, lambda: "◐ polling 1s" in header_of(app))
        header = header_of(app)
        assert "stale" not in header and "unreadable" not in header, header
        assert nodes_shown(app) == RECORDED_NODES
