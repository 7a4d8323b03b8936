"""The two JSON conventions every exo wire shape follows, in one place.

exo serializes domain objects with camelCase keys and accepts snake_case too, ignores keys it
does not know (a real exo State carries far more than we model), and writes each member of a
union wrapped in its class name: ``{"MlxRingInstance": {...}}``. Every model in this package
derives from ``WireModel`` (plain objects) or ``TaggedModel`` (union members), so the rules are
written once and cannot drift between the State, the events and the commands.

Models are frozen: ``apply`` builds new states instead of mutating, which is what keeps it pure.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel

# A JSON object as json.loads gives it: what we read of another system before we check it, and
# what we send it verbatim.
JsonObject = dict[str, Any]


class WireModel(BaseModel):
    """A frozen model with exo's camelCase JSON that ignores unknown keys."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        extra="ignore",
        frozen=True,
        use_enum_values=False,
    )


class TaggedModel(WireModel):
    """A union member that serializes as ``{"ClassName": {...fields}}``.

    Input may be tagged (exo's JSON) or a bare field mapping (convenient in Python); a tag naming
    another class is rejected, so a union can never read one member as another.
    """

    tag: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.tag = cls.__name__

    @model_validator(mode="before")
    @classmethod
    def _unwrap_tag(cls, data: Any) -> Any:
        if isinstance(data, dict) and len(data) == 1:  # pyright: ignore[reportUnknownArgumentType]
            ((key, body),) = data.items()  # pyright: ignore[reportUnknownVariableType]
            if key == cls.tag:
                return body  # pyright: ignore[reportUnknownVariableType]
            if isinstance(key, str) and key[:1].isupper() and isinstance(body, dict):
                raise ValueError(f"expected a {cls.tag}, got a {key}")
        return data  # pyright: ignore[reportUnknownVariableType]

    @model_serializer(mode="wrap")
    def _wrap_tag(
        self, handler: SerializerFunctionWrapHandler, info: SerializationInfo
    ) -> dict[str, Any]:
        return {self.tag: handler(self)}


def _tag_of(value: Any) -> str | None:
    if isinstance(value, TaggedModel):
        return value.tag
    if isinstance(value, dict) and len(value) == 1:  # pyright: ignore[reportUnknownArgumentType]
        (key,) = value.keys()  # pyright: ignore[reportUnknownVariableType]
        return key if isinstance(key, str) else None
    return None


# Use as ``Annotated[A | B, TAGGED]`` with ``Tag("A")`` on each member: pydantic then picks the
# member by the JSON's single key instead of trying each in turn, and names the bad tag on error.
TAGGED = Discriminator(_tag_of)


def first_validation_error(exc: ValidationError) -> str:
    """The first thing pydantic found wrong, as ``"where.it.is: what is wrong"``: one line that
    names the field, for a log, a close reason or an error message."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]
