"""Every repository path and module the docs name exists, so a move or a rename cannot leave
README.md or docs/*.md pointing at nothing.

Three kinds of names are read from each line:

- paths that start with a top-level entry of this repository (``keeper/core/keeper.py``,
  ``keeper/sim/master/``, ``tests/test_bridge*.py``, ``Makefile``, ``pyproject.toml``): a file, a
  folder, or a glob that must match something;
- dotted names under ``keeper.`` or ``exo_deploy_tui.`` (``keeper.core.view``,
  ``keeper.model.history.summarize``): a module or package, optionally followed by a name that
  module defines or imports (a class may be followed by one of its own names);
- relative Markdown link targets (``[store.md](store.md)``), from the document's folder.

Anything else is not ours: URLs, exo's own files (``master/placement.py``, ``src/exo/...``),
data-dir files (``events.jsonl``, ``~/.local/state/...``, ``$XDG_STATE_HOME/...``) and system
paths start with none of these, and the lookbehinds keep a match from starting inside a longer
path or URL (``https://github.com/.../tests/...``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))

TOP_FOLDERS = ("keeper", "exo_deploy_tui", "tests", "bench", "deploy", "docs")
TOP_FILES = ("Makefile", "pyproject.toml", "README.md")
PACKAGES = ("keeper", "exo_deploy_tui")

# A path begins at a top-level entry not preceded by anything a longer path, a URL, `~` or `$`
# could put there, and runs over path characters; a trailing `.` or `,` is the sentence's.
_FOLDERS = "|".join(TOP_FOLDERS)
_FILES = "|".join(map(re.escape, TOP_FILES))
_PATH = re.compile(rf"(?<![\w./~$-])(?:(?:{_FOLDERS})/[\w.*/-]*|(?:{_FILES})(?![\w.-]))")
_DOTTED = re.compile(rf"(?<![\w./-])(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# `keeper.py` written alone is a file name, not the module `keeper` with an attribute `py`.
_FILE_SUFFIXES = {"py", "md", "toml", "json", "jsonl", "tcss", "txt"}


@dataclass(frozen=True)
class Named:
    doc: str
    line: int
    name: str

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.name}"


def _named_in(doc: Path) -> tuple[list[Named], list[Named], list[Named]]:
    rel = doc.relative_to(ROOT).as_posix()
    paths: list[Named] = []
    dotted: list[Named] = []
    links: list[Named] = []
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        paths += [Named(rel, number, m.rstrip(".,")) for m in _PATH.findall(line)]
        dotted += [
            Named(rel, number, m)
            for m in _DOTTED.findall(line)
            if m.rsplit(".", 1)[1] not in _FILE_SUFFIXES
        ]
        links += [
            Named(rel, number, target.split("#", 1)[0])
            for target in _LINK.findall(line)
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#")
        ]
    return paths, dotted, links


def _path_exists(name: str, base: Path = ROOT) -> bool:
    if any(c in name for c in "*?["):
        return any(base.glob(name))
    return (base / name).exists()


def _module_file(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def _top_level(module: Path) -> dict[str, ast.stmt]:
    """The names a module binds at its top level, with the statement that binds them; the
    imports under ``if TYPE_CHECKING:`` count, for a package that loads the names they name on
    first use (``keeper/__init__.py``, PEP 562)."""
    body = ast.parse(module.read_text()).body
    typing_only = [
        inner
        for statement in body
        if isinstance(statement, ast.If)
        and isinstance(statement.test, ast.Name)
        and statement.test.id == "TYPE_CHECKING"
        for inner in statement.body
    ]
    return {name: statement for statement in body + typing_only for name in _binds(statement)}


def _binds(statement: ast.stmt) -> list[str]:
    """The names a statement of a module or class body binds."""
    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [statement.name]
    if isinstance(statement, ast.Assign):
        return [t.id for t in statement.targets if isinstance(t, ast.Name)]
    if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name):
        return [statement.target.id]
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return [(a.asname or a.name).split(".")[0] for a in statement.names]
    return []


def resolves(dotted: str) -> bool:
    """``dotted`` names a module or package of ours, or a name bound in one: the longest prefix
    that is a module, then a name it binds (an absolute ``from X import name`` is followed to
    X), then, under a class, one name of its own."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = _module_file(parts[:cut])
        if module is None:
            continue
        rest = parts[cut:]
        if not rest:
            return True
        bound = _top_level(module).get(rest[0])
        if bound is None:
            return False
        if isinstance(bound, ast.ImportFrom) and bound.module and not bound.level:
            alias = next(a for a in bound.names if (a.asname or a.name) == rest[0])
            return resolves(".".join([bound.module, alias.name, *rest[1:]]))
        if len(rest) == 1:
            return True
        return (
            isinstance(bound, ast.ClassDef)
            and len(rest) == 2
            and any(rest[1] in _binds(statement) for statement in bound.body)
        )
    return False


NAMED = [_named_in(doc) for doc in DOCS]
PATHS = [n for paths, _, _ in NAMED for n in paths]
DOTTED = [n for _, dotted, _ in NAMED for n in dotted]
LINKS = [n for _, _, links in NAMED for n in links]


def test_the_docs_are_read() -> None:
    # Guard against a silently empty check: these are named today and must be seen.
    assert any(n.name == "tests/pure/test_layering.py" for n in PATHS)
    assert any(n.name == "keeper/core/keeper.py" for n in PATHS)
    assert any(n.name == "keeper.model.history.summarize" for n in DOTTED)
    assert any(n.name.endswith("store.md") for n in LINKS)


def test_what_is_not_a_repository_path_is_left_alone() -> None:
    line = (
        "exo's `master/placement.py` and `src/exo/shared/apply.py`, "
        "https://github.com/exo-explore/exo/tests/x.py, `events.jsonl`, `snapshot.json`, "
        "`~/.local/state/exo-deploy/tui.log`, `$XDG_STATE_HOME/exo-deploy/tui.log`, "
        "/opt/exo-deploy/venv/bin/exo-deploy, `keeper.py`, the keeper. Then"
    )
    assert _PATH.findall(line) == []
    assert _DOTTED.findall(line) == ["keeper.py"]  # dropped as a file name by _named_in


def test_a_dotted_name_is_checked_down_to_its_attribute() -> None:
    assert resolves("keeper.core.view")
    assert resolves("keeper.model.history.summarize")
    assert resolves("keeper.Keeper.step")  # re-exported by keeper/__init__.py, then a method
    assert not resolves("keeper.core.calls_for_step")  # the package does not bind it
    assert not resolves("keeper.cluster_view")


def test_every_path_the_docs_name_exists() -> None:
    missing = [str(n) for n in PATHS if not _path_exists(n.name)]
    assert missing == [], "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_every_module_the_docs_name_exists() -> None:
    missing = [str(n) for n in DOTTED if not resolves(n.name)]
    assert missing == [], "modules named in the docs that do not resolve:\n" + "\n".join(missing)


def test_every_relative_link_in_the_docs_exists() -> None:
    missing = [str(n) for n in LINKS if n.name and not _path_exists(n.name, (ROOT / n.doc).parent)]
    assert missing == [], "links in the docs to files that do not exist:\n" + "\n".join(missing)
