"""``exo-deploy apply -f FILE [--prune] [--dry-run]`` and ``exo-deploy export``: the deployments
as a file kept in version control (docs/design.md §7.7).

``apply`` reads the file (``keeper.client.deployment_file``: a bad one is exit 2 naming every
problem with its line, before the service is asked anything), reads ``GET /deployments``,
computes the plan (``keeper.client.apply_plan``, a pure function), prints it one deployment a
line within 80 columns, and unless ``--dry-run`` carries it out in its order: creates, changes,
deletes. Each step is one request; if the service refuses one, the command stops there and says
which step was refused and why, what was applied before it and what was not, exit 1 (3 if the
service stopped answering). A change of a setting that a service from before it cannot change in
place (sharding, instance type, min_nodes) is looked for in the service's OpenAPI document first,
so that such a service refuses the whole plan before anything is applied.

``export`` writes the service's deployments in the file's format, every field written, so
``exo-deploy export | exo-deploy apply -f -`` changes nothing.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import anyio
from pydantic import BaseModel, ConfigDict

from keeper.cli.deployments import (
    CLIENT_TIMEOUT_S,
    EXIT_CODES_HELP,
    EXIT_FOR_FAILURE,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    ClientError,
    call_master,
    client_options,
)
from keeper.client.apply_plan import (
    Action,
    Change,
    Create,
    Delete,
    Plan,
    Step,
    Unchanged,
    Unlisted,
    plan_deployments,
    settings_of,
)
from keeper.client.deployment_file import (
    FILE_VERSION,
    MAX_FILE_BYTES,
    REQUEST_KEYS,
    DeploymentFileError,
    export_text,
    parse_deployment_file,
    shown_value,
    size_problem,
)
from keeper.client.deployments import ApiError, DeploymentsClient, master_http
from keeper.model.api_models import CommandResponse, CreateDeploymentRequest, DeploymentsResponse

# The terminal an operator may read this on over SSH: every line of the plan fits it.
WIDTH = 80
# The model column: the longest model ids run past 40 characters, cut there (as `whatif` does)
# to leave room for what changes.
MODEL_COLUMN = 40
ACTION_WORDS: dict[type[Step], str] = {
    Create: "create",
    Change: "change",
    Delete: "delete",
    Unchanged: "unchanged",
    Unlisted: "unlisted",
}
# Room a continuation line needs for a setting's change (``instance_meta MlxRing -> MlxJaccl``
# is 30), so that the column under WHAT is used only while it is wide enough.
MIN_WHAT_WIDTH = 30
# A deployment id in the plan: its first 8 characters, as `list` shows an instance's.
SHORT_ID = 8
# What every service with ``PATCH /deployments/{id}`` takes; a change of any other setting is
# looked for in the service's OpenAPI document before the plan is carried out.
ALWAYS_PATCHABLE = frozenset({"replicas", "standby", "priority", "preempt"})
# The route's path as the OpenAPI document writes it.
PATCH_PATH = "/deployments/{deployment_id}"
# The API's defaults, as JSON: a create shows only the settings the file gives otherwise.
DEFAULTS = CreateDeploymentRequest(model_id="-").model_dump(mode="json")

APPLY_HELP = f"""the file (version: {FILE_VERSION}):
  deployments:
    - model: mlx-community/Qwen3-30B-A3B-4bit
      replicas: 2
    - model: mlx-community/Llama-3.2-1B-Instruct-4bit

Each entry holds the fields of `deploy`, by the same names and rules:
  {", ".join(REQUEST_KEYS.values())}
A deployment is known by its model. A field left out means its default, not
"leave as it is": removing `replicas: 3` from an entry scales it back to 1.
A deployment of a model the file does not list is left alone, unless --prune
(then it is deleted). `export` writes such a file, every field in it.

The plan is carried out in order: creates, changes, deletes. If the service
refuses a step, apply stops there and says what was applied before it.

