"""The bridge's second sign for a suspect node: its own exo API, asked ``GET /node_id``.

Every exo node serves exo's API, and answers ``GET /node_id`` with its own node id (a JSON
string). The bridge learns which of its ``--exo`` URLs is which node by asking each of them, and
when a node it has a URL for turns suspect (its ``lastSeen`` stopped moving,
``keeper.bridge.node_liveness``) it asks that URL again: an answer from the node is noted, no
answer is the independent sign that confirms it dead at once (docs/design.md §5.18), seconds
before ``--dead-after-s`` of silence would. Sooner still, every node it has heard is asked
each round, with a short deadline, for one answer only: a connection refused, which a killed
exo's port gives at once and nothing else does, confirms it dead before its reports are even
missed (``keeper.model.liveness.probe_sign``): a kill is seen within a round (half a second),
where waiting for its reports to stall first took two to three seconds on a real cluster. A
round costs each node one ``GET /node_id``, which exo answers from memory. A node the bridge
has no URL for is confirmed by silence alone, as before.

The probes run in a task of their own beside the ticks, never inside one: a tick waiting on a
probe of a Mac that is powered off would hold up the step for the probe's whole deadline.
The answers reach the watcher between two ticks; the next tick's check reaches the verdict and
deletes the dead node's instances in the same tick. Which probes and lookups are due, and what
an answer tells, is decided by pure functions (below, and ``keeper.model.liveness``'s
``wants_probe`` and ``probe_sign``); the loop only makes the calls.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence

import anyio

from keeper.bridge.exo_client import ExoApi, ExoConnectionRefusedError, ExoUnavailableError
from keeper.model.liveness import ProbeAnswer, probe_sign, wants_probe
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
# How long a probe of a node not yet suspect waits: it looks only for a refusal (probe_sign),
# which comes back at once (the node's OS answers the connection with a reset, in milliseconds
# on a LAN); a node frozen or slow holds the probe round no longer than this.
REFUSAL_PROBE_TIMEOUT_S = 0.5
# How often the probe loop looks for a suspect node to probe: half the bridge's one-second poll,
# so a probe's answer is in before the tick after the suspicion.
PROBE_EVERY_S = 0.5
# How often a URL whose node is not known (it did not answer, or its exo has no GET /node_id) is
# asked again, and a known one checked (a Mac replaced under the same name is another node).
LOOKUP_EVERY_S = 30.0


def due_probes(
    verdicts: Mapping[NodeId, NodeWatch],
    node_of: Mapping[str, NodeId],
    silences: Mapping[NodeId, float],
) -> list[str]:
    """The URLs to probe now: those of the nodes that are suspect, or alive and heard
    (``wants_probe``; not a dead one: it needs no second sign), in URL order."""
    return sorted(
        url
        for url, node_id in node_of.items()
        if wants_probe(
            verdicts[node_id].phase if node_id in verdicts else "alive", silences.get(node_id)
        )
    )


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
        # URL -> the last sign logged of it: a node that stays refused (its exo is down for
        # minutes) is said once, not twice a second.
        self._said: dict[str, ProbeAnswer] = {}

    async def run(
        self,
        clock: Clock,
        verdicts: Callable[[], Mapping[NodeId, NodeWatch]],
        silences: Callable[[float], Mapping[NodeId, float]],
        probed: Callable[[NodeId, ProbeAnswer], None],
    ) -> None:
        """Look up and probe until cancelled; each probe's answer that tells anything
        (``probe_sign``) goes to ``probed``."""
        while True:
            now = clock.monotonic()
            await self.once(now, verdicts(), silences(now), probed)
            # Rounds start every PROBE_EVERY_S, not that long after one ends: a round held by a
            # frozen node's short probe does not delay the probe of a node turned suspect.
            await clock.sleep(max(0.0, PROBE_EVERY_S - (clock.monotonic() - now)))

    async def once(
        self,
        now: float,
        verdicts: Mapping[NodeId, NodeWatch],
        silences: Mapping[NodeId, float],
        probed: Callable[[NodeId, ProbeAnswer], None],
    ) -> None:
        """One round: ask every URL due for a lookup or a probe, all at once."""
        lookups = due_lookups(list(self._apis), self._asked_at, now)
        probes = due_probes(verdicts, self.node_of, silences)
        suspect = {node_id for node_id, watch in verdicts.items() if watch.phase == "suspect"}
        async with anyio.create_task_group() as group:
            for url in dict.fromkeys([*lookups, *probes]):
                self._asked_at[url] = now
                known = self.node_of.get(url) if url in probes else None
                group.start_soon(self._ask, url, known, known in suspect, probed)

    async def _ask(
        self,
        url: str,
        probing: NodeId | None,
        suspect: bool,
        probed: Callable[[NodeId, ProbeAnswer], None],
    ) -> None:
        """Ask ``url`` its node id: learn which node it is; for the node ``probing`` (None: a
        lookup only), its answer (or none, or a refusal) is the probe's, as far as
        ``probe_sign`` lets it tell."""
        # A node not yet suspect is asked only whether its port refuses: no need to wait long.
        quick = probing is not None and not suspect
        timeout_s = REFUSAL_PROBE_TIMEOUT_S if quick else PROBE_TIMEOUT_S
        try:
            answered = NodeId(await self._apis[url].node_id(timeout_s))
        except ExoUnavailableError as exc:
            refused = isinstance(exc, ExoConnectionRefusedError)
            answer: ProbeAnswer = "refused" if refused else "unanswered"
            sign = probe_sign(suspect, answer) if probing is not None else None
            if probing is not None and sign is not None:
                level = logging.DEBUG if self._said.get(url) == sign else logging.INFO
                log.log(level, "fast failover: node %s's own API %s: %s", probing, answer, exc)
                self._said[url] = sign
                probed(probing, sign)
            else:
                log.debug("%s: no node id (%s)", url, exc)
            return
        self._said.pop(url, None)
        known = self.node_of.get(url)
        if answered != known:
            # A URL that is another node's now gives no sign either way for the one it was.
            log.info("fast failover: %s is node %s's own API", url, answered)
            self.node_of[url] = answered
        elif probing is not None and probe_sign(suspect, "answered") is not None:
            probed(answered, "answered")
