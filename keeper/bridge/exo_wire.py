"""exo's JSON formats as the bridge reads and writes them (pure: plain data in, plain data out).

exo's models forbid unknown keys and are strict about types, and its shard metadata carries a
model card richer than ours (family, capabilities, reasoning dialect, sampling defaults...): a
runner loads and runs the model with it. So the bridge never re-encodes exo's cards through our
tolerant ``ModelCard`` (which would drop all that): it keeps exo's own JSON. The card in an
instance the bridge sends is always one exo itself produced or would produce:

- exo's own placement answer (``GET /instance/placement``), posted back verbatim;
- in the fallback for an exo without that endpoint (docs/bridge.md), a card exo showed (inside
  the shards of an instance in its State or of a placement or preview, or the ``model_card`` of
  its answer to ``POST /instance``), or exo's own card file (``--model-cards DIR``) read as exo
  reads it (``file_card``: exo's defaults for what the file leaves out).

A card is never written from exo's ``GET /models`` entry: that list has no layer count and no
sampling defaults, and a runner given null sampling behaves differently from exo's own.
``listed_card`` turns such an entry into our card only to describe a deployment, with 0 for the
figures exo's list does not give (0 = unknown, as in our ``GET /models`` entries).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from keeper.model.state import (
    AnyInstance,
    AnyShard,
    Instance,
    Memory,
    MlxRingInstance,
    ModelCard,
)
from keeper.model.wire import JsonObject, first_validation_error

MEGABYTE = 1024 * 1024  # exo's list gives sizes in MiB

# exo's model card, key by key in exo's order, with the default exo's card model gives each key a
# card file may leave out; None marks the keys every card must give.
_CARD_KEYS: tuple[tuple[str, Any], ...] = (
    ("modelId", None),
    ("storageSize", None),
    ("nLayers", None),
    ("hiddenSize", None),
    ("supportsTensor", None),
    ("numKeyValueHeads", None),
    ("tasks", None),
    ("components", None),
    ("family", ""),
    ("quantization", ""),
    ("baseModel", ""),
    ("capabilities", []),
    ("backends", ["MlxMetal", "MlxCuda", "MlxCpu"]),
    ("reasoningDialect", "none"),
    ("contextLength", 0),
    ("usesCfg", False),
    ("trustRemoteCode", True),
    ("isCustom", False),
    ("vision", None),
)
_REQUIRED_CARD_KEYS = ("modelId", "storageSize", "nLayers", "hiddenSize", "supportsTensor", "tasks")
# exo's sampling knobs; a card file that leaves one out leaves it to the engine (null), as exo does.
_SAMPLING_KNOBS = (
    "temperature",
    "topP",
    "topK",
    "minP",
    "repetitionPenalty",
    "presencePenalty",
    "frequencyPenalty",
)
_INSTANCE: TypeAdapter[AnyInstance] = TypeAdapter(Instance)


class ExoListedModel(BaseModel):
    """One entry of exo's ``GET /models``, read leniently: only ``id`` is required, and the card
    fields some exo versions add (``n_layers``...) are used when present."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: str
    storage_size_megabytes: int | None = None
    supports_tensor: bool | None = None
    tasks: list[str] | None = None
    base_model: str | None = None
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


def cards_in_state(raw_state: Mapping[str, Any]) -> dict[str, JsonObject]:
    """The model card of every model exo's State shows an instance of, as exo wrote it."""
    cards: dict[str, JsonObject] = {}
    instances = raw_state.get("instances")
    if not isinstance(instances, dict):
        return cards
    for tagged in cast(dict[str, Any], instances).values():
        for card in instance_cards(tagged):
            cards.setdefault(card["modelId"], card)
    return cards


def instance_cards(tagged: Any) -> list[JsonObject]:
    """The model cards in the shards of one of exo's tagged instances (those naming a model)."""
    cards: list[JsonObject] = []
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
                if isinstance(card, dict) and isinstance(
                    cast(JsonObject, card).get("modelId"), str
                ):
                    cards.append(cast(JsonObject, card))
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


def shard_json(shard: AnyShard, card: JsonObject) -> JsonObject:
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
            runner: shard_json(shard, card) for runner, shard in assignments.runner_to_shard.items()
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


def read_instance(raw: Any) -> AnyInstance:
    """One of exo's tagged instances read with our model; ValueError saying what is wrong."""
    try:
        return _INSTANCE.validate_python(raw)
    except ValidationError as exc:
        raise ValueError(first_validation_error(exc)) from None


def exo_model_card(card: JsonObject) -> ModelCard:
    """Our card read from exo's (the figures placement uses); ValueError if it cannot be read."""
    try:
        return ModelCard.model_validate(card)
    except ValidationError as exc:
        raise ValueError(f"exo's model card is unreadable: {first_validation_error(exc)}") from None


def file_card(from_file: JsonObject) -> JsonObject:
    """exo's card file (``camel_keys`` of its TOML) as exo's JSON spells the card it loads from
    it: every key in exo's order, exo's defaults for the ones the file leaves out. ValueError
    naming a key every card needs that the file lacks."""
    missing = [key for key in _REQUIRED_CARD_KEYS if key not in from_file]
    if missing:
        raise ValueError(f"not an exo model card: no {', '.join(missing)}")
    card: JsonObject = {key: from_file.get(key, default) for key, default in _CARD_KEYS}
    given = from_file.get("samplingDefaults")
    card["samplingDefaults"] = _sampling(cast(JsonObject, given) if isinstance(given, dict) else {})
    exo_model_card(card)
    return card


def _sampling(given: JsonObject) -> JsonObject:
    sampling: JsonObject = {knob: given.get(knob) for knob in _SAMPLING_KNOBS}
    for mode in ("thinking", "nonThinking"):
        params = given.get(mode)
        sampling[mode] = (
            {knob: cast(JsonObject, params).get(knob) for knob in _SAMPLING_KNOBS}
            if isinstance(params, dict)
            else None
        )
    return sampling


def listed_card(listed: ExoListedModel) -> ModelCard:
    """Our card for a model known only from exo's ``GET /models`` entry: the figures exo's list
    gives, 0 for the layer count, hidden size and size it does not give (0 = unknown)."""
    return ModelCard(
        model_id=listed.id,
        storage_size=Memory(in_bytes=(listed.storage_size_megabytes or 0) * MEGABYTE),
        n_layers=listed.n_layers or 0,
        hidden_size=listed.hidden_size or 0,
        supports_tensor=bool(listed.supports_tensor),
        tasks=tuple(listed.tasks) if listed.tasks else ("TextGeneration",),
        num_key_value_heads=listed.num_key_value_heads,
        base_model=listed.base_model or None,
    )
