"""The edit form's rules, without the form: what changed, whether it rolls, what a refusal names.

The form (``e``, ``screens/edit.py``) holds a deployment's settings as typed; ``edit_changes``
turns them into the body of ``PATCH /deployments/{id}`` with only the settings that differ from
the deployment's, judged first as the service would: each number by the create request's own
field (``CreateDeploymentRequest``, so the bounds and the words are the service's, and no second
copy of them exists) and sharding with min_nodes against the model (``create_problems``, the
check the service makes too). Each problem names the field at fault, so the form can say it
beside that field; nothing changed is an empty body, which the form does not send.

Changing sharding, instance_meta or min_nodes is a new placement: the keeper replaces each
instance, one at a time, the new one ready before the old one goes (``ROLLING_FIELDS``).

A refusal is one line of ``field: why`` parts (the service's 422, ``keeper.httpapi.errors``);
``refusal_notes`` splits it by field so each part goes beside its field. A service from before
placement settings could be changed in place refuses them as unknown keys ("Extra inputs are not
permitted"), which the notes say in words.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Final

from pydantic import TypeAdapter, ValidationError

from keeper.model.api_models import CreateDeploymentRequest, RequestProblem, create_problems
from keeper.model.state import Deployment, InstanceMeta, Sharding

# A setting's value in the request body: a count, a flag, or an enum's value.
Setting = int | bool | str

# The form's fields, in its order: the request's names, which ``PATCH`` takes.
EDIT_FIELDS: Final = (
    "replicas",
    "standby",
    "priority",
    "preempt",
    "sharding",
    "instance_meta",
    "min_nodes",
)
# The settings that decide where instances go: changing one places the deployment anew.
ROLLING_FIELDS: Final = frozenset({"sharding", "instance_meta", "min_nodes"})
# What the form says when one of them changed.
ROLLING_NOTE: Final = "replaces each instance, one at a time (each new one ready first)"
# pydantic's words for a key the model does not take: a service older than the field.
_UNKNOWN_KEY = "Extra inputs are not permitted"
# What the notes say instead, beside the field.
NOT_IN_PLACE = "this service cannot change it in place"

# The counts, checked by the create request's own fields.
_COUNTS: Final = {
    name: TypeAdapter(Annotated[int, CreateDeploymentRequest.model_fields[name]])
    for name in ("replicas", "standby", "priority", "min_nodes")
}


@dataclass(frozen=True)
class EditValues:
    """The form's fields as they stand: counts as typed, the rest as chosen."""

    replicas: str
    standby: str
    priority: str
    preempt: bool
    sharding: str
    instance_meta: str
    min_nodes: str


def current_values(deployment: Deployment) -> EditValues:
    """The form's fields filled with the deployment's settings."""
    return EditValues(
        replicas=str(deployment.replicas),
        standby=str(deployment.standby),
        priority=str(deployment.priority),
        preempt=deployment.preempt,
        sharding=deployment.sharding.value,
        instance_meta=deployment.instance_meta.value,
        min_nodes=str(deployment.min_nodes),
    )


def _count(name: str, text: str) -> int | RequestProblem:
    stripped = text.strip()
    # Not a number: the field's own check names it ("Input should be a valid integer").
    value: object = int(stripped) if re.fullmatch(r"[+-]?[0-9]+", stripped) else stripped
    try:
        return _COUNTS[name].validate_python(value)
    except ValidationError as exc:
        return RequestProblem(name, f"{name}: {exc.errors()[0]['msg']}")


def edit_changes(
    deployment: Deployment, values: EditValues
) -> dict[str, Setting] | list[RequestProblem]:
    """The ``PATCH`` body: the settings in ``values`` that differ from ``deployment``'s (empty
    when none does); or what is wrong with the form, each problem naming its field."""
    problems: list[RequestProblem] = []
    counts: dict[str, int] = {}
    for name in ("replicas", "standby", "priority", "min_nodes"):
        result = _count(name, getattr(values, name))
        if isinstance(result, RequestProblem):
            problems.append(result)
        else:
            counts[name] = result
    try:
        sharding = Sharding(values.sharding)
    except ValueError:
        problems.append(RequestProblem("sharding", f"sharding: unknown '{values.sharding}'"))
        sharding = deployment.sharding
    try:
        meta = InstanceMeta(values.instance_meta)
    except ValueError:
        problems.append(
            RequestProblem("instance_meta", f"instance_meta: unknown '{values.instance_meta}'")
        )
        meta = deployment.instance_meta
    min_nodes = counts.get("min_nodes", deployment.min_nodes)
    if sharding != deployment.sharding or min_nodes != deployment.min_nodes:
        # The service's own check of a placement against the model, in its words.
        card = deployment.model_card
        problems += create_problems(card.model_id, card, sharding, min_nodes)
    if problems:
        return problems
    wanted: dict[str, Setting] = {
        **counts,
        "preempt": values.preempt,
        "sharding": sharding.value,
        "instance_meta": meta.value,
    }
    now: dict[str, Setting] = {
        "replicas": deployment.replicas,
        "standby": deployment.standby,
        "priority": deployment.priority,
        "preempt": deployment.preempt,
        "sharding": deployment.sharding.value,
        "instance_meta": deployment.instance_meta.value,
        "min_nodes": deployment.min_nodes,
    }
    # In the form's order, so the body and the summary read as the form does.
    return {name: wanted[name] for name in EDIT_FIELDS if wanted[name] != now[name]}


def rolling(changes: dict[str, Setting]) -> bool:
    """Whether the change places the deployment anew (each instance replaced in turn)."""
    return not ROLLING_FIELDS.isdisjoint(changes)


def changes_text(changes: dict[str, Setting]) -> str:
    """``replicas 2, sharding Tensor``: what was asked, for the notification."""
    return ", ".join(f"{name} {_word(value)}" for name, value in changes.items())


def _word(value: Setting) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def refusal_notes(message: str) -> dict[str, str]:
    """Each form field a refusal names (``sharding: Extra inputs are not permitted;
    min_nodes: …``), with what it says of it; fields it does not name are left out."""
    notes: dict[str, str] = {}
    for part in message.split("; "):
        field, colon, why = part.partition(": ")
        if not colon or field not in EDIT_FIELDS or field in notes:
            continue
        notes[field] = f"{NOT_IN_PLACE} ({why})" if why.startswith(_UNKNOWN_KEY) else why
    return notes
