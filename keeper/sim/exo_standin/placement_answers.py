"""exo's ``/instance/placement`` and ``/instance/previews`` for the stand-in, as pure functions.

The nodes are chosen by our own placement (``keeper.core.placement.place_instance``, exo's rules in
exo's order); this module adds what exo 0.3.70 does around it:

- exo's refusals our placement does not have. Both concern a Pipeline and come, in exo, after
  the memory and tensor checks and before the engine's checks, so that is where they are judged
  here: the 8-bit DeepSeek V3.1 cannot be pipelined at all, and a Gemma 4 model (base model
  "Gemma 4 ...") can only be "pipelined" on a single node: when no single node may take it
  (``min_nodes`` above 1, or no node with the memory), exo refuses;
- exo does not count a single node as an RDMA cycle (its previews refuse MlxJaccl on one node
  with the RDMA reason, where our placement lets one node qualify), and it turns a Tensor
  placement that lands on one node into a Pipeline on MlxRing;
- exo's full model card in every shard, and the two shard fields exo has and we do not
  (``immediateException``, ``shouldTimeout``), so the instance is the one exo would answer;
- the previews: every (sharding, engine, node count) exo tries, one entry per distinct result,
  the memory each node would give up (the model's size split evenly, the remainder a byte each
  to the first nodes by id), and one ``error`` entry per sharding and engine that exo refuses.

A model exo lists but for which no full card is shipped (``keeper.sim.exo_standin.model_list``)
gets the
checks that need only the list's figures, then a refusal naming the missing layer count.
"""

from __future__ import annotations

from typing import Any, cast

from keeper.core.placement import NO_MEMORY, NO_RDMA, no_tensor_support, place_instance
from keeper.core.placement.graph import cluster_graph
from keeper.core.placement.search import CycleSearch
from keeper.model.state import AnyInstance, InstanceMeta, Sharding, State
from keeper.model.wire import JsonObject
from keeper.sim.exo_standin.model_list import ExoModel

# The one model exo refuses to pipeline at all (its weights do not split cleanly by layer).
PIPELINE_REFUSED_MODEL = "mlx-community/DeepSeek-V3.1-8bit"
PIPELINE_REFUSED = "Pipeline parallelism is not supported for DeepSeek V3.1 (8-bit)"
# Base models exo runs only whole on one node when asked for a Pipeline.
GEMMA_4_PREFIX = "Gemma 4"
GEMMA_4_PIPELINE = (
    "Pipeline parallelism is not supported for Gemma 4; use tensor parallelism instead."
)
# The order exo tries the combinations in for its previews.
PREVIEW_SHARDINGS = (Sharding.PIPELINE, Sharding.TENSOR)
PREVIEW_ENGINES = (InstanceMeta.MLX_RING, InstanceMeta.MLX_JACCL)


def no_full_card(model_id: str) -> str:
    return (
        f"The exo stand-in has no full model card for {model_id}: exo's model list gives no "
        "layer count, so it cannot be placed here"
    )


def _fits(state: State, required: int, min_nodes: int, max_nodes: int | None = None) -> bool:
    """Whether some cycle of at least ``min_nodes`` (at most ``max_nodes``) nodes reporting
    memory has ``required`` bytes free: exo's first filter."""
    graph = cluster_graph(state)
    with_memory = sum(1 << i for i, ram in enumerate(graph.ram_available) if ram is not None)
    search = CycleSearch(graph)
    top = with_memory.bit_count() if max_nodes is None else min(max_nodes, with_memory.bit_count())
    return any(
        search.best(with_memory, size, required, rdma_only=False) is not None
        for size in range(max(min_nodes, 1), top + 1)
    )


def _pipeline_refusal(state: State, model: ExoModel, min_nodes: int) -> str | None:
    """exo's Pipeline-only refusals, judged once the memory check passed."""
    if model.model_id == PIPELINE_REFUSED_MODEL:
        return PIPELINE_REFUSED
    if model.base_model.startswith(GEMMA_4_PREFIX) and not (
        min_nodes <= 1 and _fits(state, model.storage_size.in_bytes, 1, max_nodes=1)
    ):
        return GEMMA_4_PIPELINE
    return None


