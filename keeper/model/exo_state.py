"""Reading a State that came from a stock exo: closed for what cannot be read, open for the rest.

Our ``State`` model is tolerant on purpose (``keeper.model.wire``): unknown keys are ignored and a
missing key reads as empty, so our master and exo can each add to the State without breaking the
other. For a State read from someone else's exo that fails *open*: if exo renames ``instances``,
the tolerant model reads "no instances", the keeper sees every model lost and places them again,
and the extras are never removed.

Failing closed for the whole State fails too wide, though: exo adds values as it grows (a
backend, a runner status, an instance kind), and one entry we cannot read, for a model nobody
deployed, would stop the keeper for every deployment. So ``read_exo_state`` reads exo's State
entry by entry (docs/design.md §8.2):

- what everything hangs on must be there and be objects: the keys the keeper decides on
  (``DECIDING_KEYS``) and the topology placement walks. Without them nothing can be judged, and
  the answer is ``Unreadable``: nothing is placed or deleted anywhere;
- every other entry (an instance, a runner, a node's memory or identity, a download entry) is
  read on its own. One that does not read is left out of the State and named in an
  ``UnreadablePart``, with the model and nodes it concerns as far as they can be found;
- ``touched_deployments`` then says which deployments such a part concerns, and why, in words:
  the bridge places and deletes nothing for those (an unreadable instance or runner may be
  serving them), shows them with that reason, and keeps every other deployment.

Values exo adds where we only carry them (a backend) are text in the model (``BackendName``);
an unknown kind where the keeper decides (an instance, a shard or a runner status) is a part
that cannot be read.

Pure: JSON in, values out; no I/O, no clock, nothing above the data model. The lines marked
``# pragma: no mutate`` are casts (typing only), the one-pass shortcut (the same answer) and what
runs once at import (``make mutation``: no test can tell their mutants from them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast, get_args

from pydantic import TypeAdapter, ValidationError

from keeper.model.state import (
    DeploymentId,
    DownloadEntry,
    Instance,
    InstanceId,
    ModelId,
    NodeId,
    RunnerStatus,
    State,
    Topology,
)
from keeper.model.wire import JsonObject, first_validation_error

# What the keeper's step reads of exo's State: instances (what runs), runners (whether it is
# ready), the topology (where to place) and node memory (what fits). Read as empty, each of
# them makes the keeper act: place again, or place where nothing fits.
DECIDING_KEYS = ("instances", "runners", "topology", "nodeMemory")
# The parts of the topology placement walks; missing, a cluster would read as unconnected nodes.
TOPOLOGY_KEYS = ("nodes", "connections")
# What placement reads of each node's memory; missing, it would read as 0 bytes.
NODE_MEMORY_KEYS = ("ramAvailable",)
# exo's per-node keys we read, each an object keyed by node id: an entry that does not read is
# left out (its node then reads as reporting nothing of it) and named. ``nodeMemory`` is among
# them: a node whose memory cannot be read gets no placement, as one that reports none.
PER_NODE_KEYS = (
    "nodeMemory",
    "nodeIdentities",
    "nodeBackends",
    "nodeNetwork",
    "nodeRdmaCtl",
    "nodeDisk",
    "nodeSystem",
    "lastSeen",
)

# What a part that cannot be read is: an instance, a runner, something a node reports, or one
# of a node's download entries.
PartKind = Literal["instance", "runner", "node", "download"]

T = TypeVar("T")

_INSTANCE: TypeAdapter[Any] = TypeAdapter(Instance)
_RUNNER: TypeAdapter[Any] = TypeAdapter(RunnerStatus)
_DOWNLOAD: TypeAdapter[Any] = TypeAdapter(DownloadEntry)


@dataclass(frozen=True)
class Unreadable:
    """exo's State cannot be acted on at all; ``reason`` says what was wrong, for the operator."""

    reason: str


@dataclass(frozen=True)
class UnreadablePart:
    """One entry of exo's State that could not be read, left out of the State read.

    ``key`` names it as exo does (an instance or runner id, a node id); ``model_id`` is the model
    it is for and ``node_ids`` the nodes it names, as far as exo's JSON shows them; ``reason``
    says what was wrong, with the first field that did not read."""

    kind: PartKind
    key: str
    reason: str
    model_id: ModelId | None = None
    node_ids: tuple[NodeId, ...] = ()

    @property
    def words(self) -> str:
        """The part and why, as an operator reads it."""
        return f"exo's {self.kind} {self.key} cannot be read: {self.reason}"


@dataclass(frozen=True)
class ExoRead:
    """exo's State as far as it reads, and each part left out because it did not."""

    state: State
    unreadable: tuple[UnreadablePart, ...] = ()


def unreadable_instances(parts: Iterable[UnreadablePart]) -> frozenset[InstanceId]:
    """The ids of exo's instances that are there but could not be read: absent from the State
    read, yet not deleted (a record of one must not be taken as gone)."""
    return frozenset(part.key for part in parts if part.kind == "instance")


