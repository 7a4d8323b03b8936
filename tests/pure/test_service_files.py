"""The launchd agents and the systemd units in ``deploy/`` start the bridge as written (the
single bridge, and the bridge on the shared store).

Both are parsed as launchd and systemd read them (plistlib; the unit's INI syntax), and their
command line is checked against the project itself: the program is the installed command
``[project.scripts]`` names for our CLI, the subcommand is ``bridge``, and our own argparse
parser accepts every argument they pass. Paths must be absolute: neither launchd nor systemd
expands ``~`` or looks the program up on a PATH.
"""

from __future__ import annotations

import argparse
import configparser
import plistlib
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any

from keeper.bridge.etcd_access import StoreAccessOptions, check_access_options
from keeper.bridge.etcd_store import parse_store_url
from keeper.cli import ProcessCommand, build_parser

ROOT = Path(__file__).parents[2]
PLIST = ROOT / "deploy" / "launchd" / "com.exo-deploy.bridge.plist"
UNIT = ROOT / "deploy" / "systemd" / "exo-deploy-bridge.service"
EXO_ON_THIS_MACHINE = "http://127.0.0.1:52415"


def installed_command() -> str:
    """The name ``pip install`` gives our CLI's entry point (``keeper.cli:main``)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (name,) = [name for name, target in scripts.items() if target == "keeper.cli:main"]
    return name


def parsed_bridge_command(argv: list[str]) -> argparse.Namespace:
    """``argv`` (program first) checked as our CLI would run it; fails the test if refused."""
    program = PurePosixPath(argv[0])
    assert program.is_absolute(), program
    assert program.name == installed_command()
    assert argv[1] == "bridge"
    assert not any(arg.startswith("~") or "$" in arg for arg in argv), argv
    args = build_parser().parse_args(argv[1:])
    assert args.handler == ProcessCommand("cmd_bridge")
    assert args.data_dir is not None and args.data_dir.is_absolute()
    return args


def exo_urls(args: argparse.Namespace) -> list[str]:
    exo: Any = args.exo
    return list(exo) if isinstance(exo, list | tuple) else [exo]  # pyright: ignore[reportUnknownArgumentType]


def test_the_launchd_agent_runs_the_bridge_at_login_and_after_a_failure() -> None:
    agent = plistlib.loads(PLIST.read_bytes())
    assert agent["Label"] == PLIST.stem
    args = parsed_bridge_command(agent["ProgramArguments"])
    assert exo_urls(args) == [EXO_ON_THIS_MACHINE]
    assert agent["RunAtLoad"] is True
    assert agent["KeepAlive"] == {"SuccessfulExit": False}
    for key in ("StandardOutPath", "StandardErrorPath"):
        log = PurePosixPath(agent[key])
        # launchd opens the log before the bridge starts: its folder must exist on every Mac.
        assert log.parent == PurePosixPath("/Users/Shared"), log
    assert PurePosixPath(str(args.data_dir)).is_relative_to("/Users/Shared")


def test_the_systemd_unit_runs_the_bridge_and_restarts_it_on_failure() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment, method-assign]  # systemd keys are case-sensitive
    unit.read_string(UNIT.read_text())
    assert set(unit.sections()) == {"Unit", "Service", "Install"}
    service = unit["Service"]
    args = parsed_bridge_command(shlex.split(service["ExecStart"]))
    assert exo_urls(args) == [EXO_ON_THIS_MACHINE]
    assert service["Restart"] == "on-failure"
    # systemd creates /var/lib/<StateDirectory> for the service: the data dir must be it.
    assert args.data_dir == Path("/var/lib") / service["StateDirectory"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"


STORE_PLIST = ROOT / "deploy" / "launchd" / "com.exo-deploy.bridge-store.plist"
STORE_UNIT = ROOT / "deploy" / "systemd" / "exo-deploy-bridge-store.service"


def parsed_store_bridge(argv: list[str]) -> argparse.Namespace:
    """A bridge with the shared store: no data dir, a store URL our parser reads."""
    program = PurePosixPath(argv[0])
    assert program.is_absolute() and program.name == installed_command()
    args = build_parser().parse_args(argv[1:])
    assert args.handler == ProcessCommand("cmd_bridge") and args.data_dir is None
    address = parse_store_url(args.store)
    assert len(address.endpoints) == 3  # three etcd members
    # As production runs etcd: TLS, a client certificate, a user (docs/design.md §6.7).
    assert address.tls
    options = StoreAccessOptions(
        args.store_ca, args.store_cert, args.store_key, args.store_user, args.store_password_file
    )
    check_access_options(address, options)
    assert None not in (options.ca, options.cert, options.key, options.user)
    return args


def test_the_store_bridge_files_run_a_bridge_on_three_etcd_members() -> None:
    agent = plistlib.loads(STORE_PLIST.read_bytes())
    assert agent["Label"] == STORE_PLIST.stem and agent["KeepAlive"] is True
    parsed_store_bridge(agent["ProgramArguments"])
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment, method-assign]
    unit.read_string(STORE_UNIT.read_text())
    args = parsed_store_bridge(shlex.split(unit["Service"]["ExecStart"]))
    assert len(exo_urls(args)) >= 2 and unit["Service"]["Restart"] == "always"
