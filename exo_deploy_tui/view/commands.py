"""Every dashboard action, once: its key, its footer word, its help line, its ``:`` command,
and whether read-only or demo mode decides for it.

Everything else is made from this table: the dashboard's key bindings (and which show in the
footer), its ``check_action`` (read-only refuses the mutating actions, and the demo's actions
need --demo), the help screen, the command palette and the ``:`` command line. A command runs
the action its key runs, with what was typed after it appended to the action's arguments, so
``:sort name`` is ``N`` and ``:scale 3`` is ``s`` with the form filled in. Parsing a command
line is pure and returns the action's method name and arguments, or a message saying what was
wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

# What a command takes after its words, and how the help writes it.
Arguments = Literal["none", "replicas", "text", "node", "node_seconds"]
USAGE: Final[dict[Arguments, str]] = {
    "none": "",
    "replicas": "[N]",
    "text": "[TEXT]",
    "node": "[NODE]",
    "node_seconds": "[NODE [SECONDS]]",
}

# Keys the help writes as the character typed, bound under Textual's name for it.
_KEY_NAMES: Final = {"/": "slash", "?": "question_mark", ":": "colon", "esc": "escape"}


@dataclass(frozen=True)
class ActionSpec:
    key: str  # as help and the palette write it; a capital is also bound as shift+letter
    method: str  # the dashboard's ``action_<method>``
    title: str  # the binding's description: the footer's word for it
    help: str  # the help screen's line
    params: tuple[str, ...] = ()  # the action's own arguments: ``sort('name')``
    command: str = ""  # what to type after ":"; "" for a key only (not in the palette either)
    aliases: tuple[str, ...] = ()  # other words for the command
    arguments: Arguments = "none"  # what the command takes after its words
    footer: bool = False  # shown in the footer
    mutating: bool = False  # hidden and refused with --readonly
    demo_only: bool = False  # hidden and refused without --demo
    # Opens a box that takes the keys typed after it (``:``, ``/``): bound with priority, so it
    # runs when Textual routes its key, before the keys after it are routed (design §9.1).
    takes_typing: bool = False

    @property
    def action(self) -> str:
        """The Textual action the key runs: ``new``, ``sort('name')``."""
        if not self.params:
            return self.method
        return f"{self.method}({', '.join(repr(p) for p in self.params)})"

    @property
    def binding_keys(self) -> str:
        """The key as Textual names it, for a ``Binding``: ``slash``, ``S,shift+s``."""
        if len(self.key) == 1 and self.key.isupper():
            return f"{self.key},shift+{self.key.lower()}"
        return _KEY_NAMES.get(self.key, self.key)

    @property
    def args(self) -> str:
        """The command's arguments, for help."""
        return USAGE[self.arguments]


ACTIONS: Final[tuple[ActionSpec, ...]] = (
    ActionSpec(
        "n",
        "new",
        "New",
        "create a deployment (catalog)",
        command="new",
        aliases=("create",),
        footer=True,
        mutating=True,
    ),
    ActionSpec(
        "ctrl+d",
        "delete",
        "Delete",
        "delete the selected deployment",
        command="delete",
        footer=True,
        mutating=True,
    ),
    ActionSpec(
        "s",
        "scale",
        "Scale",
        "set the selection's replicas",
        command="scale",
        arguments="replicas",
        footer=True,
        mutating=True,
    ),
    ActionSpec(
        "e",
        "edit",
        "Edit",
        "edit the selection's settings",
        command="edit",
        mutating=True,
    ),
    ActionSpec(
        "ctrl+k",
        "delete_instance",
        "Del instance",
        "delete an instance (re-placed)",
        command="delete-instance",
        mutating=True,
    ),
    ActionSpec(
        "c",
        "cordon",
        "Cordon",
        "cordon or uncordon a node",
        command="cordon",
        arguments="node",
        mutating=True,
    ),
    ActionSpec(
        "D",
        "drain",
        "Drain",
        "drain a node (move instances)",
        command="drain",
        arguments="node",
        mutating=True,
    ),
    ActionSpec(
        "w",
        "whatif",
        "What if",
        "what if a node went now",
        command="whatif",
        aliases=("what-if",),
        arguments="node",
    ),
    ActionSpec(
        "enter",
        "describe",
        "Describe",
        "why, history and raw JSON",
        command="describe",
        footer=True,
    ),
    ActionSpec(
        "/",
        "filter",
        "Filter",
        "rows with TEXT (esc clears)",
        command="filter",
        arguments="text",
        footer=True,
        takes_typing=True,
    ),
    ActionSpec(
        "S",
        "sort",
        "Sort status",
        "sort by status, broken first",
        params=("status",),
        command="sort status",
    ),
    ActionSpec(
        "N", "sort", "Sort name", "sort by model name", params=("name",), command="sort name"
    ),
    ActionSpec(
        "A", "sort", "Sort age", "sort by time in status", params=("age",), command="sort age"
    ),
    ActionSpec(
        "ctrl+z", "broken", "Broken", "only deployments not serving", command="broken", footer=True
    ),
    ActionSpec(
        "p", "pause", "Pause", "freeze the screen, data flows", command="pause", footer=True
    ),
    ActionSpec(
        "1",
        "show_tab",
        "Deployments",
        "the deployments table",
        params=("deployments",),
        command="deployments",
    ),
    ActionSpec(
        "2",
        "show_tab",
        "Nodes",
        "nodes: memory, links, runners",
        params=("nodes",),
        command="nodes",
    ),
    ActionSpec(
        "3",
        "show_tab",
        "Instances",
        "instances and their runners",
        params=("instances",),
        command="instances",
    ),
    ActionSpec(
        "4",
        "show_tab",
        "Timeline",
        "what happened, in order",
        params=("timeline",),
        command="timeline",
    ),
    ActionSpec(":", "command_line", "Command", "type a command", takes_typing=True),
    ActionSpec("?", "help", "Help", "this help", command="help", footer=True),
    ActionSpec(
        "q", "quit", "Quit", "leave (also ctrl+c)", command="quit", aliases=("q",), footer=True
    ),
    ActionSpec(
        "k",
        "fault",
        "Kill node",
        "kill a node (demo)",
        params=("kill",),
        command="kill",
        arguments="node",
        demo_only=True,
    ),
    ActionSpec(
        "f",
        "fault",
        "Freeze node",
        "freeze a node (demo)",
        params=("freeze",),
        command="freeze",
        arguments="node_seconds",
        demo_only=True,
    ),
    ActionSpec(
        "x",
        "fault",
        "Partition node",
        "cut a node off (demo)",
        params=("partition",),
        command="partition",
        arguments="node_seconds",
        demo_only=True,
    ),
    ActionSpec(
        "r",
        "fault",
        "Kill runner",
        "kill a runner (demo)",
        params=("kill_runner",),
        command="killrunner",
        aliases=("kill-runner",),
        arguments="node",
        demo_only=True,
    ),
    ActionSpec(
        "M",
        "restart_master",
        "Restart master",
        "restart the master (demo)",
        command="restart-master",
        demo_only=True,
    ),
    ActionSpec("esc", "back", "Back", "back: close, unfilter, leave"),
)

