"""Chat routing over replicas (docs/design.md §6.8), against the real master in virtual time.

A chat goes to a ready instance whose nodes are all connected, the one with the fewest chats in
flight (ties: the State's order); a node whose connection closed is passed over at once, well
before it would time out, and so is one whose session cannot take the request; a chat whose
node drops (or that its node fails) before the first token is sent once more to another
replica, while one that already had text ends with an error.

Through our API's front door (docs/design.md §8.6) that error is not the client's: the last two
tests kill one replica's node under four clients streaming chats, straight to the master's
routing (the door's own upstream: chats cut there fail) and through the door (it continues each
answer cut there on the other replica: none fails, is cut or hangs).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import pytest
from anyio.abc import TaskGroup
from chat_outcomes import Outcome, chat_body, outcome_of
from model_ids import QWEN
from test_master import FakeNode, connect, say_hi, wait_until

from keeper.model.refusals import ChatFailedError
from keeper.model.request_rule import OUTCOMES as COUNTED
from keeper.sim.cluster.in_process import InProcessCluster
from keeper.sim.master.api import create_app
from keeper.sim.master.chat_upstream import upstream_client
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node.sim_node import DEFAULT_TOKENS_PER_S, NodeConfig

CHAT = "/v1/chat/completions"
# Clients on each side: several chats in flight on each replica, so the kill catches some.
CLIENTS = 4
# Tokens per chat: 2 s of a simulated node's answer, so the kill lands mid-answer.
TOKENS = 40
# A chat with no end after this long is hung: an answer (2 s) and its continuation fit many
# times over, and so would the door's hold (30 s) were the other replica not serving.
HUNG_S = 60.0
# Chats answered through the door after the kill before the clients stop: two per client shows
# the door serving on the other replica.
AFTER = 2 * CLIENTS


async def two_replicas(group: TaskGroup, nodes: list[FakeNode]) -> tuple[Master, list[str]]:
    """A master serving Qwen at replicas 2 over ``nodes``; the ready instances in State order."""
    master = Master(None, config=MasterConfig(startup_grace_s=0.0))
    await group.start(master.run)
    for node in nodes:
        await connect(master, group, node)
    await master.create_deployment(QWEN, replicas=2)
    await wait_until(lambda: len(master.ready_instances(QWEN)) == 2, 5, "two ready replicas")
    return master, [instance for instance, _ in master.ready_instances(QWEN)]


def node_serving(nodes: list[FakeNode], master: Master, instance_id: str) -> FakeNode:
    (node_id,) = master.state.instances[instance_id].shard_assignments.node_to_runner
    (node,) = [node for node in nodes if node.node_id == node_id]
    return node


@pytest.mark.anyio
async def test_ready_instances_follow_the_states_order() -> None:
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, ready = await two_replicas(group, nodes)
        assert ready == [
            iid
            for iid, inst in master.state.instances.items()
            if inst.shard_assignments.model_id == QWEN
        ]
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_chats_go_to_the_replica_with_the_fewest_in_flight_ties_in_state_order() -> None:
    nodes = [FakeNode("a", chat="hang"), FakeNode("b", chat="hang")]
    async with anyio.create_task_group() as group:
        master, (first, second) = await two_replicas(group, nodes)
        streams = [await say_hi(master) for _ in range(3)]
        assert [s.instance_id for s in streams] == [first, second, first]
        await streams[1].aclose()  # the second replica is now the less busy
        assert (await say_hi(master)).instance_id == second
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_whose_connection_closed_is_passed_over_before_it_times_out() -> None:
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, (first, second) = await two_replicas(group, nodes)
        gone = node_serving(nodes, master, first)
        assert gone._channel is not None
        await gone._channel.aclose()
        await wait_until(lambda: gone.node_id not in master.connected_nodes(), 1, "disconnect")
        assert gone.node_id in master.state.topology.nodes  # not timed out yet
        assert [i for i, _ in master.ready_instances(QWEN)] == [second]
        stream = await say_hi(master)
        assert stream.instance_id == second
        assert "".join([piece async for piece in stream]) == "Hello world"
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_node_that_cannot_take_the_request_is_passed_over_for_another_replica() -> None:
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, (first, second) = await two_replicas(group, nodes)
        # The first replica's session is still registered, but its outbox is gone: what a node
        # whose connection just ended looks like until its session is torn down.
        closing = node_serving(nodes, master, first)
        master._membership.sessions[closing.node_id].outbox.close()
        assert [i for i, _ in master.ready_instances(QWEN)] == [first, second]
        stream = await say_hi(master)
        assert stream.instance_id == second
        assert "".join([piece async for piece in stream]) == "Hello world"
        assert closing.chat_requests == []
        # With no node to take it, the chat fails at once, naming the node.
        other = node_serving(nodes, master, second)
        master._membership.sessions[other.node_id].outbox.close()
        with pytest.raises(ChatFailedError, match="could not take the request"):
            await say_hi(master)
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_chat_whose_node_drops_before_the_first_token_is_retried_on_another_replica() -> (
    None
):
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, (first, second) = await two_replicas(group, nodes)
        dropping = node_serving(nodes, master, first)
        dropping.chat = "drop"
        stream = await say_hi(master)
        assert stream.instance_id == first
        assert "".join([piece async for piece in stream]) == "Hello world"
        assert stream.instance_id == second
        assert stream.rerouted_from == first
        assert stream.finish_reason == "stop"
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_chat_its_node_fails_before_the_first_token_is_retried_on_another_replica() -> None:
    # A runner killed under a chat: the node answers an error, the client has seen nothing.
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, (first, second) = await two_replicas(group, nodes)
        node_serving(nodes, master, first).chat = "error"
        stream = await say_hi(master)
        assert "".join([piece async for piece in stream]) == "Hello world"
        assert (stream.instance_id, stream.rerouted_from) == (second, first)
        # Both failing: the node's own message, after one retry.
        node_serving(nodes, master, second).chat = "error"
        stream = await say_hi(master)
        with pytest.raises(ChatFailedError, match="runner died"):
            async for _ in stream:
                pass
        assert stream.rerouted_from is not None
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_chat_is_retried_once_only() -> None:
    nodes = [FakeNode("a", chat="drop"), FakeNode("b", chat="drop")]
    async with anyio.create_task_group() as group:
        master, _ = await two_replicas(group, nodes)
        stream = await say_hi(master)
        with pytest.raises(ChatFailedError, match="disconnected"):
            async for _ in stream:
                pass
        assert sum(len(node.chat_requests) for node in nodes) == 2
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_chat_whose_node_drops_after_the_first_token_fails_even_with_a_replica() -> None:
    nodes = [FakeNode("a"), FakeNode("b")]
    async with anyio.create_task_group() as group:
        master, (first, _) = await two_replicas(group, nodes)
        node_serving(nodes, master, first).chat = "die"
        stream = await say_hi(master)
        received: list[str] = []
        with pytest.raises(ChatFailedError, match="disconnected"):
            async for piece in stream:
                received.append(piece)
        assert received == ["Hello"]
        assert stream.rerouted_from is None
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_drop_before_the_first_token_fails_when_no_other_replica_is_ready() -> None:
    master = Master(None, config=MasterConfig(startup_grace_s=0.0))
    node = FakeNode("a", chat="drop")
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        await connect(master, group, node)
        await master.create_deployment(QWEN)
        await wait_until(lambda: bool(master.ready_instances(QWEN)), 5, "ready")
        stream = await say_hi(master)
        with pytest.raises(ChatFailedError, match="disconnected"):
            async for _ in stream:
                pass
        group.cancel_scope.cancel()


async def chatting(
    api: httpx.AsyncClient, counts: Counter[Outcome], stop: anyio.Event, offset_s: float
) -> None:
    """Streamed chats one after another until ``stop``, each counted by how it ended; the first
    after ``offset_s`` (clients spread over an answer, so the kill finds them at every point)."""
    await anyio.sleep(offset_s)
    while not stop.is_set():
        outcome: Outcome = "hung"
        with anyio.move_on_after(HUNG_S):
            status, body = 0, b""
            try:
                async with api.stream("POST", CHAT, json=chat_body(TOKENS)) as answer:
                    status, body = answer.status_code, await answer.aread()
            except httpx.TransportError:
                pass  # no answer, or one broken off: read as what came
            outcome = outcome_of(status, body, TOKENS)
        counts[outcome] += 1


@dataclass
class KillRun:
    """What one run of ``chats_through_a_kill`` saw."""

    counts: Counter[Outcome]
    master: Master
    deployment_id: str
    views: list[dict[str, Any]]  # GET /deployments' after the run


async def chats_through_a_kill(door: bool) -> KillRun:
    """Qwen at replicas 2 on three simulated nodes, ``CLIENTS`` clients streaming chats one
    after another through our API's front door (``door``) or straight to the master's routing
    (the door's own upstream), and the node of the first replica in the State's order (ties go
    to it, so it has chats in flight) crashed mid-answer; until ``AFTER`` more are answered."""
    master = Master(None, config=MasterConfig(startup_grace_s=0.0))
    nodes = [NodeConfig("a", 32.0), NodeConfig("b", 32.0), NodeConfig("c", 32.0)]
    counts: Counter[Outcome] = Counter()
    deployment, views = "", []
    async with anyio.create_task_group() as group:
        await group.start(master.run)
        cluster = InProcessCluster(master, nodes)
        await group.start(cluster.run)
        deployment = (await master.create_deployment(QWEN, replicas=2)).deployment_id or ""
        await wait_until(lambda: len(master.ready_instances(QWEN)) == 2, 60, "two replicas")
        _, victim = master.ready_instances(QWEN)[0]
        ours = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(master)), base_url="http://master"
        )
        straight = upstream_client(master.chat_source, master.catalog.values)
        api = ours if door else straight
        stop = anyio.Event()
        async with ours, straight:
            async with anyio.create_task_group() as clients:
                for index in range(CLIENTS):
                    offset_s = index * TOKENS / DEFAULT_TOKENS_PER_S / CLIENTS
                    clients.start_soon(chatting, api, counts, stop, offset_s)
                await wait_until(lambda: counts["ok"] >= 2 * CLIENTS, 30, "chats answered")
                cluster.crash(master.state.node_identities[victim].friendly_name, 3600.0)
                answered = counts["ok"]
                await wait_until(lambda: counts["ok"] >= answered + AFTER, 30, "after the kill")
                stop.set()
            views = (await ours.get("/deployments")).json()["deployments"]
        group.cancel_scope.cancel()
    return KillRun(counts, master, deployment, views)


@pytest.mark.anyio
async def test_straight_to_the_master_s_routing_a_replica_s_death_fails_chats() -> None:
    # What the front door is for: the master's routing alone ends each answer the kill cut
    # with an error (docs/design.md §6.8), as measured on processes before the door.
    run = await chats_through_a_kill(door=False)
    print(f"\nstraight to the master's routing: {dict(run.counts)}")
    assert run.counts["ok"] > 0
    assert run.counts["failed"] > 0, dict(run.counts)


@pytest.mark.anyio
async def test_through_the_front_door_no_chat_fails_is_cut_or_hangs_when_a_replica_dies() -> None:
    run = await chats_through_a_kill(door=True)
    door = run.master.front_door.counts
    counted = {o: door.total(run.deployment_id, o) for o in COUNTED}
    print(f"\nthrough the front door: {dict(run.counts)} (its counts: {counted})")
    assert (run.counts["failed"], run.counts["cut"], run.counts["hung"]) == (0, 0, 0)
    # The kill did cut answers, and the door continued them on the other replica.
    assert counted["migrated"] > 0
    # Every chat counted once, each way it ended, in /metrics' counter and the deployment's view.
    assert sum(counted.values()) == sum(run.counts.values())
    (view,) = run.views
    assert view["requests"]["outcomes"] == {o: int(n) for o, n in counted.items() if n}
