"""Chats through the bridge's front door while the node serving them is killed, against chats
sent straight to the stock-exo stand-in beside them (docs/design.md §8.6), in virtual time.

Four clients stream chats one after another through the front door, and four straight to the
stand-in (which routes and ends chats as a stock exo does, §7.5), while the node holding the
model's one instance is killed and the bridge (fast failover) places it again. Every chat is
counted by ``tests/front_door_clients.py``: answered whole, failed, cut or hung (the same count
as the fault tests on real processes, ``tests/processes/test_front_door_faults.py``). Both
counts are printed; through the front door none may fail, be cut or hang."""

from __future__ import annotations

import anyio
import httpx
import pytest
from bridge_harness import bridge_api, exo_with_bridge, wait_until
from front_door_clients import CLIENTS, Tally, start_clients

from keeper.bridge.service import BridgeConfig
from keeper.model.liveness import LivenessConfig
from keeper.model.request_rule import OUTCOMES
from keeper.sim.exo_standin.app import create_exo_compat_app

# Tokens per chat: 8 (0.4 s of a simulated node's answer: the kill lands before most chats'
# first token) and 40 (2 s: it lands mid-answer, so the door continues the text).
SHORT, LONG = 8, 40
# Chats answered through the front door after the model serves again, before the clients stop:
# two per client shows the door serving on the new instance.
AFTER = 2 * CLIENTS


@pytest.mark.anyio
@pytest.mark.parametrize("max_tokens", [SHORT, LONG])
async def test_no_chat_through_the_front_door_fails_is_cut_or_hangs_in_a_kill(
    max_tokens: int,
) -> None:
    fast = BridgeConfig(liveness=LivenessConfig(3.0, 8.0))
    nodes = (("a", 32.0), ("b", 32.0), ("c", 32.0))
    async with exo_with_bridge(nodes=nodes, bridge_config=fast) as h, bridge_api(h.bridge) as door:
        await h.serve_qwen()
        (first,) = h.exo_instances()
        holder = next(iter(h.master.state.instances[first].shard_assignments.node_to_runner))
        transport = httpx.ASGITransport(app=create_exo_compat_app(h.master))
        async with httpx.AsyncClient(transport=transport, base_url="http://exo") as exo:
            tally = Tally()
            through, straight = tally.through, tally.straight
            stop = anyio.Event()
            async with anyio.create_task_group() as group:
                start_clients(group, tally, door, exo, max_tokens, stop)
                await wait_until(lambda: through["ok"] >= 2 * CLIENTS, 30, "chats answered")
                name = h.master.state.node_identities[holder].friendly_name
                h.nodes.crash(name, 3600.0)
                await wait_until(
                    lambda: h.serving() and first not in h.exo_instances(), 120, "served again"
                )
                answered = through["ok"]
                await wait_until(lambda: through["ok"] >= answered + AFTER, 60, "answered after")
                stop.set()
        (view,) = h.bridge.deployments_view().deployments
        deployment = view.deployment.deployment_id
        door_counts = {o: h.bridge.front_door.counts.total(deployment, o) for o in OUTCOMES}
        print(f"\n{tally.line('kill')} (the door's own counts: {door_counts})")
        assert through["ok"] > 0 and straight["ok"] > 0
        # The door had work to do: chats continued, sent again or held through the kill.
        assert door_counts["migrated"] + door_counts["retried"] + door_counts["held"] > 0
        # The kill did cost the straight clients: the comparison shows something.
        assert tally.lost(straight) > 0, dict(straight)
        assert (through["failed"], through["cut"], through["hung"]) == (0, 0, 0), dict(through)
