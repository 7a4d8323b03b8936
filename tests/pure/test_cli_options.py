"""The service options of ``exo-deploy master`` and ``exo-deploy bridge`` that bound what clients
can make a service hold: parsed, refused with exit 2 when bad, and passed on to the process entry
(``run_master``, ``run_bridge``, stubbed here)."""

from __future__ import annotations

from typing import Any

import pytest

from keeper import cli
from keeper.cli import EXIT_OK, EXIT_USAGE, build_parser, main
from keeper.runtime.deployments import DEFAULT_MAX_DEPLOYMENTS

SERVICES = (["master"], ["bridge", "--exo", "http://127.0.0.1:52415"])


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    code = exited.value.code
    assert isinstance(code, int)
    return code, capsys.readouterr().err


@pytest.fixture
def entries(monkeypatch: pytest.MonkeyPatch) -> dict[str, dict[str, Any]]:
    """What ``run_master`` and ``run_bridge`` were called with, by command."""
    called: dict[str, dict[str, Any]] = {}

    def stub(command: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> int:
            called[command] = {"args": args, **kwargs}
            return EXIT_OK

        return run

    monkeypatch.setattr(cli, "run_master", stub("master"))
    monkeypatch.setattr(cli, "run_bridge", stub("bridge"))
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
    code, err = run_cli(capsys, *service, "--max-deployments", value)
    assert code == EXIT_USAGE
    assert "--max-deployments" in err
    assert message in err