# ``check_action`` is asked by method name: every entry of a method shares its rules.
_MUTATING: Final = frozenset(a.method for a in ACTIONS if a.mutating)
_DEMO_ONLY: Final = frozenset(a.method for a in ACTIONS if a.demo_only)


def allowed(method: str, *, readonly: bool, demo: bool) -> bool:
    """Whether the dashboard's ``action_<method>`` may run: for keys, ``:`` and the palette."""
    return not (readonly and method in _MUTATING) and not (method in _DEMO_ONLY and not demo)


def visible_actions(*, readonly: bool, demo: bool) -> list[ActionSpec]:
    return [a for a in ACTIONS if allowed(a.method, readonly=readonly, demo=demo)]


@dataclass(frozen=True)
class Parsed:
    method: str  # action_<method> on the dashboard
    args: tuple[str | float, ...] = ()


@dataclass(frozen=True)
class ParseError:
    message: str


# Each command's words (and each alias's), lower case, to its entry.
_BY_WORDS: Final = {
    tuple(name.split()): spec for spec in ACTIONS for name in (spec.command, *spec.aliases) if name
}
_MOST_WORDS: Final = max(len(words) for words in _BY_WORDS)


def parse_command(line: str, *, readonly: bool, demo: bool) -> Parsed | ParseError:
    words = line.strip().removeprefix(":").split()
    if not words:
        return ParseError("type a command, e.g. 'sort name' or 'help'")
    lowered = tuple(w.lower() for w in words)
    for count in range(min(_MOST_WORDS, len(words)), 0, -1):
        spec = _BY_WORDS.get(lowered[:count])
        if spec is not None:
            break
    else:
        return _unknown(lowered[0])
    name, rest = " ".join(lowered[:count]), words[count:]
    if readonly and spec.mutating:
        return ParseError(f"'{name}' is not available: the dashboard is read-only")
    if spec.demo_only and not demo:
        return ParseError(f"'{name}' works only with --demo")
    args = _arguments(spec.arguments, name, rest)
    if isinstance(args, ParseError):
        return args
    return Parsed(spec.method, spec.params + args)


def _unknown(head: str) -> ParseError:
    """A word no command is, or the first word of commands of more words (``sort``)."""
    longer = [f"'{words}'" for spec in ACTIONS if (words := spec.command).split()[:1] == [head]]
    if not longer:
        return ParseError(f"unknown command '{head}' (type 'help' for the list)")
    choices = ", ".join(longer[:-1]) + f" or {longer[-1]}" if len(longer) > 1 else longer[0]
    return ParseError(f"{head} by what? {choices}")


def _arguments(kind: Arguments, name: str, rest: list[str]) -> tuple[str | float, ...] | ParseError:
    """What was typed after command ``name``, as the action's further arguments."""
    if kind == "text":
        return (" ".join(rest),)
    if not rest:
        return ()
    if kind == "none":
        return ParseError(f"'{name}' takes no arguments")
    if kind == "replicas":
        if len(rest) > 1 or not rest[0].isdecimal():
            return ParseError(f"usage: {name} [N], N the replicas to keep")
        return (int(rest[0]),)
    with_seconds = kind == "node_seconds"
    if len(rest) > (2 if with_seconds else 1):
        return ParseError(f"usage: {name} NODE" + (" [SECONDS]" if with_seconds else ""))
    if len(rest) == 1:
        return (rest[0],)
    try:
        seconds = float(rest[1])
    except ValueError:
        return ParseError(f"'{rest[1]}' is not a number of seconds")
    if not 0 < seconds <= 3600:
        return ParseError("seconds must be between 0 and 3600")
    return (rest[0], seconds)
