"""Routing chat requests to the replicas of a model (docs/design.md §6.8).

A chat goes to the rank-0 node of the least busy ready instance of its model whose nodes are all
connected (``keeper.model.readiness.chat_targets``; ties: the State's order, as exo; none on a
node confirmed dead, which is not ready) and, when another is left, on no suspect node
(``trusted_targets``); a node that
cannot take it (its session closing, its outbox gone) is passed over for the next one in that
order; should that node or instance go, or the node fail the request, before the first text, it is
sent once more to another ready instance, and ``keeper.sim.master.chat`` follows it from there.

What became of the chats is counted here (``ChatCounts``, read by ``GET /metrics``): each sent
to a node, each sent once more, and each outcome (answered to its end, failed, or no ready
instance to send it to).

``master --exo-compat`` routes as a stock exo instead (``ChatRouting.exo_chat``, docs/design.md
§7.5): to the instance of the model with the fewest chats in flight, ready or not, wherever its
nodes; the chat is sent to its node only once every runner of the instance is ready and the node
is connected (exo's worker holds it until then), and it is never sent elsewhere.

It stands apart from the master's service because it needs only the open chats
(``ChatRouter``), the node sessions (``Membership``) and the State, never the lock or the router.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from keeper.core.failover import trusted_targets
from keeper.model.readiness import chat_targets, exo_chat_targets, instance_is_ready
from keeper.model.refusals import ChatFailedError, NoInstanceError
from keeper.model.state import NodeId, State
from keeper.sim.link.protocol import ChatMessage, ChatRequest
from keeper.sim.master.chat import ChatRouter, ChatStream, Route
from keeper.sim.master.membership import Membership

log = logging.getLogger(__name__)

# How a chat went on one instance: its id, and None (answered to its end) or how it failed.
InstanceOutcome = Callable[[str, str | None], None]
# A held chat (exo's way) looks again this often even when no event was published: a node's
# session coming back says nothing in the State until its first report, and a second is well
# under the time a load takes.
HELD_RECHECK_S = 1.0


@dataclass
class ChatCounts:
    """Chats by model since the master started: sent to a node (``routed``, a reroute
    included), sent once more (``rerouted``), and by outcome."""

    routed: Counter[str] = field(default_factory=Counter[str])
    rerouted: Counter[str] = field(default_factory=Counter[str])
    answered: Counter[str] = field(default_factory=Counter[str])
    failed: Counter[str] = field(default_factory=Counter[str])  # ended before its end
    no_instance: Counter[str] = field(default_factory=Counter[str])  # nowhere to send it: 404


class ChatRouting:
    """Picks the instance and node a chat goes to, and the next one if it is lost early."""

    def __init__(
        self,
        chats: ChatRouter,
        membership: Membership,
        state: Callable[[], State],
        on_instance_outcome: InstanceOutcome | None = None,
    ) -> None:
        self._chats = chats
        self._membership = membership
        self._state = state
        self.counts = ChatCounts()
        # Set (and replaced) whenever the State changes: held chats look again.
        self._changed = anyio.Event()
        # Told how each chat went on each instance it was sent to (the failing-chats rule of
        # docs/design.md §5.19 reads it).
        self._on_instance_outcome = on_instance_outcome

    def ready_instances(self, model_id: str) -> list[tuple[str, NodeId]]:
        """(instance id, rank-0 node) of each instance of the model a chat may go to now, in
        the State's order (``keeper.model.readiness.chat_targets``): ready, with every one of its
        nodes connected. A node whose connection closed is left out at once, long before it
        would time out."""
        connected = {node for node in self._membership.sessions if self._connected(node)}
        state = self._state()
        return trusted_targets(state, chat_targets(state, model_id, connected))

    def _connected(self, node_id: NodeId) -> bool:
        session = self._membership.sessions.get(node_id)
        return session is not None and session.closed_because is None

    def chat(self, model_id: str, messages: Sequence[ChatMessage], max_tokens: int) -> ChatStream:
        """Send a chat to a ready instance of the model; iterate the result for its text.

        The instance with the fewest chats in flight (ties: the State's order, as exo) gets it;
        should its node or instance go before the first text, it is sent once more to another
        ready instance, and so is one its node fails before the first text (docs/design.md §6.8)."""
        request = ChatRequest(
            request_id="", instance_id="", messages=list(messages), max_tokens=max_tokens
        )
        try:
            route = self._route(model_id, request, lost=None)
        except ChatFailedError:
            self.counts.failed[model_id] += 1
            raise
        if route is None:
            self.counts.no_instance[model_id] += 1
            raise NoInstanceError(
                f"No instance of {model_id} is ready to serve; deploy it or wait until it is "
                "serving",
                param="model",
            )

        noted: set[str] = set()  # the instances this chat's failure was said of

        def reroute(instance_id: str, node_id: NodeId) -> Route | None:
            log.info(
                "chat to %s: node %s or instance %s went or failed before the first token; "
                "retrying",
                model_id,
                node_id,
                instance_id,
            )
            if self._on_instance_outcome is not None:
                self._on_instance_outcome(instance_id, "failed before its first text")
                noted.add(instance_id)
            try:
                rerouted = self._route(model_id, request, lost=instance_id)
            except ChatFailedError:
                return None
            if rerouted is not None:
                self.counts.rerouted[model_id] += 1
            return rerouted

        def outcome(answered: bool) -> None:
            (self.counts.answered if answered else self.counts.failed)[model_id] += 1
            # (Said once per instance: a failure that found nowhere else was said on reroute.)
            if self._on_instance_outcome is not None and stream.instance_id not in noted:
                words = None if answered else "ended before its end"
                self._on_instance_outcome(stream.instance_id, words)

        stream = ChatStream(route, self._chats.chunk_timeout_s, reroute, outcome)
        return stream

    def state_changed(self) -> None:
        """The State moved on: chats held for their instance look at it again."""
        self._changed.set()
        self._changed = anyio.Event()

    def exo_chat(
        self, model_id: str, messages: Sequence[ChatMessage], max_tokens: int
    ) -> ChatStream:
        """Send a chat as a stock exo does: to the model's instance with the fewest chats in
        flight, ready or not (ties: the State's order), held until every runner of it is ready
        and its node connected, never sent elsewhere; ``NoInstanceError`` with exo's words when
        the model has no instance. Its stream ends without a finish_reason if the instance is
        deleted under it (``ChatRouter.instance_deleted``)."""
        targets = exo_chat_targets(self._state(), model_id)
        if not targets:
            self.counts.no_instance[model_id] += 1
            raise NoInstanceError(f"No instance found for model {model_id}")
        busy = self._chats.load([instance for instance, _ in targets])
        instance_id, node_id = min(targets, key=lambda target: busy[target[0]])
        route = self._chats.open_to(
            instance_id, node_id, lambda message: self._membership.offer_to(node_id, message)
        )
        request = ChatRequest(
            request_id=route.pending.request_id,
            instance_id=instance_id,
            messages=list(messages),
            max_tokens=max_tokens,
        )

        async def send() -> AsyncIterator[None]:
            """Waits until the chat may be sent, stepping each time it looks again."""
            while self._chats.is_open(request.request_id):
                instance = self._state().instances.get(instance_id)
                if (
                    instance is not None
                    and instance_is_ready(instance, self._state())
                    and self._connected(node_id)
                    and self._membership.offer_to(node_id, request)
                ):
                    self.counts.routed[model_id] += 1
                    return
                changed = self._changed
                with anyio.move_on_after(HELD_RECHECK_S):
                    await changed.wait()
                yield

        def outcome(answered: bool) -> None:
            (self.counts.answered if answered else self.counts.failed)[model_id] += 1

        timeout = self._chats.chunk_timeout_s
        return ChatStream(route, timeout, None, outcome, send=send, keepalive=True)

    def _route(self, model_id: str, request: ChatRequest, lost: str | None) -> Route | None:
        """Open and send the request to the least busy ready instance but ``lost`` whose node
        takes it; None if there is no such instance, ChatFailedError if none of them took it."""
        ready = [target for target in self.ready_instances(model_id) if target[0] != lost]
        if not ready:
            return None
        busy = self._chats.load([instance for instance, _ in ready])
        refused: list[NodeId] = []
        # Least busy first; a stable sort keeps ties in the State's order.
        for instance_id, node_id in sorted(ready, key=lambda target: busy[target[0]]):
            session = self._membership.sessions[node_id]
            route = self._chats.open(instance_id, session)
            sent = request.model_copy(
                update={"request_id": route.pending.request_id, "instance_id": instance_id}
            )
            if session.offer(sent):
                self.counts.routed[model_id] += 1
                return route
            self._chats.forget(route.pending.request_id)
            refused.append(node_id)
        raise ChatFailedError(f"node {', '.join(refused)} could not take the request")
