"""Chats through the bridge's front door while the node serving them is killed, against chats
sent straight to the stock-exo stand-in beside them (docs/design.md §8.6), in virtual time.

Four clients stream chats one after another through the front door, and four straight to the
stand-in (which routes and ends chats as a stock exo does, §7.5), while the node holding the
model's one instance is killed and the bridge (fast failover) places it again. Every chat is
counted: answered whole (its text the fake answer's start, its finish_reason and one [DONE]),
failed (an error status or an error event), cut (ended with neither: no finish_reason or no
[DONE]) or hung (no end within ``HUNG_S``). Both counts are printed; through the front door none
may fail, be cut or hang."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Awaitable, Callable

import anyio
import httpx
import pytest
from bridge_harness import bridge_api, exo_with_bridge, sse_events, wait_until
from model_ids import QWEN

from keeper.bridge.service import BridgeConfig
from keeper.model.liveness import LivenessConfig
from keeper.model.request_rule import OUTCOMES
from keeper.sim.exo_standin.app import create_exo_compat_app
from keeper.sim.node.sim_node import DEFAULT_TOKENS_PER_S, reply_tokens

CHAT = "/v1/chat/completions"
CLIENTS = 4
# Tokens per chat: 8 (0.4 s of a simulated node's answer: the kill lands before most chats'
# first token) and 40 (2 s: it lands mid-answer, so the door continues the text).
SHORT, LONG = 8, 40
# A chat with no end after this long is hung: the front door's hold (30 s) and a failover
# (about 15 s here: 8 s to confirm the node dead, then a placement and a load) fit well inside.
HUNG_S = 120.0
# Chats answered through the front door after the model serves again, before the clients stop:
# two per client shows the door serving on the new instance.
AFTER = 2 * CLIENTS

Outcome = str  # "ok", "failed", "cut", "hung"


def outcome_of(answer: httpx.Response, max_tokens: int) -> Outcome:
    """How one streamed chat of ``max_tokens`` ended, for the client that sent it."""
    if answer.status_code != 200:
        return "failed"
    events = sse_events(answer.content)
    chunks = [json.loads(event) for event in events if event != "[DONE]"]
    if any("error" in chunk for chunk in chunks):
        return "failed"
    finished = any(c["choices"][0].get("finish_reason") for c in chunks if c.get("choices"))
    if not finished or events.count("[DONE]") != 1 or events[-1] != "[DONE]":
        return "cut"
    text = "".join(
        choice["delta"].get("content") or "" for chunk in chunks for choice in chunk["choices"]
    )
    return "ok" if text == "".join(reply_tokens()[:max_tokens]) else "failed"


async def client(
    send: Callable[[], Awaitable[httpx.Response]],
    max_tokens: int,
    counts: Counter[Outcome],
    stop: anyio.Event,
    offset_s: float,
) -> None:
    """Chat after chat until ``stop``, each counted, the first after ``offset_s`` (clients
    spread over an answer's time, so a kill finds them at every point of their answers)."""
    await anyio.sleep(offset_s)
    while not stop.is_set():
        outcome: Outcome = "hung"
        with anyio.move_on_after(HUNG_S):
            outcome = outcome_of(await send(), max_tokens)
        counts[outcome] += 1


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
            body = {
                "model": QWEN,
                "messages": [{"role": "user", "content": "hello"}],
                "stream": True,
                "max_tokens": max_tokens,
            }
            through: Counter[Outcome] = Counter()
            straight: Counter[Outcome] = Counter()
            stop = anyio.Event()
            async with anyio.create_task_group() as group:
                for index in range(CLIENTS):
                    offset_s = index * max_tokens / DEFAULT_TOKENS_PER_S / CLIENTS
                    for counts, api in ((through, door), (straight, exo)):
                        send = functools.partial(api.post, CHAT, json=body)
                        group.start_soon(client, send, max_tokens, counts, stop, offset_s)
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
        print(
            f"\nthrough the front door: {dict(through)} (the door's own counts: {door_counts});"
            f" straight to exo: {dict(straight)}"
        )
        assert through["ok"] > 0 and straight["ok"] > 0
        # The door had work to do: chats continued, sent again or held through the kill.
        assert door_counts["migrated"] + door_counts["retried"] + door_counts["held"] > 0
        # The kill did cost the straight clients: the comparison shows something.
        assert sum(straight[o] for o in ("failed", "cut", "hung")) > 0, dict(straight)
        assert (through["failed"], through["cut"], through["hung"]) == (0, 0, 0), dict(through)
