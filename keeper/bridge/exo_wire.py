"""What the bridge sends exo, in exactly the JSON exo's strict parser accepts.

exo's models forbid unknown keys and are strict about types, and its shard metadata carries a
model card richer than ours (family, capabilities, sampling defaults...): a runner loads the model
with it. So the JSON is written here key by key from exo's format (see
``tests/fixtures/exo_create_instance.json``) rather than dumped from our tolerant models, which
would send our card and miss exo's extra shard fields (``immediateException``,
``shouldTimeout``).

The card in each shard is the one exo itself knows, in this order of preference:
1. a card exo put in its own State for an instance of the model (seen by the bridge since it
   started): that is exactly what exo built, verbatim;
2. otherwise one written from exo's ``GET /models`` entry (its family, quantization, base model,
   capabilities, context length...) plus what placement used from our card (layers, hidden size,
   storage, backends), with exo's defaults for the rest, overlaid with the model's exo card file
   when the bridge was given one (``--model-cards DIR``: exo's own TOML, so its reasoning
   dialect and sampling defaults come through).

Everything here is pure: plain data in, plain JSON-ready dicts out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel

from keeper.state import (
    AnyInstance,
    AnyShard,
    Backend,
    Memory,
    MlxRingInstance,
    ModelCard,
)

JsonObject = dict[str, Any]

# exo's sampling defaults when a card names none: every knob left to the engine.
_NO_SAMPLING_PARAMS: JsonObject = {
    "temperature": None,
    "topP": None,
    "topK": None,
    "minP": None,
    "repetitionPenalty": None,
    "presencePenalty": None,
    "frequencyPenalty": None,
}
MEGABYTE = 1024 * 1024


class ExoListedModel(BaseModel):
    """One entry of exo's ``GET /models``, read leniently: only ``id`` is required, and the card
    fields some exo versions add (``n_layers``...) are used when present."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    storage_size_megabytes: int | None = None
    supports_tensor: bool | None = None
    tasks: list[str] | None = None
    family: str | None = None
    quantization: str | None = None
    base_model: str | None = None
    capabilities: list[str] | None = None
    context_length: int | None = None
    is_custom: bool | None = None
    n_layers: int | None = None
    hidden_size: int | None = None
    num_key_value_heads: int | None = None


def listed_models(payload: Any) -> dict[str, ExoListedModel]:
    """exo's ``GET /models`` answer (``{"data": [...]}``) by id; unreadable entries skipped."""
    data = cast(dict[str, Any], payload).get("data") if isinstance(payload, dict) else None
    found: dict[str, ExoListedModel] = {}
    for entry in cast(list[Any], data) if isinstance(data, list) else []:
        try:
            listed = ExoListedModel.model_validate(entry)
        except ValidationError:
            continue
        found.setdefault(listed.id, listed)
    return found


def deployment_card(model_id: str, listed: ExoListedModel, known: ModelCard | None) -> ModelCard:
    """Our card for a model exo lists: exo's figures where it gives them, else the bridge's own
    catalog's. Raises ValueError naming what is missing."""
    n_layers = listed.n_layers or (known.n_layers if known is not None else None)
    hidden_size = listed.hidden_size or (known.hidden_size if known is not None else None)
    if n_layers is None or hidden_size is None:
        raise ValueError(
            f"exo lists {model_id} but its GET /models gives no layer count or hidden size, and "
            "the bridge has no card for it: start the bridge with --model-cards DIR holding "
            "its exo model-card .toml"
        )
    if known is not None:
        storage = known.storage_size
    elif listed.storage_size_megabytes:
        storage = Memory(in_bytes=listed.storage_size_megabytes * MEGABYTE)
    else:
        raise ValueError(
            f"exo lists {model_id} without its size, and the bridge has no card for it"
        )
    return ModelCard(
        model_id=model_id,
        storage_size=storage,
        n_layers=n_layers,
        hidden_size=hidden_size,
        supports_tensor=(
            listed.supports_tensor
            if listed.supports_tensor is not None
            else (known.supports_tensor if known is not None else False)
        ),
        tasks=tuple(listed.tasks or (known.tasks if known is not None else ("TextGeneration",))),
        backends=(
            known.backends
            if known is not None
            else (Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU)
        ),
        num_key_value_heads=listed.num_key_value_heads
        or (known.num_key_value_heads if known is not None else None),
        base_model=listed.base_model or (known.base_model if known is not None else None),
    )


def cards_in_state(raw_state: Mapping[str, Any]) -> dict[str, JsonObject]:
    """The model card of every model exo's State shows an instance of, as exo wrote it."""
    cards: dict[str, JsonObject] = {}
    instances = raw_state.get("instances")
    if not isinstance(instances, dict):
        return cards
    for tagged in cast(dict[str, Any], instances).values():
        for body in _tag_bodies(tagged):
            assignments = body.get("shardAssignments")
            if not isinstance(assignments, dict):
                continue
            shards: Any = cast(dict[str, Any], assignments).get("runnerToShard")
            if not isinstance(shards, dict):
                continue
            for shard_tagged in cast(dict[str, Any], shards).values():
                for shard in _tag_bodies(shard_tagged):
                    card: Any = shard.get("modelCard")
                    if isinstance(card, dict):
                        typed = cast(JsonObject, card)
                        model_id = typed.get("modelId")
                        if isinstance(model_id, str):
                            cards.setdefault(model_id, typed)
    return cards


