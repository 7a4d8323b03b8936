"""The deployments file that ``exo-deploy apply -f FILE`` reads and ``exo-deploy export`` writes
(docs/design.md §7.7)::

    version: 1
    deployments:
      - model: mlx-community/Qwen3-30B-A3B-4bit
        replicas: 2
        priority: 900
      - model: mlx-community/Llama-3.2-1B-Instruct-4bit

Each entry holds exactly the fields of ``POST /deployments`` (``CreateDeploymentRequest``), its
``model_id`` written ``model``; a field left out means the API's default, so an entry is the whole
of a deployment's settings, not a patch of them. Each entry is judged by that same pydantic model,
so the file obeys one set of rules with the API, and a bad value is named in the validator's own
words.

The file is read through yaml's composed nodes rather than ``yaml.safe_load`` so that every
problem names the line and column of the key or value at fault: an operator editing a file of
twenty deployments must not have to hunt for "replicas: Input should be less than or equal to
16". Every problem of the file is gathered before anything is refused, so one run names them
all; nothing here raises anything but ``DeploymentFileError``, and it is pure (text in, settings
out), so the CLI and its tests share it.

The file is bounded before it is believed (docs/design.md §7.7, "Bounds"): at most
``MAX_FILE_BYTES``, at most ``MAX_DEPTH`` levels of nesting, and no aliases. An alias is a
pointer: ten levels of ten aliases in 539 bytes make 10^10 nodes once a value is built, and
nothing a deployments file says needs one. Nesting is counted while composing
(``_BoundedLoader``), so a file of ten thousand ``[`` is refused at the 65th, before the
composer's recursion (a ``RecursionError``) or the scanner's cost, which grows with the depth,
is reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import yaml
from pydantic import ValidationError

from keeper.model.api_models import CreateDeploymentRequest

# The file's format; a later one that reads differently gets a new number, and this one refuses it.
FILE_VERSION = 1
# The file's keys by the request field each one is: the request's own names, ``model_id`` written
# ``model`` as operators say it (and as the CLI's ``deploy MODEL`` does).
FILE_KEYS: dict[str, str] = {
    ("model" if name == "model_id" else name): name for name in CreateDeploymentRequest.model_fields
}
REQUEST_KEYS = {field: key for key, field in FILE_KEYS.items()}
TOP_KEYS = ("version", "deployments")

# The largest file read. A deployments file is about 50 to 100 bytes an entry, and a service
# keeps at most 1,000 deployments by default (--max-deployments): 1 MiB holds ten times that,
# where a 50 MB file took 32 s and 818 MB to parse.
MAX_FILE_BYTES = 1024 * 1024
# The deepest nesting read. The file's own shape is three levels (the top mapping, the list, an
# entry) and its values are scalars: 64 leaves room for anything a person writes, and stays far
# below Python's recursion limit, which the composer (recursive) and the constructor reach.
MAX_DEPTH = 64
_MIB = 1024 * 1024

_MAPPING_TAG = "tag:yaml.org,2002:map"
_NULL_TAG = "tag:yaml.org,2002:null"


@dataclass(frozen=True)
class FileProblem:
    """One thing wrong with the file, where it is (1-based line and column, None when the file
    as a whole is at fault)."""

    message: str
    line: int | None = None
    column: int | None = None

    def render(self, source: str) -> str:
        """``source:line:col: message``, the form editors and compilers use."""
        if self.line is None:
            return f"{source}: {self.message}"
        return f"{source}:{self.line}:{self.column}: {self.message}"


class DeploymentFileError(Exception):
    """The file cannot be applied; ``problems`` says everything wrong with it, in file order."""

    def __init__(self, source: str, problems: Sequence[FileProblem]) -> None:
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(self.lines()))

    def lines(self) -> list[str]:
        return [problem.render(self.source) for problem in self.problems]


def _at(node: yaml.Node, message: str) -> FileProblem:
    mark = node.start_mark
    return FileProblem(message, mark.line + 1, mark.column + 1)


def _kind(node: yaml.Node) -> str:
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    if node.tag == _NULL_TAG:
        return "nothing (null)"
    try:
        return f"the value {shown_value(_value(node))}"
    except UnreadableValueError:
        return f"the value {node.value!r}"


def shown_value(value: object) -> str:
    """A value as the file spells it: ``true``, ``null``, ``'text'``, ``2``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return repr(value)


class UnreadableValueError(Exception):
    """A value yaml's safe loader will not make (a tag it does not know, ``!!int abc``)."""

    def __init__(self, node: yaml.Node, reason: str) -> None:
        super().__init__(reason)
        self.problem = _at(node, f"cannot read this value: {reason}")


