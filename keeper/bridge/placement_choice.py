"""What the bridge makes of exo's placement answers (pure: exo's JSON and State in, a choice out).

exo keeps its placement rules in its master (memory, tensor splits, RDMA, and rules of its own
for single models, such as no pipeline across nodes for Gemma 4) and keeps adding to them. A copy
of them in the bridge would place what exo refuses, and exo's ``POST /instance`` checks only
the cluster's total memory, so it would accept it. So the bridge asks exo where to place
(docs/bridge.md, "Placement"):

- ``GET /instance/placement`` answers the instance exo would create; ``read_placement`` checks it
  is an instance of the model asked for, new to exo's State, every shard carrying exo's card of
  the model, and keeps exo's JSON to be posted back verbatim;
- ``GET /instance/previews`` answers every placement exo would make of a model. For a model
  that already has an instance (replicas), ``choose_apart`` picks one whose nodes hold no runner
  of another instance of the model, so that losing a node does not take two replicas with it.

Both fail closed: what cannot be read is not placed (``ValueError`` saying why, which the
bridge makes the deployment's placement error), never guessed at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from keeper.bridge.exo_wire import instance_cards, read_instance
from keeper.core.view import nodes_serving
from keeper.model.state import AnyInstance, NodeId, State
from keeper.model.wire import JsonObject


@dataclass(frozen=True)
class ExoPlacement:
    """One instance exo would create."""

    instance: AnyInstance  # read with our model, for the keeper
    raw: JsonObject  # exo's tagged instance JSON as it came, to post back unchanged
    card: JsonObject  # exo's full model card, from its shards


@dataclass(frozen=True)
class Preview:
    """One entry of exo's ``GET /instance/previews``: a placement, or why there is none."""

    sharding: str
    instance_meta: str
    instance: JsonObject | None  # exo's tagged instance JSON
    error: str | None


def read_placement(raw: Any, model_id: str, state: State) -> ExoPlacement:
    """exo's answer to ``GET /instance/placement`` for ``model_id``, checked against exo's
    ``state``; ValueError saying why it cannot be used."""
    if not isinstance(raw, dict):
        raise ValueError("exo's answer is not a JSON object")
    tagged = cast(JsonObject, raw)
    try:
        instance = read_instance(tagged)
    except ValueError as exc:
        raise ValueError(f"exo's instance is unreadable: {exc}") from None
    assignments = instance.shard_assignments
    if assignments.model_id != model_id:
        raise ValueError(f"exo answered an instance of {assignments.model_id}")
    if instance.instance_id in state.instances:
        raise ValueError(f"exo answered instance {instance.instance_id}, which it already runs")
    if not assignments.node_to_runner:
        raise ValueError("exo's instance has no node")
    cards = instance_cards(tagged)
    if len(cards) != len(assignments.runner_to_shard) or any(
        card["modelId"] != model_id for card in cards
    ):
        raise ValueError(f"exo's shards do not all carry its model card of {model_id}")
    return ExoPlacement(instance=instance, raw=tagged, card=cards[0])


def read_previews(payload: Any) -> list[Preview]:
    """exo's ``GET /instance/previews`` answer (``{"previews": [...]}``); ValueError if it or
    an entry cannot be read."""
    entries = cast(JsonObject, payload).get("previews") if isinstance(payload, dict) else None
    if not isinstance(entries, list):
        raise ValueError("exo's answer has no list of previews")
    previews: list[Preview] = []
    for position, entry in enumerate(cast(list[Any], entries)):
        fields = cast(JsonObject, entry) if isinstance(entry, dict) else {}
        sharding, meta = fields.get("sharding"), fields.get("instance_meta")
        instance, error = fields.get("instance"), fields.get("error")
        if (
            not isinstance(sharding, str)
            or not isinstance(meta, str)
            or not (instance is None or isinstance(instance, dict))
            or not (error is None or isinstance(error, str))
        ):
            raise ValueError(f"exo's preview {position} is unreadable")
        previews.append(Preview(sharding, meta, cast(JsonObject | None, instance), error))
    return previews


def preview_card(previews: list[Preview], model_id: str) -> JsonObject | None:
    """exo's full card of ``model_id`` from the first preview that places it, if any does."""
    for preview in previews:
        if preview.instance is not None:
            for card in instance_cards(preview.instance):
                if card["modelId"] == model_id:
                    return card
    return None


def choose_apart(
    previews: list[Preview],
    state: State,
    model_id: str,
    sharding: str,
    instance_meta: str,
    min_nodes: int,
    cordoned: frozenset[NodeId] = frozenset(),
) -> ExoPlacement | None:
    """The placement among exo's ``previews`` for the deployment's sharding, instance type and
    ``min_nodes`` whose nodes hold no runner of another instance of ``model_id`` and are not
    ``cordoned``, or None.

    Of those, the one on the fewest nodes (fewer nodes to lose, less traffic between them), and
    among equals the first in exo's order, which is exo's own preference. A preview that cannot
    be read is never chosen.
    """
    taken = nodes_serving(state, model_id) | cordoned
    best: tuple[int, ExoPlacement] | None = None
    for preview in previews:
        if preview.instance is None or (preview.sharding, preview.instance_meta) != (
            sharding,
            instance_meta,
        ):
            continue
        try:
            placement = read_placement(preview.instance, model_id, state)
        except ValueError:
            continue
        nodes = placement.instance.shard_assignments.node_to_runner.keys()
        if len(nodes) < min_nodes or not taken.isdisjoint(nodes):
            continue
        if best is None or len(nodes) < best[0]:
            best = (len(nodes), placement)
    return best[1] if best is not None else None