def _tag_bodies(tagged: Any) -> list[JsonObject]:
    if not isinstance(tagged, dict):
        return []
    return [
        cast(JsonObject, body)
        for body in cast(dict[str, Any], tagged).values()
        if isinstance(body, dict)
    ]


def camel_keys(value: Any) -> Any:
    """A TOML model card (snake_case keys, nested tables) as exo's JSON spells it (camelCase)."""
    if isinstance(value, dict):
        return {
            to_camel(str(key)): camel_keys(item)
            for key, item in cast(dict[Any, Any], value).items()
        }
    if isinstance(value, list):
        return [camel_keys(item) for item in cast(list[Any], value)]
    return value


def exo_card(
    card: ModelCard,
    listed: ExoListedModel | None,
    seen: JsonObject | None,
    from_file: JsonObject | None = None,
) -> JsonObject:
    """The card exo knows for ``card``'s model (see the module docstring for the order).

    A card seen in exo's State is used only if it agrees with ours on the model and its layer
    count, since the shards' layer ranges were computed from ours. Raises ValueError if exo no
    longer lists the model and never showed its card.
    """
    if (
        seen is not None
        and seen.get("modelId") == card.model_id
        and seen.get("nLayers") == card.n_layers
    ):
        return dict(seen)
    if listed is None:
        raise ValueError(f"exo's GET /models no longer lists {card.model_id}")
    written: JsonObject = {
        "modelId": card.model_id,
        "storageSize": {"inBytes": card.storage_size.in_bytes},
        "nLayers": card.n_layers,
        "hiddenSize": card.hidden_size,
        "supportsTensor": card.supports_tensor,
        "numKeyValueHeads": card.num_key_value_heads,
        "tasks": list(listed.tasks or card.tasks),
        "components": None,
        "family": listed.family or "",
        "quantization": listed.quantization or "",
        "baseModel": listed.base_model or card.base_model or "",
        "capabilities": list(listed.capabilities or ()),
        "backends": [backend.value for backend in card.backends],
        # exo's defaults for a card file that does not say (its own cards mostly do not).
        "reasoningDialect": "none",
        "contextLength": listed.context_length or 0,
        "usesCfg": False,
        "trustRemoteCode": True,
        "isCustom": bool(listed.is_custom),
        "vision": None,
        "samplingDefaults": {**_NO_SAMPLING_PARAMS, "thinking": None, "nonThinking": None},
    }
    if from_file is not None and from_file.get("nLayers") == card.n_layers:
        sampling = from_file.get("samplingDefaults")
        written.update({k: v for k, v in from_file.items() if k in written})
        if isinstance(sampling, dict):
            written["samplingDefaults"] = _sampling(cast(JsonObject, sampling))
    return written


def _sampling(given: JsonObject) -> JsonObject:
    """Sampling defaults with every knob exo has, the ones a card file leaves out as null."""
    sampling: JsonObject = {**_NO_SAMPLING_PARAMS, "thinking": None, "nonThinking": None}
    sampling.update({k: v for k, v in given.items() if k in sampling})
    for mode in ("thinking", "nonThinking"):
        params = sampling[mode]
        if isinstance(params, dict):
            sampling[mode] = {
                **_NO_SAMPLING_PARAMS,
                **{k: v for k, v in cast(JsonObject, params).items() if k in _NO_SAMPLING_PARAMS},
            }
    return sampling


def _shard_json(shard: AnyShard, card: JsonObject) -> JsonObject:
    return {
        shard.tag: {
            "modelCard": card,
            "deviceRank": shard.device_rank,
            "worldSize": shard.world_size,
            "immediateException": False,
            "shouldTimeout": None,
            "startLayer": shard.start_layer,
            "endLayer": shard.end_layer,
            "nLayers": shard.n_layers,
        }
    }


def instance_json(instance: AnyInstance, card: JsonObject) -> JsonObject:
    """``instance`` as exo's tagged Instance JSON, every shard carrying ``card``."""
    assignments = instance.shard_assignments
    shard_assignments: JsonObject = {
        "modelId": assignments.model_id,
        "runnerToShard": {
            runner: _shard_json(shard, card)
            for runner, shard in assignments.runner_to_shard.items()
        },
        "nodeToRunner": dict(assignments.node_to_runner),
    }
    if isinstance(instance, MlxRingInstance):
        body: JsonObject = {
            "instanceId": instance.instance_id,
            "shardAssignments": shard_assignments,
            "hostsByNode": {
                node: [{"ip": host.ip, "port": host.port} for host in hosts]
                for node, hosts in instance.hosts_by_node.items()
            },
            "ephemeralPort": instance.ephemeral_port,
        }
    else:
        body = {
            "instanceId": instance.instance_id,
            "shardAssignments": shard_assignments,
            "jacclDevices": [list(row) for row in instance.jaccl_devices],
            "jacclCoordinators": dict(instance.jaccl_coordinators),
        }
    return {instance.tag: body}


def create_instance_body(instance: AnyInstance, card: JsonObject) -> JsonObject:
    """The body of exo's ``POST /instance``."""
    return {"instance": instance_json(instance, card)}