def _value(node: yaml.Node) -> Any:
    """The Python value of ``node`` as ``yaml.safe_load`` would read it; UnreadableValueError
    if it would refuse it."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)  # pyright: ignore[reportUnknownMemberType]
    except yaml.MarkedYAMLError as exc:  # a tag the safe loader has no constructor for
        raise UnreadableValueError(node, exc.problem or str(exc)) from None
    # A known tag on text it cannot be (!!int abc, !!bool '', !!timestamp x): the safe
    # constructors raise whatever their parsing does (ValueError, KeyError, IndexError,
    # AttributeError, found by tests/pure/test_apply_plan.py's fuzzing), so any error is that.
    except Exception:
        tag = node.tag.rsplit(":", 1)[-1]
        raise UnreadableValueError(node, f"not a valid !!{tag}: {node.value!r}") from None


def _pairs(
    node: yaml.MappingNode, known: Sequence[str], where: str, problems: list[FileProblem]
) -> dict[str, yaml.Node]:
    """The mapping's values by key; unknown, repeated and non-text keys become problems."""
    found: dict[str, yaml.Node] = {}
    for key_node, value_node in node.value:
        key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str) or key not in known:
            shown = repr(key) if isinstance(key, str) else _kind(key_node)
            problems.append(
                _at(key_node, f"unknown key {shown} {where} (known: {', '.join(known)})")
            )
        elif key in found:
            line = found[key].start_mark.line + 1
            problems.append(_at(key_node, f"{key!r} given twice {where} (first at line {line})"))
        else:
            found[key] = value_node
    return found


@dataclass(frozen=True)
class _Entry:
    """One entry of the list as read: its request if it is valid, its model either way."""

    request: CreateDeploymentRequest | None
    model: object


def _entry(node: yaml.Node, index: int, problems: list[FileProblem]) -> _Entry:
    where = f"in deployment {index + 1}"
    if not isinstance(node, yaml.MappingNode):
        problems.append(
            _at(node, f"deployment {index + 1} should be a mapping (model: ...), got {_kind(node)}")
        )
        return _Entry(None, None)
    values = _pairs(node, list(FILE_KEYS), where, problems)
    fields: dict[str, Any] = {}
    unreadable: set[str] = set()
    for key, value in values.items():
        try:
            fields[FILE_KEYS[key]] = _value(value)
        except UnreadableValueError as exc:
            problems.append(exc.problem)
            unreadable.add(key)
    model = fields.get("model_id")
    try:
        request = CreateDeploymentRequest.model_validate(fields)
    except ValidationError as exc:
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "model_id"
            key = REQUEST_KEYS.get(field, field)
            if key in unreadable:  # said already: not "required" as well
                continue
            if error["type"] == "missing":
                problems.append(_at(node, f"{key}: required {where} (the model to deploy)"))
                continue
            # A value of 600 characters is not repeated back; the message says what is wrong.
            long = error["type"] == "string_too_long"
            got = "" if long else f" (got {shown_value(error['input'])})"
            problems.append(_at(values[key], f"{key}: {error['msg']}{got}"))
        return _Entry(None, model)
    return _Entry(None if unreadable else request, model)


