"""``exo-deploy list / deploy / scale / undeploy / history`` against a real master: output,
messages and exit codes.

Scripts rely on the exit codes (0 done, 1 refused with the master's message on stderr, 2 bad
usage, 3 master unreachable), so each is pinned here against a master serving its real API on
a loopback port (in a background thread), with and without a token.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.abc import TaskStatus
from anyio.from_thread import start_blocking_portal
from model_ids import LLAMA, QWEN
from process_helpers import free_port, wait_for

from keeper.cli import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, build_parser, main
from keeper.cli.deployments import format_history
from keeper.model.api_models import DeploymentHistoryResponse, IncidentChats, IncidentView
from keeper.model.catalog import catalog_by_id
from keeper.model.state import RecoveryPhases
from keeper.sim.cluster import local
from keeper.sim.cluster.local import LocalCluster
from keeper.sim.master.server import serve
from keeper.sim.master.service import Master, MasterConfig
from keeper.sim.node import node_process
from keeper.sim.node.sim_node import DEFAULT_DISK_GB, DEFAULT_DOWNLOAD_MB_PER_S, NodeConfig

QWEN_30B = "mlx-community/Qwen3-30B-A3B-4bit"
TOKEN = "s3cret-token"
DISK_OPTIONS = ("disk_gb", "download_mb_per_s", "has_models")


def _serve_in_thread(token: str | None, config: MasterConfig | None = None) -> Iterator[str]:
    with start_blocking_portal(backend="asyncio") as portal:

        async def run(*, task_status: TaskStatus[int]) -> None:
            await serve(Master(None, config=config), "127.0.0.1", 0, token, task_status=task_status)

        future, port = portal.start_task(run)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            future.cancel()


@pytest.fixture(scope="module")
def master_url() -> Iterator[str]:
    yield from _serve_in_thread(None)


@pytest.fixture
def new_master_url() -> Iterator[str]:
    """A master started for the one test: still within its start-up grace (15 s) as it runs,
    however long the module's shared master has been up."""
    yield from _serve_in_thread(None)


@pytest.fixture(scope="module")
def stepping_url() -> Iterator[str]:
    """A master that steps its keeper from the start (no grace): what placement says of a
    deployment is known within a second."""
    yield from _serve_in_thread(None, MasterConfig(startup_grace_s=0.0))


@pytest.fixture(scope="module")
def guarded_url() -> Iterator[str]:
    yield from _serve_in_thread(TOKEN)


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_DEPLOY_TOKEN", raising=False)
    monkeypatch.delenv("EXO_DEPLOY_URL", raising=False)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exited.value.code
    assert isinstance(code, int)
    return code, out, err


