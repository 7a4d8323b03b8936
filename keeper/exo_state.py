"""Reading a State that came from a stock exo: strict about what the keeper decides on.

Our ``State`` model is tolerant on purpose (``keeper.wire``): unknown keys are ignored and a
missing key reads as empty, so our master and exo can each add to the State without breaking the
other. For a State we produce ourselves that is right. For a State read from someone else's exo
it fails *open*: if exo renames ``instances``, the tolerant model reads "no instances", the
keeper sees every model lost and places them again, and the extras are never removed.

So a State read from exo goes through ``read_exo_state`` first: the keys the keeper decides on
(``DECIDING_KEYS``) must be present and be objects, and every entry under them must parse on its
own, so the answer can name the instance (or runner, or node) that did not. Anything else exo
adds stays ignored. The answer is a ``State`` or an ``Unreadable`` saying what was wrong, and
the caller acts on nothing until a read comes back whole.

Pure: JSON in, a value out; no I/O, no clock, nothing above the data model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from pydantic import TypeAdapter, ValidationError

from keeper.state import Instance, MemoryUsage, RunnerStatus, State, Topology
from keeper.wire import first_validation_error

# What the keeper's step reads of exo's State: instances (what runs), runners (whether it is
# ready), the topology (where to place) and node memory (what fits). Read as empty, each of
# them makes the keeper act: place again, or place where nothing fits.
DECIDING_KEYS = ("instances", "runners", "topology", "nodeMemory")
# The parts of the topology placement walks; missing, a cluster would read as unconnected nodes.
TOPOLOGY_KEYS = ("nodes", "connections")
# What placement reads of each node's memory; missing, it would read as 0 bytes.
NODE_MEMORY_KEYS = ("ramAvailable",)

_INSTANCE: TypeAdapter[Any] = TypeAdapter(Instance)
_RUNNER: TypeAdapter[Any] = TypeAdapter(RunnerStatus)


@dataclass(frozen=True)
class Unreadable:
    """exo's State cannot be acted on; ``reason`` says what was wrong, for the operator."""

    reason: str


def read_exo_state(raw: Mapping[str, Any]) -> State | Unreadable:
    """exo's ``GET /state`` JSON as our State, or why it cannot be acted on."""
    for key in DECIDING_KEYS:
        if key not in raw:
            return Unreadable(f'exo\'s State has no "{key}"')
        if not isinstance(raw[key], dict):
            return Unreadable(f'exo\'s State has "{key}" that is not an object')
    problem = (
        _instances_problem(cast(dict[str, Any], raw["instances"]))
        or _runners_problem(cast(dict[str, Any], raw["runners"]))
        or _topology_problem(cast(dict[str, Any], raw["topology"]))
        or _node_memory_problem(cast(dict[str, Any], raw["nodeMemory"]))
    )
    if problem is not None:
        return Unreadable(problem)
    try:
        return State.model_validate(raw)
    except ValidationError as exc:  # a key the keeper does not decide on, but still ours
        return Unreadable(f"exo's State: {first_validation_error(exc)}")


def _instances_problem(instances: dict[str, Any]) -> str | None:
    for instance_id, body in instances.items():
        try:
            instance = _INSTANCE.validate_python(body)
        except ValidationError as exc:
            return f"instance {instance_id}: {first_validation_error(exc)}"
        if instance.instance_id != instance_id:
            return f"instance {instance_id}: its instanceId is {instance.instance_id}"
    return None


def _runners_problem(runners: dict[str, Any]) -> str | None:
    for runner_id, body in runners.items():
        try:
            _RUNNER.validate_python(body)
        except ValidationError as exc:
            return f"runner {runner_id}: {first_validation_error(exc)}"
    return None


def _topology_problem(topology: dict[str, Any]) -> str | None:
    for key in TOPOLOGY_KEYS:
        if key not in topology:
            return f'exo\'s State has a topology without "{key}"'
    try:
        Topology.model_validate(topology)
    except ValidationError as exc:
        return f"topology: {first_validation_error(exc)}"
    return None


def _node_memory_problem(node_memory: dict[str, Any]) -> str | None:
    for node_id, body in node_memory.items():
        if not isinstance(body, dict):
            return f"nodeMemory of node {node_id}: not an object"
        for key in NODE_MEMORY_KEYS:
            if key not in body:
                return f'nodeMemory of node {node_id}: no "{key}"'
        try:
            MemoryUsage.model_validate(body)
        except ValidationError as exc:
            return f"nodeMemory of node {node_id}: {first_validation_error(exc)}"
    return None
