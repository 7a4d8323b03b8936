"""A bridge whose steps fail says so: in ``/healthz`` and in every deployment, until one succeeds.

A keeper whose step raises while the test says so stands for any bug in a step (the bridge must
not die of it, nor look healthy). It runs against the ``--exo-compat`` stand-in
(``tests/bridge_harness.py``) in virtual time; what the bridge says is read through its API.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, ExoWithBridge, bridge_api, exo_with_bridge
from model_ids import LLAMA, QWEN

from keeper.bridge.exo_client import ExoClient
from keeper.bridge.service import Bridge, BridgeConfig
from keeper.model.constants import STARTUP_GRACE
from keeper.model.events import AnyEvent
from keeper.model.state import State
from keeper.runtime.hosted_keeper import KeeperLike, KeeperWrapper, PlaceFn, default_keeper


class FailingKeeper(KeeperWrapper):
    """The keeper, whose step raises ``failure`` while it is set (a bug in a step)."""

    def __init__(self, inner: KeeperLike) -> None:
        super().__init__(inner)
        self.failure: Exception | None = None

    def step(self, state: State, now: float) -> list[AnyEvent]:
        if self.failure is not None:
            raise self.failure
        return self.inner.step(state, now)


@asynccontextmanager
async def bridge_with_failing_keeper() -> AsyncIterator[tuple[ExoWithBridge, FailingKeeper]]:
    made: list[FailingKeeper] = []

    def factory(started_at: float, place: PlaceFn, *, startup_grace: float) -> KeeperLike:
        made.append(FailingKeeper(default_keeper(started_at, place, startup_grace=startup_grace)))
        return made[-1]

    async with exo_with_bridge() as h:
        h.bridge_scope.cancel()
        h.bridge = Bridge(
            ExoClient(EXO_URL, transport=h.link),
            None,
            config=BridgeConfig(),
            keeper_factory=factory,
        )
        await h.group.start(h.bridge.run)
        (keeper,) = made
        yield h, keeper


async def wait_for_health(
    api: httpx.AsyncClient, holds: Callable[[dict[str, Any]], bool], within_s: float, what: str
) -> dict[str, Any]:
    """``GET /healthz`` once ``holds`` says its body is as expected (its body then)."""
    with anyio.fail_after(within_s):
        while not holds(health := (await api.get("/healthz")).json()):
            await anyio.sleep(0.05)
    return health


def step_failures(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if "step of the bridge failed" in record.message]


@pytest.mark.anyio
async def test_a_failing_step_is_in_healthz_and_every_deployment_until_a_step_succeeds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="keeper.bridge.service")
    async with bridge_with_failing_keeper() as (h, keeper), bridge_api(h.bridge) as api:
        await h.serve_qwen()
        await h.bridge.create_deployment(LLAMA)
        keeper.failure = RecursionError("maximum recursion depth exceeded")
        await wait_for_health(api, lambda b: not b.get("step", {}).get("ok"), 3, "the failure")
        await anyio.sleep(10)  # ten more failing steps

        assert h.bridge.running
        response = await api.get("/healthz")
        assert response.status_code == 503
        health: dict[str, Any] = response.json()
        assert health["status"] == "degraded"
        assert health["exo"]["reachable"] is True and health["exo"]["state_readable"] is True
        step = health["step"]
        assert step["ok"] is False
        assert step["error"] == "RecursionError: maximum recursion depth exceeded"
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", step["failing_since"])
        views = (await api.get("/deployments")).json()["deployments"]
        assert len(views) == 2
        for view in views:
            assert re.fullmatch(
                r"step failing since \d\d:\d\d:\d\d: "
                r"RecursionError: maximum recursion depth exceeded",
                view["detail"],
            ), view["detail"]
        # Logged with its traceback once, not once a step; another error is logged again.
        (logged,) = step_failures(caplog)
        assert logged.exc_info is not None
        keeper.failure = KeyError("deployment")
        health = await wait_for_health(
            api, lambda b: b["step"]["error"] == "KeyError: 'deployment'", 3, "the new error"
        )
        assert health["step"]["failing_since"] == step["failing_since"]  # failing all along
        await anyio.sleep(5)
        assert len(step_failures(caplog)) == 2

        keeper.failure = None  # the next good step clears it
        await wait_for_health(api, lambda b: b["step"]["ok"], 3, "a good step")
        response = await api.get("/healthz")
        assert response.status_code == 200
        assert response.json()["status"] == "ok"
        assert response.json()["step"] == {"ok": True, "failing_since": None, "error": None}
        for view in (await api.get("/deployments")).json()["deployments"]:
            assert not (view["detail"] or "").startswith("step failing"), view["detail"]


@pytest.mark.anyio
async def test_a_step_failing_from_the_start_is_reported_before_anything_is_placed() -> None:
    async with bridge_with_failing_keeper() as (h, keeper):
        keeper.failure = RuntimeError("boom")
        await h.bridge.create_deployment(QWEN)
        await anyio.sleep(STARTUP_GRACE + 5)
        assert h.bridge.running
        assert h.exo_instances() == []
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is not None
        assert re.fullmatch(r"step failing since \d\d:\d\d:\d\d: RuntimeError: boom", view.detail)
