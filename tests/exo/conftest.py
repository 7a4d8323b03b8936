"""tests/exo: ``make test-exo``, the bridge against a real exo cluster the machine already runs.

The tier is not part of ``make test`` (tests/conftest.py leaves this folder out unless it is
named), since it needs a cluster: its URLs come from the environment, never from a path of the
machine that hosts it, so a clone without the cluster only gets told what to set:

- ``EXO_DEPLOY_EXO_URLS``: every exo node's API, comma-separated;
- ``EXO_DEPLOY_EXO_CONTROL``: the control API that kills, freezes and restarts them
  (tests/exo_cluster.py lists its routes);
- ``EXO_DEPLOY_EXO_MODEL`` (optional): the model to deploy, a small one (default
  ``exo-harness/tiny-llama``);
- ``EXO_DEPLOY_EXO_REPORT`` (optional): where the run's figures go as JSON.

One cluster and one bridge serve the whole session, as an operator's would: the scenarios run in
file order, each starting from a whole cluster (``restored``, before and after each test). Each
scenario records its figures; they are written to the JSON report at the end and its path is
printed, so a run's figures can be pasted into docs/measurements.md.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from exo_cluster import DEFAULT_MODEL, Bridge, ExoCluster, running_bridge
from process_helpers import run_cli

URLS_VAR = "EXO_DEPLOY_EXO_URLS"
CONTROL_VAR = "EXO_DEPLOY_EXO_CONTROL"
MODEL_VAR = "EXO_DEPLOY_EXO_MODEL"
REPORT_VAR = "EXO_DEPLOY_EXO_REPORT"


def pytest_configure(config: pytest.Config) -> None:
    missing = [v for v in (URLS_VAR, CONTROL_VAR) if not os.environ.get(v)]
    if missing:
        raise pytest.UsageError(
            "tests/exo runs against a real exo cluster: set "
            + " and ".join(missing)
            + f" ({URLS_VAR}=http://HOST:PORT,... every exo node's API; {CONTROL_VAR}=http://"
            "HOST:PORT the control API that kills, freezes and restarts them)"
        )
    config.addinivalue_line(
        "markers",
        "starts_after_a_kill: the scenario starts from the node the one before it killed",
    )
    config.stash[REPORT_KEY] = Report(_report_path())


def _report_path() -> Path:
    given = os.environ.get(REPORT_VAR)
    if given:
        return Path(given)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path(tempfile.gettempdir()) / "exo-deploy-test-exo" / f"report-{stamp}.json"


class Report:
    """The run's figures, by scenario, written as JSON at the end of the session."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.scenarios: dict[str, dict[str, Any]] = {}
        self.started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def record(self, scenario: str, **figures: Any) -> None:
        self.scenarios.setdefault(scenario, {}).update(figures)

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "started": self.started,
            "machine": {
                "cores": os.cpu_count(),
                "load_average": [round(x, 2) for x in os.getloadavg()],
                "platform": platform.platform(),
                "nice": os.nice(0),
            },
            "exo_urls": os.environ.get(URLS_VAR, ""),
            "scenarios": self.scenarios,
        }
        self.path.write_text(json.dumps(body, indent=2) + "\n")


REPORT_KEY = pytest.StashKey[Report]()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(REPORT_KEY, None)
    if report is None:
        return
    if not report.scenarios:
        return
    report.write()
    terminalreporter.write_sep("-", "make test-exo figures")
    for name, figures in report.scenarios.items():
        terminalreporter.write_line(f"{name}: {json.dumps(figures)}")
    terminalreporter.write_line(f"figures written to {report.path}")


@pytest.fixture(scope="session")
def report(request: pytest.FixtureRequest) -> Report:
    return request.config.stash[REPORT_KEY]


@pytest.fixture(scope="session")
def cluster() -> ExoCluster:
    urls = [u.strip().rstrip("/") for u in os.environ[URLS_VAR].split(",") if u.strip()]
    model = os.environ.get(MODEL_VAR) or DEFAULT_MODEL
    return ExoCluster(urls, os.environ[CONTROL_VAR], model)


@pytest.fixture(scope="session")
def bridge(cluster: ExoCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bridge]:
    """One bridge for the session, started on a whole cluster with none of the model's
    instances left from before (an instance placed by hand would be the bridge's to count)."""
    cluster.restore()
    cluster.clear()
    with running_bridge(cluster, tmp_path_factory.mktemp("exo-bridge")) as running:
        try:
            yield running
        finally:
            cluster.restore()
            # What the bridge placed goes with it: the next run starts from no instance.
            listed = running.get("/deployments") or {"deployments": []}
            for view in listed["deployments"]:
                run_cli("undeploy", view["deployment"]["deploymentId"], "--url", running.url)
            cluster.clear()


@pytest.fixture(autouse=True)
def restored(cluster: ExoCluster, request: pytest.FixtureRequest, report: Report) -> None:
    """Each scenario starts on a whole cluster, but one that starts from the node the scenario
    before it killed; the nodes still catching up with the master's log are reported."""
    if request.node.get_closest_marker("starts_after_a_kill") is None:
        cluster.restore()
        report.record("nodes catching up at the start", **{request.node.name: cluster.lagging})
        if cluster.healed:
            report.record("nodes restarted to end a split", **{request.node.name: cluster.healed})
            cluster.healed = []