def read_exo_state(raw: Mapping[str, Any]) -> ExoRead | Unreadable:
    """exo's ``GET /state`` JSON as our State with what did not read left out and named, or why
    it cannot be acted on at all."""
    for key in DECIDING_KEYS:
        if key not in raw:
            return Unreadable(f'exo\'s State has no "{key}"')
        if not isinstance(raw[key], dict):
            return Unreadable(f'exo\'s State has "{key}" that is not an object')
    topology = _topology_problem(cast(JsonObject, raw["topology"]))  # pragma: no mutate
    if topology is not None:
        return topology
    # The one-pass read is a shortcut for a State that reads whole: the entry-by-entry read below
    # gives the same answer, only slower, so no test can tell a change in it (no mutate).
    whole = _read(State.model_validate, raw, "exo's State")  # pragma: no mutate
    if isinstance(whole, State) and _reads_whole(whole, raw):
        return ExoRead(state=whole)  # every entry read: no need to read them one by one
    parts: list[UnreadablePart] = []
    kept: dict[str, Any] = dict(raw)
    instances = cast(JsonObject, raw["instances"])  # pragma: no mutate
    kept["instances"] = _instances(instances, parts)
    runners = cast(JsonObject, raw["runners"])  # pragma: no mutate
    kept["runners"] = _runners(runners, instances, parts)
    for key in PER_NODE_KEYS:
        if key in raw:
            kept[key] = _per_node(key, raw[key], parts)
    if "downloads" in raw:
        kept["downloads"] = _downloads(raw["downloads"], parts)
    # What is left is ours to read whole: a value of the wrong kind here (say, a
    # lastEventAppliedIdx that is not a number) leaves nothing to judge by.
    state = _read(State.model_validate, kept, "exo's State")
    if isinstance(state, Unreadable):
        return state
    return ExoRead(state=state, unreadable=tuple(parts))


def _reads_whole(state: State, raw: Mapping[str, Any]) -> bool:
    """Whether a State that read in one go holds every entry as exo wrote it: each instance
    under its own id, and each node's memory with what placement reads of it (a missing field
    would read as 0 bytes, not fail)."""
    if any(instance.instance_id != key for key, instance in state.instances.items()):
        return False
    memory = cast(JsonObject, raw["nodeMemory"])  # pragma: no mutate
    problems = [_node_entry_problem("nodeMemory", b) for b in memory.values()]  # pragma: no mutate
    return all(problem is None for problem in problems)  # pragma: no mutate


def touched_deployments(state: State, parts: Iterable[UnreadablePart]) -> dict[DeploymentId, str]:
    """The deployments of ``state`` that a part left out of exo's State concerns, each with the
    first such part in words: an instance or a runner of its model (it may be serving it, or
    failing). A part whose model cannot be found concerns every deployment. A node's report or a
    download entry concerns none: the node is left out of placement, the entry reads as absent."""
    touched: dict[DeploymentId, str] = {}
    for part in parts:
        if part.kind not in ("instance", "runner"):
            continue
        for deployment_id, deployment in sorted(state.deployments.items()):
            if deployment_id in touched:
                continue
            if part.model_id is None or part.model_id == deployment.model_card.model_id:
                touched[deployment_id] = part.words
    return touched


# --- the entries ----------------------------------------------------------------------------


def _read(read: Callable[[Any], T], body: Any, what: str) -> T | Unreadable:
    """``body`` as ``read`` reads it, or why not: ``what`` it is and the first error."""
    try:
        return read(body)
    except ValidationError as exc:
        return Unreadable(f"{what}: {first_validation_error(exc)}")


def _why(read: Callable[[Any], Any], body: Any) -> str | None:
    """Why ``body`` does not read, or None when it does."""
    try:
        read(body)
    except ValidationError as exc:
        return first_validation_error(exc)
    return None


def _instances(instances: JsonObject, parts: list[UnreadablePart]) -> JsonObject:
    kept: JsonObject = {}
    for instance_id, body in instances.items():
        why = _why(_INSTANCE.validate_python, body)
        if why is None:
            read_id = _INSTANCE.validate_python(body).instance_id
            if read_id == instance_id:
                kept[instance_id] = body
                continue
            why = f"its instanceId is {read_id}"
        model_id, node_ids = _instance_names(body)
        parts.append(UnreadablePart("instance", instance_id, why, model_id, node_ids))
    return kept


def _runners(runners: JsonObject, instances: JsonObject, parts: list[UnreadablePart]) -> JsonObject:
    kept: JsonObject = {}
    for runner_id, body in runners.items():
        why = _why(_RUNNER.validate_python, body)
        if why is None:
            kept[runner_id] = body
            continue
        model_id, node_ids = _runner_names(runner_id, instances)
        parts.append(UnreadablePart("runner", runner_id, why, model_id, node_ids))
    return kept