exit codes:
  0  done (or nothing to do)
  1  refused by the master (its message is printed on stderr)
  2  bad usage, or a bad file (nothing is applied)
  3  the master could not be reached"""


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _value(value: object) -> str:
    """A setting's value as the file spells it (``true``, ``Pipeline``, ``2``)."""
    return value if isinstance(value, str) else shown_value(value)


def step_detail(step: Step) -> list[str]:
    """What the step does, in words, as the pieces a line may break between: each setting that
    changes (``replicas 3 -> 1``) is one."""
    if isinstance(step, Create):
        settings = step.request.model_dump(mode="json")
        given = [
            f"{REQUEST_KEYS[name]} {_value(value)}"
            for name, value in settings.items()
            if name != "model_id" and value != DEFAULTS[name]
        ]
        return given or ["default settings"]
    if isinstance(step, Change):
        return [
            f"{change.name} {_value(change.old)} -> {_value(change.new)}" for change in step.changes
        ]
    if isinstance(step, Delete):
        return [f"not in the file: deleted ({step.deployment_id[:SHORT_ID]})"]
    if isinstance(step, Unlisted):
        return ["not in the file: kept (--prune deletes it)"]
    return ["as the file asks"]


def _filled(lead: str, pieces: list[str], indent: int) -> list[str]:
    """``pieces`` after ``lead``, comma-separated, a line broken between two pieces once it would
    pass WIDTH (a piece longer than the room left is broken between its words); the lines after
    the first start ``indent`` columns in."""
    last = len(pieces) - 1
    texts = [piece + ("," if index < last else "") for index, piece in enumerate(pieces)]
    margin = " " * indent
    lines: list[str] = []
    for text in texts:
        if not lines:
            lines.append(lead + text)
        elif len(lines[-1]) + 1 + len(text) <= WIDTH:
            lines[-1] += " " + text
        else:
            lines.append(margin + text)
        if len(lines[-1]) > WIDTH:
            lines[-1:] = textwrap.wrap(
                lines[-1], WIDTH, subsequent_indent=margin, break_on_hyphens=False
            )
    return lines


def format_plan(plan: Plan) -> str:
    """The plan, one deployment a line in the order it is carried out (what changes continued
    on the lines under it when the line has no room for it all), then the counts."""
    lines: list[str] = []
    if plan.steps:
        models = [_cut(step.model_id, MODEL_COLUMN) for step in plan.steps]
        model_width = max(len("MODEL"), *(len(model) for model in models))
        action_width = max(len(word) for word in ACTION_WORDS.values())
        what_column = action_width + 2 + model_width + 2
        # Under WHAT while that leaves room for a setting's change, else under MODEL.
        indent = what_column if WIDTH - what_column >= MIN_WHAT_WIDTH else action_width + 2
        lines.append(f"{'ACTION'.ljust(action_width)}  {'MODEL'.ljust(model_width)}  WHAT")
        for step, model in zip(plan.steps, models, strict=True):
            lead = f"{ACTION_WORDS[type(step)].ljust(action_width)}  {model.ljust(model_width)}  "
            lines += _filled(lead, step_detail(step), indent)
    lines.append(plan_counts(plan))
    return "\n".join(lines)


def plan_counts(plan: Plan) -> str:
    counts = (
        f"{plan.count(Create)} to create, {plan.count(Change)} to change, "
        f"{plan.count(Delete)} to delete, {plan.count(Unchanged)} unchanged"
    )
    unlisted = plan.count(Unlisted)
    return f"plan: {counts}" + (f", {unlisted} unlisted (kept)" if unlisted else "")


def action_words(step: Action) -> str:
    """A step in a few words: ``change of MODEL (deployment ID)``."""
    if isinstance(step, Create):
        return f"create of {step.model_id}"
    return f"{ACTION_WORDS[type(step)]} of {step.model_id} (deployment {step.deployment_id})"


# --- reading the file -----------------------------------------------------------------------


