"""``GET /metrics``'s pure parts and its shipped files: node liveness (the rule the TUI and
the metrics share), the incident tally (each incident and recovery counted
once, from the service's start), and every metric name the Grafana dashboard and the alerting
rules use is one the exporter exports; ``promtool check rules`` passes where promtool is."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from keeper_harness import build_instance, card
from metrics_scrape import parse, value
from prometheus_client import CollectorRegistry, generate_latest

from keeper.bridge.metrics import ExoCollector, ExoFacts
from keeper.master.chat_routing import ChatCounts
from keeper.master.metrics import ChatCollector
from keeper.model.api_models import HealthView, WebhookEndpointHealth, WebhooksHealth
from keeper.model.history import summarize
from keeper.model.liveness import SILENT_AFTER_S, node_liveness, nodes_by_state
from keeper.model.state import Deployment, NodeIdentity, ServingRecord, State, Topology
from keeper.runtime.deployments import deployment_views
from keeper.runtime.metrics import (
    MetricsSnapshot,
    RecoveryCounts,
    ServiceMetrics,
    WebhookCollector,
    tally,
)

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "exo-deploy.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
MODEL = "org/model-a"


# --- liveness ------------------------------------------------------------------------


def test_nodes_alive_silent_gone_and_cordoned_names() -> None:
    instance = build_instance(card(MODEL), ["gone-with-instance"], "i1")
    state = State(
        topology=Topology(nodes=["fresh", "quiet", "undated"]),
        node_identities={"departed": NodeIdentity(friendly_name="old")},
        instances={"i1": instance},
        cordoned=("away-mac", "fresh"),
    )
    heard = {"fresh": 100.0 - (SILENT_AFTER_S - 0.1), "quiet": 100.0 - SILENT_AFTER_S}
    assert node_liveness(state, heard, 100.0) == {
        "fresh": "alive",
        "quiet": "silent",
        "undated": "alive",
        "departed": "gone",
        "gone-with-instance": "gone",
    }
    assert nodes_by_state(state, heard, 100.0) == {
        "alive": 2,
        "silent": 1,
        "gone": 2,
        "cordoned": 2,
    }
    assert nodes_by_state(State(), {}, 0.0) == {"alive": 0, "silent": 0, "gone": 0, "cordoned": 0}


# --- the tally ------------------------------------------------------------------------------


def _records(*changes: tuple[float, bool]) -> tuple[ServingRecord, ...]:
    return tuple(
        ServingRecord(at=at, serving=serving, cause=None if serving else "node a timed out")
        for at, serving in changes
    )


def test_each_incident_and_recovery_is_counted_once_from_the_start() -> None:
    counts = RecoveryCounts()
    # Served at 0, down 10-40 (before the service started at 50), down 60-75, down since 90.
    records = _records((0, True), (10, False), (40, True), (60, False), (75, True), (90, False))
    history = summarize("d", records, window_start=50.0, window_end=100.0)
    tally(counts, history, started_at=50.0)
    assert counts.incidents == 2  # 60 and 90; the one at 10 began before the start
    assert counts.buckets[-1] == 1  # one recovery: 60-75
    assert counts.recovered_s == 15.0
    assert counts.buckets[1] == 0 and counts.buckets[2] == 1  # le 10: 0, le 20: 1
    tally(counts, history, started_at=50.0)  # the same records again: nothing new
    assert (counts.incidents, counts.buckets[-1]) == (2, 1)
    later = summarize("d", (*records, *_records((130, True))), window_start=50.0, window_end=140.0)
    tally(counts, later, started_at=50.0)
    assert (counts.incidents, counts.buckets[-1], counts.recovered_s) == (2, 2, 55.0)


def test_a_recovery_that_ends_after_the_start_is_observed() -> None:
    counts = RecoveryCounts()
    records = _records((0, True), (40, False), (70, True))
    tally(counts, summarize("d", records, window_start=50.0, window_end=80.0), started_at=50.0)
    assert (counts.incidents, counts.buckets[-1], counts.recovered_s) == (0, 1, 30.0)


# --- the shipped dashboard and rules use only exported names -------------------------------


WEBHOOKS = WebhooksHealth(
    endpoints=[
        WebhookEndpointHealth(
            url="http://hooks.example:8080/…",
            pending=3,
            delivered_total=7,
            dropped_total=2,
            failed_attempts_total=5,
            last_error="timed out",
        )
    ],
    durable=True,
    outbox_write_failures_total=1,
)


def test_the_webhooks_counters_are_exported_as_healthz_shows_them() -> None:
    registry = CollectorRegistry()
    registry.register(WebhookCollector(lambda: WEBHOOKS))
    _, samples = parse(generate_latest(registry).decode())
    url = {"url": "http://hooks.example:8080/…"}
    assert value(samples, "exo_deploy_webhook_pending", **url) == 3
    assert value(samples, "exo_deploy_webhook_delivered_total", **url) == 7
    assert value(samples, "exo_deploy_webhook_dropped_total", **url) == 2  # never silently
    assert value(samples, "exo_deploy_webhook_failed_attempts_total", **url) == 5
    assert value(samples, "exo_deploy_webhook_outbox_write_failures_total") == 1


def _every_family_exported() -> tuple[set[str], set[str]]:
    """(sample names, histogram family names) of a master's and a bridge's families together,
    from a snapshot with one deployment, a chat of each outcome and a bridge's exo facts."""
    deployment = Deployment(deployment_id="d1", model_card=card(MODEL), placement_error="no")
    records = _records((0, True), (10, False), (20, True))
    state = State(deployments={"d1": deployment}, serving_history={"d1": records})
    snapshot = MetricsSnapshot(
        state=state, deployments=deployment_views(state, None, None), now=30.0, started_at=0.0
    )
    metrics = ServiceMetrics(lambda: snapshot, lambda: 0.0)
    counts = ChatCounts()
    for counter in (
        counts.routed,
        counts.rerouted,
        counts.answered,
        counts.failed,
        counts.no_instance,
    ):
        counter[MODEL] += 1
    metrics.add(ChatCollector(counts))
    facts = ExoFacts(True, True, 1.0, 1.0, now=2.0, started_at=0.0)
    metrics.add(ExoCollector(lambda: facts))
    metrics.add(WebhookCollector(lambda: WEBHOOKS))
    text = metrics.exposition_now().decode()
    families, samples = parse(text)
    histograms = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE") and line.endswith(" histogram")
    }
    assert families  # parsed at all
    return {name for name, _ in samples}, histograms


