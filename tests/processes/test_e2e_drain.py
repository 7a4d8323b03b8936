"""Drains for real: ``exo-deploy cluster`` as processes, a model at replicas 1 and one at
replicas 2 on 3 nodes, chats to both without pause, and ``exo-deploy drain --wait`` of the node
serving them (docs/design.md §5.15).

What it shows: no chat fails, because each replacement is ready before the old instance goes
and new chats go to it from then on; the drained node ends empty; and a model never has more
than its replicas + 1 instances, the extra one only while its move runs (watched from a thread
reading the State every 50 ms for the whole drain).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import shared_http as http
from model_ids import LLAMA, QWEN
from process_helpers import START_DEADLINE_S, model_instances, wait_for
from test_e2e_cluster import Cluster, _all_up, running_cluster
from test_e2e_replicas import CHAT_TIMEOUT_S, Chats

pytestmark = pytest.mark.e2e

REPLICAS = {QWEN: 1, LLAMA: 2}
CLIENTS_PER_MODEL = 2
WATCH_EVERY_S = 0.05


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(tmp_path) as running:
        yield running


def _ready(cluster: Cluster) -> bool | None:
    listed = cluster.get("/deployments")
    if listed is None or len(listed["deployments"]) != len(REPLICAS):
        return None
    return all(d["readyReplicas"] == d["replicas"] for d in listed["deployments"]) or None


def _nodes_of(cluster: Cluster, model: str) -> dict[str, str]:
    """Instance id -> node id of the model's instances."""
    return dict(model_instances(cluster.get("/state") or {}, model))


class Watch:
    """The most instances of each model seen, read from the State until stopped."""

    def __init__(self, cluster: Cluster, models: tuple[str, ...] = tuple(REPLICAS)) -> None:
        self.cluster = cluster
        self.models = models
        self.most: Counter[str] = Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            state = self.cluster.get("/state") or {}
            for model in self.models:
                count = len(_shards_of(state, model))
                self.most[model] = max(self.most[model], count)
            time.sleep(WATCH_EVERY_S)


@contextlib.contextmanager
def under_load(cluster: Cluster, models: tuple[str, ...]) -> Iterator[tuple[list[Chats], Watch]]:
    """Chats to ``models`` without pause and the instance watch, for the body of the ``with``:
    40 chats answered before it, 40 more after it, then everything stopped and joined."""
    chats = [Chats(cluster.url, model) for model in models for _ in range(CLIENTS_PER_MODEL)]
    threads = [threading.Thread(target=c.client) for c in chats]
    watch = Watch(cluster, models)
    watcher = threading.Thread(target=watch.run)
    for thread in [*threads, watcher]:
        thread.start()
    try:
        wait_for("chats answered", 10, lambda: sum(c.answered for c in chats) >= 40 or None)
        yield chats, watch
        answered = sum(c.answered for c in chats)
        wait_for(
            "chats answered after the change",
            10,
            lambda: sum(c.answered for c in chats) >= answered + 40 or None,
        )
    finally:
        for c in chats:
            c.stop.set()
        watch.stop.set()
        for thread in [*threads, watcher]:
            thread.join(timeout=CHAT_TIMEOUT_S + 5)


