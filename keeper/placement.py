"""Placement: pick the nodes for an instance (stub; being written)."""

from __future__ import annotations

from keeper.state import AnyInstance, InstanceMeta, ModelCard, Sharding, State


def place_instance(
    state: State,
    model_card: ModelCard,
    sharding: Sharding | str,
    instance_meta: InstanceMeta | str,
    min_nodes: int,
) -> AnyInstance:
    raise NotImplementedError
