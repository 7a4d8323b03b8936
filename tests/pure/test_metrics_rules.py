"""``GET /metrics``'s pure parts and its shipped files: node liveness (the rule the TUI and
the metrics share), the incident tally (each incident and recovery counted
once, from the service's start), and every metric name the Grafana dashboard and the alerting
rules use is one the exporter exports, and the rules are checked as promtool checks them: in
Python everywhere (each selector's labels and values exist, each duration parses, each template
names a label the alert has), and by ``promtool check rules`` itself where ``make`` could unpack
Debian's promtool (where apt is), which also replays scrapes through them (a node outage, and
chats failing through the front door)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from keeper_harness import build_instance, card, node_info
from metrics_scrape import Samples, parse, value
from prometheus_client import CollectorRegistry, generate_latest

from keeper.bridge.metrics import ExoCollector, ExoFacts
from keeper.model.api_models import HealthView, WebhookEndpointHealth, WebhooksHealth
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    InstanceCreated,
    NodeConfirmedDead,
    NodeDownloadProgress,
    NodeSuspected,
    RunnerStatusUpdated,
)
from keeper.model.history import TimedEvent, replay, summarize
from keeper.model.liveness import SILENT_AFTER_S, node_liveness, nodes_by_state
from keeper.model.request_rule import OUTCOMES
from keeper.model.state import (
    Deployment,
    DownloadCompleted,
    Memory,
    NodeIdentity,
    RecoveryPhases,
    RunnerReady,
    ServingRecord,
    State,
    Topology,
)
from keeper.runtime.deployments import deployment_views
from keeper.runtime.metrics import (
    PHASE_BUCKETS_S,
    MetricsSnapshot,
    PhaseCounts,
    RecoveryCounts,
    ServiceMetrics,
    WebhookCollector,
    tally,
)
from keeper.runtime.request_counts import RequestCounts
from keeper.sim.master.chat_routing import ChatCounts
from keeper.sim.master.metrics import ChatCollector

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "exo-deploy.json"
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = ROOT / "tests" / "fixtures" / "prometheus" / "alerts_test.yml"
REQUEST_RULE_TESTS = ROOT / "tests" / "fixtures" / "prometheus" / "requests_failing_test.yml"
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


def _exposition() -> tuple[Samples, set[str]]:
    """(every sample, histogram family names) of a master's and a bridge's families together,
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
    requests = RequestCounts(metrics.registry)  # the front door's, as the bridge mounts it
    for outcome in OUTCOMES:
        requests.count("d1", outcome, None, 0.0)
    text = metrics.exposition_now().decode()
    families, samples = parse(text)
    histograms = {
        line.split()[2]
        for line in text.splitlines()
        if line.startswith("# TYPE") and line.endswith(" histogram")
    }
    assert families  # parsed at all
    return samples, histograms


def _every_family_exported() -> tuple[set[str], set[str]]:
    """(sample names, histogram family names) of everything exported."""
    samples, histograms = _exposition()
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
        "ExoDeployDeploymentOutage",
        "ExoDeployDeploymentAtRisk",
        "ExoDeployReplicasShort",
        "ExoDeployExoUnreadable",
        "ExoDeployNodeSilent",
        "ExoDeployRequestsFailing",
    }


# --- the rules, checked without promtool ----------------------------------------------------

