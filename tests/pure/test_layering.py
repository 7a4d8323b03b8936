"""The architecture, checked: each floor imports only what sits below it.

The floors are packages, so a module's floor is its prefix and a new module is checked the moment
it exists (``test_every_module_has_a_floor``). Lowest first:

- ``keeper.model``: the data model (State, events, apply, wire shapes, the shared rules and the
  refusals), pure;
- ``keeper.core``: the keeper, its memo, its view of the cluster and placement, pure;
- ``keeper.client``: the deployments API's HTTP client, the data model plus httpx;
- ``keeper.runtime``, ``keeper.sim.link``: the shell every service shares (clock, log, hosted
  keeper, process entry and what stops a start; the node protocol);
- ``keeper.httpapi``: the HTTP layer on that shell (routes, auth, serving): it may use the
  runtime, never the other way;
- ``keeper.sim.master``, ``keeper.sim.node``, ``keeper.bridge``: the services, siblings that never
  import each other;
- ``keeper.sim.exo_standin``: a stock exo's API, served over a master;
- ``keeper.sim.cluster``: a master with its nodes on one machine, and the demo facade;
- ``keeper.sim.soak``, then ``keeper.cli``.

The TUI talks to a master over HTTP and reads the answers with the data model; besides it, it may
import only the client and the ``keeper.sim.cluster.demo`` facade behind ``--demo``. docs/design.md
draws the floors.

This is a plain AST walk over every import statement (including those inside functions), rather
than import-linter, because the rules name standard-library modules (asyncio, time, socket...)
that import-linter's contracts cannot see without treating the whole stdlib as a package.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DATA_MODEL = "keeper.model"
KEEPER_CORE = "keeper.core"
CLIENT = "keeper.client"
SERVICES = ("keeper.sim.master", "keeper.sim.node", "keeper.bridge")
SIM = "keeper.sim"
# Every package of ``keeper`` but the simulation and the CLI that starts it.
PRODUCT_AND_SHARED = (
    DATA_MODEL,
    KEEPER_CORE,
    CLIENT,
    "keeper.runtime",
    "keeper.httpapi",
    "keeper.bridge",
)
# Lowest first; a floor may import its own and any lower floor's modules (and the ``keeper``
# package, whose __init__ re-exports the pinned names).
FLOORS: tuple[tuple[str, ...], ...] = (
    (DATA_MODEL,),
    (KEEPER_CORE,),
    (CLIENT,),
    ("keeper.runtime", "keeper.sim.link"),
    ("keeper.httpapi",),
    SERVICES,
    ("keeper.sim.exo_standin",),
    ("keeper.sim.cluster",),
    ("keeper.sim.soak",),
    ("keeper.cli",),
)
# Pairs on one floor or across floors that must still stay apart: the services are siblings; the
# shell runtime does not use the CLI's client; the cluster, the soak and the stand-in never need
# the bridge (it runs as its own process beside them).
APART: tuple[tuple[str, str], ...] = (
    *[(a, b) for a in SERVICES for b in SERVICES if a != b],
    *[(floor, CLIENT) for floor in ("keeper.runtime", "keeper.sim.link", "keeper.httpapi")],
    *[(floor, CLIENT) for floor in SERVICES],
    ("keeper.sim.exo_standin", "keeper.bridge"),
    ("keeper.sim.cluster", "keeper.bridge"),
    ("keeper.sim.soak", "keeper.bridge"),
    # The product an operator runs beside a real exo, and the layers it stands on, never need
    # the simulation (``keeper.sim``: our master, simulated nodes, their link, local clusters,
    # the stock-exo stand-in, the soak); only the CLI, which starts it, imports it.
    *[(floor, SIM) for floor in PRODUCT_AND_SHARED],
)
PURE = (DATA_MODEL, KEEPER_CORE)
# What a pure function of State must not reach for: clocks, event loops, files, sockets,
# processes, randomness with hidden state, HTTP and UI libraries.
IMPURE_MODULES = {
    "asyncio",
    "anyio",
    "trio",
    "time",
    "datetime",
    "os",
    "io",
    "pathlib",
    "shutil",
    "socket",
    "select",
    "selectors",
    "subprocess",
    "threading",
    "multiprocessing",
    "signal",
    "logging",
    "random",
    "tempfile",
    "httpx",
    "fastapi",
    "starlette",
    "sse_starlette",
    "httpx_sse",
    "uvicorn",
    "websockets",
    "textual",
    "rich",
}


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_our_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports_of(path: Path) -> list[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [Import(module, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append(Import(module, target, node.lineno))
            # `from keeper import master` imports the module keeper.sim.master.
            found += [
                Import(module, f"{target}.{alias.name}", node.lineno)
                for alias in node.names
                if _is_our_module(f"{target}.{alias.name}")
            ]
    return found


def _all_imports(package: str) -> list[Import]:
    return [imp for path in sorted((ROOT / package).rglob("*.py")) for imp in _imports_of(path)]


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def floor_of(module: str) -> int | None:
    for level, floor in enumerate(FLOORS):
        if any(_within(module, prefix) for prefix in floor):
            return level
    return None


def _fmt(imp: Import) -> str:
    return f"{imp.importer} (line {imp.line}) imports {imp.imported}"


# Read when a test first asks, not at import: every pytest worker imports this module to
# collect it, and parsing every module is a second of CPU that only the worker running these
# tests needs to spend.
@functools.cache
def keeper_imports() -> list[Import]:
    return _all_imports("keeper")


@functools.cache
def tui_imports() -> list[Import]:
    return _all_imports("exo_deploy_tui")


def test_the_walk_sees_imports() -> None:
    # Guard against a silently empty check.
    assert any(
        i.importer == "keeper.model.apply" and i.imported == "keeper.model.events"
        for i in keeper_imports()
    )


def test_every_module_has_a_floor() -> None:
    """No flat modules beside the floors: each module of ``keeper`` lives in one of them."""
    modules = {_module_name(path) for path in (ROOT / "keeper").rglob("*.py")}
    packages = {"keeper", SIM}  # their __init__ modules hold a docstring only
    assert sorted(m for m in modules if m not in packages and floor_of(m) is None) == []


def test_no_floor_imports_a_higher_one() -> None:
    bad: list[str] = []
    for imp in keeper_imports():
        importer, imported = floor_of(imp.importer), floor_of(imp.imported)
        if importer is not None and imported is not None and imported > importer:
            bad.append(_fmt(imp))
    assert bad == []


@pytest.mark.parametrize(("layer", "forbidden"), APART)
def test_floors_that_stay_apart(layer: str, forbidden: str) -> None:
    bad = [
        _fmt(i)
        for i in keeper_imports()
        if _within(i.importer, layer) and _within(i.imported, forbidden)
    ]
    assert bad == []


@pytest.mark.parametrize("layer", PURE)
def test_the_pure_floors_import_no_io(layer: str) -> None:
    bad = [
        _fmt(i)
        for i in keeper_imports()
        if _within(i.importer, layer) and i.imported.split(".")[0] in IMPURE_MODULES
    ]
    assert bad == []


def test_the_pure_floors_open_no_files() -> None:
    bad = [
        f"{path.name} line {node.lineno}"
        for path in sorted((ROOT / "keeper").rglob("*.py"))
        if any(_within(_module_name(path), layer) for layer in PURE)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"open", "print", "input"}
    ]
    assert bad == []


def test_keeper_never_imports_the_tui() -> None:
    assert [_fmt(i) for i in keeper_imports() if _within(i.imported, "exo_deploy_tui")] == []


def test_tui_reads_the_master_only_through_http() -> None:
    allowed = (DATA_MODEL, CLIENT, "keeper.sim.cluster.demo")
    bad = [
        _fmt(i)
        for i in tui_imports()
        if _within(i.imported, "keeper")
        and i.imported != "keeper"
        and not any(_within(i.imported, a) for a in allowed)
    ]
    assert bad == []


def test_tui_screens_and_widgets_never_import_the_app() -> None:
    """Attributes down, messages up: a screen reads what it is given and posts messages, so
    nothing under it needs the app's module."""
    lower = ("exo_deploy_tui.screens", "exo_deploy_tui.widgets")
    bad = [
        _fmt(i)
        for i in tui_imports()
        if any(_within(i.importer, layer) for layer in lower)
        and _within(i.imported, "exo_deploy_tui.app")
    ]
    assert bad == []