# A metric name in PromQL: an identifier not followed by "(" (a function) and outside strings.
_IDENTIFIER = re.compile(r"(?<![\w:])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def metric_names(expr: str) -> set[str]:
    """The exo-deploy metric names a PromQL expression reads (label values and functions apart)."""
    bare = _STRING.sub('""', expr)
    return {name for name in _IDENTIFIER.findall(bare) if name.startswith("exo_deploy_")}


def _dashboard_exprs(node: Any) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _dashboard_exprs(value)]
    if isinstance(node, list):
        return [e for value in node for e in _dashboard_exprs(value)]
    return []


def _rule_exprs() -> list[str]:
    document = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in document["groups"] for rule in group["rules"]]


def test_the_name_reader_sees_names_not_label_values_or_functions() -> None:
    expr = (
        "histogram_quantile(0.9, sum by (le) "
        '(rate(exo_deploy_x_bucket{model="exo_deploy_no"}[5m]))) / exo_deploy_y'
        " + exo_deploy_not_a_function(1)"
    )
    assert metric_names(expr) == {"exo_deploy_x_bucket", "exo_deploy_y"}


@pytest.mark.parametrize("source", ["dashboard", "rules"])
def test_every_name_the_shipped_files_use_is_exported(source: str) -> None:
    exprs = (
        _dashboard_exprs(json.loads(DASHBOARD.read_text()))
        if source == "dashboard"
        else _rule_exprs()
    )
    assert exprs
    samples, histograms = _every_family_exported()
    used = set().union(*(metric_names(expr) for expr in exprs))
    assert used
    unknown = set()
    for name in used:
        base = re.sub(r"_(bucket|sum|count)$", "", name)
        if name not in samples and not (base in histograms and name != base):
            unknown.add(name)
    assert unknown == set(), f"{source} uses names the exporter does not export: {sorted(unknown)}"


def test_the_dashboard_covers_what_operators_watch() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = " ".join(panel["title"].lower() for panel in dashboard["panels"])
    for topic in ("availability", "replicas", "incidents", "recovery", "keeper step", "nodes"):
        assert topic in titles, topic
    alerts = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
    }
    assert alerts == {
        "ExoDeployDeploymentNotServing",
        "ExoDeployReplicasShort",
        "ExoDeployExoUnreadable",
        "ExoDeployNodeSilent",
    }


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool is not None
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 4 rules found" in checked.stdout


def test_a_broken_instance_is_exported_by_problem() -> None:
    deployment = Deployment(deployment_id="d1", model_card=card(MODEL))
    state = State(deployments={"d1": deployment})
    (view,) = deployment_views(state, None, None)
    health = HealthView(instance="i1", problem="stalled", why="w", since="2026-01-01T00:00:00Z")
    name = "exo_deploy_deployment_instance_unhealthy"
    labels = {"deployment": "d1", "model": MODEL, "problem": "stalled"}
    for shown, expected in ((view, None), (view.model_copy(update={"health": health}), 1.0)):
        snapshot = MetricsSnapshot(state=state, deployments=[shown], now=30.0, started_at=0.0)
        _, samples = parse(
            ServiceMetrics(lambda s=snapshot: s, lambda: 0.0).exposition_now().decode()
        )
        assert samples.get((name, frozenset(labels.items()))) == expected