# A Prometheus duration ("2m", "1h30m", "500ms"): units from the largest, each at most once.
_DURATION = re.compile(r"^(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?$")
# A metric selector with its label matchers: name{label="value", other!~"re"}.
_SELECTOR = re.compile(r"(?<![\w:])(exo_deploy_[\w:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r'\s*([a-zA-Z_]\w*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')
# A range or subquery: [2m], [5m:30s].
_RANGE = re.compile(r"\[([^\]:]+)(?::([^\]]*))?\]")
# A template's reference to one of the alert's labels: {{ $labels.model }}.
_LABEL_REF = re.compile(r"\$labels\.(\w+)")
# The labels Prometheus adds to every series it scrapes (its target's), beyond the exporter's.
TARGET_LABELS = frozenset({"instance", "job"})
# The keys a Prometheus alerting rule may have, and the severities deploy/README.md routes on.
RULE_KEYS = frozenset({"alert", "expr", "for", "keep_firing_for", "labels", "annotations"})
SEVERITIES = frozenset({"critical", "warning"})


def _rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    assert set(document) == {"groups"}
    rules: list[dict[str, Any]] = []
    for group in document["groups"]:
        assert set(group) <= {"name", "interval", "rules", "limit"} and group["name"]
        rules.extend(group["rules"])
    return rules


def _labels_of(samples: Samples, name: str) -> list[dict[str, str]]:
    """The label sets ``name`` is exported with (a histogram's series by their family)."""
    return [dict(labels) for sample, labels in samples if sample == name]


def _is_duration(text: str) -> bool:
    return bool(text) and _DURATION.match(text.strip()) is not None


def test_the_duration_reader_takes_prometheus_durations_only() -> None:
    for good in ("2m", "1h30m", "500ms", "1y2w3d4h5m6s7ms", "0s"):
        assert _is_duration(good), good
    for bad in ("", "2", "m", "2 m", "1.5m", "30m1h", "2min", "-1m"):
        assert not _is_duration(bad), bad


def test_each_rule_is_well_formed_and_its_durations_parse() -> None:
    rules = _rules()
    assert len(rules) == 7  # what promtool reports below, where it runs
    for rule in rules:
        name = rule.get("alert")
        assert isinstance(name, str) and name, rule
        assert set(rule) <= RULE_KEYS, (name, set(rule) - RULE_KEYS)
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), name
        for key in ("for", "keep_firing_for"):
            if key in rule:
                assert _is_duration(str(rule[key])), (name, key, rule[key])
        for window, step in _RANGE.findall(rule["expr"]):
            assert _is_duration(window), (name, window)
            assert not step or _is_duration(step), (name, step)
        assert rule["expr"].count("(") == rule["expr"].count(")"), name
        assert rule["labels"]["severity"] in SEVERITIES, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name


def test_each_selector_matches_labels_and_values_the_exporter_exports() -> None:
    samples, _ = _exposition()
    selectors = 0
    for rule in _rules():
        for name, matchers in _SELECTOR.findall(rule["expr"]):
            exported = _labels_of(samples, name)
            assert exported, (rule["alert"], name)
            parsed = _MATCHER.findall(matchers)
            assert "".join(m.group(0) for m in _MATCHER.finditer(matchers)).strip() == (
                matchers.strip()
            ), (rule["alert"], matchers)  # every matcher understood
            for label, operator, wanted in parsed:
                selectors += 1
                assert any(label in labels for labels in exported), (rule["alert"], name, label)
                if operator == "=":
                    values = {labels.get(label) for labels in exported}
                    assert wanted in values, (rule["alert"], name, label, wanted, values)
    assert selectors >= 3  # status="serving", state="silent", outcome="failed"


def test_each_template_names_a_label_its_alert_carries() -> None:
    samples, _ = _exposition()
    for rule in _rules():
        carried = set(TARGET_LABELS)
        for name in metric_names(rule["expr"]):
            for labels in _labels_of(samples, name):
                carried |= set(labels)
        texts = [*rule["annotations"].values(), *rule["labels"].values()]
        used = {label for text in texts for label in _LABEL_REF.findall(str(text))}
        assert used <= carried, (rule["alert"], sorted(used - carried))