def _per_node(key: str, entries: Any, parts: list[UnreadablePart]) -> Any:
    """``entries`` of a per-node key with each node's entry that does not read left out."""
    if not isinstance(entries, dict):
        return entries  # the whole value is wrong: the State's own read names it
    read = _ENTRY_READERS[key]
    kept: JsonObject = {}
    for node_id, body in cast(JsonObject, entries).items():  # pragma: no mutate
        why = _node_entry_problem(key, body)
        if why is None:
            why = _why(read, body)
        if why is None:
            kept[node_id] = body
        else:
            parts.append(UnreadablePart("node", node_id, f"{key}: {why}", None, (node_id,)))
    return kept


def _node_entry_problem(key: str, body: Any) -> str | None:
    if key != "nodeMemory":
        return None
    if not isinstance(body, dict):
        return "not an object"
    for wanted in NODE_MEMORY_KEYS:
        if wanted not in body:
            return f'no "{wanted}"'
    return None


def _downloads(downloads: Any, parts: list[UnreadablePart]) -> Any:
    """exo's download entries with each one that does not read left out."""
    if not isinstance(downloads, dict):
        return downloads
    kept: JsonObject = {}
    for node_id, entries in cast(JsonObject, downloads).items():  # pragma: no mutate
        if not isinstance(entries, list):
            parts.append(UnreadablePart("download", node_id, "not an array", None, (node_id,)))
            continue
        readable: list[Any] = []
        for body in cast(list[Any], entries):  # pragma: no mutate
            why = _why(_DOWNLOAD.validate_python, body)
            if why is None:
                readable.append(body)
            else:
                model_id = _find_model_id(body)
                key = f"{node_id}/{model_id}" if model_id is not None else node_id
                parts.append(UnreadablePart("download", key, why, model_id, (node_id,)))
        kept[node_id] = readable
    return kept


def _topology_problem(topology: JsonObject) -> Unreadable | None:
    for key in TOPOLOGY_KEYS:
        if key not in topology:
            return Unreadable(f'exo\'s State has a topology without "{key}"')
    read = _read(Topology.model_validate, topology, "topology")
    return read if isinstance(read, Unreadable) else None


# --- naming what did not read ---------------------------------------------------------------


def _instance_names(body: Any) -> tuple[ModelId | None, tuple[NodeId, ...]]:
    """The model and nodes an instance's JSON names, whatever its kind: exo wraps each instance
    in its kind's name, and every kind so far carries ``shardAssignments``."""
    assignments = _member(_untagged(body), "shardAssignments")
    model_id = _member(assignments, "modelId")
    nodes = _member(assignments, "nodeToRunner")
    mapping = cast(JsonObject, nodes)  # pragma: no mutate
    node_ids = tuple(sorted(mapping)) if isinstance(nodes, dict) else ()
    return (model_id if isinstance(model_id, str) else None), node_ids


def _runner_names(
    runner_id: str, instances: JsonObject
) -> tuple[ModelId | None, tuple[NodeId, ...]]:
    """The model and node of the instance that names ``runner_id`` in exo's JSON."""
    for body in instances.values():
        assignments = _member(_untagged(body), "shardAssignments")
        nodes = _member(assignments, "nodeToRunner")
        if not isinstance(nodes, dict):
            continue
        for node_id, named in cast(JsonObject, nodes).items():  # pragma: no mutate
            if named == runner_id:
                model_id = _member(assignments, "modelId")
                return (model_id if isinstance(model_id, str) else None), (node_id,)
    return None, ()


def _find_model_id(body: Any) -> ModelId | None:
    """The first ``modelId`` in ``body``, searched breadth first (a download entry names its
    model inside its shard's card)."""
    level: list[Any] = [body]
    while level:
        deeper: list[Any] = []
        for value in level:
            if isinstance(value, dict):
                mapping = cast(JsonObject, value)  # pragma: no mutate
                found = mapping.get("modelId", mapping.get("model_id"))
                if isinstance(found, str):
                    return found
                deeper.extend(mapping.values())
        level = deeper
    return None


def _untagged(body: Any) -> Any:
    """The object inside exo's ``{"KindName": {...}}`` wrapping (the body itself if unwrapped)."""
    unwrapped: Any = body
    if isinstance(body, dict) and len(cast(JsonObject, body)) == 1:
        unwrapped = next(iter(cast(JsonObject, body).values()))  # pragma: no mutate
    return unwrapped


def _member(body: Any, key: str) -> Any:
    """``body[key]`` when ``body`` is an object, else None."""
    if not isinstance(body, dict):
        return None
    value: Any = cast(JsonObject, body).get(key)  # pragma: no mutate
    return value


# --- one State field read alone -------------------------------------------------------------


def _entry_reader(key: str) -> Callable[[Any], Any]:
    """A reader of one node's entry under exo's per-node ``key``, as the State reads it."""
    fields = State.model_fields  # pragma: no mutate
    field = next(f for n, f in fields.items() if (f.alias or n) == key)  # pragma: no mutate
    _, value_type = get_args(field.annotation)  # pragma: no mutate
    return TypeAdapter[Any](value_type).validate_python  # pragma: no mutate


# Each per-node key's reader of one node's entry.
_ENTRY_READERS = {key: _entry_reader(key) for key in PER_NODE_KEYS}
