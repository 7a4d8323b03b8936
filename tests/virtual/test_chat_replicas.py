"""Chat routing over replicas (docs/design.md §6.8), against the real master in virtual time.

A chat goes to a ready instance whose nodes are all connected, the one with the fewest chats in
flight (ties: the State's order); a node whose connection closed is passed over at once, well
before it would time out, and so is one whose session cannot take the request; a chat whose
node drops (or that its node fails) before the first token is sent once more to another
replica, while one that already had text ends with an error.
"""

from __future__ import annotations

import anyio
import pytest
from anyio.abc import TaskGroup
from model_ids import QWEN
from test_master import FakeNode, connect, say_hi, wait_until

from keeper.model.refusals import ChatFailedError
from keeper.sim.master.service import Master, MasterConfig


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
