"""A deployment's chats in the dashboard's words (``view/requests.py``): the REQ/S and ERR
cells, which columns yield at narrow widths (``view/cells.py``), and describe's ``chats``
lines."""

from __future__ import annotations

from typing import cast

import pytest
from model_ids import LLAMA, QWEN
from rich.text import Text

from exo_deploy_tui.model.cluster import ClusterModel
from exo_deploy_tui.model.format import short_model
from exo_deploy_tui.model.updates import ConnectionUpdate
from exo_deploy_tui.screens.describe import describe_text
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder
from exo_deploy_tui.view.cells import (
    REQUESTS_COLUMNS_FROM,
    deployment_cells,
    deployment_columns,
)
from exo_deploy_tui.view.requests import chats_lines, errors_cell, rate_cell, rate_text
from keeper.model.api_models import RequestsView
from keeper.model.catalog import catalog_by_id
from keeper.model.request_rule import Outcome
from keeper.model.request_window import EndedRequest, requests_view

T = FROZEN_NOW


def summed(**outcomes: int) -> RequestsView:
    """The service's own sum (``keeper.model.request_window``) of chats that ended so."""
    ended = [
        EndedRequest(T - 10, cast(Outcome, name), 0.42 if name != "failed" else None)
        for name, count in outcomes.items()
        for _ in range(count)
    ]
    view = requests_view(ended, T)
    assert view is not None
    return view


# --- the cells --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        (112 / 300, "0.4"),
        (1 / 300, "<0.1"),  # one chat in five minutes: not "0.0"
        (0.05, "0.1"),
        (9.9, "9.9"),
        (12.4, "12"),
        (1234.0, "1k"),
        (12_345.0, "12k"),
    ],
)
def test_the_rate_in_at_most_four_characters(rate: float, text: str) -> None:
    assert rate_text(rate) == text
    assert len(text) <= 4


def test_no_sum_reads_a_dim_dash_and_errors_read_in_the_error_colour() -> None:
    assert rate_cell(None) == ("—", "dim") and errors_cell(None) == ("—", "dim")
    assert rate_cell(summed(ok=120)) == ("0.4", "")
    assert errors_cell(summed(ok=120)) == ("0", "dim")
    assert errors_cell(summed(ok=1, failed=3)) == ("3", "bold red")
    assert errors_cell(summed(failed=1500))[0] == "1k"  # ERR's three characters


def connected(builder: ClusterBuilder) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], T)
    return model


def three_nodes() -> ClusterBuilder:
    return ClusterBuilder().node("studio").node("mini-a").node("mini-b").link_all()


def test_the_row_shows_its_rate_and_failures_and_dashes_without_a_sum() -> None:
    model = connected(
        three_nodes()
        .deployment(QWEN, on=["mini-a"])
        .chats(QWEN, ok=112, held=3, migrated=1, failed=4)
        .deployment("mlx-community/Qwen3-8B-4bit", on=["mini-b"])
    )
    columns = deployment_columns(80, model_len=15)
    keys = [c.key for c in columns]
    cells = {
        row.model_id: dict(zip(keys, deployment_cells(row, columns), strict=True))
        for row in model.deployment_rows(T)
    }
    busy, idle = cells[QWEN], cells["mlx-community/Qwen3-8B-4bit"]
    assert (busy["rate"][0].strip(), busy["err"]) == ("0.4", ("4", "bold red"))
    assert (idle["rate"], idle["err"]) == (("—", "dim"), ("—", "dim"))


# --- which columns yield ----------------------------------------------------------------------


def keys(width: int, model_len: int, *, replicas: bool = True) -> list[str]:
    return [c.key for c in deployment_columns(width, model_len, replicas=replicas)]


def test_at_80_columns_err_shows_and_the_rate_takes_only_room_to_spare() -> None:
    qwen, llama = len(short_model(QWEN)), len(short_model(LLAMA))
    assert keys(80, qwen) == ["status", "model", "ready", "rate", "err", "nodes", "age", "next"]
    # A Llama name (26) keeps whole; the rate yields, failures stay.
    assert keys(80, llama) == ["status", "model", "ready", "err", "nodes", "age", "next"]
    for model_len in (qwen, llama):
        columns = deployment_columns(80, model_len)
        (model,) = [c for c in columns if c.key == "model"]
        (nodes,) = [c for c in columns if c.key == "nodes"]
        assert model.width > model_len and nodes.width >= 8
        assert sum(c.width for c in columns) < 80  # and the scrollbar