@pytest.mark.e2e(seconds=45)
def test_a_drain_under_load_fails_no_chat_and_keeps_replicas_plus_one(cluster: Cluster) -> None:
    wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))
    for model, replicas in REPLICAS.items():
        created = http.post(
            f"{cluster.url}/deployments",
            json={"model_id": model, "replicas": replicas},
        )
        assert created.status_code == 200, created.text
    wait_for("every replica ready", 60, lambda: _ready(cluster))
    # The node of the replicas-1 model; if no replica of the other is there, one of its nodes
    # is drained next, so both kinds of move run.
    (qwen_node,) = _nodes_of(cluster, QWEN).values()
    targets = [qwen_node]
    if qwen_node not in _nodes_of(cluster, LLAMA).values():
        targets.append(next(iter(_nodes_of(cluster, LLAMA).values())))

    timings: list[float] = []
    with under_load(cluster, tuple(REPLICAS)) as (chats, watch):
        for node in targets:
            started = time.monotonic()
            drained = cluster.cli("drain", node, "--wait")
            timings.append(time.monotonic() - started)
            assert drained.returncode == 0, drained.stderr
            assert all(node not in _nodes_of(cluster, m).values() for m in REPLICAS)
            assert cluster.cli("uncordon", node).returncode == 0
    failures = [f for c in chats for f in c.failures]
    assert failures == []
    assert all(watch.most[m] <= REPLICAS[m] + 1 for m in REPLICAS), watch.most
    assert all(watch.most[m] == REPLICAS[m] + 1 for m in REPLICAS), watch.most  # each moved
    assert _ready(cluster)
    print(
        f"\n{sum(c.answered for c in chats)} chats answered, none failed; drains "
        + ", ".join(f"{t:.1f} s" for t in timings)
        + f"; most instances seen {dict(watch.most)}"
    )


# The rolling change each model gets: Llama, on 2 nodes, sharded by tensor (one node is always
# a pipeline ring); Qwen, which supports no tensor sharding, placed on 2 nodes instead of 1.
CHANGES = {LLAMA: ("--sharding", "Tensor"), QWEN: ("--min-nodes", "2")}
CREATED = {LLAMA: {"min_nodes": 2}, QWEN: {}}


def _shards_of(state: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """The shard assignments of each of the model's instances in the State."""
    return [
        instance["shardAssignments"]
        for tagged in state.get("instances", {}).values()
        for instance in tagged.values()
        if instance["shardAssignments"]["modelId"] == model
    ]


def _changed(cluster: Cluster, model: str) -> bool | None:
    """The model's deployment done updating, with as many instances as its replicas, each as
    its change asks."""
    state = cluster.get("/state") or {}
    listed = cluster.get("/deployments") or {"deployments": []}
    view = next(
        (d for d in listed["deployments"] if d["deployment"]["modelCard"]["modelId"] == model), None
    )
    if view is None or view.get("updating") is not None:
        return None
    instances = _shards_of(state, model)
    if model == LLAMA:
        kinds = {kind for i in instances for shard in i["runnerToShard"].values() for kind in shard}
        as_asked = kinds == {"TensorShardMetadata"}
    else:
        as_asked = all(len(i["nodeToRunner"]) >= 2 for i in instances)
    return (len(instances) == 1 and as_asked) or None


@pytest.mark.e2e(seconds=45)
def test_a_rolling_change_of_sharding_under_load_fails_no_chat(cluster: Cluster) -> None:
    wait_for("the master and 3 nodes", START_DEADLINE_S, lambda: _all_up(cluster))
    ids: dict[str, str] = {}
    for model, options in CREATED.items():
        created = http.post(f"{cluster.url}/deployments", json={"model_id": model, **options})
        assert created.status_code == 200, created.text
        ids[model] = created.json()["deployment_id"]
    wait_for("every replica ready", 60, lambda: _ready(cluster))
    timings: dict[str, float] = {}
    with under_load(cluster, tuple(CREATED)) as (chats, watch):
        for model, change in CHANGES.items():
            started = time.monotonic()
            changed = cluster.cli("set", ids[model], *change)
            assert changed.returncode == 0, changed.stderr
            assert "one at a time" in changed.stdout
            wait_for(f"{model} replaced", 90, lambda m=model: _changed(cluster, m))
            timings[model] = time.monotonic() - started
    failures = [f for c in chats for f in c.failures]
    assert failures == []
    assert all(watch.most[m] == 2 for m in CREATED), watch.most  # replicas + 1, once each
    assert _ready(cluster)
    print(
        f"\n{sum(c.answered for c in chats)} chats answered, none failed; rolling changes "
        + ", ".join(f"{m.split('/')[-1]} {t:.1f} s" for m, t in timings.items())
        + f"; most instances seen {dict(watch.most)}"
    )