# The dashboard's layers, lowest first (docs/design.md §9.1): the pure model of the cluster, the
# feed that brings it what a master answers, what the screen says, the widgets that draw it, the
# screens, then the app. A layer may import its own and lower layers' modules.
TUI_FLOORS: tuple[str, ...] = (
    "exo_deploy_tui.model",
    "exo_deploy_tui.feed",
    "exo_deploy_tui.view",
    "exo_deploy_tui.widgets",
    "exo_deploy_tui.screens",
)
# What each lower layer must not reach for: the model is pure (no UI, no I/O, no clock), the feed
# and the view draw nothing (no Textual: the feed is HTTP, the view Rich text).
TUI_FORBIDDEN: dict[str, frozenset[str]] = {
    # The model shows the master's dates on the local clock (``time.localtime`` of a given
    # moment, ISO dates parsed): it may import time and datetime, and never reads the clock
    # (``test_the_tui_model_reads_no_clock``).
    "exo_deploy_tui.model": frozenset(IMPURE_MODULES - {"time", "datetime"}),
    "exo_deploy_tui.feed": frozenset({"textual", "rich"}),
    "exo_deploy_tui.view": frozenset({"textual", "httpx", "anyio"}),
}


def tui_floor_of(module: str) -> int | None:
    for level, floor in enumerate(TUI_FLOORS):
        if _within(module, floor):
            return level
    return None


