"""The create form's rules, without the form: search the catalog, validate before sending.

Validating here (a model chosen, a sane node count, one deployment per model, and the checks
the master makes of a request against its model, ``keeper.api_models.create_problems``, in the
master's words) means most mistakes are named before anything is sent; the master still has the
last word, and the form shows its refusal verbatim.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from keeper.api_models import (
    MAX_MIN_NODES,
    CreateDeploymentRequest,
    ModelListEntry,
    create_problems,
)
from keeper.state import InstanceMeta, Sharding, State


def search_models(entries: Sequence[ModelListEntry], query: str) -> list[ModelListEntry]:
    """Entries whose id or name contains every word of ``query`` (any case), smallest first."""
    words = query.casefold().split()
    found = [e for e in entries if all(w in f"{e.id} {e.name}".casefold() for w in words)]
    return sorted(found, key=lambda e: (e.storage_size_megabytes, e.id))


def validate_create(
    entry: ModelListEntry | None,
    sharding: str,
    instance_meta: str,
    min_nodes_text: str,
    deployed: Mapping[str, str],
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
    try:
        shard = Sharding(sharding)
        meta = InstanceMeta(instance_meta)
    except ValueError as exc:
        return str(exc)
    # The checks the master makes too (keeper.api_models.create_problems), named before sending.
    problems = create_problems(entry.id, entry, shard, min_nodes)
    if problems:
        return f"{problems[0].message}."
    return CreateDeploymentRequest(
        model_id=entry.id, sharding=shard, instance_meta=meta, min_nodes=min_nodes
    )


def fit_hint(entry: ModelListEntry, state: State) -> str:
    """How the model's size compares with the memory the cluster has free, in one line.

    Placement needs the whole model in the free memory of one cycle of nodes; the largest single
    node and the sum over all nodes bound what any cycle can offer.
    """
    need_gb = entry.storage_size_megabytes / 1024
    free = {
        node: usage.ram_available.in_bytes / 1024**3
        for node, usage in state.node_memory.items()
        if node in state.topology.nodes
    }
    if not free:
        return f"needs {need_gb:.1f} GB; no node reports its memory yet"
    best_node, best_gb = max(free.items(), key=lambda item: item[1])
    identity = state.node_identities.get(best_node)
    name = identity.friendly_name if identity and identity.friendly_name else best_node[:8]
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
