"""The architecture, checked: each layer imports only what sits below it.

Lowest first: the data model -> placement and the keeper core (pure: no I/O, clock, asyncio,
HTTP or Textual) -> the shell runtime every service shares (``keeper.runtime``, ``keeper.link``,
``keeper.httpapi``) -> the three services, siblings that never import each other (the master,
the simulated nodes, the bridge) -> a master with its nodes on one machine (``keeper.cluster``)
-> the soak and the demo facade -> the CLI. The TUI talks to a master over HTTP and reads the
answers with the data model; besides the data model it may import only the deployments client
(``keeper.api_client``, which the CLI uses too and which imports only the data model and HTTP)
and the ``keeper.demo`` facade behind ``--demo``. docs/design.md draws the layers.

This is a plain AST walk over every import statement (including those inside functions), rather
than import-linter, because the rules name standard-library modules (asyncio, time, socket...)
that import-linter's contracts cannot see without treating the whole stdlib as a package.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

DATA_MODEL = {
    "keeper.wire",
    "keeper.state",
    "keeper.events",
    "keeper.apply",
    "keeper.ids",
    "keeper.api_models",
    "keeper.catalog",
    "keeper.constants",
    "keeper.exo_state",
    "keeper.readiness",
    "keeper.history",
}
# The deployments API's HTTP client, shared by the CLI and the TUI: the data model plus httpx.
API_CLIENT = "keeper.api_client"
KEEPER_CORE = ("keeper.core", "keeper.placement", "keeper.memo", "keeper.cluster_view")
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
            # `from keeper import master` imports the module keeper.master.
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


def _is_core(name: str) -> bool:
    return any(_within(name, p) for p in KEEPER_CORE)


def _fmt(imp: Import) -> str:
    return f"{imp.importer} (line {imp.line}) imports {imp.imported}"


KEEPER_IMPORTS = _all_imports("keeper")
TUI_IMPORTS = _all_imports("exo_deploy_tui")


def test_the_walk_sees_imports() -> None:
    # Guard against a silently empty check.
    assert any(
        i.importer == "keeper.apply" and i.imported == "keeper.events" for i in KEEPER_IMPORTS
    )


def test_data_model_imports_only_the_data_model() -> None:
    bad = [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if i.importer in DATA_MODEL
        and _within(i.imported, "keeper")
        and i.imported not in DATA_MODEL
        and i.imported != "keeper"
    ]
    bad += [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if i.importer in DATA_MODEL and i.imported.split(".")[0] in IMPURE_MODULES
    ]
    assert bad == []


def test_keeper_core_is_pure() -> None:
    bad = [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if _is_core(i.importer) and i.imported.split(".")[0] in IMPURE_MODULES
    ]
    bad += [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if _is_core(i.importer)
        and _within(i.imported, "keeper")
        and not (i.imported in DATA_MODEL or _is_core(i.imported) or i.imported == "keeper")
    ]
    assert bad == []


def test_keeper_core_opens_no_files() -> None:
    bad = [
        f"{path.name} line {node.lineno}"
        for path in sorted((ROOT / "keeper").rglob("*.py"))
        if _is_core(_module_name(path))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"open", "print", "input"}
    ]
    assert bad == []


RUNTIME = ("keeper.runtime", "keeper.link", "keeper.httpapi")
SERVICES = ("keeper.master", "keeper.node", "keeper.bridge")
ABOVE_SERVICES = ("keeper.cluster", "keeper.soak", "keeper.demo", "keeper.cli")


def _others(service: str) -> tuple[str, ...]:
    return tuple(s for s in SERVICES if s != service)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        *[(layer, SERVICES + ABOVE_SERVICES) for layer in RUNTIME],
        # The services are siblings: the nodes and the bridge import nothing from the master.
        *[(service, _others(service) + ABOVE_SERVICES) for service in SERVICES],
        ("keeper.cluster", ("keeper.bridge", "keeper.soak", "keeper.demo", "keeper.cli")),
        ("keeper.soak", ("keeper.bridge", "keeper.cli", "keeper.demo")),
        ("keeper.demo", ("keeper.bridge", "keeper.soak", "keeper.cli")),
        ("keeper", ("exo_deploy_tui",)),
    ],
)
def test_lower_layers_never_import_higher_ones(layer: str, forbidden: tuple[str, ...]) -> None:
    bad = [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if _within(i.importer, layer) and any(_within(i.imported, f) for f in forbidden)
    ]
    assert bad == []


def test_the_api_client_imports_only_the_data_model() -> None:
    bad = [
        _fmt(i)
        for i in KEEPER_IMPORTS
        if i.importer == API_CLIENT
        and _within(i.imported, "keeper")
        and i.imported not in DATA_MODEL
    ]
    assert bad == []


def test_tui_reads_the_master_only_through_http() -> None:
    allowed = DATA_MODEL | {"keeper", "keeper.demo", API_CLIENT}
    bad = [
        _fmt(i) for i in TUI_IMPORTS if _within(i.imported, "keeper") and i.imported not in allowed
    ]
    assert bad == []


def test_tui_screens_and_widgets_never_import_the_app() -> None:
    """Attributes down, messages up: a screen reads what it is given and posts messages, so
    nothing under it needs the app's module."""
    lower = ("exo_deploy_tui.screens", "exo_deploy_tui.widgets")
    bad = [
        _fmt(i)
        for i in TUI_IMPORTS
        if any(_within(i.importer, layer) for layer in lower)
        and _within(i.imported, "exo_deploy_tui.app")
    ]
    assert bad == []
