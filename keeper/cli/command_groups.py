"""``exo-deploy --help``'s list of commands, grouped by what they are for.

argparse lists a parser's subcommands in one column in the order they were added, and has no
grouping of its own. So the commands are added without a ``help`` (argparse then lists none of
them) and ``build_parser`` puts this listing in the parser's description instead: each group
under its heading, in the order of ``COMMAND_GROUPS``, whatever order the modules add their
commands in. Only argparse's public interface is used (its help formatter's methods are an
implementation detail); the layout is argparse's own (two spaces in, names in a column, help
wrapped to the terminal's width less 2), and a pure function, tested without a terminal.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Mapping
from typing import Final

# Each group's heading and its commands, in the order --help lists them: first what an operator
# runs against a real cluster (the bridge beside a stock exo, and the commands that talk to a
# master or bridge), then what runs a simulated cluster on this machine, then the one for a
# stopped service's data dir. A command missing here is listed last under the first group
# (tests/pure/test_cli_help.py holds the table to the parser's commands).
COMMAND_GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    (
        "a real cluster",
        (
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
        ),
    ),
    ("simulation", ("master", "node", "cluster", "soak", "soak-sim")),
    ("maintenance", ("log",)),
)

# argparse's layout: entries two spaces in, and the help column at most this far in (its
# ``max_help_position``), so a long name cannot push the help off a narrow terminal.
_INDENT = 2
_MAX_HELP_COLUMN = 24
# Below this many columns for the help, a terminal too narrow still gets words, not letters.
_MIN_HELP_WIDTH = 20


def help_width() -> int:
    """The width argparse formats help for: the terminal's (or $COLUMNS), less 2."""
    return shutil.get_terminal_size().columns - 2


def grouped_commands(helps: Mapping[str, str], width: int) -> str:
    """The commands of ``helps`` (name to its help line) under their groups' headings, laid
    out for ``width`` columns; a group with none of them is left out."""
    known = {name for _, names in COMMAND_GROUPS for name in names}
    groups = [(title, [n for n in names if n in helps]) for title, names in COMMAND_GROUPS]
    others = [name for name in helps if name not in known]
    if others:
        title, names = groups[0]
        groups[0] = (title, [*names, *others])
    longest = max((len(name) for name in helps), default=0)
    column = min(_INDENT + longest + 2, _MAX_HELP_COLUMN)
    wrap_at = max(width - column, _MIN_HELP_WIDTH)
    blocks: list[str] = []
    for title, names in groups:
        if not names:
            continue
        lines = [f"{title}:"]
        for name in names:
            wrapped = textwrap.wrap(helps[name], wrap_at) or [""]
            entry = " " * _INDENT + name
            if len(entry) + 2 > column:  # too long for the column: the help starts below it
                lines.append(entry)
                lines.extend(" " * column + line for line in wrapped)
                continue
            lines.append(entry.ljust(column) + wrapped[0])
            lines.extend(" " * column + line for line in wrapped[1:])
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