def test_unreachable_master_exits_3_and_says_where(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (["list"], ["deploy", QWEN], ["scale", "some-id", "2"], ["undeploy", "some-id"]):
        code, out, err = run_cli(capsys, *argv, "--url", url)
        assert code == EXIT_UNREACHABLE
        assert out == ""
        assert f"cannot reach the master at {url}" in err


def test_deploy_list_undeploy_round_trip(
    new_master_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "deploy", QWEN, "--url", new_master_url)
    assert (code, err) == (EXIT_OK, "")
    assert out.startswith(f"Deployment of {QWEN} created: ")
    deployment_id = out.strip().rsplit(" ", 1)[1]

    code, out, _ = run_cli(capsys, "list", "--url", new_master_url)
    assert code == EXIT_OK
    header, row = out.strip().splitlines()
    assert header.split()[:5] == ["DEPLOYMENT", "MODEL", "STATUS", "READY", "INSTANCE"]
    assert row.split()[:4] == [deployment_id, QWEN, "placing", "0/1"]
    assert "grace" in row  # a new master waits before placing, and the list says why

    code, out, _ = run_cli(capsys, "list", "--url", new_master_url, "--json")
    assert code == EXIT_OK
    (view,) = json.loads(out)["deployments"]
    assert view["deployment"]["deploymentId"] == deployment_id
    assert view["status"] == "placing"

    code, out, err = run_cli(capsys, "undeploy", deployment_id, "--url", new_master_url)
    assert (code, err) == (EXIT_OK, "")
    assert deployment_id in out
    code, out, _ = run_cli(capsys, "list", "--url", new_master_url)
    assert (code, out.strip()) == (EXIT_OK, "no deployments")


def test_deploy_with_replicas_then_scale(
    master_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "mlx-community/Llama-3.2-3B-Instruct-4bit"
    code, out, err = run_cli(capsys, "deploy", model, "--replicas", "3", "--url", master_url)
    assert (code, err) == (EXIT_OK, "")
    deployment_id = out.strip().rsplit(" ", 1)[1]
    code, out, _ = run_cli(capsys, "list", "--url", master_url)
    row = next(line for line in out.splitlines() if line.startswith(deployment_id))
    assert row.split()[3] == "0/3"

    code, out, err = run_cli(capsys, "scale", deployment_id, "2", "--url", master_url)
    assert (code, err) == (EXIT_OK, "")
    assert out.strip() == f"Deployment of {model} scaled from 3 to 2 replica(s): {deployment_id}"
    code, out, _ = run_cli(capsys, "scale", deployment_id, "2", "--url", master_url, "--json")
    assert code == EXIT_OK
    answer = json.loads(out)
    assert answer["deployment_id"] == deployment_id
    assert "already keeps 2" in answer["message"]
    code, out, _ = run_cli(capsys, "list", "--url", master_url, "--json")
    (view,) = [
        v
        for v in json.loads(out)["deployments"]
        if v["deployment"]["deploymentId"] == deployment_id
    ]
    assert (view["replicas"], view["readyReplicas"]) == (2, 0)

    code, out, err = run_cli(capsys, "scale", deployment_id, "17", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "replicas: Input should be less than or equal to 16" in err
    code, out, err = run_cli(capsys, "scale", "nope", "2", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "Deployment 'nope' not found" in err
    assert run_cli(capsys, "undeploy", deployment_id, "--url", master_url)[0] == EXIT_OK


def test_deploy_with_a_priority_then_set_it_and_its_refusals(
    master_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "mlx-community/Qwen3-8B-4bit"
    argv = ("deploy", model, "--priority", "900", "--preempt", "--url", master_url)
    code, out, err = run_cli(capsys, *argv)
    assert (code, err) == (EXIT_OK, "")
    deployment_id = out.strip().rsplit(" ", 1)[1]

    def shown() -> tuple[int, bool, str]:
        code, out, _ = run_cli(capsys, "list", "--url", master_url, "--json")
        assert code == EXIT_OK
        (view,) = [
            v
            for v in json.loads(out)["deployments"]
            if v["deployment"]["deploymentId"] == deployment_id
        ]
        code, table, _ = run_cli(capsys, "list", "--url", master_url)
        header, *rows = table.strip().splitlines()
        assert header.split()[5] == "PRIORITY"
        (row,) = [r for r in rows if r.startswith(deployment_id)]
        return view["deployment"]["priority"], view["deployment"]["preempt"], row

    priority, preempt, row = shown()
    assert (priority, preempt) == (900, True)
    assert "900 preempts" in row

    code, out, err = run_cli(capsys, "set", deployment_id, "--priority", "200", "--url", master_url)
    assert (code, err) == (EXIT_OK, "")
    assert "now has priority 200, preempting, was priority 900, preempting" in out
    code, out, err = run_cli(capsys, "set", deployment_id, "--no-preempt", "--url", master_url)
    assert (code, err) == (EXIT_OK, "")
    priority, preempt, row = shown()
    assert (priority, preempt) == (200, False)
    assert "preempts" not in row
    code, out, err = run_cli(
        capsys, "set", deployment_id, "--preempt", "--standby", "0", "--url", master_url
    )
    assert (code, err) == (EXIT_OK, "")
    assert "standby" in out and "priority 200, preempting" in out
    assert shown()[:2] == (200, True)

    code, out, err = run_cli(
        capsys, "set", deployment_id, "--priority", "1001", "--url", master_url
    )
    assert (code, out) == (EXIT_REFUSED, "")
    assert "priority: Input should be less than or equal to 1000" in err
    code, out, err = run_cli(capsys, "deploy", LLAMA, "--priority", "-1", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "priority: Input should be greater than or equal to 0" in err
    code, out, err = run_cli(capsys, "set", "nope", "--priority", "3", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "Deployment 'nope' not found" in err
    assert shown()[:2] == (200, True)  # refused: nothing changed
    assert run_cli(capsys, "undeploy", deployment_id, "--url", master_url)[0] == EXIT_OK


def test_deploy_with_standby_and_its_refusal(
    master_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "mlx-community/Llama-3.2-3B-Instruct-4bit"
    code, out, err = run_cli(capsys, "deploy", model, "--standby", "5", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "standby: Input should be less than or equal to 4" in err
    code, out, err = run_cli(capsys, "deploy", model, "--standby", "2", "--url", master_url)
    assert (code, err) == (EXIT_OK, "")
    deployment_id = out.strip().rsplit(" ", 1)[1]
    code, out, _ = run_cli(capsys, "list", "--url", master_url, "--json")
    (view,) = [
        v
        for v in json.loads(out)["deployments"]
        if v["deployment"]["deploymentId"] == deployment_id
    ]
    assert view["deployment"]["standby"] == 2
    assert run_cli(capsys, "undeploy", deployment_id, "--url", master_url)[0] == EXIT_OK


def test_history_prints_the_figures_and_refusals_exit_1(
    stepping_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "mlx-community/Llama-3.2-3B-Instruct-4bit"
    code, out, _ = run_cli(capsys, "deploy", model, "--url", stepping_url)
    deployment_id = out.strip().rsplit(" ", 1)[1]

    # This master has no nodes: once the keeper has stepped, placement has said why the model
    # cannot start, and a start placement explained is an incident from the deployment's
    # creation (before that step the history reads "has not served", as the next test pins).
    def explained() -> list[str] | None:
        code, out, err = run_cli(capsys, "history", deployment_id, "--url", stepping_url)
        assert (code, err) == (EXIT_OK, "")
        lines = out.strip().splitlines()
        return lines if "1 incident(s)" in lines[0] else None

    header, columns, incident = wait_for("the keeper's verdict in the history", 10, explained)
    assert header == f"{deployment_id}: last 24 h, available 0.00%, 1 incident(s)"
    assert columns.split() == ["START", "END", "DOWN", "RECOVERY", "CHATS", "CAUSE"]
    assert incident.split()[1] == "ongoing"
    assert incident.split()[5] == "none"  # the master counts its chats: none met it
    assert "unplaceable: " in incident
    code, out, _ = run_cli(
        capsys, "history", deployment_id, "--hours", "2.5", "--url", stepping_url, "--json"
    )
    assert code == EXIT_OK
    assert json.loads(out)["windowHours"] == 2.5
    code, out, err = run_cli(
        capsys, "history", deployment_id, "--hours", "0", "--url", stepping_url
    )
    assert (code, out) == (EXIT_REFUSED, "")
    assert "hours" in err
    code, out, err = run_cli(capsys, "history", "nope", "--url", stepping_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "Deployment 'nope' not found" in err
    assert run_cli(capsys, "undeploy", deployment_id, "--url", stepping_url)[0] == EXIT_OK


def test_history_of_a_deployment_that_has_not_served_says_so() -> None:
    # Created, never served and no verdict yet: a start-up is no incident, and no availability.
    history = DeploymentHistoryResponse(
        deployment_id="d1", window_hours=24, availability=None, incidents=[], mttr_s=None
    )
    assert format_history(history) == "d1: has not served in the last 24 h"


def test_history_lists_incidents_newest_first_with_their_cause() -> None:
    history = DeploymentHistoryResponse(
        deployment_id="d1",
        window_hours=24,
        availability=0.991,
        incidents=[
            IncidentView(
                start="2026-11-30T01:00:00.000Z",
                end="2026-11-30T01:00:33.200Z",
                downtime_s=33.2,
                cause="node studio timed out",
                phases=RecoveryPhases(detected=30.0, placed=0.05, downloaded=0.0, loaded=3.2),
                chats=IncidentChats(held=12, failed=1),
            ),
            IncidentView(
                start="2026-11-30T02:00:00.000Z", end=None, downtime_s=5.0, cause="unplaceable: x"
            ),
        ],
        mttr_s=33.2,
    )
    assert format_history(history).splitlines() == [
        "d1: last 24 h, available 99.10%, 2 incident(s), MTTR 33.2 s",
        "START                     END                       DOWN    RECOVERY"
        "                                      CHATS              CAUSE",
        "2026-11-30T02:00:00.000Z  ongoing                   5.0 s   -"
        "                                             -                  unplaceable: x",
        "2026-11-30T01:00:00.000Z  2026-11-30T01:00:33.200Z  33.2 s  "
        "detected 30.0 s, placed 0.05 s, loaded 3.2 s  12 held, 1 failed  node studio timed out",
    ]


def test_refusals_exit_1_with_the_masters_message(
    master_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "deploy", "no-such/model", "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert "exo-deploy deploy: Unknown model 'no-such/model'" in err

    code, out, _ = run_cli(capsys, "deploy", LLAMA, "--url", master_url, "--json")
    assert code == EXIT_OK
    deployment_id = json.loads(out)["deployment_id"]
    code, out, err = run_cli(capsys, "deploy", LLAMA, "--url", master_url)
    assert (code, out) == (EXIT_REFUSED, "")
    assert f"already has deployment {deployment_id}" in err

    code, _, err = run_cli(capsys, "deploy", LLAMA, "--min-nodes", "999", "--url", master_url)
    assert code == EXIT_REFUSED
    assert "min_nodes" in err

    code, _, err = run_cli(capsys, "undeploy", "nope", "--url", master_url, "--json")
    assert code == EXIT_REFUSED
    assert "Deployment 'nope' not found" in err
    assert run_cli(capsys, "undeploy", deployment_id, "--url", master_url)[0] == EXIT_OK


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    cases = [
        (["deploy"], "MODEL"),
        (["deploy", QWEN, "--min-nodes", "0"], "must be at least 1"),
        (["deploy", QWEN, "--sharding", "Diagonal"], "invalid choice"),
        (["deploy", QWEN, "--replicas", "0"], "must be at least 1"),
        (["deploy", QWEN, "--replicas", "two"], "not a whole number"),
        (["scale", "some-id"], "N"),
        (["scale", "some-id", "0"], "must be at least 1"),
        (["scale", "some-id", "-1"], "must be at least 1"),
        (["scale", "some-id", "1.5"], "not a whole number"),
        (["deploy", QWEN, "--priority", "high"], "not a whole number"),
        (["set", "some-id"], "give one at least of --replicas, --standby, --priority,"),
        (["set", "some-id", "--preempt", "--no-preempt"], "not allowed with argument"),
        (["set", "some-id", "--priority", "1.5"], "not a whole number"),
        (["node"], "--master"),
        (["node", "--master", "http://x", "--backends", "MlxQuantum"], "unknown backend"),
        (["cluster", "--nodes", "0"], "must be at least 1"),
        (["node", "--master", "http://x", "--has", "nobody/nothing"], "unknown model"),
        (["cluster", "--download-mb-s", "0"], "must be more than 0"),
        (["node", "--master", "http://x", "--disk-gb", "-5"], "must be more than 0"),
        (["node", "--master", "http://x", "--disk-gb", "10", "--has", QWEN_30B], "10.0 GiB disk"),
        (["cluster", "--disk-gb", "10", "--has", f"{QWEN},{QWEN_30B}"], "take 16.7 GiB, more"),
        (["frobnicate"], "invalid choice"),
        (["list", "--url", "ftp://example.invalid"], "not a master URL"),
    ]
    for argv, message in cases:
        code, _, err = run_cli(capsys, *argv)
        assert code == EXIT_USAGE, argv
        assert message in err, (argv, err)


def test_node_disk_flags_reach_its_config(monkeypatch: pytest.MonkeyPatch) -> None:
    configs: list[NodeConfig] = []

    def run_node(
        config: NodeConfig, master: str, token: str | None, fault_file: Path | None
    ) -> int:
        configs.append(config)
        return EXIT_OK

    monkeypatch.setattr(node_process, "run_node_process", run_node)
    argv = ["node", "--master", "http://x", "--name", "n"]
    disk = ["--disk-gb", "50", "--download-mb-s", "300", "--has", f"{QWEN}, {LLAMA},{QWEN}"]
    for given in (argv, argv + disk):
        args = build_parser().parse_args(given)
        assert args.handler(args) == EXIT_OK
    default, told = configs
    assert (default.disk_gb, default.download_mb_per_s, default.has_models) == (
        DEFAULT_DISK_GB,
        DEFAULT_DOWNLOAD_MB_PER_S,
        (),
    )
    assert (told.disk_gb, told.download_mb_per_s) == (50.0, 300.0)
    assert [card.model_id for card in told.has_models] == [QWEN, LLAMA]  # once each
    assert told.has_models[0] == catalog_by_id()[QWEN]


def test_cluster_passes_the_disk_flags_to_every_node(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    runs: list[dict[str, Any]] = []

    def run(nodes: int, port: int, data_dir: Path, **options: Any) -> int:
        runs.append(options)
        return EXIT_OK

    monkeypatch.setattr(local, "run_cluster", run)
    given = ["--data-dir", str(tmp_path), "--disk-gb", "64", "--download-mb-s", "150"]
    args = build_parser().parse_args(["cluster", *given, "--has", QWEN])
    assert args.handler(args) == EXIT_OK
    (options,) = runs
    assert (options["disk_gb"], options["download_mb_per_s"]) == (64.0, 150.0)
    assert options["has_models"] == (QWEN,)
    # Each node process is started with them, and reads them back as given.
    cluster = LocalCluster(3, 1, tmp_path, **{k: options[k] for k in DISK_OPTIONS})
    for name in cluster.node_names():
        argv = cluster._node_argv(name, 16, 4242)  # pyright: ignore[reportPrivateUsage]
        node = build_parser().parse_args(argv[argv.index("node") :])
        assert (node.disk_gb, node.download_mb_s) == (64.0, 150.0)
        assert [card.model_id for card in node.has] == [QWEN]
    plain = LocalCluster(1, 1, tmp_path)._node_argv("node-1", 16, 4242)  # pyright: ignore[reportPrivateUsage]
    assert not {"--disk-gb", "--download-mb-s", "--has"} & set(plain)  # the node's defaults


def test_soak_commands_take_their_own_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("soak", "soak-sim"):
        code, _, err = run_cli(capsys, name, "--minutes" if name == "soak" else "--hours", "1")
        assert code == EXIT_USAGE, name
        assert "--report" in err, (name, err)
    code, out, _ = run_cli(capsys, "--help")
    assert code == EXIT_OK
    assert "soak-sim" in out


def test_soak_sim_without_trio_says_how_to_get_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "trio.testing", None)  # as if trio were not installed
    report = tmp_path / "report.json"
    code, _, err = run_cli(capsys, "soak-sim", "--hours", "1", "--report", str(report))
    assert code == EXIT_USAGE
    assert "exo-deploy soak-sim needs trio: pip install 'exo-deploy[sim]'" in err
    assert not report.exists()


def test_a_token_is_sent_when_given(
    guarded_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = run_cli(capsys, "deploy", QWEN, "--url", guarded_url)
    assert code == EXIT_REFUSED
    assert "token" in err.lower()
    code, out, _ = run_cli(capsys, "deploy", QWEN, "--url", guarded_url, "--token", TOKEN)
    assert code == EXIT_OK
    deployment_id = out.strip().rsplit(" ", 1)[1]
    monkeypatch.setenv("EXO_DEPLOY_TOKEN", TOKEN)  # read when the parser is built
    assert run_cli(capsys, "undeploy", deployment_id, "--url", guarded_url)[0] == EXIT_OK


def test_help_names_the_exit_codes_and_module_entry_works() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "keeper.cli", "deploy", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0
    assert "3  the master could not be reached" in done.stdout
    assert "1  refused by the master" in done.stdout
