"""The master's own families in ``GET /metrics``: what became of the chats.

The families every service exports (deployments, nodes, the keeper's step) are built once, in
``keeper.runtime.metrics``; a chat is routed only by the master, so its counts
(``keeper.sim.master.chat_routing.ChatCounts``) are an extra collector the master adds to its
registry, read at each scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from keeper.runtime.metrics import PREFIX
from keeper.sim.master.chat_routing import ChatCounts


class ChatCollector:
    """``exo_deploy_chats_total{model,result}``, ``..._chats_routed_total{model}`` and
    ``..._chats_rerouted_total{model}`` from the master's chat counts."""

    def __init__(self, counts: ChatCounts) -> None:
        self._counts = counts

    def collect(self) -> Iterator[Metric]:
        counts = self._counts
        outcomes = CounterMetricFamily(
            PREFIX + "chats",
            "Chats by outcome: answered (to its end), failed (ended before it: node lost, "
            "runner died, silence), no_instance (no ready instance: a 404)",
            labels=["model", "result"],
        )
        for result, by_model in (
            ("answered", counts.answered),
            ("failed", counts.failed),
            ("no_instance", counts.no_instance),
        ):
            for model, count in sorted(by_model.items()):
                outcomes.add_metric([model, result], count)
        routed = CounterMetricFamily(
            PREFIX + "chats_routed",
            "Chats sent to a node of a ready instance (a reroute included)",
            labels=["model"],
        )
        for model, count in sorted(counts.routed.items()):
            routed.add_metric([model], count)
        rerouted = CounterMetricFamily(
            PREFIX + "chats_rerouted",
            "Chats sent once more to another instance, their first lost before its first text",
            labels=["model"],
        )
        for model, count in sorted(counts.rerouted.items()):
            rerouted.add_metric([model], count)
        yield from (outcomes, routed, rerouted)