def read_file(path: str) -> tuple[str, str]:
    """(the file's name for messages, its text); ``-`` is standard input. ClientError (usage)
    if it cannot be read, or is larger than a deployments file may be: no more of it than that
    is read (docs/design.md §7.7, "Bounds")."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            content = _read_stdin(MAX_FILE_BYTES + 1)
        else:
            with Path(path).open("rb") as file:
                content = file.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ClientError(f"cannot read {source}: {exc.strerror or exc}", EXIT_USAGE) from None
    too_large = size_problem(content)
    if too_large is not None:
        raise ClientError(f"{too_large.render(source)}: nothing applied", EXIT_USAGE)
    try:
        text = content.decode("utf-8") if isinstance(content, bytes) else content
    except UnicodeDecodeError as exc:
        raise ClientError(
            f"{source}: not UTF-8 text (byte {exc.start}): nothing applied", EXIT_USAGE
        ) from None
    return source, text


def _read_stdin(limit: int) -> bytes | str:
    """At most ``limit`` bytes of standard input (characters, when it is not a byte stream, as
    under a test's capture)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:
        return sys.stdin.read(limit)
    return cast(bytes, buffer.read(limit))


# --- carrying the plan out ------------------------------------------------------------------


class _PatchSchema(BaseModel):
    """The part of an OpenAPI document that says what ``PATCH /deployments/{id}`` takes."""

    model_config = ConfigDict(extra="ignore")

    paths: dict[str, dict[str, Any]] = {}
    components: dict[str, dict[str, Any]] = {}


def patch_fields(document: _PatchSchema) -> frozenset[str] | None:
    """The settings the service's PATCH body takes, or None if the document does not say."""
    try:
        body = document.paths[PATCH_PATH]["patch"]["requestBody"]["content"]["application/json"]
        schema = cast(dict[str, Any], body["schema"])
        ref = schema.get("$ref")
        if isinstance(ref, str):
            schema = document.components["schemas"][ref.rsplit("/", 1)[-1]]
        return frozenset(cast(dict[str, Any], schema["properties"]))
    except (KeyError, TypeError, AttributeError):
        return None


async def unchangeable(client: DeploymentsClient, plan: Plan) -> str | None:
    """Why the service cannot carry out the plan's changes, if its document says it takes no
    such field in PATCH; None when it does, or when it cannot be told (then the service judges
    each request, and a refusal is reported where it happens)."""
    wanted = [
        (step, change)
        for step in plan.actions
        if isinstance(step, Change)
        for change in step.changes
        if change.name not in ALWAYS_PATCHABLE
    ]
    if not wanted:
        return None
    try:
        document = (await client.call("GET", "/openapi.json", _PatchSchema)).value
    except ApiError:
        return None
    taken = patch_fields(document)
    if taken is None:
        return None
    for step, change in wanted:
        if change.name not in taken:
            return (
                f"the service at {client.url} cannot change {change.name} in place (its PATCH "
                f"/deployments/{{id}} takes {', '.join(sorted(taken))}): {action_words(step)} "
                f"asks {change.name} {_value(change.old)} -> {_value(change.new)}; nothing "
                "applied (delete the deployment and apply again to recreate it)"
            )
    return None


async def _carry_out(client: DeploymentsClient, step: Action) -> CommandResponse:
    if isinstance(step, Create):
        return (await client.create(step.request)).value
    if isinstance(step, Change):
        return (await client.update(step.deployment_id, step.patch_body())).value
    return (await client.delete(step.deployment_id)).value


def refusal_report(plan: Plan, done: Sequence[Action], refused: Action, error: ApiError) -> str:
    """What to say when ``refused`` failed after ``done``: which step, the service's words, what
    was applied and what was not."""
    what = action_words(refused)
    if isinstance(refused, Change):
        what += f" ({', '.join(step_detail(refused))})"
    verb = "refused" if error.kind == "refused" else "failed"  # no answer: it may have been done
    lines = [f"{what} {verb}: {error.message}"]
    newer = (
        [c.name for c in refused.changes if c.name not in ALWAYS_PATCHABLE]
        if isinstance(refused, Change)
        else []
    )
    # pydantic's words for a key the body does not take: the service's PATCH predates them.
    if newer and error.status == 422 and "Extra inputs are not permitted" in error.message:
        lines.append(
            f"this service cannot change {', '.join(newer)} in place (an older exo-deploy): "
            "delete the deployment and apply again to recreate it"
        )
    later = plan.actions[len(done) + 1 :]
    applied = ", ".join(action_words(step) for step in done) or "nothing"
    lines.append(f"applied before it: {applied}")
    if later:
        lines.append(f"not applied: {', '.join(action_words(step) for step in later)}")
    return "\n".join(lines)


def cmd_apply(args: argparse.Namespace) -> int:
    source, text = read_file(args.file)
    try:
        desired = parse_deployment_file(text, source)
    except DeploymentFileError as exc:
        for line in exc.lines():
            print(line, file=sys.stderr)
        print(f"exo-deploy apply: {source}: nothing applied", file=sys.stderr)
        return EXIT_USAGE
    current = call_master(args, lambda client: client.list()).value
    plan = plan_deployments(
        desired, [view.deployment for view in current.deployments], prune=args.prune
    )
    print(format_plan(plan), flush=True)
    if args.dry_run:
        print("dry run: nothing applied")
        return EXIT_OK
    if not plan.actions:
        return EXIT_OK
    return anyio.run(_apply, args, plan)


async def _apply(args: argparse.Namespace, plan: Plan) -> int:
    async with master_http(args.url, args.token, CLIENT_TIMEOUT_S) as http:
        return await carry_out_plan(
            DeploymentsClient(http, CLIENT_TIMEOUT_S),
            plan,
            say=lambda line: print(line, flush=True),
            complain=lambda line: print(f"exo-deploy apply: {line}", file=sys.stderr),
        )


async def carry_out_plan(
    client: DeploymentsClient,
    plan: Plan,
    *,
    say: Callable[[str], None],
    complain: Callable[[str], None],
) -> int:
    """Carry out ``plan``'s actions in order, each service answer said as it comes; stop at the
    first refusal, complain of it (and of what was and was not applied) and return its exit code.
    A change the service's document says it cannot make refuses the plan before any step."""
    refusal = await unchangeable(client, plan)
    if refusal is not None:
        complain(refusal)
        return EXIT_REFUSED
    done: list[Action] = []
    for step in plan.actions:
        try:
            answer = await _carry_out(client, step)
        except ApiError as exc:
            for line in refusal_report(plan, done, step, exc).splitlines():
                complain(line)
            return EXIT_FOR_FAILURE[exc.kind]
        done.append(step)
        say(f"{answer.message}: {answer.deployment_id}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    current: DeploymentsResponse = call_master(args, lambda client: client.list()).value
    # By model, not in the service's (id) order: the same deployments export as the same file on
    # any cluster, and a file kept in version control changes only where they do.
    requests = sorted(
        (settings_of(view.deployment) for view in current.deployments), key=lambda r: r.model_id
    )
    sys.stdout.write(export_text(requests))
    return EXIT_OK


def add_apply_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """``apply`` and ``export``, each made by ``command(name, help)``."""
    apply = command(
        "apply",
        "make the deployments what FILE lists: create, change, and with --prune delete",
        epilog=APPLY_HELP,
    )
    apply.add_argument(
        "-f",
        "--file",
        required=True,
        metavar="FILE",
        help="the deployments file (YAML); - reads standard input",
    )
    apply.add_argument(
        "--prune",
        action="store_true",
        help="delete the deployments of models the file does not list",
    )
    apply.add_argument("--dry-run", action="store_true", help="print the plan only; change nothing")
    client_options(apply, json_option=False)
    apply.set_defaults(handler=cmd_apply)

    export = command(
        "export",
        "print the deployments as a file for `apply -f` (every field written)",
        epilog=EXIT_CODES_HELP,
    )
    client_options(export, json_option=False)
    export.set_defaults(handler=cmd_export)
