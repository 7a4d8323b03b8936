"""What ``exo-deploy apply`` does to make the service's deployments what a file asks for
(docs/design.md §7.7): a pure function of the file's deployments and the service's, so that the
plan printed, the plan carried out and the plan ``--dry-run`` shows are one.

A deployment is known by its model: the services refuse a second deployment of a model (409,
``keeper.runtime.deployments.new_deployment``), so a file's entry and a running deployment of
the same model are the same deployment. Each of the file's entries is its deployment's whole
settings (a field left out is the API's default), so the plan compares every field and a change
carries only the fields that differ, old and new.

The steps are ordered as they are carried out: creates, then changes, then deletes (``--prune``
only). Make before break: if the service refuses a step, everything the file adds or changes
before it is already in place and nothing has yet been taken away.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from keeper.model.api_models import CreateDeploymentRequest
from keeper.model.state import Deployment

# The settings a plan compares: every field of a create but the model, which is the identity.
SETTINGS: tuple[str, ...] = tuple(
    name for name in CreateDeploymentRequest.model_fields if name != "model_id"
)

# A setting's value as the API's JSON carries it (an enum as its text).
JsonValue = str | int | bool


@dataclass(frozen=True)
class FieldChange:
    name: str
    old: JsonValue
    new: JsonValue


@dataclass(frozen=True)
class Create:
    """The file's deployment of a model the service has none of: ``POST /deployments``."""

    request: CreateDeploymentRequest

    @property
    def model_id(self) -> str:
        return self.request.model_id


@dataclass(frozen=True)
class Change:
    """A deployment whose settings differ from the file's: ``PATCH /deployments/{id}`` with
    those only."""

    deployment_id: str
    model_id: str
    changes: tuple[FieldChange, ...]

    def patch_body(self) -> dict[str, JsonValue]:
        return {change.name: change.new for change in self.changes}


@dataclass(frozen=True)
class Delete:
    """A deployment of a model the file does not list, with ``--prune``: ``DELETE``."""

    deployment_id: str
    model_id: str


@dataclass(frozen=True)
class Unchanged:
    """A deployment as the file asks for it already."""

    deployment_id: str
    model_id: str


@dataclass(frozen=True)
class Unlisted:
    """A deployment of a model the file does not list, left alone (no ``--prune``)."""

    deployment_id: str
    model_id: str


Action = Create | Change | Delete
Step = Create | Change | Delete | Unchanged | Unlisted


@dataclass(frozen=True)
class Plan:
    """The steps, in the order they are carried out (creates, changes, deletes), then those
    that do nothing (unchanged, then unlisted)."""

    steps: tuple[Step, ...]

    @property
    def actions(self) -> tuple[Action, ...]:
        return tuple(step for step in self.steps if isinstance(step, Create | Change | Delete))

    def count(self, kind: type[Step]) -> int:
        return sum(isinstance(step, kind) for step in self.steps)


def settings_of(deployment: Deployment) -> CreateDeploymentRequest:
    """The request that would create ``deployment`` as it is now."""
    return CreateDeploymentRequest(
        model_id=deployment.model_card.model_id,
        sharding=deployment.sharding,
        instance_meta=deployment.instance_meta,
        min_nodes=deployment.min_nodes,
        replicas=deployment.replicas,
        standby=deployment.standby,
        priority=deployment.priority,
        preempt=deployment.preempt,
        repair=deployment.repair,
    )


def differences(
    current: CreateDeploymentRequest, desired: CreateDeploymentRequest
) -> tuple[FieldChange, ...]:
    """The settings ``desired`` holds differently from ``current``, in the request's order."""
    old, new = current.model_dump(mode="json"), desired.model_dump(mode="json")
    return tuple(
        FieldChange(name, old[name], new[name]) for name in SETTINGS if old[name] != new[name]
    )


def by_model(current: Sequence[Deployment]) -> dict[str, Deployment]:
    """The deployments by model; were a model kept twice (a log from before the rule), the
    first listed is the one the file's entry matches and the others count as unlisted."""
    found: dict[str, Deployment] = {}
    for deployment in current:
        found.setdefault(deployment.model_card.model_id, deployment)
    return found


def plan_deployments(
    desired: Sequence[CreateDeploymentRequest], current: Sequence[Deployment], *, prune: bool
) -> Plan:
    """What makes ``current`` (the service's deployments, as listed) what ``desired`` (the file's,
    one per model) asks for; deployments of other models are deleted only with ``prune``."""
    matched = by_model(current)
    creates: list[Step] = []
    changes: list[Step] = []
    unchanged: list[Step] = []
    for request in desired:
        existing = matched.get(request.model_id)
        if existing is None:
            creates.append(Create(request))
            continue
        found = differences(settings_of(existing), request)
        if found:
            changes.append(Change(existing.deployment_id, request.model_id, found))
        else:
            unchanged.append(Unchanged(existing.deployment_id, request.model_id))
    wanted = {request.model_id for request in desired}
    others = [
        deployment
        for deployment in current
        if deployment.model_card.model_id not in wanted
        or matched[deployment.model_card.model_id] is not deployment
    ]
    kind = Delete if prune else Unlisted
    left = [kind(d.deployment_id, d.model_card.model_id) for d in others]
    deletes = left if prune else []
    unlisted = [] if prune else left
    return Plan((*creates, *changes, *deletes, *unchanged, *unlisted))


def outcome(
    plan: Plan, current: Mapping[str, CreateDeploymentRequest]
) -> dict[str, CreateDeploymentRequest]:
    """The settings by deployment id once ``plan`` is carried out on ``current`` (settings by
    deployment id), a create's under the key ``create:MODEL`` (its id is the service's to
    choose): what the plan promises, for the checks that it keeps it."""
    after = dict(current)
    for step in plan.actions:
        if isinstance(step, Create):
            after[f"create:{step.model_id}"] = step.request
        elif isinstance(step, Change):
            before = after[step.deployment_id].model_dump(mode="json")
            after[step.deployment_id] = CreateDeploymentRequest.model_validate(
                {**before, **step.patch_body()}
            )
        else:
            del after[step.deployment_id]
    return after
