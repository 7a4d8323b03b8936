"""Model rows to styled text: what each table cell, the header and the detail strip say.

Pure (rich Text, no Textual) so the words are tested without a terminal. Column widths depend on
the terminal width: at 80 columns every column the operator needs fits, and wider terminals get
room for the model name and the placement error. Colours are named ANSI colours so 16-colour
terminals show them as meant, and every status also has a word and a symbol.

One module (about 680 lines) on purpose: the column widths of every table are decided together,
from one terminal width, so that the tables line up with the header and the detail strip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from rich.console import Console
from rich.text import Text

from exo_deploy_tui.model.cluster import (
    Connection,
    DeploymentRow,
    InstanceRow,
    NodeRow,
    RunnerRow,
    Summary,
)
from exo_deploy_tui.model.downloads import DownloadFacts, download_mark, download_words
from exo_deploy_tui.model.draining import progress_words
from exo_deploy_tui.model.format import (
    STATUS_COLOR,
    STATUS_SYMBOL,
    clock_time,
    duration,
    gigabytes,
    percent_available,
    short_id,
    short_model,
    sparkline,
    status_label,
    truncate,
)
from exo_deploy_tui.model.timeline import Level, TimelineEntry
from exo_deploy_tui.view.columns import Cell, Cells, Column
from exo_deploy_tui.view.requests import errors_cell, rate_cell
from keeper.model.api_models import DeploymentStatus, ServiceHealthView, WaitReason
from keeper.model.state import DEFAULT_PRIORITY

# Only measures and wraps text for fit_lines; it never prints.
_MEASURE = Console(width=200, legacy_windows=False, color_system=None)
DIM = "dim"
LEVEL_STYLE: dict[Level, tuple[str, str]] = {
    "info": ("·", ""),
    "good": ("✔", "green"),
    "warn": ("!", "yellow"),
    "error": ("✖", "red"),
}
WAIT_WORD: dict[WaitReason, str] = {
    "grace": "grace",
    "backoff": "backoff",
    "unplaceable_retry": "retry",
    "placement_in_flight": "placing",
}
# Leads a timeline line the master's serving records told (before the dashboard connected, or
# while it was away) rather than one the dashboard saw happen.
HISTORY_MARK = "history ·"
# The widest terminal that still gets the compact columns; from here on there is room for the
# placement error as a column of its own.
WIDE_TABLE_FROM = 110


def _cell(text: str, style: str, width: int) -> Cell:
    # One column of padding on the right, drawn by us: DataTable's padding costs two per column.
    return (truncate(text, width - 1), style)


# --- deployments --------------------------------------------------------------------------


# Below this width the instance id moves out of the table into the detail strip, so the model
# name (the one thing an operator scans for) gets the room. The failure count goes too: NEXT
# already says "backoff" in amber, and the detail strip says how many were lost in a row.
INSTANCE_COLUMN_FROM = 100
# From here the table has room for the last 24 h's availability beside READY; on a narrower
# terminal describe shows it, with the incidents behind it.
AVAIL_COLUMN_FROM = 100
# From here PRIO, each deployment's priority (0-1000, which waits for a placement first and
# what may preempt what), shows beside them; the default (500) dim, so one set apart stands out.
# On a narrower terminal describe's raw JSON says it.
PRIO_COLUMN_FROM = 100
# AVAIL turns amber below 99 % of a day (14 minutes down: more than a dozen ordinary recoveries,
# so something keeps failing) and red below 90 % (over two hours: it mostly does not serve).
AVAIL_AMBER_BELOW = 0.99
AVAIL_RED_BELOW = 0.90
# From here ERR, each deployment's failed chats through the front door over the last five
# minutes (``view/requests.py``), shows beside READY: the one number of them an operator acts
# on, so like NEXT's failover words it takes its 4 from MODEL and NODES. REQ/S, their rate,
# shows only in room to spare: where MODEL keeps its longest name whole and NODES its minimum
# beside it, and on a wide table PLACEMENT ERROR its own (at 80 columns, names up to 22
# characters: Qwen3's, not Llama's). On a narrower split pane both yield; describe says them.
REQUESTS_COLUMNS_FROM = 80
# The narrowest NODES gets: a short node name, or two cut.
NODES_MIN = 8
# The widest MODEL gets: the longest names in exo's catalog, and room left for the rest.
MODEL_MAX = 34
# What a wide table keeps for PLACEMENT ERROR before NODES widens: the start of exo's words
# ("No cycles found…"); the detail strip says them whole.
ERROR_MIN = 16
# NEXT widens, up to this, while a row says more than a timer (``replacing on mini-a``, 19):
# a failover's words are the ones an operator reads then; NODES and MODEL give the room back.
NEXT_MAX = 21


def deployment_columns(
    width: int,
    model_len: int = 26,
    nodes_len: int = 14,
    *,
    replicas: bool = True,
    next_len: int = 0,
) -> tuple[Column, ...]:
    """Columns for a table ``width`` wide whose longest model name, node list and NEXT words
    are given; ``replicas``: whether there are deployments to count replicas of, serving
    records to summarise and chats to count (not on a stock exo)."""
    fixed = [
        Column("status", "STATUS", 13),
        Column("age", "AGE", 7),
        Column("next", "NEXT", max(12, min(next_len + 1, NEXT_MAX))),
    ]
    if replicas:
        fixed.append(Column("ready", "READY", 6))  # "16/16" and its padding
    if replicas and width >= AVAIL_COLUMN_FROM:
        fixed.append(Column("avail", "AVAIL", 6))  # "99.2%" and its padding
    if replicas and width >= PRIO_COLUMN_FROM:
        fixed.append(Column("prio", "PRIO", 5))  # "1000" and its padding
    if replicas and width >= REQUESTS_COLUMNS_FROM:
        fixed.append(Column("err", "ERR", 4))  # "999", "12k" and its padding
    if width >= INSTANCE_COLUMN_FROM:
        fixed.append(Column("fail", "FAIL", 5))
        fixed.append(Column("instance", "INSTANCE", 9))
    rate = Column("rate", "REQ/S", 6)  # "<0.1", "12" and its padding
    spare = width - sum(c.width for c in fixed) - 1 - min(model_len + 1, MODEL_MAX) - NODES_MIN
    if width >= WIDE_TABLE_FROM:
        spare -= ERROR_MIN
    if replicas and width >= REQUESTS_COLUMNS_FROM and spare >= rate.width:
        fixed.append(rate)
    room = max(20, width - sum(c.width for c in fixed) - 1)  # 1: the scrollbar
    model_w = max(12, min(model_len + 1, MODEL_MAX, room - NODES_MIN))
    if width >= WIDE_TABLE_FROM:
        nodes_w = max(NODES_MIN, min(nodes_len + 1, 24, room - model_w - ERROR_MIN))
        flexible = [
            Column("model", "MODEL", model_w),
            Column("nodes", "NODES", nodes_w),
            Column("error", "PLACEMENT ERROR", room - model_w - nodes_w),
        ]
    else:
        flexible = [Column("model", "MODEL", model_w), Column("nodes", "NODES", room - model_w)]
    by_key = {c.key: c for c in (*fixed, *flexible)}
    order = (
        "status",
        "model",
        "ready",
        "avail",
        "prio",
        "rate",
        "err",
        "instance",
        "nodes",
        "age",
        "next",
        "fail",
        "error",
    )
    return tuple(by_key[k] for k in order if k in by_key)


# A deployment a drain is moving, and a draining node: a planned change under way, neither
# healthy nor broken, in a colour no status uses. A cordon alone is a caution.
DRAINING_SYMBOL = "⇢"
DRAINING_STYLE = "magenta"
CORDONED_SYMBOL = "⊘"
CORDONED_STYLE = "yellow"


# A rolling change: the deployment's instances replaced one by one, as planned as a drain.
UPDATING_SYMBOL = "⟳"


# A deployment with an instance on a suspect node: not broken yet, no longer surely serving
# (docs/design.md §5.18). Amber like a caution, with a word and a symbol of its own.
AT_RISK_SYMBOL = "⚠"
AT_RISK_STYLE = "yellow"


def status_text(row: DeploymentRow) -> str:
    if row.at_risk:  # what happens next: in NEXT (``failover_next``)
        return f"{AT_RISK_SYMBOL} at risk"
    if row.draining:
        return f"{DRAINING_SYMBOL} draining"
    if row.updating is not None:  # how far: in NEXT (``next_text``), as STATUS has no room
        return f"{UPDATING_SYMBOL} updating"
    return status_label(row.status)


def status_style(row: DeploymentRow) -> str:
    if row.at_risk:
        return f"bold {AT_RISK_STYLE}"
    planned = row.draining or row.updating is not None
    return f"bold {DRAINING_STYLE if planned else STATUS_COLOR[row.status]}"


def failover_next(row: DeploymentRow) -> str | None:
    """What a failover does next, in NEXT: ``confirming 5s`` while the node is only suspect
    (and a replacement, if any, is ready), ``replacing on mini-a`` while its replacement
    loads, ``can't replace`` when none fits (the detail strip says why); None when no
    failover is under way or a confirmed one has nothing more to say than the status."""
    failover = row.failover
    if failover is None:
        return None
    on = ",".join(failover.replacing_on)
    if failover.phase == "confirmed":
        return f"replacing on {on}" if on and not failover.replacement_ready else None
    if on and not failover.replacement_ready:
        return f"replacing on {on}"
    if failover.why is not None and not on:
        return "can't replace"
    return f"confirming {duration(failover.for_s)}"


def failover_words(row: DeploymentRow) -> str:
    """The failover in words, for the detail strip; empty when none is under way."""
    failover = row.failover
    if failover is None:
        return ""
    nodes = ", ".join(failover.nodes)
    on = ", ".join(failover.replacing_on)
    replacement = ""
    if on:
        replacement = (
            f" · replacement on {on} {'ready' if failover.replacement_ready else 'loading'}"
        )
    if failover.phase == "confirmed":
        dead_for = duration(failover.for_s)
        return f"{nodes} confirmed dead {dead_for} ago: its instance serves nothing{replacement}"
    words = f"{nodes} suspect {duration(failover.for_s)}"
    if on:
        return words + replacement
    if failover.why is not None:
        return f"{words}: {failover.why}"
    return f"{words}: placing a replacement (nothing is deleted until it is confirmed dead)"


def next_text(row: DeploymentRow) -> str:
    failover = failover_next(row)
    if failover is not None:
        return failover
    if row.updating is not None and row.next_attempt_in_s is None:
        replaced, replicas = row.updating
        return f"updated {replaced}/{replicas}"
    if row.next_attempt_in_s is None:
        if row.download is not None:
            return download_next(row.download)
        if row.status == "starting" and row.load_progress is not None:
            return f"load {row.load_progress:.0%}"
        return ""
    word = WAIT_WORD[row.waiting] if row.waiting else "next"
    return f"{word} {duration(row.next_attempt_in_s)}"


def nodes_text(row: DeploymentRow) -> str:
    """Where it runs: each instance's nodes, commas within one, ``|`` between replicas."""
    groups = row.replica_nodes or ((row.nodes,) if row.nodes else ())
    return "|".join(",".join(nodes) for nodes in groups) or "-"