def test_the_longest_catalog_name_stays_whole_at_80_with_err_beside_it() -> None:
    longest = max(len(short_model(c.model_id)) for c in catalog_by_id().values())
    columns = deployment_columns(80, longest)
    assert "err" in [c.key for c in columns]
    (model,) = [c for c in columns if c.key == "model"]
    assert model.width > longest


def test_below_80_columns_both_yield_and_a_stock_exo_has_neither() -> None:
    assert not {"rate", "err"} & set(keys(REQUESTS_COLUMNS_FROM - 1, 15))
    assert {"rate", "err"} <= set(keys(REQUESTS_COLUMNS_FROM, 15))
    assert not {"rate", "err"} & set(keys(200, 15, replicas=False))


def test_a_wide_table_keeps_the_placement_errors_room_before_the_rate() -> None:
    # 120 columns less the wide layout's borders: a Llama name leaves no room for the rate
    # beside PLACEMENT ERROR's 16; Qwen names do.
    long = deployment_columns(118, len(short_model(LLAMA)))
    assert "rate" not in [c.key for c in long] and "err" in [c.key for c in long]
    assert next(c.width for c in long if c.key == "error") >= 14
    short = deployment_columns(118, len(short_model(QWEN)))
    assert "rate" in [c.key for c in short]
    assert [c.width for c in short if c.key == "error"] == [16]


@pytest.mark.parametrize("width", [80, 99, 100, 110, 118, 120, 160])
@pytest.mark.parametrize("model_len", [13, 15, 18, 26, 27])
def test_the_columns_fit_and_every_column_has_room(width: int, model_len: int) -> None:
    columns = deployment_columns(width, model_len)
    assert sum(c.width for c in columns) < width
    assert all(c.width >= 4 for c in columns), columns


# --- describe ---------------------------------------------------------------------------------


def plain(lines: list[Text]) -> list[str]:
    return [line.plain for line in lines]


def test_describe_says_the_window_rate_p95_and_each_outcome_in_words() -> None:
    lines = chats_lines(summed(ok=112, held=3, migrated=1), room=64)
    assert plain(lines) == [
        "116 in the last 5 min · 0.4/s · p95 first token 0.42 s",
        "112 ok · 3 held · 1 migrated · 0 failed",
        "held: waited for it to serve, then answered",
        "migrated: cut mid-answer, then continued",
    ]


def test_describe_counts_the_rarer_outcomes_only_when_they_happened() -> None:
    lines = plain(chats_lines(summed(ok=2, retried=1, cancelled=1, rejected=2, failed=1), 200))
    assert (
        lines[1] == "2 ok · 0 held · 1 retried · 0 migrated · 1 failed · 1 cancelled · 2 rejected"
    )
    assert "retried: sent again before its first token" in lines[2]
    assert "failed: the client got an error" in lines[2]


def test_describe_styles_failures_red_cautions_yellow_and_zeros_dim() -> None:
    counts = chats_lines(summed(ok=5, held=1, failed=2), 200)[1]
    by_word = {counts.plain[s.start : s.end]: str(s.style) for s in counts.spans}
    assert by_word["2 failed"] == "bold red" and by_word["1 held"] == "yellow"
    assert by_word["0 migrated"] == "dim" and "5 ok" not in by_word  # plain


def test_describe_without_a_sum_says_none_and_where_chats_are_counted() -> None:
    (line,) = plain(chats_lines(None, room=64))
    assert line == "none in the last 5 min via /v1/chat/completions here"


def test_a_part_that_does_not_fit_goes_to_the_next_line_never_cut() -> None:
    lines = plain(chats_lines(summed(ok=112, held=3, migrated=1), room=40))
    assert all(len(line) <= 40 for line in lines[:2])
    assert " · ".join(lines).count("p95 first token 0.42 s") == 1
    assert "116 in the last 5 min · 0.4/s" in lines


def test_describe_shows_the_chats_field_under_the_keeper() -> None:
    model = connected(three_nodes().deployment(QWEN, on=["mini-a"]).chats(QWEN, ok=30, failed=2))
    text = describe_text(model, "dep-qwen3-0.6b-4bit", QWEN, T, width=75).plain
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("chats"))
    assert lines[at - 1].startswith("keeper")
    assert lines[at] == "chats      32 in the last 5 min · 0.1/s · p95 first token 0.42 s"
    assert lines[at + 1] == "           30 ok · 0 held · 0 migrated · 2 failed"
    assert lines[at + 2] == "           failed: the client got an error"
