"""Alert webhooks on the bridge: its notices come from exo's State with the bridge's own
deployments merged in (the State its keeper steps on), delivered by the bridge's own task. A
node of exo crashes under the bridge's deployment: an incident opens, named by the node, and is
resolved once exo runs the replacement the bridge placed; a drain through the bridge finishes.
Against the exo stand-in with simulated nodes (``tests/bridge_harness.py``), in virtual time;
the webhook is an httpx transport that records what it is sent."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from bridge_harness import ExoWithBridge, bridge_api, exo_with_bridge, wait_until
from model_ids import QWEN

from keeper.bridge.service import BridgeConfig
from keeper.model.state import node_name
from keeper.runtime.webhooks import WebhookConfig

THREE_NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))
HOOK = "http://hooks.test/alerts"


class Hook(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.keys: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.bodies.append(json.loads(await request.aread()))
        self.keys.append(request.headers.get("Idempotency-Key"))
        return httpx.Response(204)

    def kinds(self) -> list[str]:
        return [body["kind"] for body in self.bodies]


def config(hook: Hook) -> BridgeConfig:
    return BridgeConfig(webhooks=WebhookConfig(urls=(HOOK,), transport=hook))


def serving_node(h: ExoWithBridge) -> str:
    (instance_id,) = h.exo_instances()
    state = h.master.state
    (node,) = state.instances[instance_id].shard_assignments.node_to_runner
    return node_name(state, node)


@pytest.mark.anyio
async def test_a_node_lost_under_the_bridge_opens_and_resolves_an_incident() -> None:
    hook = Hook()
    async with exo_with_bridge(nodes=THREE_NODES, bridge_config=config(hook)) as h:
        await h.serve_qwen()
        assert hook.bodies == []  # a start-up is no incident
        lost = serving_node(h)
        h.nodes.crash(lost, down_s=600)
        await wait_until(lambda: "incident_resolved" in hook.kinds(), 120, "the incident's end")
        assert hook.kinds() == ["incident_opened", "incident_resolved"]
        opened, resolved = hook.bodies
        assert opened["model_id"] == QWEN
        assert opened["cause"] == f"node {lost} timed out"
        assert opened["text"].startswith(f"exo-deploy: {QWEN} not serving since ")
        assert resolved["start"] == opened["start"] and resolved["downtime_s"] > 0
        assert hook.keys == [body["id"] for body in hook.bodies]
        health = h.bridge.health().webhooks.endpoints[0]
        assert (health.delivered_total, health.pending, health.url) == (2, 0, "http://hooks.test/…")


@pytest.mark.anyio
async def test_a_drain_through_the_bridge_is_announced_finished() -> None:
    hook = Hook()
    async with exo_with_bridge(nodes=THREE_NODES, bridge_config=config(hook)) as h:
        await h.serve_qwen()
        node = serving_node(h)
        async with bridge_api(h.bridge) as api:
            assert (await api.post(f"/nodes/{node}/drain", json={})).status_code == 200
        await wait_until(lambda: "drain_finished" in hook.kinds(), 60, "the drain's notice")
        (finished,) = [body for body in hook.bodies if body["kind"] == "drain_finished"]
        assert finished["node"] == node
        assert "incident_opened" not in hook.kinds()  # make-before-break: it never stopped
        async with bridge_api(h.bridge) as api:
            health = (await api.get("/healthz")).json()
        assert health["webhooks"]["endpoints"][0]["delivered_total"] >= 1
