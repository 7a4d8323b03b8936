"""The dashboard's pure parts: its key table, command line, form rules, cell text, URL checks."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from model_ids import LLAMA as LLAMA_1B
from model_ids import QWEN
from textual.binding import Binding

from exo_deploy_tui.cli import check_url, main
from exo_deploy_tui.failure_log import failure_log_path, record_failure
from exo_deploy_tui.model.cluster import ClusterModel, Connection, DeploymentRow, Summary
from exo_deploy_tui.model.format import duration, precise_duration, short_id, short_model
from exo_deploy_tui.screens.dashboard import DashboardScreen
from exo_deploy_tui.screens.help import HELP_WIDTH, help_text
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder
from exo_deploy_tui.view.cells import (
    deployment_cells,
    deployment_columns,
    detail_text,
    header_text,
    instance_columns,
    next_text,
    node_columns,
)
from exo_deploy_tui.view.commands import (
    ACTIONS,
    Arguments,
    Parsed,
    ParseError,
    allowed,
    parse_command,
    visible_actions,
)
from exo_deploy_tui.view.forms import fit_hint, search_models, validate_create
from keeper.model.api_models import CreateDeploymentRequest, ModelListEntry, model_entry
from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id
from keeper.model.refusals import BadRequestError
from keeper.model.state import InstanceMeta, Sharding
from keeper.runtime.deployments import new_deployment

ENTRIES = [model_entry(c) for c in BUILTIN_MODEL_CARDS]
BY_ID = {e.id: e for e in ENTRIES}
DEEPSEEK = "mlx-community/DeepSeek-V3.1-4bit"


# --- command line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("sort name", Parsed("sort", ("name",))),
        (":sort AGE", Parsed("sort", ("age",))),
        ("filter qwen 30b", Parsed("filter", ("qwen 30b",))),
        ("filter", Parsed("filter", ("",))),  # clears it
        ("nodes", Parsed("show_tab", ("nodes",))),
        ("new", Parsed("new")),
        ("q", Parsed("quit")),
        ("kill studio", Parsed("fault", ("kill", "studio"))),
        ("freeze mini-a 12", Parsed("fault", ("freeze", "mini-a", 12.0))),
        ("killrunner mini-b", Parsed("fault", ("kill_runner", "mini-b"))),
        ("kill", Parsed("fault", ("kill",))),
        ("cordon mini-a", Parsed("cordon", ("mini-a",))),
        ("drain", Parsed("drain")),
    ],
)
def test_commands_parse(line: str, expected: Parsed) -> None:
    assert parse_command(line, readonly=False, demo=True) == expected


@pytest.mark.parametrize(
    ("line", "readonly", "demo", "message"),
    [
        ("", False, False, "type a command"),
        ("sort size", False, False, "sort by what?"),
        ("frob", False, False, "unknown command 'frob'"),
        ("new", True, False, "read-only"),
        ("delete", True, False, "read-only"),
        ("cordon studio", True, False, "read-only"),
        ("drain", True, False, "read-only"),
        ("kill studio", False, False, "only with --demo"),
        ("restart-master", False, False, "only with --demo"),
        ("freeze studio soon", False, True, "'soon' is not a number of seconds"),
        ("freeze studio 0", False, True, "between 0 and 3600"),
        ("kill studio 5", False, True, "usage: kill NODE"),
        ("pause now", False, False, "takes no arguments"),
    ],
)
def test_bad_commands_say_what_is_wrong(
    line: str, readonly: bool, demo: bool, message: str
) -> None:
    parsed = parse_command(line, readonly=readonly, demo=demo)
    assert isinstance(parsed, ParseError)
    assert message in parsed.message


# --- the dashboard's keys: one table ------------------------------------------------------------

# Per kind of command argument, the most a command takes: as typed, and as the action gets it.
MOST_ARGUMENTS: dict[Arguments, tuple[str, tuple[str | float, ...]]] = {
    "none": ("", ()),
    "replicas": ("3", (3,)),
    "text": ("qwen 30b", ("qwen 30b",)),
    "node": ("studio", ("studio",)),
    "node_seconds": ("studio 5", ("studio", 5.0)),
}
MODES = [(False, False), (True, False), (False, True), (True, True)]  # (readonly, demo)


def test_every_dashboard_binding_is_an_entry_of_the_table() -> None:
    bound = list(Binding.make_bindings(DashboardScreen.BINDINGS))  # one per key
    table = {key: spec for spec in ACTIONS for key in spec.binding_keys.split(",")}
    assert len(table) == sum(len(s.binding_keys.split(",")) for s in ACTIONS)  # no key twice
    assert sorted(b.key for b in bound) == sorted(table)
    for binding in bound:
        spec = table[binding.key]
        assert (binding.action, binding.description, binding.show) == (
            spec.action,
            spec.title,
            spec.footer,
        )
    # The footer lists its keys in the table's order.
    assert [b.key for b in bound if b.show] == [
        key for spec in ACTIONS if spec.footer for key in spec.binding_keys.split(",")
    ]


def test_every_entry_is_a_dashboard_action_that_takes_what_its_command_adds() -> None:
    defined = {n.removeprefix("action_") for n in vars(DashboardScreen) if n.startswith("action_")}
    assert defined == {spec.method for spec in ACTIONS}
    for spec in ACTIONS:
        method = getattr(DashboardScreen, f"action_{spec.method}")
        inspect.signature(method).bind(None, *spec.params)  # as its key calls it
        if not spec.command:
            assert spec.method in ("command_line", "back"), spec  # keys only
            continue
        typed, parsed = MOST_ARGUMENTS[spec.arguments]
        for name in (spec.command, *spec.aliases):
            line = f"{name} {typed}"
            assert parse_command(line, readonly=False, demo=True) == Parsed(
                spec.method, spec.params + parsed
            ), line
        inspect.signature(method).bind(None, *spec.params, *parsed)  # as its command calls it


def test_the_actions_that_change_the_cluster_are_the_mutating_ones() -> None:
    # A new action that changes the cluster (or the app) must be marked so in the table.
    assert {s.method for s in ACTIONS if s.mutating} == {
        "new",
        "delete",
        "scale",
        "edit",
        "delete_instance",
        "cordon",
        "drain",
    }
    assert {s.method for s in ACTIONS if s.demo_only} == {"fault", "restart_master"}


@pytest.mark.parametrize(("readonly", "demo"), MODES)
def test_readonly_refuses_exactly_the_mutating_entries_and_demo_the_demos(
    readonly: bool, demo: bool
) -> None:
    offered = visible_actions(readonly=readonly, demo=demo)
    for spec in ACTIONS:
        refused = (readonly and spec.mutating) or (spec.demo_only and not demo)
        # check_action decides by method name: for keys, ``:`` and the palette alike.
        assert allowed(spec.method, readonly=readonly, demo=demo) is not refused, spec
        assert (spec in offered) is not refused, spec  # help and palette
        if spec.command:
            parsed = parse_command(spec.command, readonly=readonly, demo=demo)
            assert isinstance(parsed, ParseError) is refused, spec


def test_readonly_and_demo_decide_what_is_offered() -> None:
    plain = {a.command for a in visible_actions(readonly=True, demo=False)}
    assert "new" not in plain and "delete" not in plain and "kill" not in plain
    demo = {a.command for a in visible_actions(readonly=False, demo=True)}
    assert {"new", "delete", "kill", "freeze", "restart-master"} <= demo


# --- the create form's rules ------------------------------------------------------------------


def test_search_matches_every_word_smallest_first() -> None:
    assert [e.id for e in search_models(ENTRIES, "qwen3")][:2] == [
        QWEN,
        "mlx-community/Qwen3-8B-4bit",
    ]
    assert [e.id for e in search_models(ENTRIES, "LLAMA 70")] == [
        "mlx-community/Llama-3.3-70B-Instruct-4bit"
    ]
    assert search_models(ENTRIES, "nothing-like-this") == []


def test_validate_create() -> None:
    entry = BY_ID[QWEN]
    llama = BY_ID[LLAMA_1B]  # supports tensor parallelism, as exo says; Qwen3-0.6B does not
    ok = validate_create(llama, "Tensor", "MlxJaccl", " 2 ", {})
    assert ok == CreateDeploymentRequest(
        model_id=LLAMA_1B,
        sharding=Sharding.TENSOR,
        instance_meta=InstanceMeta.MLX_JACCL,
        min_nodes=2,
    )
    assert validate_create(entry, "Pipeline", "MlxRing", "", {}) == CreateDeploymentRequest(
        model_id=QWEN
    )
    assert "Choose a model" in str(validate_create(None, "Pipeline", "MlxRing", "1", {}))
    assert "whole number" in str(validate_create(entry, "Pipeline", "MlxRing", "two", {}))
    assert "between 1 and 1024" in str(validate_create(entry, "Pipeline", "MlxRing", "0", {}))
    assert "already has a deployment (dep-1)" in str(
        validate_create(entry, "Pipeline", "MlxRing", "1", {QWEN: "dep-1"})
    )
    assert "does not support tensor" in str(validate_create(entry, "Tensor", "MlxRing", "1", {}))


NO_TENSOR = BY_ID[QWEN].model_copy(update={"supports_tensor": False})


@pytest.mark.parametrize(
    ("entry", "sharding", "min_nodes", "field"),
    [
        (BY_ID[QWEN], "Pipeline", 29, "min_nodes"),  # Qwen3 0.6B has 28 layers
        (NO_TENSOR, "Tensor", 1, "sharding"),
        (NO_TENSOR.model_copy(update={"n_layers": 0}), "Pipeline", 500, None),  # layers unknown
        (BY_ID[QWEN].model_copy(update={"supports_tensor": True}), "Tensor", 28, None),
    ],
)
def test_the_form_refuses_what_the_master_refuses_in_the_same_words(
    entry: ModelListEntry, sharding: str, min_nodes: int, field: str | None
) -> None:
    form = validate_create(entry, sharding, "MlxRing", str(min_nodes), {})
    card = catalog_by_id()[QWEN].model_copy(
        update={"n_layers": entry.n_layers, "supports_tensor": entry.supports_tensor}
    )
    try:
        new_deployment({}, card, sharding, "MlxRing", min_nodes)
    except BadRequestError as refused:
        assert (refused.param, form) == (field, f"{refused}.")
    else:
        assert field is None
        assert isinstance(form, CreateDeploymentRequest)


def test_fit_hint_compares_the_model_with_free_memory() -> None:
    state = ClusterBuilder().node("studio", ram_gb=96, free_gb=60).node("mini", free_gb=20).state
    assert fit_hint(BY_ID[QWEN], state).startswith("needs 0.3 GB: fits on one node")
    assert "most free: 60.0 GB on studio, 80.0 GB in all" in fit_hint(BY_ID[QWEN], state)
    assert "more than the whole cluster has free" in fit_hint(BY_ID[DEEPSEEK], state)
    assert "no node reports" in fit_hint(BY_ID[QWEN], ClusterBuilder().state)


# --- cells ------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [60, 79, 80, 99, 100, 118, 120, 200])
def test_columns_fit_the_width(width: int) -> None:
    for columns in (deployment_columns(width), node_columns(width), instance_columns(width)):
        assert sum(c.width for c in columns) <= max(width, 60), (width, columns)


def test_the_80_column_table_keeps_the_longest_catalog_name_whole() -> None:
    longest = max(len(short_model(c.model_id)) for c in catalog_by_id().values())
    (model,) = [c for c in deployment_columns(80, model_len=longest) if c.key == "model"]
    assert model.width > longest


def row(**changes: object) -> DeploymentRow:
    base = DeploymentRow(
        deployment_id="d",
        model_id=QWEN,
        status="placing",
        instance_id=None,
        nodes=(),
        in_status_s=75,
        in_status_known=False,
        placement_error=None,
        waiting="backoff",
        next_attempt_in_s=7.4,
        failures=2,
        load_progress=None,
        sharding="Pipeline",
        instance_meta="MlxRing",
        min_nodes=1,
    )
    return DeploymentRow(**{**base.__dict__, **changes})  # pyright: ignore[reportArgumentType]


def test_cells_say_status_in_words_and_symbols() -> None:
    cells = [text.strip() for text, _ in deployment_cells(row(), deployment_columns(80))]
    assert cells == ["○ placing", "Qwen3-0.6B-4bit", "0/1", "—", "-", "1m15s+", "backoff 7s"]
    wide = [text.strip() for text, _ in deployment_cells(row(), deployment_columns(120))]
    assert wide[:3] == ["○ placing", "Qwen3-0.6B-4bit", "0/1"] and "2" in wide  # FAIL
    assert next_text(row(waiting="unplaceable_retry", next_attempt_in_s=30)) == "retry 30s"
    assert next_text(row(status="starting", next_attempt_in_s=None, load_progress=0.5)) == (
        "load 50%"
    )


def test_the_detail_strip_explains_a_master_without_deployments() -> None:
    assert "n creates one" in detail_text(None, 80, 3).plain
    text = detail_text(None, 80, 3, has_deployments_api=False).plain
    assert "no deployments API" in text and len(text.splitlines()) <= 3


def test_the_header_says_stale_since_when() -> None:
    model = ClusterModel()
    summary = model.summary(FROZEN_NOW)
    stale = Connection("down", "cannot connect", 4.0, stale_since=FROZEN_NOW)
    text = header_text(
        stale, summary, FROZEN_NOW, "http://h:1", width=120, paused=False, readonly=False
    ).plain
    assert "✖ stale since" in text and "cannot connect, retrying in 4s" in text
    live = header_text(
        Connection("live"),
        Summary(3, 0, 0, {"serving": 2}, 2, 2),
        FROZEN_NOW,
        "http://h:1",
        width=80,
        paused=True,
        readonly=True,
    ).plain
    assert "● live" in live and "PAUSED" in live and "read-only" in live
    assert len(live) <= 80


def test_formatting() -> None:
    assert [duration(s) for s in (0, 9.9, 61, 3600 * 3 + 120, 86400 * 2 + 3600)] == [
        "0s",
        "9s",
        "1m01s",
        "3h02m",
        "2d01h",
    ]
    assert precise_duration(37.24) == "37.2 s"
    assert short_id("12D3KooWstudioxxxx") == "studioxx"
    assert short_id("d1e5a83e-505d-463e") == "d1e5a83e"
    assert short_id(None) == "-"


# --- command line arguments --------------------------------------------------------------------


def test_urls_are_checked() -> None:
    assert check_url("http://127.0.0.1:52415") is None
    assert check_url("https://master.lan") is None
    assert "http:// or https://" in str(check_url("127.0.0.1:52415"))
    assert "no host" in str(check_url("http://"))
    assert "bad port" in str(check_url("http://host:99999"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--url", "ftp://x"], "--url must start with http:// or https://"),
        (["--demo", "--url", "http://x:1"], "--demo starts its own master"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_clear_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_without_a_terminal_it_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--url", "http://127.0.0.1:1"])
    assert exited.value.code == 2
    assert "needs a terminal" in capsys.readouterr().err


def test_help_lists_every_key_and_command_inside_80x24() -> None:
    actions = visible_actions(readonly=False, demo=True)
    lines = help_text(actions).plain.splitlines()
    # 24 rows less the footer and the dialog's border: no scrolling.
    assert len(lines) <= 21, len(lines)
    assert max(len(line) for line in lines) <= HELP_WIDTH  # inside an 80-column dialog
    plain = "\n".join(lines)
    for spec in actions:
        assert f"{spec.key:>6} {spec.help}" in plain, spec  # never cut
        if spec.command:
            assert f":{spec.command} {spec.args}".rstrip() in plain, spec
    assert "ctrl+k delete an instance" in plain and "     s set the" in plain
    assert "     e edit the selection's settings" in plain and ":edit" in plain
    # Two columns: the second's keys start in one column.
    assert len({line.index(" 4 what happened") for line in lines if "4 what" in line}) == 1


def test_the_failure_log_follows_xdg_state_home(tmp_path: Path) -> None:
    home = Path.home()
    assert failure_log_path({}) == home / ".local/state/exo-deploy/tui.log"
    assert failure_log_path({"XDG_STATE_HOME": "relative"}) == failure_log_path({})
    assert failure_log_path({"XDG_STATE_HOME": "/s"}) == Path("/s/exo-deploy/tui.log")
    target = tmp_path / "made" / "on" / "demand.log"
    try:
        raise ValueError("first")
    except ValueError as exc:
        assert record_failure(exc, "one", target) == target
        assert record_failure(exc, "two", target) == target
    text = target.read_text()
    assert text.count("ValueError: first") == 2 and "one\n" in text and "two\n" in text
    # A log that cannot be written is skipped, never a new failure.
    assert (
        record_failure(ValueError("x"), "three", tmp_path / "made" / "on" / "demand.log" / "x")
        is None
    )
