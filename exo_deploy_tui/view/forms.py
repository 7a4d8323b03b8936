"""The create form's rules, without the form: search the catalog, validate before sending.

Validating here (a model chosen, a sane node count, one deployment per model, and the checks
the master makes of a request against its model, ``keeper.model.api_models.create_problems``, in the
master's words) means most mistakes are named before anything is sent; the master still has the
last word, and the form shows its refusal verbatim.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import TypeAdapter, ValidationError

from keeper.model.api_models import (
    MAX_MIN_NODES,
    CreateDeploymentRequest,
    ModelListEntry,
    create_problems,
)
from keeper.model.state import (
    MAX_REPLICAS,
    InstanceMeta,
    Sharding,
    State,
    friendly_name,
    node_name,
)

# The request's own ``replicas`` field (1..MAX_REPLICAS, a whole number), so the form refuses
# exactly what the master would, in the words of its 422 ("replicas: Input should be less than
# or equal to 16"), and no second copy of the bounds exists.
_REPLICAS = TypeAdapter(Annotated[int, CreateDeploymentRequest.model_fields["replicas"]])


def check_replicas(text: str) -> int | str:
    """The replica count typed in ``text``, or what is wrong with it, as the master says it."""
    stripped = text.strip()
    # Not a number: the field's own check names it ("Input should be a valid integer").
    value: object = int(stripped) if re.fullmatch(r"[+-]?[0-9]+", stripped) else stripped
    try:
        return _REPLICAS.validate_python(value)
    except ValidationError as exc:
        return f"replicas: {exc.errors()[0]['msg']}"


def search_models(entries: Sequence[ModelListEntry], query: str) -> list[ModelListEntry]:
    """Entries whose id or name contains every word of ``query`` (any case), smallest first."""
    words = query.casefold().split()
    found = [e for e in entries if all(w in f"{e.id} {e.name}".casefold() for w in words)]
    return sorted(found, key=lambda e: (e.storage_size_megabytes, e.id))


def no_match(query: str) -> str:
    """What the catalog says instead of an empty list."""
    return f"no model matches '{query}'"


def validate_create(
    entry: ModelListEntry | None,
    sharding: str,
    instance_meta: str,
    min_nodes_text: str,
    deployed: Mapping[str, str],
    replicas_text: str = "1",
) -> CreateDeploymentRequest | str:
    """The request to send, or what is wrong with the form (one sentence)."""
    if entry is None:
        return "Choose a model from the list (type to search)."
    if entry.id in deployed:
        return f"{entry.id} already has a deployment ({deployed[entry.id]})."
    text = min_nodes_text.strip() or "1"
    try:
        min_nodes = int(text)
    except ValueError:
        return f"Min nodes must be a whole number, not '{text}'."
    if not 1 <= min_nodes <= MAX_MIN_NODES:
        return f"Min nodes must be between 1 and {MAX_MIN_NODES}."
    replicas = check_replicas(replicas_text)
    if isinstance(replicas, str):
        return f"{replicas}."
    try:
        shard = Sharding(sharding)
        meta = InstanceMeta(instance_meta)
    except ValueError as exc:
        return str(exc)
    # The checks the master makes too (keeper.model.api_models.create_problems), named before
    # sending.
    problems = create_problems(entry.id, entry, shard, min_nodes)
    if problems:
        return f"{problems[0].message}."
    return CreateDeploymentRequest(
        model_id=entry.id,
        sharding=shard,
        instance_meta=meta,
        min_nodes=min_nodes,
        replicas=replicas,
    )


def fit_hint(entry: ModelListEntry, state: State, replicas: int = 1) -> str:
    """How the model's size compares with the memory the cluster has free, in one line.

    Placement needs the whole model in the free memory of one cycle of nodes; the largest single
    node and the sum over all nodes bound what any cycle can offer. With several replicas each
    needs nodes of its own (the keeper places them apart, docs/design.md §5.11): the count of
    nodes that can hold the model alone says whether they all fit, and pooling the others
    largest first bounds how many more could fit on several nodes each.
    """
    if replicas > 1:
        return _replicas_fit_hint(entry, state, min(replicas, MAX_REPLICAS))
    need_gb = entry.storage_size_megabytes / 1024
    free = {
        node: usage.ram_available.in_bytes / 1024**3
        for node, usage in state.node_memory.items()
        if node in state.topology.nodes
    }
    if not free:
        return f"needs {need_gb:.1f} GB; no node reports its memory yet"
    best_node, best_gb = max(free.items(), key=lambda item: item[1])
    name = _name(state, best_node)
    total_gb = sum(free.values())
    if need_gb <= best_gb:
        verdict = "fits on one node"
    elif need_gb <= total_gb:
        verdict = "needs several nodes"
    else:
        verdict = "more than the whole cluster has free"
    return (
        f"needs {need_gb:.1f} GB: {verdict} (most free: {best_gb:.1f} GB on {name}, "
        f"{total_gb:.1f} GB in all)"
    )


def _free_gb(state: State) -> dict[str, float]:
    return {
        node: usage.ram_available.in_bytes / 1024**3
        for node, usage in state.node_memory.items()
        if node in state.topology.nodes
    }


def _name(state: State, node: str) -> str:
    """The node by name (``keeper.model.state.node_name``), or the start of its id."""
    return node_name(state, node) if friendly_name(state, node) else node[:8]


def _replicas_fit_hint(entry: ModelListEntry, state: State, replicas: int) -> str:
    need_gb = entry.storage_size_megabytes / 1024
    free = _free_gb(state)
    if not free:
        return f"needs {need_gb:.1f} GB for each of {replicas} replicas; no node reports memory yet"
    alone = sorted((gb for gb in free.values() if gb >= need_gb), reverse=True)
    best_node = max(free, key=lambda n: free[n])
    most = f"most free: {free[best_node]:.1f} GB on {_name(state, best_node)}"
    if len(alone) >= replicas:
        return (
            f"needs {need_gb:.1f} GB on each of {replicas} nodes apart: fits "
            f"({len(alone)} node{'s' if len(alone) != 1 else ''} can hold it; {most})"
        )
    # The rest pooled largest first: each group that reaches the model's size is one more
    # replica spanning several nodes (an upper bound: a group also needs a cycle of links).
    pooled = 0
    gathered = 0.0
    for gb in sorted((gb for gb in free.values() if gb < need_gb), reverse=True):
        gathered += gb
        if gathered >= need_gb:
            pooled, gathered = pooled + 1, 0.0
    holders = f"{len(alone)} node{'s' if len(alone) != 1 else ''}"
    if len(alone) + pooled >= replicas:
        return (
            f"needs {need_gb:.1f} GB for each of {replicas} replicas apart: only {holders} "
            f"can hold it alone, the others must span several nodes each ({most})"
        )
    who = f"only {holders} can hold it" if alone else "no node can hold it alone"
    room = f" (room for {len(alone) + pooled} apart)" if pooled else ""
    return f"needs {need_gb:.1f} GB each; {who}{room}: {replicas} replicas won't all fit"
