"""Reading a State that came from a stock exo: strict about what the keeper decides on.

Our ``State`` model is tolerant on purpose (``keeper.model.wire``): unknown keys are ignored and a
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

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from pydantic import TypeAdapter, ValidationError

from keeper.model.state import Instance, MemoryUsage, RunnerStatus, State, Topology
from keeper.model.wire import first_validation_error

# What the keeper's step reads of exo's State: instances (what runs), runners (whether it is
# ready), the topology (where to place) and node memory (what fits). Read as empty, each of
# them makes the keeper act: place again, or place where nothing fits.
DECIDING_KEYS = ("instances", "runners", "topology", "nodeMemory")
# The parts of the topology placement walks; missing, a cluster would read as unconnected nodes.
TOPOLOGY_KEYS = ("nodes", "connections")
# What placement reads of each node's memory; missing, it would read as 0 bytes.
NODE_MEMORY_KEYS = ("ramAvailable",)

T = TypeVar("T")

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
        return problem
    # A key the keeper does not decide on can still fail to parse: it is ours all the same.
    return _read(State.model_validate, raw, "exo's State")


def _read(read: Callable[[Any], T], body: Any, what: str) -> T | Unreadable:
    """``body`` as ``read`` reads it, or why not: ``what`` it is and the first error."""
    try:
        return read(body)
    except ValidationError as exc:
        return Unreadable(f"{what}: {first_validation_error(exc)}")


def _instances_problem(instances: dict[str, Any]) -> Unreadable | None:
    for instance_id, body in instances.items():
        instance = _read(_INSTANCE.validate_python, body, f"instance {instance_id}")
        if isinstance(instance, Unreadable):
            return instance
        if instance.instance_id != instance_id:
            return Unreadable(f"instance {instance_id}: its instanceId is {instance.instance_id}")
    return None


def _runners_problem(runners: dict[str, Any]) -> Unreadable | None:
    for runner_id, body in runners.items():
        runner = _read(_RUNNER.validate_python, body, f"runner {runner_id}")
        if isinstance(runner, Unreadable):
            return runner
    return None


def _topology_problem(topology: dict[str, Any]) -> Unreadable | None:
    for key in TOPOLOGY_KEYS:
        if key not in topology:
            return Unreadable(f'exo\'s State has a topology without "{key}"')
    read = _read(Topology.model_validate, topology, "topology")
    return read if isinstance(read, Unreadable) else None


def _node_memory_problem(node_memory: dict[str, Any]) -> Unreadable | None:
    for node_id, body in node_memory.items():
        if not isinstance(body, dict):
            return Unreadable(f"nodeMemory of node {node_id}: not an object")
        for key in NODE_MEMORY_KEYS:
            if key not in body:
                return Unreadable(f'nodeMemory of node {node_id}: no "{key}"')
        memory = _read(MemoryUsage.model_validate, body, f"nodeMemory of node {node_id}")
        if isinstance(memory, Unreadable):
            return memory
    return None
