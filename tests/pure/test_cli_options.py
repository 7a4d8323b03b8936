"""Command-line options, parsed in-process: the deployment maximum of ``exo-deploy master`` and
``exo-deploy bridge``, and the token every command that takes one reads from ``--token-file``,
``$EXO_DEPLOY_TOKEN`` or ``--token`` (keeper.client.token_options), the TUI's included. Each is
refused with exit 2 and a message naming the problem when bad, and passed on to the process entry
(``run_master``, ``run_bridge``, stubbed here). A real process reading its token from a file is
tests/processes/test_token_file.py. And ``--version`` on both commands."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pytest

from exo_deploy_tui.cli import _parser as tui_parser  # pyright: ignore[reportPrivateUsage]
from exo_deploy_tui.cli import main as tui_main
from keeper.bridge import server as bridge_server
from keeper.cli import EXIT_OK, EXIT_USAGE, build_parser, main
from keeper.cli.deployments import answer_line
from keeper.client import version_option
from keeper.client.token_options import MAX_TOKEN_FILE_BYTES, TOKEN_ENV
from keeper.model.api_models import CommandResponse
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS
from keeper.sim.master import server as master_server

SERVICES = (["master"], ["bridge", "--exo", "http://127.0.0.1:52415"])
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``exo-deploy ARGV``."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    code = exited.value.code
    assert isinstance(code, int)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def entries(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """What ``run_master`` and ``run_bridge`` were called with, by command."""
    called: dict[str, dict[str, Any]] = {}

    def stub(command: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> int:
            called[command] = {"args": args, **kwargs}
            return EXIT_OK

        return run

    # Each command imports its service when it runs (keeper.cli.processes): stubbed at home.
    monkeypatch.setattr(master_server, "run_master", stub("master"))
    monkeypatch.setattr(bridge_server, "run_bridge", stub("bridge"))
    return called


@pytest.mark.parametrize("service", SERVICES, ids=lambda argv: argv[0])
def test_max_deployments_reaches_the_service(
    service: list[str], entries: dict[str, dict[str, Any]]
) -> None:
    for given, expected in (([], DEFAULT_MAX_DEPLOYMENTS), (["--max-deployments", "5"], 5)):
        args = build_parser().parse_args([*service, *given])
        assert args.handler(args) == EXIT_OK
        assert entries[service[0]]["max_deployments"] == expected


@pytest.mark.parametrize("service", SERVICES, ids=lambda argv: argv[0])
@pytest.mark.parametrize(("value", "message"), [("0", "at least 1"), ("lots", "whole number")])
def test_a_bad_max_deployments_is_a_usage_error(
    service: list[str], value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(capsys, *service, "--max-deployments", value)
    assert code == EXIT_USAGE
    assert "--max-deployments" in err
    assert message in err


# --- the token, from a file or the environment ------------------------------------------------

TOKEN = "s3cret-token"
# Every command that takes a token, as far as its token options.
TOKEN_COMMANDS = (
    *SERVICES,
    ["node", "--master", "http://127.0.0.1:52415"],
    ["list"],
    ["deploy", "some/model"],
    ["undeploy", "some-id"],
)


@pytest.fixture(autouse=True)
def _no_ambient_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def token_file(tmp_path: Path, content: str | bytes, name: str = "token") -> Path:
    path = tmp_path / name
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)
    return path


@pytest.mark.parametrize("command", TOKEN_COMMANDS, ids=lambda argv: argv[0])
def test_every_token_command_reads_a_token_file_or_the_environment(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = token_file(tmp_path, f"{TOKEN}\n")
    assert build_parser().parse_args([*command, "--token-file", str(path)]).token == TOKEN
    assert build_parser().parse_args(command).token is None
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")  # read as the parser is built
    assert build_parser().parse_args(command).token == "from-the-environment"
    assert build_parser().parse_args([*command, "--token-file", str(path)]).token == TOKEN
    assert build_parser().parse_args([*command, "--token", "given"]).token == "given"


def test_the_tui_reads_a_token_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = token_file(tmp_path, f"  {TOKEN}  \n")
    assert tui_parser().parse_args(["--token-file", str(path)]).token == TOKEN
    monkeypatch.setenv(TOKEN_ENV, "from-the-environment")
    assert tui_parser().parse_args([]).token == "from-the-environment"
    with pytest.raises(SystemExit) as exited:
        tui_main(["--token-file", str(tmp_path / "absent")])
    assert exited.value.code == 2
    assert f"cannot read the token file {tmp_path / 'absent'}" in capsys.readouterr().err


def test_the_token_file_reaches_the_master(
    tmp_path: Path, entries: dict[str, dict[str, Any]]
) -> None:
    path = token_file(tmp_path, TOKEN)
    args = build_parser().parse_args(["master", "--host", "0.0.0.0", "--token-file", str(path)])
    assert args.handler(args) == EXIT_OK
    host, _, _, token, *_ = entries["master"]["args"]
    assert (host, token) == ("0.0.0.0", TOKEN)


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("", "is empty"),
        (" \n\n", "is empty"),
        ("two words\n", "holds more than one word"),
        ("one\ntwo\n", "holds more than one word"),
        (b"\xff\xfe\x00", "is not text"),
        ("x" * (MAX_TOKEN_FILE_BYTES + 1), f"is larger than {MAX_TOKEN_FILE_BYTES} bytes"),
    ],
    ids=["empty", "blank", "two-words", "two-lines", "binary", "huge"],
)
@pytest.mark.parametrize("command", [["master"], ["node", "--master", "http://x"], ["list"]])
def test_a_token_file_that_gives_no_token_is_a_usage_error_naming_it(
    command: list[str],
    content: str | bytes,
    problem: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = token_file(tmp_path, content)
    code, _, err = run_cli(capsys, *command, "--token-file", str(path))
    assert code == EXIT_USAGE
    assert f"the token file {path} {problem}" in err
    assert "Traceback" not in err


def test_a_token_file_that_cannot_be_read_is_a_usage_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for path, why in ((tmp_path / "absent", "No such file"), (tmp_path, "Is a directory")):
        code, _, err = run_cli(capsys, "bridge", "--exo", "http://x", "--token-file", str(path))
        assert code == EXIT_USAGE
        assert f"cannot read the token file {path}: {why}" in err


def test_token_and_token_file_are_one_or_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = token_file(tmp_path, TOKEN)
    code, _, err = run_cli(capsys, "master", "--token", TOKEN, "--token-file", str(path))
    assert code == EXIT_USAGE
    assert "not allowed with" in err


def test_the_help_says_a_token_on_the_command_line_shows_in_ps(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for command in ("master", "bridge", "node", "list"):
        code, out, _ = run_cli(capsys, command, "--help")
        out = " ".join(out.split())
        assert code == EXIT_OK
        assert "--token-file PATH" in out
        assert "see it in ps" in out, command


def test_the_help_says_each_webhook_is_sent_every_notice(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Several webhooks are not fallbacks tried in order: each gets every notice."""
    for command in ("master", "bridge", "cluster"):
        code, out, _ = run_cli(capsys, command, "--help")
        out = " ".join(out.split())
        assert code == EXIT_OK
        assert "repeat for several: each is sent every notice" in out, command
        assert "in order" not in out.split("--webhook URL")[-1], command


