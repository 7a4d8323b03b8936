"""Routing chat requests to the replicas of a model (docs/design.md §6.8).

A chat goes to the rank-0 node of the least busy ready instance of its model whose nodes are all
connected (``keeper.model.readiness.chat_targets``; ties: the State's order, as exo); a node that
cannot take it (its session closing, its outbox gone) is passed over for the next one in that order;
should that node or instance go, or the node fail the request, before the first text, it is sent
once more to another ready instance, and ``keeper.master.chat`` follows it from there.

It stands apart from the master's service because it needs only the open chats
(``ChatRouter``), the node sessions (``Membership``) and the State, never the lock or the router.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from keeper.link.protocol import ChatMessage, ChatRequest
from keeper.master.chat import ChatRouter, ChatStream, Route
from keeper.master.membership import Membership
from keeper.model.readiness import chat_targets
from keeper.model.refusals import ChatFailedError, NoInstanceError
from keeper.model.state import NodeId, State

log = logging.getLogger(__name__)


class ChatRouting:
    """Picks the instance and node a chat goes to, and the next one if it is lost early."""

    def __init__(
        self, chats: ChatRouter, membership: Membership, state: Callable[[], State]
    ) -> None:
        self._chats = chats
        self._membership = membership
        self._state = state

    def ready_instances(self, model_id: str) -> list[tuple[str, NodeId]]:
        """(instance id, rank-0 node) of each instance of the model a chat may go to now, in
        the State's order (``keeper.model.readiness.chat_targets``): ready, with every one of its
        nodes connected. A node whose connection closed is left out at once, long before it
        would time out."""
        connected = {node for node in self._membership.sessions if self._connected(node)}
        return chat_targets(self._state(), model_id, connected)

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
        route = self._route(model_id, request, lost=None)
        if route is None:
            raise NoInstanceError(
                f"No instance of {model_id} is ready to serve; deploy it or wait until it is "
                "serving",
                param="model",
            )

        def reroute(instance_id: str, node_id: NodeId) -> Route | None:
            log.info(
                "chat to %s: node %s or instance %s went or failed before the first token; "
                "retrying",
                model_id,
                node_id,
                instance_id,
            )
            try:
                return self._route(model_id, request, lost=instance_id)
            except ChatFailedError:
                return None

        return ChatStream(route, self._chats.chunk_timeout_s, reroute)

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
                return route
            self._chats.forget(route.pending.request_id)
            refused.append(node_id)
        raise ChatFailedError(f"node {', '.join(refused)} could not take the request")
