"""Every chat counted, the ones the front door refuses too (docs/design.md §8.6): a body that is
not a chat (400), one over 1 MiB (413: by its Content-Length, answered by the app's guard before
the route runs, or sent chunked past the bound), one that is not JSON (415), and one past
``--max-inflight`` (429) are each counted ``rejected``, under the model's deployment when the
body names a model that has one, else under ''; never ``failed``, which is about the cluster."""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator

import anyio
import pytest
from bridge_harness import no_instance, wait_until
from front_door_harness import ASK, CHAT, chat, counted, deployment_of, serving
from model_ids import QWEN

from keeper.bridge.service import BridgeConfig
from keeper.runtime.front_door import FrontDoorConfig

JSON = {"content-type": "application/json"}
OVER = 1024 * 1024 + 1  # one byte past the guard's bound


async def chunked_body() -> AsyncIterator[bytes]:
    yield b'{"model": "' + QWEN.encode() + b'", "messages": [], "pad": "'
    for _ in range(20):
        yield b"x" * 65536
    yield b'"}'


@pytest.mark.anyio
async def test_refused_chats_are_counted_rejected_under_their_model_s_deployment() -> None:
    async with serving() as (h, api):
        deployment = deployment_of(h)
        # Readable enough to name a model with a deployment: counted under it.
        no_messages = await api.post(CHAT, json={"model": QWEN})
        assert no_messages.status_code == 400
        empty = await api.post(CHAT, json={"model": QWEN, "messages": []})
        assert empty.status_code == 400
        assert counted(h, "rejected") == 2
        # No model to read, or one with no deployment: under ''.
        broken = await api.post(CHAT, content=b'{"model": ', headers=JSON)
        assert broken.status_code == 400
        no_model = await api.post(CHAT, json={"messages": ASK})
        assert no_model.status_code == 400
        not_ours = await api.post(CHAT, json={"model": "acme/none"})
        assert not_ours.status_code == 400
        assert counted(h, "rejected", "") == 3
        # The guard's refusals: the body unread, so under ''.
        big = await api.post(CHAT, content=b"{" + b" " * OVER + b"}", headers=JSON)
        assert big.status_code == 413
        streamed_big = await api.post(CHAT, content=chunked_body(), headers=JSON)
        assert "content-length" not in streamed_big.request.headers
        assert streamed_big.status_code == 413
        text = await api.post(CHAT, content=b"{}", headers={"content-type": "text/plain"})
        assert text.status_code == 415
        assert counted(h, "rejected", "") == 6
        assert counted(h, "rejected") == 2
        # None of them is a failure of the cluster's, and none reached exo.
        assert counted(h, "failed") == counted(h, "failed", "") == 0
        assert not [call for call in h.link.calls if call[1] == CHAT]
        (view,) = h.bridge.deployments_view().deployments
        assert view.requests is not None and view.requests.outcomes == {"rejected": 2}
        assert view.requests.errors == 0
        metrics = (await api.get("/metrics")).text
        assert f'exo_deploy_requests_total{{deployment="{deployment}",outcome="rejected"}} 2.0' in (
            metrics
        )
        assert 'exo_deploy_requests_total{deployment="",outcome="rejected"} 6.0' in metrics


@pytest.mark.anyio
async def test_a_chat_past_max_inflight_is_counted_rejected() -> None:
    config = BridgeConfig(front_door=FrontDoorConfig(max_inflight=1, hold_s=10.0))
    async with serving(config) as (h, api):
        h.link.chat_scripts.extend(no_instance() for _ in range(1000))
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(api.post, CHAT, json=chat(stream=True)))
            await wait_until(lambda: h.bridge.front_door.inflight == 1, 5, "one chat held")
            refused = await api.post(CHAT, json=chat(stream=False))
            assert refused.status_code == 429
            assert counted(h, "rejected") == 1
        # The held one ran out its hold: a failure, apart from the refusal.
        assert counted(h, "failed") == 1 and counted(h, "rejected") == 1
