"""The bridge's second sign for a suspect node: its own exo API, asked ``GET /node_id``.

Every exo node serves exo's API, and answers ``GET /node_id`` with its own node id (a JSON
string). The bridge learns which of its ``--exo`` URLs is which node by asking each of them, and
when a node it has a URL for turns suspect (its ``lastSeen`` stopped moving,
``keeper.bridge.node_liveness``) it asks that URL again: an answer from the node is noted, no
answer is the independent sign that confirms it dead at once (docs/design.md §5.18), seconds
before ``--dead-after-s`` of silence would. A node the bridge has no URL for is confirmed by
silence alone, as before.

The probes run in a task of their own beside the ticks, never inside one: a tick waiting on a
probe of a Mac that is powered off would stretch the bridge's own checks past the gap it reads
as its own pause (``keeper.model.liveness.MAX_OBSERVER_GAP_S``), and it would then judge nobody.
The answers reach the watcher between two ticks; the next tick's check reaches the verdict and
deletes the dead node's instances in the same tick. Which probes and lookups are due is decided
by the two pure functions below; the loop only makes the calls.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import anyio

from keeper.bridge.exo_client import ExoApi, ExoUnavailableError
from keeper.model.state import NodeId, NodeWatch
from keeper.runtime.clock import Clock

log = logging.getLogger(__name__)

# How long a probe waits for a node's own API. exo answers GET /node_id from memory in
# milliseconds on a LAN, and a node whose process died answers "connection refused" at once;
# only a Mac that is gone altogether (off, unplugged) answers nothing, and this is how long that
# takes to count. Two seconds leave a node whose event loop is briefly busy (loading a model)
# twice the bridge's poll to answer: the node has already been silent for --suspect-after-s, and
# a false "dead" costs its instances. With the defaults a dead node is confirmed 3 + 2 = 5 s
# after its last report at worst, against 8 s by silence.
PROBE_TIMEOUT_S = 2.0
# How often the probe loop looks for a suspect node to probe: half the bridge's one-second poll,
# so a probe's answer is in before the tick after the suspicion.
PROBE_EVERY_S = 0.5
# How often a URL whose node is not known (it did not answer, or its exo has no GET /node_id) is
# asked again, and a known one checked (a Mac replaced under the same name is another node).
LOOKUP_EVERY_S = 30.0


def due_probes(verdicts: Mapping[NodeId, NodeWatch], node_of: Mapping[str, NodeId]) -> list[str]:
    """The URLs to probe now: those of the nodes that are suspect (not yet dead: a dead one
    needs no second sign), in URL order."""
    suspect = {node_id for node_id, watch in verdicts.items() if watch.phase == "suspect"}
    return sorted(url for url, node_id in node_of.items() if node_id in suspect)


def due_lookups(urls: Sequence[str], asked_at: Mapping[str, float], now: float) -> list[str]:
    """The URLs to ask their node id now: never asked, or asked LOOKUP_EVERY_S ago or more
    (known or not: a Mac replaced under the same name is another node), in the order given."""
    return [url for url in urls if now - asked_at.get(url, -math.inf) >= LOOKUP_EVERY_S]


class NodeProbes:
    """Which ``--exo`` URL is which node, and the probes of suspect ones (module doc)."""

    def __init__(self, apis: Sequence[ExoApi]) -> None:
        self._apis = {api.url: api for api in apis}
        self.node_of: dict[str, NodeId] = {}  # URL -> the node whose API it is
        self._asked_at: dict[str, float] = {}  # URL -> monotonic time it was last asked

    async def run(
        self,
        clock: Clock,
        verdicts: Callable[[], Mapping[NodeId, NodeWatch]],
        probed: Callable[[NodeId, bool], None],
    ) -> None:
        """Look up and probe until cancelled; each probe's answer goes to ``probed``."""
        while True:
            await self.once(clock.monotonic(), verdicts(), probed)
            await clock.sleep(PROBE_EVERY_S)

    async def once(
        self,
        now: float,
        verdicts: Mapping[NodeId, NodeWatch],
        probed: Callable[[NodeId, bool], None],
    ) -> None:
        """One round: ask every URL due for a lookup or a probe, all at once."""
        lookups = due_lookups(list(self._apis), self._asked_at, now)
        due = dict.fromkeys([*lookups, *due_probes(verdicts, self.node_of)])
        suspect = {node_id for node_id, watch in verdicts.items() if watch.phase == "suspect"}
        async with anyio.create_task_group() as group:
            for url in due:
                self._asked_at[url] = now
                group.start_soon(self._ask, url, suspect, probed)

    async def _ask(
        self, url: str, suspect: set[NodeId], probed: Callable[[NodeId, bool], None]
    ) -> None:
        """Ask ``url`` its node id: learn which node it is; for a suspect node, its answer (or
        none) is the probe's."""
        known = self.node_of.get(url)
        try:
            answered = NodeId(await self._apis[url].node_id(PROBE_TIMEOUT_S))
        except ExoUnavailableError as exc:
            if known is not None and known in suspect:
                log.info("fast failover: suspect node %s's own API did not answer: %s", known, exc)
                probed(known, False)
            else:
                log.debug("%s: no node id (%s)", url, exc)
            return
        if answered != known:
            # A URL that is another node's now gives no sign either way for the one it was.
            log.info("fast failover: %s is node %s's own API", url, answered)
            self.node_of[url] = answered
        elif answered in suspect:
            probed(answered, True)