def exo_place(
    state: State, model: ExoModel, sharding: Sharding, instance_meta: InstanceMeta, min_nodes: int
) -> JsonObject:
    """The instance exo would place, in exo's JSON; ValueError(exo's reason) if exo refuses."""
    card = model.card()
    if card is None or model.full_card is None:
        if not _fits(state, model.storage_size.in_bytes, min_nodes):
            raise ValueError(NO_MEMORY)
        if sharding == Sharding.TENSOR and not model.listed.get("supports_tensor"):
            raise ValueError(no_tensor_support(model.model_id))
        refusal = (
            _pipeline_refusal(state, model, min_nodes) if sharding == Sharding.PIPELINE else None
        )
        raise ValueError(refusal or no_full_card(model.model_id))
    try:
        instance = place_instance(state, card, sharding, instance_meta, min_nodes)
    except ValueError as exc:
        if str(exc) == NO_MEMORY or sharding == Sharding.TENSOR:
            raise
        refusal = _pipeline_refusal(state, model, min_nodes)
        raise ValueError(refusal or str(exc)) from None
    if sharding == Sharding.PIPELINE:
        refusal = _pipeline_refusal(state, model, min_nodes)
        if refusal is not None:
            raise ValueError(refusal)
    if len(instance.shard_assignments.node_to_runner) == 1:
        if instance_meta == InstanceMeta.MLX_JACCL:
            raise ValueError(NO_RDMA)
        if sharding == Sharding.TENSOR:
            # One node has nothing to split: exo makes it a Pipeline on MlxRing.
            instance = place_instance(state, card, Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
    return exo_instance_json(instance, model.full_card)


def exo_instance_json(instance: AnyInstance, full_card: JsonObject) -> JsonObject:
    """``instance`` as exo writes it: its shards carry exo's full card and exo's extra fields."""
    tagged: JsonObject = instance.model_dump(mode="json")
    body: JsonObject = next(iter(tagged.values()))
    for runner, shard in body["shardAssignments"]["runnerToShard"].items():
        body["shardAssignments"]["runnerToShard"][runner] = exo_shard_json(shard, full_card)
    return tagged


def exo_shard_json(shard: JsonObject, full_card: JsonObject) -> JsonObject:
    """A shard of our State's JSON (``{"PipelineShardMetadata": {...}}``) as exo writes it:
    with exo's full card and exo's extra fields."""
    ((tag, fields),) = shard.items()
    return {
        tag: {
            "modelCard": full_card,
            "deviceRank": fields["deviceRank"],
            "worldSize": fields["worldSize"],
            "immediateException": False,
            "shouldTimeout": None,
            "startLayer": fields["startLayer"],
            "endLayer": fields["endLayer"],
            "nLayers": fields["nLayers"],
        }
    }


def memory_delta_by_node(node_ids: list[str], storage_bytes: int) -> dict[str, int]:
    """The model's size split evenly over ``node_ids``; the remainder a byte each to the first
    nodes by id (exo's preview figure, not the layer split)."""
    share, remainder = divmod(storage_bytes, len(node_ids))
    return {
        node: share + (1 if index < remainder else 0) for index, node in enumerate(sorted(node_ids))
    }


def exo_previews(state: State, model: ExoModel) -> list[JsonObject]:
    """exo's ``previews`` for ``model``: nothing when the cluster has no node."""
    node_count = len(state.topology.nodes)
    previews: list[JsonObject] = []
    seen: set[tuple[Sharding, InstanceMeta, int]] = set()
    for sharding in PREVIEW_SHARDINGS:
        for engine in PREVIEW_ENGINES:
            for min_nodes in range(1, node_count + 1):
                entry: JsonObject = {
                    "model_id": model.model_id,
                    "sharding": sharding.value,
                    "instance_meta": engine.value,
                }
                try:
                    instance = exo_place(state, model, sharding, engine, min_nodes)
                except ValueError as exc:
                    if (sharding, engine, 0) not in seen:
                        entry.update(instance=None, memory_delta_by_node=None, error=str(exc))
                        previews.append(entry)
                    seen.add((sharding, engine, 0))
                    continue
                nodes = list(_body(instance)["shardAssignments"]["nodeToRunner"])
                if (sharding, engine, len(nodes)) not in seen:
                    delta = memory_delta_by_node(nodes, model.storage_size.in_bytes)
                    entry.update(instance=instance, memory_delta_by_node=delta, error=None)
                    previews.append(entry)
                seen.add((sharding, engine, len(nodes)))
    return previews


def _body(tagged: JsonObject) -> Any:
    return next(iter(tagged.values()))


def state_at(state_json: JsonObject, path: str) -> Any:
    """The value at ``path`` ("nodeMemory/<id>/ramTotal", list items by index) in the State's
    JSON; KeyError naming the path (dotted, as exo writes it) if there is none."""
    value: Any = state_json
    for part in (segment for segment in path.split("/") if segment):
        try:
            if isinstance(value, list):
                value = cast(list[Any], value)[int(part)]
            else:
                value = cast(dict[str, Any], value)[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise KeyError(
                f"unable to find path '{path.replace('/', '.')}' in state json"
            ) from None
    return value
