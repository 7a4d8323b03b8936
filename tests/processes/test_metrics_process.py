"""``GET /metrics`` of a real ``exo-deploy cluster`` (a master and node processes, real sockets):
a node holding the model is killed with SIGKILL while the other nodes are cordoned (so it is an
outage, not a seamless failover), and the scrape shows the replica not ready and the incident
counted, then, a node uncordoned, the ready replicas back and the recovery in the histogram, as
the history API says it; the body is
what Prometheus reads (parsed by prometheus_client's parser), gzipped when asked."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import shared_http as http
from metrics_scrape import Samples, parse
from model_ids import QWEN as MODEL
from process_helpers import GET_TIMEOUT_S, START_DEADLINE_S, nodes_heard, run_cli, wait_for
from test_e2e_cluster import running_cluster

pytestmark = pytest.mark.e2e


def scrape(url: str) -> Samples | None:
    try:
        response = http.get(url + "/metrics", timeout=GET_TIMEOUT_S)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    return parse(response.text)[1]


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_a_killed_node_is_counted_in_a_real_scrape(tmp_path: Path) -> None:
    with running_cluster(tmp_path) as cluster:
        wait_for("the master", START_DEADLINE_S, lambda: cluster.get("/healthz"))
        layout = wait_for("the cluster's nodes", START_DEADLINE_S, cluster.layout)
        names = sorted(node["name"] for node in layout["nodes"])
        # Cordons name nodes as the master's State knows them: a node whose process runs but
        # whose report the master has not applied yet is refused as unknown.
        wait_for(
            "the master to hear every node",
            START_DEADLINE_S,
            lambda: nodes_heard(cluster.get("/nodes"), len(names)),
        )
        # Only the first node open to placement: the instance lands there, and once it is
        # killed the keeper has nowhere to fail over until a node is uncordoned. A replacement
        # ready before the node is confirmed dead would write no incident at all (design.md
        # §5.18, "Honest clocks"), and whether it is depends on timing alone.
        holder, *closed = names
        for name in closed:
            cordoned = run_cli("cordon", name, "--url", cluster.url)
            assert cordoned.returncode == 0, cordoned.stderr
        created = run_cli("deploy", MODEL, "--json", "--url", cluster.url)
        assert created.returncode == 0, created.stderr
        (view,) = wait_for(
            "the deployment listed", 10, lambda: cluster.get("/deployments") or None
        )["deployments"]
        deployment_id = view["deployment"]["deploymentId"]
        labels = {"deployment": deployment_id, "model": MODEL}

        def ready_is(count: float) -> Samples | None:
            samples = scrape(cluster.url)
            ready = (
                sample(samples, "exo_deploy_deployment_replicas_ready", **labels)
                if samples
                else None
            )
            return samples if ready == count else None

        wait_for("one ready replica in the scrape", 60, lambda: ready_is(1))
        instance = wait_for("the instance's node", 10, cluster.serving_node)
        assert instance[1] == holder
        os.kill(cluster.pid_of(holder), signal.SIGKILL)

        # Confirmed dead (its closed connection, then the suspicion threshold: seconds), its
        # instance is not ready, and with every other node cordoned it stays so.
        # The incident is counted once its serving record is written, a look after readiness.
        def down() -> Samples | None:
            samples = ready_is(0)
            if samples is None:
                return None
            count = sample(samples, "exo_deploy_deployment_incidents_total", **labels)
            return samples if count == 1 else None

        while_down = wait_for("no ready replica, the incident counted", 30, down)
        assert sample(while_down, "exo_deploy_deployment_recovery_seconds_count", **labels) == 0
        uncordoned = run_cli("uncordon", closed[0], "--url", cluster.url)
        assert uncordoned.returncode == 0, uncordoned.stderr

        def recovered() -> Samples | None:
            samples = ready_is(1)
            if samples is None:
                return None
            count = sample(samples, "exo_deploy_deployment_recovery_seconds_count", **labels)
            return samples if count == 1 else None

        samples = wait_for("serving again, the recovery observed", 60, recovered)
        history = cluster.get(f"/deployments/{deployment_id}/history")
        assert history is not None
        (incident,) = history["incidents"]
        assert sample(samples, "exo_deploy_deployment_incidents_total", **labels) == 1
        recovered_s = sample(samples, "exo_deploy_deployment_recovery_seconds_sum", **labels)
        assert recovered_s == pytest.approx(incident["downtimeS"], abs=0.001)
        assert sample(samples, "exo_deploy_keeper_placements_total", result="placed") == 2
        assert sample(samples, "exo_deploy_nodes", state="alive") == 2

        # Prometheus asks for gzip: the same text, compressed.
        zipped = http.get(cluster.url + "/metrics", headers={"Accept-Encoding": "gzip"})
        assert zipped.headers["content-encoding"] == "gzip"
        assert b"exo_deploy_nodes" in zipped.content