def test_failing_chats_alert_per_deployment_over_minutes_not_one_chat() -> None:
    """Where promtool is missing, the shape of ExoDeployRequestsFailing that its rule tests
    (requests_failing_test.yml) replay: failed chats as a rate over minutes, per deployment
    and service, against a share of the chats that excludes cancellations and rejections, with
    a "for", and words that name the deployment and what to run."""
    (rule,) = [r for r in _rules() if r["alert"] == "ExoDeployRequestsFailing"]
    expr = " ".join(rule["expr"].split())
    assert expr.count('exo_deploy_requests_total{outcome="failed",deployment!=""}') == 2
    assert 'outcome!~"cancelled|rejected"' in expr
    assert expr.count("sum by (job, instance, deployment) (") == 3
    assert {window for window, _ in _RANGE.findall(expr)} == {"5m"}
    assert rule["for"] == "5m" and rule["labels"]["severity"] == "critical"
    assert "{{ $labels.deployment }}" in rule["annotations"]["summary"]
    assert "exo-deploy history {{ $labels.deployment }}" in rule["annotations"]["description"]


def _promtool() -> str | None:
    """promtool in the venv (``make``'s install step unpacks Debian's there where apt is), else
    on PATH."""
    beside = Path(sys.executable).parent / "promtool"
    return str(beside) if beside.is_file() else shutil.which("promtool")


