"""The two JSON conventions every exo wire shape follows, in one place.

exo serializes domain objects with camelCase keys and accepts snake_case too, ignores keys it
does not know (a real exo State carries far more than we model), and writes each member of a
union wrapped in its class name: ``{"MlxRingInstance": {...}}``. Every model in this package
derives from ``WireModel`` (plain objects) or ``TaggedModel`` (union members), so the rules are
written once and cannot drift between the State, the events and the commands. A union is declared
once, as the plain union of its member classes, and ``Annotated[that, TAGGED]`` reads it: the
tags come from the classes, so no class name is ever spelled as a string.

Models are frozen: ``apply`` builds new states instead of mutating, which is what keeps it pure.
"""

from __future__ import annotations

from types import UnionType
from typing import Annotated, Any, ClassVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    GetCoreSchemaHandler,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.alias_generators import to_camel
from pydantic_core import CoreSchema

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


def tagged_members(union: Any) -> tuple[type[TaggedModel], ...]:
    """The member classes of a tagged union (``A | B``, or ``Annotated[A | B, TAGGED]``), in
    declaration order; a TypeError unless there are two or more, each a ``TaggedModel``, and no two
    share a tag. (A single TaggedModel class needs no union: it reads its own tag.)"""
    if get_origin(union) is Annotated:
        union = get_args(union)[0]
    if get_origin(union) not in (Union, UnionType):
        raise TypeError(f"a tagged union is a union of two or more TaggedModel classes: {union!r}")
    members: tuple[Any, ...] = get_args(union)
    checked: list[type[TaggedModel]] = []
    for member in members:
        if not (isinstance(member, type) and issubclass(member, TaggedModel)):
            raise TypeError(
                f"a tagged union takes TaggedModel classes, tagged by their class name: {member!r}"
            )
        if any(seen.tag == member.tag for seen in checked):
            raise TypeError(f"two members of a tagged union are both tagged {member.tag!r}")
        checked.append(member)
    return tuple(checked)


# Not written ``Annotated[...]``/``Union[...]`` in the code below: those are type expressions to
# pyright, and these members are only known when the schema is built.
_ANNOTATED: Any = Annotated
_UNION: Any = Union
_DISCRIMINATOR = Discriminator(_tag_of)


class _TaggedUnion:
    """What ``TAGGED`` is: the pydantic schema of a union of ``TaggedModel`` classes, each member
    read under its class name (its ``tag``).

    Why a marker inside ``Annotated`` rather than a function that returns the union: a union is
    declared once, as the plain union of its classes (``AnyEvent = A | B``), because that is the
    one spelling pyright (strict) reads as a type, for annotations, ``isinstance`` and ``match``;
    a type built by a call is opaque to it. ``Annotated[AnyEvent, TAGGED]`` is that same type to
    pyright, and to pydantic the union this builds from it when the schema is made: exactly
    ``Annotated[Annotated[A, Tag("A")] | Annotated[B, Tag("B")], Discriminator(_tag_of)]``, the
    hand-written spelling it replaces, so the JSON, the JSON schema, the parsing speed and the
    errors (an unknown tag is ``union_tag_invalid``, naming it and the expected tags) are the same.
    pydantic picks the member by the JSON's single key instead of trying each in turn.
    """

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        tagged = tuple(_ANNOTATED[member, Tag(member.tag)] for member in tagged_members(source))
        return handler.generate_schema(_ANNOTATED[_UNION[tagged], _DISCRIMINATOR])

    def __repr__(self) -> str:
        return "TAGGED"


# ``Annotated[A | B, TAGGED]``: the union of TaggedModel classes A and B, as a field type or a
# TypeAdapter's, read and written as ``{"A": {...}}`` (see ``_TaggedUnion``).
TAGGED = _TaggedUnion()


def first_validation_error(exc: ValidationError) -> str:
    """The first thing pydantic found wrong, as ``"where.it.is: what is wrong"``: one line that
    names the field, for a log, a close reason or an error message."""
    errors = exc.errors()
    if not errors:
        return str(exc)
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]