def download_next(download: DownloadFacts) -> str:
    """What a starting deployment waits for, in the NEXT column: ``↓43% 46s``."""
    mark = download_mark(download)
    if download.phase == "downloading" and download.eta_s is not None:
        return f"{mark} {duration(download.eta_s)}"
    return mark


def download_style(download: DownloadFacts) -> str:
    return "red" if download.phase == "failed" else "yellow"


def ready_cell(row: DeploymentRow) -> tuple[str, str]:
    """``ready/replicas``, amber while fewer are ready than the deployment keeps."""
    return f"{row.ready_replicas}/{row.replicas}", "bold yellow" if row.short else ""


def availability_cell(row: DeploymentRow) -> tuple[str, str]:
    """The last 24 h's availability, amber then red as it falls; dim ``—`` with no records."""
    value = row.availability
    if value is None:
        return percent_available(None), DIM
    if value < AVAIL_RED_BELOW:
        return percent_available(value), "bold red"
    if value < AVAIL_AMBER_BELOW:
        return percent_available(value), "bold yellow"
    return percent_available(value), ""


def age_text(row: DeploymentRow) -> str:
    return duration(row.in_status_s) + ("" if row.in_status_known else "+")


def deployment_cells(row: DeploymentRow, columns: tuple[Column, ...]) -> Cells:
    values: dict[str, tuple[str, str]] = {
        "status": (status_text(row), status_style(row)),
        "model": (short_model(row.model_id), "bold" if row.broken else ""),
        "ready": ready_cell(row),
        "avail": availability_cell(row),
        "prio": (str(row.priority), DIM if row.priority == DEFAULT_PRIORITY else "bold"),
        "rate": rate_cell(row.requests),
        "err": errors_cell(row.requests),
        "instance": (short_id(row.instance_id) if row.instance_id else "-", DIM),
        "nodes": (nodes_text(row), ""),
        "age": (age_text(row), ""),
        "next": (next_text(row), _next_style(row)),
        "fail": (str(row.failures) if row.failures else "", "red" if row.failures else ""),
        "error": (row.placement_error or "", "red"),
    }
    return tuple(_cell(*values[c.key], c.width) for c in columns)


