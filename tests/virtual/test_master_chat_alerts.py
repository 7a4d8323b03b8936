"""Our master's chats through its front door, told to the operator as the bridge's are
(docs/design.md §6.9, §3.5): with no node to place on, chats are refused after the hold, a run
of them is one ``requests_failing`` naming the deployment and its status, and the history's
incident (placement explained why it cannot start) counts them failed. In virtual time; the
webhook is an httpx transport that records what it is sent."""

from __future__ import annotations

import pytest
from chat_outcomes import chat_body
from model_ids import QWEN
from test_bridge_webhooks import HOOK, Hook
from test_master import wait_until
from test_master_front_door import master_with_a_node

from keeper.core.request_alerts import MIN_FAILED
from keeper.runtime.front_door import FrontDoorConfig
from keeper.runtime.webhooks import WebhookConfig
from keeper.sim.master.service import MasterConfig

CHAT = "/v1/chat/completions"


@pytest.mark.anyio
async def test_failing_chats_on_the_master_are_announced_and_counted_in_the_incident() -> None:
    hook = Hook()
    config = MasterConfig(
        startup_grace_s=0.0,
        front_door=FrontDoorConfig(hold_s=1.0),
        webhooks=WebhookConfig(urls=(HOOK,), transport=hook),
    )
    async with master_with_a_node(config, nodes=0) as (master, client):
        created = await master.create_deployment(QWEN)  # no node: nothing will serve it
        deployment_id = created.deployment_id
        await wait_until(lambda: "cant_place" in hook.kinds(), 30, "placement saying why not")
        for _ in range(MIN_FAILED):
            assert (await client.post(CHAT, json=chat_body(4))).status_code == 503
        await wait_until(lambda: "requests_failing" in hook.kinds(), 5, "the failing notice")
        (failing,) = [body for body in hook.bodies if body["kind"] == "requests_failing"]
        assert failing["deployment_id"] == deployment_id
        assert (failing["failed"], failing["chats"]) == (MIN_FAILED, MIN_FAILED)
        assert failing["status"].startswith("cant_place: ")
        history = (await client.get(f"/deployments/{deployment_id}/history")).json()
        (incident,) = history["incidents"]
        assert incident["end"] is None and incident["cause"].startswith("unplaceable: ")
        assert incident["chats"] == {"held": 0, "retried": 0, "migrated": 0, "failed": MIN_FAILED}