@pytest.mark.skipif(
    _promtool() is None, reason="no promtool: `make` unpacks one where apt is; checked above"
)
def test_promtool_accepts_the_rules() -> None:
    promtool = _promtool()
    assert promtool is not None
    checked = subprocess.run(
        [promtool, "check", "rules", str(RULES)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


@pytest.mark.skipif(_promtool() is None, reason="promtool is not installed")
@pytest.mark.parametrize("replayed", [RULE_TESTS, REQUEST_RULE_TESTS], ids=lambda p: p.stem)
def test_the_rules_fire_as_promtools_rule_tests_replay_them(replayed: Path) -> None:
    """tests/fixtures/prometheus/alerts_test.yml: what a 15 s scrape reads around a node lost
    and failed over in seconds (at risk, then an incident no scrape saw down) and one lost with
    no room for a replacement (not serving from the verdict on); requests_failing_test.yml:
    chats failing through the front door (fires after its 5 minutes), and neither a busy
    deployment's few failures, one flaky chat, a trickle, nor a model with no deployment."""
    promtool = _promtool()
    assert promtool is not None
    tested = subprocess.run(
        [promtool, "test", "rules", str(replayed)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


# --- a node outage, scraped (docs/design.md §5.18, "Honest clocks") -------------------------


def _outage_scrapes() -> list[Samples]:
    """GET /metrics at each moment of a node outage on our master's rules: serving on studio;
    studio suspect (last heard at 100); confirmed dead at 108; a replacement on mini-a placed
    at 108.5, its download done at 112, ready at 115."""
    log: list[TimedEvent] = []

    def at(when: float, *events: AnyEvent) -> None:
        log.extend(TimedEvent(idx=len(log) + i, at=when, event=e) for i, e in enumerate(events))

    deployment = Deployment(deployment_id="d1", model_card=card(MODEL))
    shard = next(
        iter(
            build_instance(card(MODEL), ["n-mini"], "x").shard_assignments.runner_to_shard.values()
        )
    )
    at(0.0, node_info("n-studio"), node_info("n-mini"), DeploymentCreated(deployment=deployment))
    at(1.0, InstanceCreated(instance=build_instance(card(MODEL), ["n-studio"], "i1")))
    at(5.0, RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerReady()))
    moments: list[tuple[float, list[AnyEvent]]] = [
        (50.0, []),
        (103.0, [NodeSuspected(node_id="n-studio", last_heard=100.0, at=103.0)]),
        (108.0, [NodeConfirmedDead(node_id="n-studio", last_heard=100.0, at=108.0, why="x")]),
        (108.5, [InstanceCreated(instance=build_instance(card(MODEL), ["n-mini"], "i2"))]),
        (
            112.0,
            [
                NodeDownloadProgress(
                    download_progress=DownloadCompleted(
                        node_id="n-mini", shard_metadata=shard, total=Memory(in_bytes=1)
                    )
                )
            ],
        ),
        (115.0, [RunnerStatusUpdated(runner_id="i2-runner-0", runner_status=RunnerReady())]),
    ]
    state = replay(log)
    snapshot = [MetricsSnapshot(state, [], 0.0, 0.0)]
    # The service's clock moves past a body's age at each moment: every scrape builds afresh.
    clock = [0.0]
    metrics = ServiceMetrics(lambda: snapshot[0], lambda: clock[0])
    scrapes: list[Samples] = []
    for when, events in moments:
        timed = [TimedEvent(idx=len(log) + i, at=when, event=e) for i, e in enumerate(events)]
        log.extend(timed)
        state = replay(timed, state)
        views = deployment_views(state, None, None)
        snapshot[0] = MetricsSnapshot(state=state, deployments=views, now=when, started_at=0.0)
        clock[0] = when
        scrapes.append(parse(metrics.exposition_now().decode())[1])
    return scrapes


def test_a_node_outage_is_at_risk_then_not_serving_then_one_incident_with_its_phases() -> None:
    labels = {"deployment": "d1", "model": MODEL}
    scrapes = _outage_scrapes()

    def series(name: str, **more: str) -> list[float]:
        return [value(samples, name, **labels, **more) for samples in scrapes]

    assert series("exo_deploy_deployment_at_risk") == [0, 1, 0, 0, 0, 0]
    assert series("exo_deploy_deployment_status", status="serving") == [1, 1, 0, 0, 0, 1]
    assert series("exo_deploy_deployment_replicas_ready") == [1, 1, 0, 0, 0, 1]
    assert series("exo_deploy_deployment_incidents_total") == [0, 0, 1, 1, 1, 1]
    assert series("exo_deploy_deployment_recovery_seconds_count") == [0, 0, 0, 0, 0, 1]
    # One start (the last heartbeat, 100), one down time: 15 s, of which 8 s detection.
    assert (
        scrapes[-1][("exo_deploy_deployment_recovery_seconds_sum", frozenset(labels.items()))]
        == 15.0
    )
    last = scrapes[-1]
    phases = {
        phase: value(last, "exo_deploy_recovery_phase_seconds_sum", phase=phase)
        for phase in ("detected", "placed", "downloaded", "loaded")
    }
    assert phases == {"detected": 8.0, "placed": 0.5, "downloaded": 3.5, "loaded": 3.0}
    for phase, seconds in phases.items():
        assert value(last, "exo_deploy_recovery_phase_seconds_count", phase=phase) == 1
        for bound in PHASE_BUCKETS_S:
            bucket = value(
                last, "exo_deploy_recovery_phase_seconds_bucket", phase=phase, le=repr(bound)
            )
            assert bucket == (1 if seconds <= bound else 0), (phase, bound)
    assert value(scrapes[-2], "exo_deploy_recovery_phase_seconds_count", phase="loaded") == 0


def test_phase_counts_add_every_recovery_once_and_skip_one_without_phases() -> None:
    counts, phases = RecoveryCounts(), PhaseCounts()
    told = RecoveryPhases(detected=8.0, placed=0.5, downloaded=0.0, loaded=3.0)
    records = (
        ServingRecord(at=0.0, serving=True),
        ServingRecord(at=10.0, serving=False, cause="x", noticed=18.0),
        ServingRecord(at=21.5, serving=True, phases=told),
        ServingRecord(at=30.0, serving=False, cause="y"),
        ServingRecord(at=35.0, serving=True),  # no phases (an old record): counted as a recovery
    )
    history = summarize("d", records, window_start=0.0, window_end=40.0)
    tally(counts, history, 0.0, phases)
    tally(counts, history, 0.0, phases)  # again: nothing new
    assert counts.buckets[-1] == 2
    assert phases.sums == {"detected": 8.0, "placed": 0.5, "downloaded": 0.0, "loaded": 3.0}
    assert phases.buckets["placed"] == [0] + [1] * len(PHASE_BUCKETS_S)  # 0.5 <= 0.5
    assert phases.buckets["downloaded"] == [1] * (len(PHASE_BUCKETS_S) + 1)
    assert phases.buckets["detected"][-1] == 1


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