def _next_style(row: DeploymentRow) -> str:
    if row.waiting == "backoff":
        return "yellow"
    if row.next_attempt_in_s is None and row.download is not None:
        return "red" if row.download.phase == "failed" else ""
    return ""


_WAIT_REASON: dict[WaitReason, str] = {
    "grace": "the master's startup grace",
    "backoff": "backoff after a lost placement",
    "unplaceable_retry": "retry of an unplaceable model",
    "placement_in_flight": "its placement to show up",
}


def timer_words(row: DeploymentRow) -> str:
    """The keeper's timers for a deployment, in words; empty when nothing is pending."""
    parts: list[str] = []
    if row.next_attempt_in_s is not None:
        why = _WAIT_REASON[row.waiting] if row.waiting else "the keeper"
        parts.append(f"next attempt in {duration(row.next_attempt_in_s)} (waiting for {why})")
    if row.failures:
        parts.append(f"{row.failures} lost before ready in a row")
    if row.download is not None:
        parts.append(f"{row.download_on}: {download_words(row.download)}")
    elif row.load_progress is not None:
        parts.append(f"loading {row.load_progress:.0%}")
    return " · ".join(parts)


def no_deployments_api(url: str) -> str:
    """Why create and delete cannot work against this master, and what would make them work."""
    return (
        "This master has no deployments API (a stock exo master). To keep deployments beside "
        f"it, run `exo-deploy bridge --exo {url}` and point the dashboard at the bridge."
    )


