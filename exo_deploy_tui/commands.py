"""Every dashboard action, once: its key, its ``:`` command, its help line.

The help screen, the ``:`` command line and the command palette all read this table, so an
action reachable by a key is reachable the two other ways too, and the help never drifts from
the bindings. Parsing a command line is pure and returns the action's method name and
arguments, or a message saying what was wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True)
class ActionSpec:
    action: str  # the dashboard's ``action_<name>`` method
    key: str  # as shown in help and the footer
    command: str  # what to type after ":"
    help: str
    args: str = ""  # the command's arguments, for help
    mutating: bool = False  # hidden and refused with --readonly
    demo_only: bool = False  # shown only with --demo


ACTIONS: Final[tuple[ActionSpec, ...]] = (
    ActionSpec("new", "n", "new", "create a deployment (catalog)", mutating=True),
    ActionSpec("delete", "ctrl+d", "delete", "delete the selected deployment", mutating=True),
    ActionSpec("scale", "s", "scale", "set the selection's replicas", args="[N]", mutating=True),
    ActionSpec(
        "delete_instance",
        "ctrl+k",
        "delete-instance",
        "delete an instance (re-placed)",
        mutating=True,
    ),
    ActionSpec("describe", "enter", "describe", "why, history and raw JSON"),
    ActionSpec("filter", "/", "filter", "rows with TEXT (esc clears)", args="[TEXT]"),
    ActionSpec("sort('status')", "S", "sort status", "sort by status, broken first"),
    ActionSpec("sort('name')", "N", "sort name", "sort by model name"),
    ActionSpec("sort('age')", "A", "sort age", "sort by time in status"),
    ActionSpec("broken", "ctrl+z", "broken", "only deployments not serving"),
    ActionSpec("pause", "p", "pause", "freeze the screen, data flows"),
    ActionSpec("show_tab('deployments')", "1", "deployments", "the deployments table"),
    ActionSpec("show_tab('nodes')", "2", "nodes", "nodes: memory, links, runners"),
    ActionSpec("show_tab('instances')", "3", "instances", "instances and their runners"),
    ActionSpec("show_tab('timeline')", "4", "timeline", "what happened, in order"),
    ActionSpec("command_line", ":", "", "type a command"),
    ActionSpec("help", "?", "help", "this help"),
    ActionSpec("quit", "q", "quit", "leave (also ctrl+c)"),
    ActionSpec("fault('kill')", "k", "kill", "kill a node (demo)", args="[NODE]", demo_only=True),
    ActionSpec(
        "fault('freeze')", "f", "freeze", "freeze a node (demo)", "[NODE [SECONDS]]", demo_only=True
    ),
    ActionSpec(
        "fault('partition')",
        "x",
        "partition",
        "cut a node off (demo)",
        "[NODE [SECONDS]]",
        demo_only=True,
    ),
    ActionSpec(
        "fault('kill_runner')",
        "r",
        "killrunner",
        "kill a runner (demo)",
        "[NODE]",
        demo_only=True,
    ),
    ActionSpec(
        "restart_master", "M", "restart-master", "restart the master (demo)", demo_only=True
    ),
)


def visible_actions(*, readonly: bool, demo: bool) -> list[ActionSpec]:
    return [a for a in ACTIONS if not (readonly and a.mutating) and not (a.demo_only and not demo)]


@dataclass(frozen=True)
class Parsed:
    method: str  # action_<method> on the dashboard
    args: tuple[str | float, ...] = ()


@dataclass(frozen=True)
class ParseError:
    message: str


_SORTS: Final = ("status", "name", "age")
_FAULTS: Final = {
    "kill": "kill",
    "freeze": "freeze",
    "partition": "partition",
    "killrunner": "kill_runner",
    "kill-runner": "kill_runner",
}
_SIMPLE: Final = {
    "new": "new",
    "create": "new",
    "delete": "delete",
    "describe": "describe",
    "broken": "broken",
    "pause": "pause",
    "help": "help",
    "quit": "quit",
    "q": "quit",
    "restart-master": "restart_master",
    "delete-instance": "delete_instance",
}
_TABS: Final = ("deployments", "nodes", "instances", "timeline")


def parse_command(line: str, *, readonly: bool, demo: bool) -> Parsed | ParseError:
    words = line.strip().removeprefix(":").split()
    if not words:
        return ParseError("type a command, e.g. 'sort name' or 'help'")
    head, rest = words[0].lower(), words[1:]
    mutating = {"new", "delete", "scale", "delete_instance"}
    if head in _SIMPLE:
        method = _SIMPLE[head]
        if readonly and method in mutating:
            return ParseError(f"'{head}' is not available: the dashboard is read-only")
        if method == "restart_master" and not demo:
            return ParseError("'restart-master' works only with --demo")
        if rest:
            return ParseError(f"'{head}' takes no arguments")
        return Parsed(method)
    if head == "scale":
        if readonly:
            return ParseError("'scale' is not available: the dashboard is read-only")
        if not rest:
            return Parsed("scale")
        if len(rest) > 1 or not rest[0].isdecimal():
            return ParseError("usage: scale [N], N the replicas to keep")
        return Parsed("scale", (int(rest[0]),))
    if head in _TABS:
        return Parsed("show_tab", (head,))
    if head == "filter":
        return Parsed("set_filter", (" ".join(rest),))
    if head == "sort":
        if len(rest) != 1 or rest[0].lower() not in _SORTS:
            return ParseError("sort by what? 'sort status', 'sort name' or 'sort age'")
        return Parsed("sort", (rest[0].lower(),))
    if head in _FAULTS:
        if not demo:
            return ParseError(f"'{head}' works only with --demo")
        kind = _FAULTS[head]
        if not rest:
            return Parsed("fault", (kind,))
        if len(rest) > 2 or (len(rest) == 2 and kind not in ("freeze", "partition")):
            return ParseError(
                f"usage: {head} NODE" + (" [SECONDS]" if kind in ("freeze", "partition") else "")
            )
        if len(rest) == 2:
            try:
                seconds = float(rest[1])
            except ValueError:
                return ParseError(f"'{rest[1]}' is not a number of seconds")
            if not 0 < seconds <= 3600:
                return ParseError("seconds must be between 0 and 3600")
            return Parsed("fault", (kind, rest[0], seconds))
        return Parsed("fault", (kind, rest[0]))
    return ParseError(f"unknown command '{head}' (type 'help' for the list)")