def test_every_tui_layer_imports_only_lower_ones() -> None:
    bad = [
        _fmt(i)
        for i in tui_imports()
        if (importer := tui_floor_of(i.importer)) is not None
        and (imported := tui_floor_of(i.imported)) is not None
        and imported > importer
    ]
    assert bad == []


def test_the_tui_layers_below_the_app_never_import_its_shell() -> None:
    """The app's own modules (app, cli, terminal, testing, ...) sit on top of every layer."""
    shell = [
        _module_name(path)
        for path in sorted((ROOT / "exo_deploy_tui").glob("*.py"))
        if path.name != "__init__.py"
    ]
    assert "exo_deploy_tui.app" in shell  # guard: the walk sees the shell
    bad = [
        _fmt(i)
        for i in tui_imports()
        if tui_floor_of(i.importer) is not None and any(_within(i.imported, m) for m in shell)
    ]
    assert bad == []


@pytest.mark.parametrize("layer", sorted(TUI_FORBIDDEN))
def test_the_tui_model_feed_and_view_keep_to_their_kind(layer: str) -> None:
    forbidden = TUI_FORBIDDEN[layer]
    bad = [
        _fmt(i)
        for i in tui_imports()
        if _within(i.importer, layer) and i.imported.split(".")[0] in forbidden
    ]
    assert bad == []


# The calls that read a clock, by the name they are called by.
CLOCK_READS = {"time", "monotonic", "perf_counter", "now", "utcnow", "today"}


def test_the_tui_model_reads_no_clock() -> None:
    bad = [
        f"{path.name} line {node.lineno}"
        for path in sorted((ROOT / "exo_deploy_tui" / "model").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in CLOCK_READS
    ]
    assert bad == []


def test_the_tui_model_opens_no_files() -> None:
    bad = [
        f"{path.name} line {node.lineno}"
        for path in sorted((ROOT / "exo_deploy_tui" / "model").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"open", "print", "input"}
    ]
    assert bad == []


def test_tui_modules_do_not_import_each_other_in_a_circle() -> None:
    """A cycle (even one under TYPE_CHECKING) means two modules are one: the lower one's names
    belong in it."""
    edges: dict[str, set[str]] = {}
    for imp in tui_imports():
        if _within(imp.imported, "exo_deploy_tui") and imp.imported != imp.importer:
            edges.setdefault(imp.importer, set()).add(imp.imported)
    cycles = sorted(
        f"{a} <-> {b}"
        for a, targets in edges.items()
        for b in targets
        if a in edges.get(b, ()) and a < b
    )
    assert cycles == []
