"""The stand-in's ``GET /events`` answers as a stock exo's does (``events.json``,
``events-headers.txt`` in ``tests/fixtures/exo_recordings``): 200, ``application/json``, one
array of the whole log from its beginning, each event ``{"EventTag": {snake_case fields}}``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from recorded_exo import recorded, recorded_content_type

from keeper.model.events import NodeGatheredInfo, NodeTimedOut
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.master.service import Master, MasterConfig

SNAKE = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$")
TAG = re.compile(r"^[A-Z][A-Za-z0-9]*$")


@pytest.fixture(scope="module", params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Both of anyio's backends on their real clocks (anyio's own default), not the MockClock
    of tests/virtual."""
    return request.param


def exo_shaped(event: Any) -> bool:
    """One tag naming the event's class, over an object whose keys are all snake_case, as far
    down as objects go (tags of nested unions, like ``NodeBackends``, are class names too)."""

    def keys_ok(value: Any) -> bool:
        if isinstance(value, dict):
            items: dict[str, Any] = value  # pyright: ignore[reportUnknownVariableType]
            if len(items) == 1 and all(TAG.match(k) for k in items):
                return all(keys_ok(v) for v in items.values())
            return all(SNAKE.match(k) and keys_ok(v) for k, v in items.items())
        if isinstance(value, list):
            return all(keys_ok(v) for v in value)  # pyright: ignore[reportUnknownVariableType]
        return True

    if not isinstance(event, dict) or len(event) != 1:  # pyright: ignore[reportUnknownArgumentType]
        return False
    ((tag, body),) = event.items()  # pyright: ignore[reportUnknownVariableType]
    return bool(TAG.match(tag)) and isinstance(body, dict) and keys_ok(body)


def test_the_recorded_exo_log_has_the_shape_checked_below() -> None:
    events = json.loads(recorded("events"))
    assert events and all(exo_shaped(e) for e in events)
    assert recorded_content_type("events") == "application/json"


async def events_of(master: Master) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_exo_compat_app(master))
    async with httpx.AsyncClient(transport=transport, base_url="http://exo") as http:
        return await http.get("/events", headers={"Accept": "text/event-stream"})


async def run_and_emit(data_dir: Path, events: list[Any]) -> httpx.Response:
    """A stand-in on ``data_dir`` that logs ``events``, asked for /events once they are in."""
    master = Master(data_dir, config=MasterConfig(keeper_enabled=False))
    answers: list[httpx.Response] = []
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        before = master.state.last_event_applied_idx
        await master.emit(events)
        with anyio.fail_after(10):
            while master.state.last_event_applied_idx < before + len(events):
                await anyio.sleep(0.01)
        answers.append(await events_of(master))
        group.cancel_scope.cancel()
    (answer,) = answers
    return answer


def joined(name: str) -> NodeGatheredInfo:
    return NodeGatheredInfo(node_id=name, when="2026-11-30T09:10:42Z")


@pytest.mark.anyio
async def test_events_is_the_whole_log_from_the_beginning_as_exo_writes_it(
    tmp_path: Path,
) -> None:
    await run_and_emit(tmp_path, [joined("node-a")])
    # A second run on the same log: /events still starts from the first run's first event.
    response = await run_and_emit(tmp_path, [joined("node-b"), NodeTimedOut(node_id="node-a")])
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    events = response.json()
    assert [next(iter(e)) for e in events] == [
        "NodeGatheredInfo",
        "NodeGatheredInfo",
        "NodeTimedOut",
    ]
    assert all(exo_shaped(e) for e in events)
    assert events[0]["NodeGatheredInfo"]["node_id"] == "node-a"
    assert events[2] == {"NodeTimedOut": {"node_id": "node-a"}}


@pytest.mark.anyio
async def test_a_master_without_a_data_directory_has_an_empty_log() -> None:
    master = Master(None, config=MasterConfig(keeper_enabled=False))
    response = await events_of(master)
    assert (response.status_code, response.headers["content-type"]) == (200, "application/json")
    assert response.json() == []