class _OverBoundsError(Exception):
    """The file passes one of the module's bounds; ``problem`` says which, and where."""

    def __init__(self, problem: FileProblem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _at_mark(mark: yaml.Mark | None, message: str) -> FileProblem:
    if mark is None:
        return FileProblem(message)
    return FileProblem(message, mark.line + 1, mark.column + 1)


class _BoundedLoader(yaml.SafeLoader):
    """yaml's safe loader, composing no alias and no node deeper than ``MAX_DEPTH``."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def _next_mark(self) -> yaml.Mark | None:
        event: yaml.Event = self.peek_event()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        # The stubs give an event's mark as the C extension's or the pure one's: it is the pure.
        return cast(yaml.Mark | None, event.start_mark)  # pyright: ignore[reportUnknownMemberType]

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            raise _OverBoundsError(
                _at_mark(
                    self._next_mark(),
                    "aliases (*name) are not read in a deployments file: write the value out",
                )
            )
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _OverBoundsError(
                _at_mark(
                    self._next_mark(),
                    f"nested deeper than {MAX_DEPTH} levels, the most a deployments file may be",
                )
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def size_problem(content: bytes | str) -> FileProblem | None:
    """Why ``content`` is too large to read (naming the line the limit falls on), or None."""
    # surrogatepass: a str from anywhere (a test, a fuzzer) is measured, never an error here.
    data = content.encode("utf-8", "surrogatepass") if isinstance(content, str) else content
    if len(data) <= MAX_FILE_BYTES:
        return None
    line = data[:MAX_FILE_BYTES].count(b"\n") + 1
    return FileProblem(
        f"larger than {MAX_FILE_BYTES // _MIB} MiB, the most a deployments file may be "
        f"(the limit falls in line {line})"
    )


def parse_deployment_file(text: str, source: str) -> list[CreateDeploymentRequest]:
    """The deployments ``text`` asks for, in file order; DeploymentFileError naming every problem
    (``source`` is the file's name in the messages) if there is any."""
    too_large = size_problem(text)
    if too_large is not None:
        raise DeploymentFileError(source, [too_large])
    try:
        root = yaml.compose(text, Loader=_BoundedLoader)
    except _OverBoundsError as exc:
        raise DeploymentFileError(source, [exc.problem]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        what = exc.problem or "unreadable"
        if exc.context:  # "while parsing a flow node", "while scanning a quoted scalar"
            started = exc.context_mark
            begun = (
                f" begun at line {started.line + 1}, column {started.column + 1}"
                if started is not None and mark is not None and started.line != mark.line
                else ""
            )
            # "expected a single document in the stream ..., but found another document"
            joined = what.startswith("but ")
            what = f"{exc.context}{begun}, {what}" if joined else f"{what} ({exc.context}{begun})"
        if mark is None:
            raise DeploymentFileError(source, [FileProblem(f"YAML syntax error: {what}")]) from None
        problem = FileProblem(f"YAML syntax error: {what}", mark.line + 1, mark.column + 1)
        raise DeploymentFileError(source, [problem]) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow: it has no mark
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - before.rfind("\n")
        problem = FileProblem(
            f"not readable as YAML: {exc.reason} (#x{exc.character:04x})", line, column
        )
        raise DeploymentFileError(source, [problem]) from None
    except yaml.YAMLError as exc:
        what = " ".join(str(exc).split())  # one line, whatever yaml wrote
        raise DeploymentFileError(source, [FileProblem(f"not readable as YAML: {what}")]) from None
    shape = "a mapping with 'deployments:', a list of {model: ...} (and 'version: 1')"
    if root is None:
        raise DeploymentFileError(source, [FileProblem(f"the file is empty: expected {shape}")])
    if not isinstance(root, yaml.MappingNode) or root.tag != _MAPPING_TAG:
        raise DeploymentFileError(source, [_at(root, f"expected {shape}, got {_kind(root)}")])
    problems: list[FileProblem] = []
    top = _pairs(root, TOP_KEYS, "at the top", problems)
    if "version" in top:
        version = top["version"]
        try:
            value = _value(version)
        except UnreadableValueError as exc:
            problems.append(exc.problem)
            value = FILE_VERSION
        if type(value) is not int or value != FILE_VERSION:  # true is no version
            got = _kind(version).removeprefix("the value ")
            problems.append(
                _at(version, f"version: this exo-deploy reads version {FILE_VERSION}, got {got}")
            )
    listed = top.get("deployments")
    if listed is None:
        if not problems:
            problems.append(_at(root, "no 'deployments:' list (write 'deployments: []' for none)"))
        raise DeploymentFileError(source, sorted(problems, key=_place))
    if not isinstance(listed, yaml.SequenceNode):
        problems.append(_at(listed, f"deployments: should be a list, got {_kind(listed)}"))
        raise DeploymentFileError(source, sorted(problems, key=_place))
    requests: list[CreateDeploymentRequest] = []
    first_line: dict[str, int] = {}
    for index, node in enumerate(listed.value):
        entry = _entry(node, index, problems)
        if isinstance(entry.model, str) and entry.model in first_line:
            problems.append(
                _at(
                    node,
                    f"model {entry.model} is listed twice (first at line "
                    f"{first_line[entry.model]}): a model has one deployment",
                )
            )
            continue
        if isinstance(entry.model, str):
            first_line[entry.model] = node.start_mark.line + 1
        if entry.request is not None:
            requests.append(entry.request)
    if problems:
        raise DeploymentFileError(source, sorted(problems, key=_place))
    return requests


def _place(problem: FileProblem) -> tuple[int, int]:
    return (problem.line or 0, problem.column or 0)


def file_entry(request: CreateDeploymentRequest) -> dict[str, Any]:
    """One deployment as the file writes it: every field, the model first."""
    values = request.model_dump(mode="json")
    return {REQUEST_KEYS[field]: value for field, value in values.items()}


EXPORT_HEADER = (
    "# exo-deploy apply -f FILE keeps these deployments: a field left out means its default,\n"
    "# a model left out is kept unless --prune (then deleted).\n"
)


def export_text(requests: Sequence[CreateDeploymentRequest]) -> str:
    """The file that asks for exactly ``requests``: every field written, defaults included, so
    that the file says what the deployments are without the reader knowing the defaults (and a
    later change of a default does not change what an exported file asks for)."""
    document = {
        "version": FILE_VERSION,
        "deployments": [file_entry(request) for request in requests],
    }
    # The stubs leave one of safe_dump's parameters (width) partly untyped.
    body: str = yaml.safe_dump(  # pyright: ignore[reportUnknownMemberType]
        document, sort_keys=False, default_flow_style=False, allow_unicode=True
    )
    return EXPORT_HEADER + body
