"""``exo-deploy --help`` lists the commands grouped (keeper.cli.command_groups): a real cluster,
then simulation, then maintenance, each command once, under its group, in the table's order."""

from __future__ import annotations

import re

import pytest

from keeper.cli import EXIT_OK, EXIT_USAGE, main
from keeper.cli.command_groups import COMMAND_GROUPS, grouped_commands

HEADINGS = ["a real cluster:", "simulation:", "maintenance:"]


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """The exit code, stdout and stderr of ``exo-deploy ARGV``."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    code = exited.value.code
    assert isinstance(code, int)
    out, err = capsys.readouterr()
    return code, out, err


def listed(help_text: str) -> dict[str, list[str]]:
    """Each heading of the help's command groups, with the commands listed under it in order."""
    groups: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in help_text.splitlines():
        if line in HEADINGS:
            current = groups[line.removesuffix(":")] = []
        elif not line.strip():
            current = None
        elif current is not None and (entry := re.match(r"  ([a-z-]+)(  |$)", line)):
            current.append(entry.group(1))
    return groups


def parser_commands(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The parser's commands, as argparse names them refusing one that is not."""
    code, _, err = run_cli(capsys, "no-such-command")
    assert code == EXIT_USAGE
    choices = err.split("choose from", 1)[1]
    return re.findall(r"[a-z][a-z-]*", choices)


def test_help_lists_the_commands_grouped_in_order(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, out, _ = run_cli(capsys, "--help")
    assert code == EXIT_OK
    groups = listed(out)
    assert list(groups) == ["a real cluster", "simulation", "maintenance"]
    assert groups["a real cluster"][:16] == [
        "bridge",
        "list",
        "deploy",
        "set",
        "scale",
        "undeploy",
        "history",
        "apply",
        "export",
        "nodes",
        "cordon",
        "uncordon",
        "drain",
        "whatif",
        "repair",
        "webhooks",
    ]
    assert groups["simulation"] == ["master", "node", "cluster", "soak", "soak-sim"]
    assert groups["maintenance"] == ["log"]
    # The groups come before the options, each command is listed once, with its help.
    assert out.index("a real cluster:") < out.index("options:") < out.index("exit codes:")
    for name in parser_commands(capsys):
        assert len(re.findall(rf"^  {name}  ", out, flags=re.MULTILINE)) == 1, name
    assert "  drain     cordon NODE and move the keeper's instances off it" in out


def test_every_command_of_the_parser_is_in_one_group(capsys: pytest.CaptureFixture[str]) -> None:
    """A new command has a place in the table: none falls into the first group unplaced."""
    tabled = [name for _, names in COMMAND_GROUPS for name in names]
    assert len(tabled) == len(set(tabled))
    assert sorted(parser_commands(capsys)) == sorted(tabled)


def test_the_listing_wraps_to_the_width_under_the_help_column() -> None:
    helps = {"log": "one two three four five six", "deploy": "a b", "frobnicate": "new"}
    text = grouped_commands(helps, width=32)
    assert text == (
        "a real cluster:\n"
        "  deploy      a b\n"
        "  frobnicate  new\n"
        "\n"
        "maintenance:\n"
        "  log         one two three four\n"
        "              five six"
    )


def test_a_name_too_long_for_the_column_has_its_help_below_it() -> None:
    long_name = "a-command-with-a-very-long-name"
    text = grouped_commands({long_name: "its help", "log": "data dir"}, width=80)
    lines = text.splitlines()
    assert lines[:3] == ["a real cluster:", f"  {long_name}", " " * 24 + "its help"]
    assert lines[-1] == "  log" + " " * 19 + "data dir"