def detail_text(
    row: DeploymentRow | None, width: int, lines: int, *, has_deployments_api: bool = True
) -> Text:
    """The selected deployment in full: what the narrow table had to cut."""
    if row is None:
        if not has_deployments_api:
            return fit_lines(
                Text(
                    "This master has no deployments API (a stock exo master): its nodes and "
                    "instances are shown (keys 2 and 3). For deployments, run `exo-deploy "
                    "bridge` beside it, or exo-deploy's master.",
                    style=DIM,
                ),
                width,
                lines,
            )
        return Text("No deployments.  n creates one.", style=DIM)
    text = Text(no_wrap=False)
    text.append(short_model(row.model_id), style="bold")
    text.append("  ")
    if row.at_risk:
        text.append(status_text(row), style=status_style(row))
    else:
        text.append(status_label(row.status), style=f"bold {STATUS_COLOR[row.status]}")
    text.append(f"  {row.sharding}/{row.instance_meta}, min {row.min_nodes}", style=DIM)
    if row.replicas > 1:
        style = "bold yellow" if row.short else ""
        text.append(f"  {row.ready_replicas}/{row.replicas} replicas ready", style=style)
    if row.instance_id:
        text.append(f"  instance {short_id(row.instance_id)} on {', '.join(row.nodes)}")
    if row.moving_off is not None:
        text.append(
            f"  {DRAINING_SYMBOL} moving off {row.moving_off} (drain)", style=DRAINING_STYLE
        )
    failover = failover_words(row)
    if failover:
        style = "red" if row.failover is not None and row.failover.phase == "confirmed" else ""
        text.append(f"\n{AT_RISK_SYMBOL} ", style=f"bold {AT_RISK_STYLE}")
        text.append(failover, style=style or AT_RISK_STYLE)
    # The error and why come before the timer: the NEXT column already shows when the keeper
    # tries again, so on a narrow strip the timer's words are what may be cut.
    if row.placement_error:
        text.append("\n✖ ", style="bold red")
        text.append(row.placement_error, style="red")
        if row.placement_why:
            text.append(f": {row.placement_why}")
    timer = timer_words(row)
    if timer:
        failed = row.download is not None and row.download.phase == "failed"
        text.append("\n" + timer, style="red" if failed else "yellow" if row.failures else "")
    return fit_lines(text, width, lines)


