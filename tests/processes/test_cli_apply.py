"""``exo-deploy apply -f FILE [--prune] [--dry-run]`` and ``exo-deploy export`` against a real
master on a loopback port (served from a background thread, a fresh one per test): what each
does to the master's deployments, what it prints, and the exit codes scripts rely on (0 done,
1 refused, 2 bad usage or a bad file, 3 unreachable). The plan's rules on their own are
tests/pure/test_apply_plan.py's.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from process_helpers import free_port
from test_cli import run_cli
from threaded_master import Served, served_master

from keeper.cli import EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE
from keeper.model.state import Deployment, InstanceMeta, Sharding
from keeper.sim.master.service import MasterConfig

QWEN_30B = "mlx-community/Qwen3-30B-A3B-4bit"
LLAMA = "mlx-community/Llama-3.2-1B-Instruct-4bit"
LLAMA_3B = "mlx-community/Llama-3.2-3B-Instruct-4bit"
# How long the exported file piped into apply may take, two interpreters starting included.
PIPE_TIMEOUT_S = 60.0

TWO = f"""\
version: 1
deployments:
  - model: {QWEN_30B}
    replicas: 3
    priority: 900
  - model: {LLAMA}
"""


@pytest.fixture
def served() -> Iterator[Served]:
    with served_master() as served:
        yield served


@pytest.fixture(autouse=True)
def _no_ambient_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EXO_DEPLOY_TOKEN", raising=False)
    monkeypatch.delenv("EXO_DEPLOY_URL", raising=False)


def write(tmp_path: Path, text: str, name: str = "deployments.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def by_model(served: Served) -> dict[str, Deployment]:
    return {d.model_card.model_id: d for d in served.master.state.deployments.values()}


def plan_lines(out: str) -> list[list[str]]:
    """The plan's lines that start a deployment, as words (the header and counts left out)."""
    lines = out.splitlines()
    end = next(i for i, line in enumerate(lines) if line.startswith("plan: "))
    return [line.split() for line in lines[1:end] if not line.startswith(" ")]


