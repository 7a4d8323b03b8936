"""Every tagged union reads and writes each member under its class name, and refuses any other tag.

A union is declared once, as the plain union of its classes, and ``Annotated[that, TAGGED]``
(``keeper.model.wire``) derives the tags from the classes. These tests find every union built that
way in the package (so a new one is checked the moment it exists), and pin what the JSON of each
member looks like and how an unknown tag is refused: both are the wire (the event log on disk,
the node protocol, exo's State), which the derivation must never change.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin

import pytest
from pydantic import Tag, TypeAdapter, ValidationError
from test_state_wire import _every_event  # pyright: ignore[reportPrivateUsage]

import keeper
from keeper.model.events import IndexedEvent
from keeper.model.state import (
    AnyRunnerStatus,
    Backend,
    DownloadFailed,
    DownloadPending,
    MemoryUsage,
    NodeIdentity,
    NodeNetwork,
    RDMAConnection,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    State,
)
from keeper.model.wire import TAGGED, TaggedModel, WireModel, tagged_members
from keeper.sim.link.protocol import (
    CancelChat,
    CancelDownload,
    Challenge,
    ChatChunk,
    ChatError,
    ChatMessage,
    ChatRequest,
    DeleteDownload,
    DownloadReport,
    EventMessage,
    Heartbeat,
    Hello,
    LinkDown,
    LinkUp,
    NodeInfo,
    RequestInstanceDeletion,
    RunnerStatusReport,
    StartDownload,
    Welcome,
)

FIXTURES = Path(__file__).parent.parent / "fixtures"


def _tagged_unions() -> dict[str, Any]:
    """Every ``Annotated[..., TAGGED]`` a module of the package defines, once each, by where it
    is defined (the module of its first member) and its name there."""
    found: dict[str, Any] = {}
    seen: set[int] = set()
    for module in pkgutil.walk_packages(keeper.__path__, "keeper."):
        if module.name.endswith("__main__"):  # runs the CLI
            continue
        for name, value in sorted(vars(importlib.import_module(module.name)).items()):
            if get_origin(value) is not Annotated or id(value) in seen:
                continue
            if any(meta is TAGGED for meta in value.__metadata__):
                seen.add(id(value))
                found[f"{tagged_members(value)[0].__module__}.{name}"] = value
    return found


TAGGED_UNIONS = _tagged_unions()


def test_the_unions_are_found() -> None:
    assert set(TAGGED_UNIONS) >= {
        "keeper.model.events.Event",
        "keeper.model.state.Shard",
        "keeper.model.state.Instance",
        "keeper.model.state.RunnerStatus",
        "keeper.sim.link.protocol.NodeMessage",
        "keeper.sim.link.protocol.MasterMessage",
    }


@pytest.fixture(scope="module")
def samples() -> dict[type[TaggedModel], list[TaggedModel]]:
    """At least one value of every member of every tagged union, by class."""
    state = State.model_validate(json.loads((FIXTURES / "exo_state.json").read_text()))
    recorded = FIXTURES / "exo_recordings" / "state-downloading.json"
    downloading = State.model_validate(json.loads(recorded.read_text()))
    downloads = [entry for entries in downloading.downloads.values() for entry in entries]
    values: list[TaggedModel] = [
        *_every_event(state),
        *state.instances.values(),
        *(
            shard
            for instance in state.instances.values()
            for shard in instance.shard_assignments.runner_to_shard.values()
        ),
        *(member() for member in get_args(AnyRunnerStatus)),
        RunnerLoading(layers_loaded=3, total_layers=9),
        RunnerFailed(error_message="boom"),
        *downloads,
        DownloadPending(node_id="n", shard_metadata=downloads[0].shard_metadata),
        DownloadFailed(
            node_id="n", shard_metadata=downloads[0].shard_metadata, error_message="disk full"
        ),
        Hello(node_id="n", name="studio", signature="ab", running_instances=["i"]),
        NodeInfo(
            memory=MemoryUsage(),
            backends=[Backend.MLX_METAL],
            identity=NodeIdentity(friendly_name="studio"),
            network=NodeNetwork(),
        ),
        Heartbeat(),
        RunnerStatusReport(runner_id="r", runner_status=RunnerReady()),
        LinkUp(sink="m", edge=RDMAConnection(source_rdma_iface="a", sink_rdma_iface="b")),
        LinkDown(sink="m", edge=RDMAConnection(source_rdma_iface="a", sink_rdma_iface="b")),
        RequestInstanceDeletion(instance_id="i", reason="runner keeps failing"),
        ChatChunk(request_id="q", text="hi", finish_reason="stop"),
        ChatError(request_id="q", message="no runner"),
        Challenge(nonce="00ff"),
        Welcome(state=state),
        EventMessage(indexed=IndexedEvent(idx=7, event=_every_event(state)[0])),
        ChatRequest(
            request_id="q", instance_id="i", messages=[ChatMessage(role="user", content="hi")]
        ),
        CancelChat(request_id="q"),
        StartDownload(shard_metadata=downloads[0].shard_metadata),
        DeleteDownload(model_id="m"),
        CancelDownload(model_id="m"),
        DownloadReport(download_progress=downloads[0]),
    ]
    by_class: dict[type[TaggedModel], list[TaggedModel]] = {}
    for value in values:
        by_class.setdefault(type(value), []).append(value)
    return by_class


@pytest.mark.parametrize("name", sorted(TAGGED_UNIONS))
def test_every_member_round_trips_under_its_class_name(
    name: str, samples: dict[type[TaggedModel], list[TaggedModel]]
) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(TAGGED_UNIONS[name])
    for member in tagged_members(TAGGED_UNIONS[name]):
        assert member.tag == member.__name__
        assert samples.get(member), f"no sample of {member.__name__}: add one to samples()"
        for value in samples[member]:
            raw = adapter.dump_json(value)
            assert list(json.loads(raw)) == [member.__name__]
            assert adapter.dump_python(value, mode="json") == json.loads(raw)
            read = adapter.validate_json(raw)
            assert type(read) is member and read == value
            assert adapter.validate_python(json.loads(raw)) == value


@pytest.mark.parametrize("name", sorted(TAGGED_UNIONS))
def test_an_unknown_tag_is_refused_naming_it_and_the_tags_that_are_the_class_names(
    name: str,
) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(TAGGED_UNIONS[name])
    expected = ", ".join(repr(m.__name__) for m in tagged_members(TAGGED_UNIONS[name]))
    for bad in ('{"NoSuchKind": {}}', '{"noSuchKind": {"a": 1}}'):
        with pytest.raises(ValidationError) as refused:
            adapter.validate_json(bad)
        (error,) = refused.value.errors()
        tag = next(iter(json.loads(bad)))
        assert error["type"] == "union_tag_invalid"
        assert error.get("ctx") == {
            "discriminator": "_tag_of()",
            "tag": tag,
            "expected_tags": expected,
        }
        assert error["msg"] == (
            f"Input tag '{tag}' found using _tag_of() does not match any of the expected tags: "
            f"{expected}"
        )


@pytest.mark.parametrize("name", sorted(TAGGED_UNIONS))
@pytest.mark.parametrize("untagged", [{}, {"a": {}, "b": {}}, [], None, "Heartbeat", 3])
def test_a_value_with_no_single_tag_is_refused_as_untagged(name: str, untagged: Any) -> None:
    adapter: TypeAdapter[Any] = TypeAdapter(TAGGED_UNIONS[name])
    for read in (adapter.validate_python, lambda raw: adapter.validate_json(json.dumps(raw))):
        with pytest.raises(ValidationError) as refused:
            read(untagged)
        (error,) = refused.value.errors()
        assert error["type"] == "union_tag_not_found"
        assert error["msg"] == "Unable to extract tag using discriminator _tag_of()"


def _adapter_of(union: Any) -> TypeAdapter[Any]:
    """``TypeAdapter(Annotated[union, TAGGED])`` for a union known only at run time."""
    annotated: Any = Annotated  # a type expression to pyright otherwise
    return TypeAdapter(annotated[union, TAGGED])


class _First(TaggedModel):
    pass


class _Second(TaggedModel):
    n: int = 0


class _Plain(WireModel):
    pass


def test_a_union_tags_by_class_name_in_declaration_order() -> None:
    union = Annotated[_First | _Second, TAGGED]
    assert tagged_members(union) == (_First, _Second)
    assert tagged_members(_First | _Second) == (_First, _Second)
    adapter: TypeAdapter[_First | _Second] = TypeAdapter(union)
    assert adapter.dump_json(_Second(n=2)) == b'{"_Second":{"n":2}}'
    assert adapter.validate_json(b'{"_First":{}}') == _First()


@pytest.mark.parametrize(
    "union",
    [
        _First,  # one class needs no union: it reads its own tag
        _First | _Plain,  # not a TaggedModel: it has no tag
        int | str,
        # The spelling TAGGED replaced: a member's tag comes from its class, never from a string.
        Annotated[_First, Tag("_First")] | Annotated[_Second, Tag("_Second")],
    ],
)
def test_what_is_not_a_union_of_tagged_classes_is_refused_when_built(union: Any) -> None:
    with pytest.raises(TypeError, match="tagged union"):
        _adapter_of(union)


def test_two_members_with_one_tag_are_refused() -> None:
    other: Any = type(
        "_First", (TaggedModel,), {"__module__": __name__}
    )  # another class, same name
    with pytest.raises(TypeError, match="both tagged '_First'"):
        _adapter_of(_First | other)