def fit_lines(text: Text, width: int, lines: int) -> Text:
    """Wrap to ``width`` and keep ``lines`` lines, ending with an ellipsis if cut."""
    if width <= 1 or lines <= 0:
        return text
    wrapped = list(text.wrap(_MEASURE, width))
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1].truncate(width - 1)
        wrapped[-1].append("…")
    return Text("\n").join(wrapped)


# --- nodes --------------------------------------------------------------------------------


# With what exo reports of disks, downloads and vitals, the nodes table's last column lists the
# node's models (its runners, then what its disk holds or fetches) and keeps at least this much
# room: the longest catalog name with a download's mark. The optional columns fit around it.
MODELS_MIN = 28
# The GPU column: its percentage and a sparkline of this many readings.
GPU_SPARK_WIDTH = 8
# The widest the LINKS column grows beside the models: four node names.
LINKS_MAX = 28


def node_columns(
    width: int, *, disk: bool = False, vitals: bool = False, models: bool = False
) -> tuple[Column, ...]:
    """The nodes table's columns; ``disk``, ``vitals``, ``models``: whether any node reports
    its disk, its vitals, or holds (or fetches) a model other than its runners'. Without any of
    those, the table is as it always was; with them, DISK is always shown, then the vitals (GPU
    with its history, temperature and power), LINKS and BACKENDS as the room allows."""
    if not (disk or vitals or models):
        narrow = width < 90
        fixed = [
            Column("name", "NODE", 12),
            Column("state", "STATE", 14),
            Column("memory", "MEM USED", 12),
            Column("backends", "BACKENDS", 9 if narrow else 16),
        ]
        room = max(12, width - sum(c.width for c in fixed) - 1)
        links_w = max(6, room * 2 // 5)
        return (
            *fixed,
            Column("links", "LINKS", links_w),
            Column("runners", "RUNNERS", room - links_w),
        )
    wide = width >= WIDE_TABLE_FROM
    columns = [
        Column("name", "NODE", 12),
        Column("state", "STATE", 14),
        Column("memory", "MEM USED", 12),
    ]
    if disk:
        # "48.5G free/500G" where there is room for the whole, "48.5G free" otherwise.
        columns.append(Column("disk", "DISK", 16 if wide else 11))
    room = width - sum(c.width for c in columns) - 1  # 1: the scrollbar
    optional: list[tuple[Column, ...]] = []
    if vitals:
        gpu = Column("gpu", "GPU", 6 + GPU_SPARK_WIDTH)  # "100% " and the sparkline
        optional.append((gpu, Column("heat", "TEMP PWR", 11)))
    optional += [(Column("links", "LINKS", 10),), (Column("backends", "BACKENDS", 9),)]
    for unit in optional:
        needs = sum(c.width for c in unit)
        if room - needs >= MODELS_MIN:
            columns += unit
            room -= needs
    # What is left beyond the models' minimum is shared as the old table shares it: two
    # fifths to the links (up to what a few names need), the rest to the models.
    extra = max(0, room - MODELS_MIN)
    links_extra = min(extra * 2 // 5, LINKS_MAX - 10)
    if links_extra > 0 and any(c.key == "links" for c in columns):
        columns = [
            replace(c, width=c.width + links_extra) if c.key == "links" else c for c in columns
        ]
        room -= links_extra
    columns.append(Column("models", "MODELS", max(MODELS_MIN, room)))
    order = ("name", "state", "memory", "disk", "gpu", "heat", "backends", "links", "models")
    by_key = {c.key: c for c in columns}
    return tuple(by_key[k] for k in order if k in by_key)


def liveness_text(row: NodeRow) -> tuple[str, str]:
    quiet = row.quiet_for_s
    if row.liveness == "gone":
        # Unknown when it left: a stock exo still listed it as we connected.
        return ("✖ gone" if quiet is None else f"✖ gone {duration(quiet)}"), "bold red"
    if row.liveness == "suspect":
        return f"◌ suspect {duration(quiet or 0)}", "bold yellow"
    if row.liveness == "dead":
        return "✖ dead", "bold red"
    if row.liveness == "silent":
        return f"◌ silent {duration(quiet or 0)}", "bold yellow"
    if row.liveness == "away":
        return "○ away", DIM
    return "● alive", "green"


def node_cells(row: NodeRow, columns: tuple[Column, ...]) -> Cells:
    if row.ram_total is not None and row.ram_used is not None:
        memory = f"{gigabytes(row.ram_used)}/{gigabytes(row.ram_total)}"
    else:
        memory = "-"
    backends = ",".join(b.removeprefix("Mlx") for b in row.backends) or "-"
    values: dict[str, tuple[str, str]] = {
        "name": (row.name, "bold" if row.liveness != "alive" else ""),
        "state": liveness_text(row),
        "memory": (memory, ""),
        "backends": (backends, ""),
        "links": (",".join(row.links) if row.links else "-", ""),
        "runners": (", ".join(row.runners) if row.runners else "-", DIM if not row.runners else ""),
    }
    keys = {c.key for c in columns}
    if "disk" in keys:
        values["disk"] = disk_cell(row, whole=_width_of(columns, "disk") >= 16)
    if "gpu" in keys:
        values["gpu"] = gpu_cell(row)
        values["heat"] = heat_cell(row)
    if "models" in keys:
        values["models"] = (", ".join(row.models), "") if row.models else ("-", DIM)
    return tuple(_cell(*values[c.key], c.width) for c in columns)


# The most lines a drain's stuck reason takes under its node: the keeper's reason names the
# model, the nodes left out and the placement's error, two lines at 80 columns, rarely three.
STUCK_LINES_MAX = 3


def node_key(row: NodeRow) -> str:
    """A node's row key: its liveness with it, so a node that left and came back (a new id, the
    same name) never takes the row of the one that left."""
    return f"{row.liveness}:{row.node_id}"


def cordon_lines(row: NodeRow, width: int) -> list[Cell]:
    """The lines under a cordoned or draining node, ``width`` wide: ``cordoned``, or the
    drain's progress and the keeper's reason it is stuck, wrapped rather than cut."""
    room = width - 4  # the branch (" └ ") and the cell's padding
    if row.drain is not None:
        said = [(f"{DRAINING_SYMBOL} {progress_words(row.drain)}", DRAINING_STYLE, 2)]
        if row.drain.stuck:
            said.append((f"stuck: {row.drain.stuck}", "red", STUCK_LINES_MAX))
    elif row.cordoned:
        said = [(f"{CORDONED_SYMBOL} cordoned: nothing new is placed here", CORDONED_STYLE, 2)]
    else:
        return []
    lines: list[Cell] = []
    for text, style, most in said:
        for line in fit_lines(Text(text), room, most).plain.splitlines():
            lines.append(_cell(("   " if lines else " └ ") + line, style, width))
    return lines


def node_table_rows(
    rows: Sequence[NodeRow], columns: tuple[Column, ...]
) -> list[tuple[str, Cells]]:
    """Per node: its row (``node_key``), then its cordon's or drain's lines, each one cell
    spanning the table (keyed ``<node key> cordon <n>``)."""
    span = sum(c.width for c in columns)
    table: list[tuple[str, Cells]] = []
    for row in rows:
        key = node_key(row)
        table.append((key, node_cells(row, columns)))
        table += [(f"{key} cordon {n}", (cell,)) for n, cell in enumerate(cordon_lines(row, span))]
    return table


def _width_of(columns: tuple[Column, ...], key: str) -> int:
    return next((c.width for c in columns if c.key == key), 0)


# A disk with less than this much free is amber: less than the largest common model.
DISK_LOW_BELOW = 20 * 1024**3


def disk_cell(row: NodeRow, *, whole: bool) -> tuple[str, str]:
    """``320G free`` (``320G free/500G`` when ``whole``), amber when low; ``-`` unknown."""
    if row.disk_free is None or row.disk_total is None:
        return "-", DIM
    text = f"{gigabytes(row.disk_free)} free"
    if whole:
        text += f"/{gigabytes(row.disk_total)}"
    return text, "bold yellow" if row.disk_free < DISK_LOW_BELOW else ""


def gpu_cell(row: NodeRow) -> tuple[str, str]:
    """``62% ▂▃▅▇▆▅▃▅``: the GPU now, and its last readings."""
    if row.vitals is None:
        return "-", DIM
    now = f"{round(row.vitals.gpu_usage * 100)}%"
    return f"{now:<4} {sparkline(row.gpu_history[-GPU_SPARK_WIDTH:])}", ""


def heat_cell(row: NodeRow) -> tuple[str, str]:
    """``58°C 95W``: temperature and the system's power draw."""
    vitals = row.vitals
    if vitals is None:
        return "-", DIM
    return f"{vitals.temp:.0f}°C {vitals.sys_power:.0f}W", ""


# --- instances ----------------------------------------------------------------------------


def instance_columns(width: int) -> tuple[Column, ...]:
    layers = Column("layers", "LAYERS", 9)
    room = max(40, width - layers.width - 1)
    what_w = room * 5 // 9
    return (
        Column("what", "INSTANCE / RANK NODE", what_w),
        layers,
        Column("status", "STATUS", room - what_w),
    )


def _bar(fraction: float, width: int = 8) -> str:
    filled = round(max(0.0, min(1.0, fraction)) * width)
    return "█" * filled + "░" * (width - filled)


def runner_status_text(runner: RunnerRow, width: int | None = None) -> tuple[str, str]:
    """What a runner shows: its download while it waits for one (in ``width`` when given), its
    loading progress, its failure, or its status."""
    if runner.download is not None:
        return download_words(runner.download, width), download_style(runner.download)
    if runner.progress is not None:
        return f"Loading {_bar(runner.progress)} {runner.progress:.0%}", "yellow"
    if runner.error:
        return f"✖ Failed: {runner.error}", "red"
    style = {"Ready": "green", "Running": "green", "Failed": "red", "Unknown": DIM}.get(
        runner.status, "yellow"
    )
    symbol = "●" if style == "green" else ("✖" if style == "red" else "◐")
    return f"{symbol} {runner.status}", style


def unhealthy_key(instance_id: str) -> str:
    """The row key of the line saying why an instance is unhealthy."""
    return f"{instance_id} unhealthy"


def instance_table_rows(
    instances: list[InstanceRow], columns: tuple[Column, ...]
) -> list[tuple[str, Cells]]:
    """Per instance: its head row (keyed by the instance id), the reason it is unhealthy if it
    is (one cell spanning the table), then a row per runner (keyed by the runner id)."""
    rows: list[tuple[str, Cells]] = []
    span = sum(c.width for c in columns)
    status_w = max(1, _width_of(columns, "status") - 1)
    for instance in instances:
        # A runner whose node left serves nothing, whatever status it last reported.
        ready = sum(
            1 for r in instance.runners if r.status in ("Ready", "Running") and r.node_present
        )
        if instance.unhealthy is not None:
            status = ("✖ unhealthy", "bold red")
        elif instance.ready:
            status = ("● ready", "green")
        else:
            status = (f"◐ {ready}/{len(instance.runners)} ready", "yellow")
        head: dict[str, tuple[str, str]] = {
            "what": (f"{short_model(instance.model_id)} {short_id(instance.instance_id)}", "bold"),
            "layers": (instance.kind.removeprefix("Mlx"), DIM),
            "status": status,
        }
        rows.append((instance.instance_id, tuple(_cell(*head[c.key], c.width) for c in columns)))
        if instance.unhealthy is not None:
            why = f" │ ✖ unhealthy: {instance.unhealthy}"
            rows.append((unhealthy_key(instance.instance_id), (_cell(why, "red", span),)))
        for index, runner in enumerate(instance.runners):
            branch = "└" if index == len(instance.runners) - 1 else "├"
            gone = "" if runner.node_present else " ✖gone"
            cells: dict[str, tuple[str, str]] = {
                "what": (
                    f" {branch} {runner.rank} {runner.node_name}{gone}",
                    "" if runner.node_present else "red",
                ),
                "layers": (f"{runner.start_layer}-{runner.end_layer - 1}", ""),
                "status": runner_status_text(runner, status_w),
            }
            rows.append((runner.runner_id, tuple(_cell(*cells[c.key], c.width) for c in columns)))
    return rows


# --- timeline, header ---------------------------------------------------------------------


def timeline_line(entry: TimelineEntry) -> Text:
    symbol, style = LEVEL_STYLE[entry.level]
    line = Text(no_wrap=False)
    line.append(clock_time(entry.at), style=DIM)
    line.append(f" {symbol} ", style=f"bold {style}".strip())
    if entry.history:
        # Told from the master's records, not seen happening: the word says so in any colours.
        line.append(f"{HISTORY_MARK} ", style="dim italic")
    line.append(entry.text, style=style)
    return line


def connection_text(
    connection: Connection, now: float, url: str, quiet_s: float | None = None
) -> Text:
    text = Text()
    host = url.removeprefix("http://").removeprefix("https://")
    if connection.stale_since is not None:
        text.append(
            f" ✖ stale since {clock_time(connection.stale_since)} ", style="bold reverse red"
        )
        if connection.mode == "unreadable":
            # Why is what matters here: no retry countdown after it, so a long why still fits.
            text.append(f" unreadable: {connection.detail}", style="bold red")
            return text
        detail = f" {connection.detail}" if connection.detail else ""
        retry = (
            f", retrying in {connection.retry_in_s:.0f}s"
            if connection.retry_in_s is not None and connection.retry_in_s >= 1
            else ", retrying"
        )
        text.append(f"{detail}{retry}", style="red")
        return text
    mode = connection.mode
    if quiet_s is not None and mode in ("live", "polling"):
        # Connected, but the master has stopped speaking: what the rest of the screen shows is
        # as of its last word, and this says so before anything reads as the nodes' fault.
        text.append(f"◌ no word for {quiet_s:.0f}s", style="bold yellow")
    elif mode == "live":
        text.append("● live", style="bold green")
    elif mode == "polling":
        text.append("◐ polling 1s", style="bold yellow")
        if connection.detail:
            text.append(f" · {connection.detail}", style="yellow")
    elif mode == "unreadable":
        text.append(f"✖ unreadable: {connection.detail}", style="bold red")
    elif mode == "down":
        text.append(f"✖ cannot reach {host}", style="bold red")
        if connection.detail:
            text.append(f" ({connection.detail})", style="red")
    else:
        text.append(f"○ connecting to {host}…", style="bold cyan")
    return text


_STATUSES: tuple[DeploymentStatus, ...] = ("serving", "starting", "placing", "cant_place")


def summary_text(summary: Summary, *, wide: bool) -> Text:
    text = Text()
    text.append(f"{summary.nodes_alive} node{'s' if summary.nodes_alive != 1 else ''}")
    if summary.nodes_suspect:
        text.append(f" ◌{summary.nodes_suspect} suspect", style="bold yellow")
    if summary.nodes_dead:
        text.append(f" ✖{summary.nodes_dead} dead", style="bold red")
    if summary.nodes_silent:
        text.append(f" ◌{summary.nodes_silent} silent", style="bold yellow")
    if summary.nodes_gone:
        text.append(f" ✖{summary.nodes_gone} gone", style="red")
    if not summary.deployments_api:
        text.append(f" · {summary.instances} instance{'s' if summary.instances != 1 else ''}")
        return text
    text.append(f" · {summary.deployments} deployment{'s' if summary.deployments != 1 else ''}")
    for status in _STATUSES:
        count = summary.by_status.get(status, 0)
        if count:
            label = f"{status_label(status)} {count}" if wide else f"{STATUS_SYMBOL[status]}{count}"
            text.append(f" {label}", style=f"bold {STATUS_COLOR[status]}")
    return text


def service_text(service: ServiceHealthView | None) -> Text | None:
    """Which bridge answers and its part, ``bridge b2 · standby (acting: b1)``, when its
    /healthz says (bridges sharing a store); None when it says nothing of a role."""
    if service is None or service.role is None:
        return None
    text = Text()
    text.append(f"bridge {service.name}" if service.name else "bridge")
    if service.role == "acting":
        text.append(" · acting", style="bold green")
        return text
    text.append(" · standby", style="bold yellow")
    if service.leader and service.leader != service.name:
        text.append(f" (acting: {service.leader})", style="yellow")
    return text


def header_text(
    connection: Connection,
    summary: Summary,
    now: float,
    url: str,
    *,
    width: int,
    paused: bool,
    readonly: bool,
    service: ServiceHealthView | None = None,
) -> Text:
    left = Text()
    left.append(" exo-deploy ", style="bold reverse")
    left.append(" ")
    left.append_text(connection_text(connection, now, url, summary.master_quiet_s))
    role = service_text(service)
    if role is not None:
        left.append(" · ", style="dim")
        left.append_text(role)
    if paused:
        left.append("  ❚❚ PAUSED", style="bold reverse yellow")
    if readonly:
        left.append("  read-only", style="bold magenta")
    right = summary_text(summary, wide=width >= WIDE_TABLE_FROM)
    right.append(f"  {clock_time(now)} ")
    gap = width - left.cell_len - right.cell_len
    if gap >= 2:
        return Text.assemble(left, " " * gap, right)
    # Narrow: the connection state matters most; the summary moves to the panel titles.
    left.truncate(width, overflow="ellipsis")
    return left