def test_a_node_whose_key_file_others_can_read_exits_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    key_file = tmp_path / "node.key"
    key_file.write_text("11" * 32 + "\n")
    key_file.chmod(0o644)
    argv = ["node", "--master", "http://127.0.0.1:9", "--key-file", str(key_file)]
    code, _, err = run_cli(capsys, *argv)
    assert code == EXIT_USAGE
    assert f"node key file {key_file} is open to group or others (mode 0644)" in err


@pytest.mark.parametrize(("command", "run"), [("exo-deploy", main), ("exo-deploy-tui", tui_main)])
def test_version_is_the_installed_package_s(
    command: str, run: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--version`` says the version pip installed (the package's metadata, pyproject's), and
    exits 0 before anything starts (the TUI does not ask for a terminal)."""
    with pytest.raises(SystemExit) as exited:
        run(["--version"])
    assert exited.value.code == EXIT_OK
    assert capsys.readouterr().out == f"{command} {version('exo-deploy')}\n"
    assert version("exo-deploy") == tomllib.loads(PYPROJECT.read_text())["project"]["version"]


def test_version_without_the_package_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise PackageNotFoundError(name)

    monkeypatch.setattr(version_option, "version", not_installed)
    assert version_option.package_version() == "unknown (exo-deploy is not installed)"


def test_repair_options_reach_the_request_and_a_bad_one_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["deploy", "m/x"]).repair == "auto"  # the API's default
    assert parser.parse_args(["deploy", "m/x", "--repair", "report"]).repair == "report"
    assert parser.parse_args(["set", "d1"]).repair is None  # left as it is
    assert parser.parse_args(["set", "d1", "--repair", "auto"]).repair == "auto"
    assert parser.parse_args(["repair", "inst-1"]).instance_id == "inst-1"
    assert parser.parse_args(["node", "--master", "http://m", "--fault", "lose-runner"]).fault == (
        "lose-runner"
    )
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["set", "d1", "--repair", "sometimes"])
    assert exited.value.code == EXIT_USAGE
    assert "--repair: invalid choice: 'sometimes'" in capsys.readouterr().err


@pytest.mark.parametrize("service", SERVICES)
@pytest.mark.parametrize("hold", ["-1", "inf", "nan", "soon"])
def test_a_hold_that_is_not_a_number_of_seconds_exits_2(
    capsys: pytest.CaptureFixture[str], service: list[str], hold: str
) -> None:
    code, _, err = run_cli(capsys, *service, "--hold-s", hold)
    assert code == EXIT_USAGE
    assert "--hold-s" in err and hold in err


def test_an_answer_names_its_deployment_and_a_repair_no_deployment_it_lacks() -> None:
    created = CommandResponse(message="Deployment created", command_id="c", deployment_id="d-1")
    assert answer_line(created) == "Deployment created: d-1"
    repaired = CommandResponse(
        message="Instance i-1 will be replaced", command_id="c", instance_id="i-1"
    )
    assert answer_line(repaired) == "Instance i-1 will be replaced"  # not ": None"
