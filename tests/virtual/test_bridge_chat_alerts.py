"""The bridge's chats through its front door, told to the operator (docs/design.md §6.9, §3.5):
a run of failed chats is one ``requests_failing`` notice naming the deployment, how many of its
chats failed over what time and its status, and the chats answered again one
``requests_recovered`` three minutes on; and the history says how many chats each incident
held. In virtual time on the stock-exo stand-in (``tests/bridge_harness.py``): exo's 404 for
want of an instance is scripted on the link, so a chat fails after the 1 s hold; the webhook is
an httpx transport that records what it is sent."""

from __future__ import annotations

import anyio
import httpx
import pytest
from bridge_harness import bridge_api, exo_with_bridge, no_instance, wait_until
from model_ids import QWEN
from test_bridge_webhooks import HOOK, Hook

from keeper.bridge.service import BridgeConfig
from keeper.core.request_alerts import MIN_FAILED, RECOVERY_WINDOW_S
from keeper.runtime.front_door import FrontDoorConfig
from keeper.runtime.webhooks import WebhookConfig

CHAT = "/v1/chat/completions"
NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))


def chat() -> dict[str, object]:
    return {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def chats(api: httpx.AsyncClient, n: int) -> list[int]:
    """``n`` chats at once; their statuses."""
    statuses: list[int] = []

    async def one() -> None:
        statuses.append((await api.post(CHAT, json=chat())).status_code)

    async with anyio.create_task_group() as group:
        for _ in range(n):
            group.start_soon(one)
    return statuses


@pytest.mark.anyio
async def test_failing_chats_are_announced_once_and_their_recovery_once() -> None:
    hook = Hook()
    config = BridgeConfig(
        webhooks=WebhookConfig(urls=(HOOK,), transport=hook),
        front_door=FrontDoorConfig(hold_s=1.0),
    )
    async with exo_with_bridge(nodes=NODES, bridge_config=config) as h:
        deployment_id, _ = await h.serve_qwen()
        async with bridge_api(h.bridge) as api:
            # exo loses track of the model for these chats: each is refused after its hold.
            h.link.chat_scripts.extend(no_instance() for _ in range(200))
            assert await chats(api, MIN_FAILED - 1) == [503] * (MIN_FAILED - 1)
            await anyio.sleep(2.0)  # steps go by: one flaky chat or two are no run
            assert hook.kinds() == []
            assert await chats(api, 1) == [503]
            await wait_until(lambda: "requests_failing" in hook.kinds(), 5, "the failing notice")
            (failing,) = hook.bodies
            assert failing["deployment_id"] == deployment_id and failing["model_id"] == QWEN
            assert (failing["failed"], failing["chats"], failing["window_s"]) == (3, 3, 60.0)
            assert failing["status"] == "serving"  # exo's State still shows its instance
            words = f"{QWEN} (deployment {deployment_id}) are failing: 3 of 3 failed"
            assert words in failing["text"]
            assert hook.keys == [failing["id"]]
            # More failures in the same run say nothing more.
            assert await chats(api, 4) == [503] * 4
            h.link.chat_scripts.clear()
            assert await chats(api, 1) == [200]
            await anyio.sleep(RECOVERY_WINDOW_S - 10)
            assert hook.kinds() == ["requests_failing"]  # the failures have not thinned yet
            await wait_until(
                lambda: "requests_recovered" in hook.kinds(), 30, "the recovered notice"
            )
            assert hook.kinds() == ["requests_failing", "requests_recovered"]
            recovered = hook.bodies[1]
            assert recovered["since"] == failing["since"]
            assert recovered["id"] == f"requests_recovered:{deployment_id}:{failing['since']}"
            assert recovered["answered"] == 1 and recovered["last_failed"] is not None
            assert "answered again: 1 answered since the last failed one" in recovered["text"]


@pytest.mark.anyio
async def test_the_history_says_how_many_chats_each_incident_held() -> None:
    async with exo_with_bridge(nodes=NODES) as h:
        deployment_id, first = await h.serve_qwen()
        async with bridge_api(h.bridge) as api:
            assert await chats(api, 2) == [200, 200]  # before the incident: not its
            deleted = await h.exo_api("DELETE", f"/instance/{first}")  # exo loses the instance
            assert deleted.status_code == 200
            await wait_until(lambda: not h.exo_instances(), 5, "the instance gone from exo")
            assert await chats(api, 3) == [200, 200, 200]  # held until it is placed again
            answer = await api.get(f"/deployments/{deployment_id}/history")
            assert answer.status_code == 200
            (incident,) = answer.json()["incidents"]
            assert incident["end"] is not None
            chats_of = incident["chats"]
            assert chats_of["held"] + chats_of["retried"] == 3
            assert (chats_of["migrated"], chats_of["failed"]) == (0, 0)
