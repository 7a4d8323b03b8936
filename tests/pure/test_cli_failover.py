"""``--suspect-after-s`` / ``--dead-after-s`` on ``master``, ``bridge`` and ``cluster``
(docs/design.md §5.18): the defaults 3 / 8 reach the service; a negative value, one that is not
a number, a suspicion above the death or a death below 2 s is exit 2 naming the flag."""

from __future__ import annotations

from typing import Any

import pytest
from test_cli_options import entries, run_cli  # noqa: F401 (the fixture)

from keeper.cli import EXIT_OK, EXIT_USAGE, build_parser
from keeper.model.liveness import LivenessConfig
from keeper.sim.cluster import local

SERVICES = (["master"], ["bridge", "--exo", "http://127.0.0.1:52415"])


@pytest.mark.parametrize("service", SERVICES, ids=lambda argv: argv[0])
def test_the_flags_reach_the_service(
    service: list[str],
    entries: dict[str, dict[str, Any]],  # noqa: F811
) -> None:
    args = build_parser().parse_args(service)
    assert args.handler(args) == EXIT_OK
    assert entries[service[0]]["liveness"] == LivenessConfig(3.0, 8.0)
    given = [*service, "--suspect-after-s", "0", "--dead-after-s", "0"]
    args = build_parser().parse_args(given)
    assert args.handler(args) == EXIT_OK
    assert entries[service[0]]["liveness"] == LivenessConfig(0.0, 0.0)


def test_cluster_passes_them_on(monkeypatch: pytest.MonkeyPatch) -> None:
    called: dict[str, Any] = {}

    def run_cluster(*args: Any, **kwargs: Any) -> int:
        called.update(kwargs)
        return EXIT_OK

    monkeypatch.setattr(local, "run_cluster", run_cluster)
    args = build_parser().parse_args(["cluster", "--suspect-after-s", "2", "--dead-after-s", "5"])
    assert args.handler(args) == EXIT_OK
    assert called["liveness"] == LivenessConfig(2.0, 5.0)


@pytest.mark.parametrize("service", [*SERVICES, ["cluster"]], ids=lambda argv: argv[0])
@pytest.mark.parametrize(
    ("given", "flag", "message"),
    [
        (["--suspect-after-s", "-1"], "--suspect-after-s", "0 or more"),
        (["--suspect-after-s", "soon"], "--suspect-after-s", "not a number of seconds"),
        (["--dead-after-s", "nan"], "--dead-after-s", "0 or more"),
        (["--suspect-after-s", "9"], "--suspect-after-s (9)", "must not be above"),
        (["--dead-after-s", "1.5"], "--dead-after-s", "at least 2"),
    ],
)
def test_bad_flags_exit_2_naming_the_flag(
    service: list[str],
    given: list[str],
    flag: str,
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, _, err = run_cli(capsys, *service, *given)
    assert code == EXIT_USAGE
    assert flag in err and message in err
    assert "Traceback" not in err
