"""``GET /metrics`` on the bridge, in front of the ``--exo-compat`` stand-in in virtual time: the
same deployment families as the master's, agreeing with the bridge's ``GET /deployments``, and
whether exo answers and gives a State to act on, flipping as the stand-in stops answering or
answers a State the bridge cannot read, with the seconds since each last held."""

from __future__ import annotations

import anyio
import pytest
from bridge_harness import bridge_api, exo_with_bridge
from metrics_scrape import scrape, value
from model_ids import QWEN
from waiting import wait_until

from keeper.runtime.metrics import METRICS_MAX_AGE_S


@pytest.mark.anyio
async def test_exo_reachable_and_readable_flip_with_the_stand_in() -> None:
    async with exo_with_bridge() as h, bridge_api(h.bridge) as client:
        deployment_id, _ = await h.serve_qwen()
        assert deployment_id is not None
        labels = {"deployment": deployment_id, "model": QWEN}
        samples = await scrape(client)
        (view,) = h.bridge.deployments_view().deployments
        assert (
            value(samples, "exo_deploy_deployment_replicas_ready", **labels)
            == view.ready_replicas
            == 1
        )
        assert value(samples, "exo_deploy_deployment_status", **labels, status="serving") == 1
        assert value(samples, "exo_deploy_keeper_placements_total", result="placed") == 1
        assert value(samples, "exo_deploy_keeper_step_duration_seconds_count") > 0
        assert value(samples, "exo_deploy_nodes", state="alive") == 2
        assert value(samples, "exo_deploy_exo_reachable") == 1
        assert value(samples, "exo_deploy_exo_state_readable") == 1
        assert value(samples, "exo_deploy_exo_unreachable_seconds") == 0
        assert value(samples, "exo_deploy_exo_state_unreadable_seconds") == 0
        # Chats are the master's: the bridge does not route them.
        assert not any(name.startswith("exo_deploy_chats") for name, _ in samples)

        # exo answers, with a State the bridge cannot act on: reachable, not readable.
        h.link.state_answer = (200, {"runners": {}})
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        await anyio.sleep(10)
        samples = await scrape(client)
        assert value(samples, "exo_deploy_exo_reachable") == 1
        assert value(samples, "exo_deploy_exo_state_readable") == 0
        assert value(samples, "exo_deploy_exo_unreachable_seconds") == 0
        assert 10 <= value(samples, "exo_deploy_exo_state_unreadable_seconds") <= 12

        # exo stops answering: neither.
        h.link.state_answer = None
        h.link.down = True
        await anyio.sleep(5)
        samples = await scrape(client)
        assert value(samples, "exo_deploy_exo_reachable") == 0
        assert value(samples, "exo_deploy_exo_state_readable") == 0
        assert 4 <= value(samples, "exo_deploy_exo_unreachable_seconds") <= 6
        assert 15 <= value(samples, "exo_deploy_exo_state_unreadable_seconds") <= 17

        # Back: both hold again, within a body's age (a second) of exo answering.
        h.link.down = False
        await wait_until(lambda: h.bridge.outage is None, 3, "exo followed again")
        with anyio.fail_after(METRICS_MAX_AGE_S + 1):
            while value(samples := await scrape(client), "exo_deploy_exo_state_readable") != 1:
                await anyio.sleep(0.1)
        assert value(samples, "exo_deploy_exo_reachable") == 1
        assert value(samples, "exo_deploy_exo_state_unreadable_seconds") == 0


@pytest.mark.anyio
async def test_a_bridge_that_never_reached_exo_counts_from_its_start() -> None:
    async with exo_with_bridge() as h:
        h.link.down = True
        await h.restart_bridge(None)  # a new bridge that has never had an answer
        await anyio.sleep(5)
        async with bridge_api(h.bridge) as client:
            samples = await scrape(client)
        assert value(samples, "exo_deploy_exo_reachable") == 0
        assert 4.5 <= value(samples, "exo_deploy_exo_unreachable_seconds") <= 5.5
        assert 4.5 <= value(samples, "exo_deploy_exo_state_unreadable_seconds") <= 5.5
