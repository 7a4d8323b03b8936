"""Commands: what clients ask the master to do, before it becomes events.

The API validates a request into one of these, and the master turns it into events (or an
error) under its lock. Keeping commands separate from events is exo's design: a command may be
refused, an event has happened.
"""

from __future__ import annotations

from typing import Annotated
from uuid import uuid4

from pydantic import Field, Tag, TypeAdapter

from keeper.state import (
    DeploymentId,
    Instance,
    InstanceId,
    InstanceMeta,
    ModelCard,
    Sharding,
)
from keeper.wire import TAGGED, TaggedModel


def new_id() -> str:
    return str(uuid4())


class CreateDeployment(TaggedModel):
    command_id: str = Field(default_factory=new_id)
    model_card: ModelCard
    sharding: Sharding = Sharding.PIPELINE
    instance_meta: InstanceMeta = InstanceMeta.MLX_RING
    min_nodes: int = Field(default=1, ge=1)


class DeleteDeployment(TaggedModel):
    command_id: str = Field(default_factory=new_id)
    deployment_id: DeploymentId


class PlaceInstance(TaggedModel):
    command_id: str = Field(default_factory=new_id)
    model_card: ModelCard
    sharding: Sharding = Sharding.PIPELINE
    instance_meta: InstanceMeta = InstanceMeta.MLX_RING
    min_nodes: int = Field(default=1, ge=1)


class CreateInstance(TaggedModel):
    command_id: str = Field(default_factory=new_id)
    instance: Instance


class DeleteInstance(TaggedModel):
    command_id: str = Field(default_factory=new_id)
    instance_id: InstanceId


Command = Annotated[
    Annotated[CreateDeployment, Tag("CreateDeployment")]
    | Annotated[DeleteDeployment, Tag("DeleteDeployment")]
    | Annotated[PlaceInstance, Tag("PlaceInstance")]
    | Annotated[CreateInstance, Tag("CreateInstance")]
    | Annotated[DeleteInstance, Tag("DeleteInstance")],
    TAGGED,
]

AnyCommand = CreateDeployment | DeleteDeployment | PlaceInstance | CreateInstance | DeleteInstance

COMMAND_ADAPTER: TypeAdapter[AnyCommand] = TypeAdapter(Command)