def test_apply_creates_and_a_second_apply_changes_nothing(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path, TWO)
    code, out, err = run_cli(capsys, "apply", "-f", file, "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert plan_lines(out) == [
        ["create", QWEN_30B, "replicas", "3,", "priority", "900"],
        ["create", LLAMA, "default", "settings"],
    ]
    assert "plan: 2 to create, 0 to change, 0 to delete, 0 unchanged" in out
    assert f"Deployment of {QWEN_30B} created: " in out
    kept = by_model(served)
    assert sorted(kept) == sorted([QWEN_30B, LLAMA])
    assert (kept[QWEN_30B].replicas, kept[QWEN_30B].priority) == (3, 900)
    assert (kept[LLAMA].replicas, kept[LLAMA].standby, kept[LLAMA].priority) == (1, 1, 500)

    code, out, err = run_cli(capsys, "apply", "-f", file, "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert [words[0] for words in plan_lines(out)] == ["unchanged", "unchanged"]
    assert out.splitlines()[-1] == "plan: 0 to create, 0 to change, 0 to delete, 2 unchanged"
    assert by_model(served) == kept


def test_a_change_goes_through_patch_and_a_field_left_out_is_its_default(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    ids = {model: d.deployment_id for model, d in by_model(served).items()}
    # replicas: 3 taken out of the file: back to 1; standby and preempt now set.
    changed = TWO.replace("    replicas: 3\n", "    standby: 0\n    preempt: true\n")
    code, out, err = run_cli(capsys, "apply", "-f", write(tmp_path, changed), "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert plan_lines(out) == [
        ["change", QWEN_30B, "replicas", "3", "->", "1,"],
        ["unchanged", LLAMA, "as", "the", "file", "asks"],
    ]
    # What does not fit the line continues under it, between two settings.
    assert "standby 1 -> 0, preempt false -> true" in out
    assert f"scaled from 3 to 1 replica(s): {ids[QWEN_30B]}" in out
    qwen = by_model(served)[QWEN_30B]
    assert qwen.deployment_id == ids[QWEN_30B]  # changed in place, not made again
    assert (qwen.replicas, qwen.standby, qwen.priority, qwen.preempt) == (1, 0, 900, True)


@pytest.mark.parametrize(
    ("setting", "line", "expected"),
    [
        ("sharding", "sharding: Tensor", Sharding.TENSOR),
        ("instance_meta", "instance_meta: MlxJaccl", InstanceMeta.MLX_JACCL),
        ("min_nodes", "min_nodes: 2", 2),
    ],
)
def test_a_placement_setting_changes_through_patch(
    served: Served,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    setting: str,
    line: str,
    expected: object,
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    before = by_model(served)[QWEN_30B]
    changed = TWO.replace("    priority: 900\n", f"    priority: 900\n    {line}\n")
    code, out, err = run_cli(capsys, "apply", "-f", write(tmp_path, changed), "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert plan_lines(out)[0][:3] == ["change", QWEN_30B, setting]
    after = by_model(served)[QWEN_30B]
    assert after.deployment_id == before.deployment_id
    assert getattr(after, setting) == expected
    code, out, _ = run_cli(capsys, "apply", "-f", write(tmp_path, changed), "--url", served.url)
    assert (code, [w[0] for w in plan_lines(out)]) == (EXIT_OK, ["unchanged", "unchanged"])


def test_prune_deletes_what_the_file_does_not_list_and_only_then(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    llama_id = by_model(served)[LLAMA].deployment_id
    only_qwen = write(tmp_path, TWO.replace(f"  - model: {LLAMA}\n", ""), "qwen.yaml")

    code, out, err = run_cli(capsys, "apply", "-f", only_qwen, "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert plan_lines(out)[1][:2] == ["unlisted", LLAMA]
    assert "--prune deletes it" in out
    assert sorted(by_model(served)) == sorted([QWEN_30B, LLAMA])

    code, out, err = run_cli(capsys, "apply", "-f", only_qwen, "--prune", "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert plan_lines(out)[0][:2] == ["delete", LLAMA]
    assert f"deleted: {llama_id}" in out
    assert sorted(by_model(served)) == [QWEN_30B]


def test_dry_run_prints_the_plan_and_changes_nothing(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    before = by_model(served)
    other = f"deployments:\n  - model: {QWEN_30B}\n  - model: {LLAMA_3B}\n"
    code, out, err = run_cli(
        capsys, "apply", "-f", write(tmp_path, other), "--prune", "--dry-run", "--url", served.url
    )
    assert (code, err) == (EXIT_OK, "")
    assert [words[:2] for words in plan_lines(out)] == [
        ["create", LLAMA_3B],
        ["change", QWEN_30B],
        ["delete", LLAMA],
    ]
    assert out.splitlines()[-1] == "dry run: nothing applied"
    assert by_model(served) == before


def test_export_then_apply_from_stdin_changes_nothing(
    served: Served,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    before = by_model(served)
    code, exported, err = run_cli(capsys, "export", "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert "version: 1\n" in exported
    assert f"- model: {QWEN_30B}\n" in exported
    assert "  replicas: 3\n" in exported
    assert "  sharding: Pipeline\n" in exported  # every field written, defaults too
    assert exported.index(LLAMA) < exported.index(QWEN_30B)  # by model, whatever the ids

    monkeypatch.setattr(sys, "stdin", io.StringIO(exported))
    code, out, err = run_cli(capsys, "apply", "-f", "-", "--prune", "--url", served.url)
    assert (code, err) == (EXIT_OK, "")
    assert [words[0] for words in plan_lines(out)] == ["unchanged", "unchanged"]
    assert by_model(served) == before


def test_export_piped_into_apply_between_two_processes(served: Served, tmp_path: Path) -> None:
    """The shell's ``exo-deploy export | exo-deploy apply -f -``, as operators type it."""
    command = [sys.executable, "-m", "keeper.cli"]
    subprocess.run(
        [*command, "apply", "-f", write(tmp_path, TWO), "--url", served.url],
        check=True,
        capture_output=True,
        timeout=PIPE_TIMEOUT_S,
    )
    exported = subprocess.run(
        [*command, "export", "--url", served.url],
        check=True,
        capture_output=True,
        text=True,
        timeout=PIPE_TIMEOUT_S,
    ).stdout
    applied = subprocess.run(
        [*command, "apply", "-f", "-", "--prune", "--url", served.url],
        input=exported,
        capture_output=True,
        text=True,
        timeout=PIPE_TIMEOUT_S,
        check=False,
    )
    assert (applied.returncode, applied.stderr) == (EXIT_OK, "")
    assert applied.stdout.splitlines()[-1] == (
        "plan: 0 to create, 0 to change, 0 to delete, 2 unchanged"
    )


def test_a_refusal_mid_way_says_what_was_applied_and_stops(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A master that keeps one deployment: the file's second create is refused.
    with served_master(MasterConfig(max_deployments=1)) as served:
        three = TWO + f"  - model: {LLAMA_3B}\n"
        code, out, err = run_cli(capsys, "apply", "-f", write(tmp_path, three), "--url", served.url)
        assert code == EXIT_REFUSED
        assert f"Deployment of {QWEN_30B} created: " in out
        lines = err.splitlines()
        assert lines[0].startswith(f"exo-deploy apply: create of {LLAMA} refused: ")
        assert "at most 1 deployments" in lines[0]
        assert lines[1:] == [
            f"exo-deploy apply: applied before it: create of {QWEN_30B}",
            f"exo-deploy apply: not applied: create of {LLAMA_3B}",
        ]
        assert sorted(by_model(served)) == [QWEN_30B]


BAD_FILES = [
    pytest.param("deployments:\n  - model: [\n", "3:1: YAML syntax error: ", id="syntax"),
    pytest.param(
        f"deployments:\n  - model: {LLAMA}\n    replica: 2\n",
        "3:5: unknown key 'replica' in deployment 1 (known: model, sharding, instance_meta, "
        "min_nodes, replicas, standby, priority, preempt, repair)",
        id="unknown-key",
    ),
    pytest.param(
        f"deployments:\n  - model: {LLAMA}\n    replicas: 0\n",
        "3:15: replicas: Input should be greater than or equal to 1 (got 0)",
        id="bad-value",
    ),
    pytest.param(
        f"deployments:\n  - model: {LLAMA}\n  - model: {LLAMA}\n",
        f"3:5: model {LLAMA} is listed twice (first at line 2): a model has one deployment",
        id="duplicate-model",
    ),
    pytest.param(
        f"- model: {LLAMA}\n",
        "1:1: expected a mapping with 'deployments:'",
        id="not-a-mapping",
    ),
    pytest.param(
        "deployments: 3\n", "1:14: deployments: should be a list, got the value 3", id="not-a-list"
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD_FILES)
def test_a_bad_file_is_exit_2_naming_the_problem_before_the_service_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    # No master at the URL: the file is judged before anything is asked of it (else exit 3).
    file = write(tmp_path, text)
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = run_cli(capsys, "apply", "-f", file, "--url", url)
    assert (code, out) == (EXIT_USAGE, "")
    first, last = err.splitlines()[0], err.splitlines()[-1]
    assert first.startswith(f"{file}:{message}")
    assert last == f"exo-deploy apply: {file}: nothing applied"
    assert "Traceback" not in err


def test_a_bad_file_changes_nothing_on_the_master(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "apply", "-f", write(tmp_path, TWO), "--url", served.url)[0] == 0
    before = by_model(served)
    # A good change beside a bad entry: nothing of it is applied.
    bad = TWO.replace("replicas: 3", "replicas: 2") + "  - model: m/x\n    standby: 9\n"
    code, _, err = run_cli(
        capsys, "apply", "-f", write(tmp_path, bad), "--prune", "--url", served.url
    )
    assert code == EXIT_USAGE
    assert "8:14: standby: Input should be less than or equal to 4 (got 9)" in err
    assert by_model(served) == before


def test_a_file_that_cannot_be_read_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.yaml"
    code, out, err = run_cli(capsys, "apply", "-f", str(missing))
    assert (code, out) == (EXIT_USAGE, "")
    assert err.strip() == f"exo-deploy apply: cannot read {missing}: No such file or directory"
    (tmp_path / "latin1.yaml").write_bytes(b"deployments: []\n# caf\xe9\n")
    code, _, err = run_cli(capsys, "apply", "-f", str(tmp_path / "latin1.yaml"))
    assert code == EXIT_USAGE
    assert "not UTF-8 text" in err


def test_unreachable_master_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (["apply", "-f", write(tmp_path, TWO)], ["export"]):
        code, out, err = run_cli(capsys, *argv, "--url", url)
        assert (code, out) == (EXIT_UNREACHABLE, "")
        assert f"cannot reach the master at {url}" in err
