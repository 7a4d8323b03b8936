"""The cap on every string a node gives (``keeper.model.node_strings``): each string of a node
message, however deep (a model, a list, a mapping's keys and values), is at most 512 characters,
a friendly name at most 64, the cut marked; what is short enough is the very same object."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from keeper.model.node_strings import (
    CUT_MARK,
    MAX_FRIENDLY_NAME,
    MAX_NODE_STRING,
    capped,
    cut,
)
from keeper.model.state import (
    Backend,
    MemoryUsage,
    NetworkInterface,
    NodeIdentity,
    NodeNetwork,
    Topology,
)
from keeper.sim.link.protocol import Hello, NodeInfo, RequestInstanceDeletion


def info(name: str, interface: str) -> NodeInfo:
    return NodeInfo(
        memory=MemoryUsage(),
        backends=[Backend.MLX_METAL],
        identity=NodeIdentity(friendly_name=name, chip_id=interface),
        network=NodeNetwork(interfaces=[NetworkInterface(name=interface, ip_address="10.0.0.1")]),
    )


def test_cut_keeps_what_fits_and_marks_what_does_not() -> None:
    assert cut("abc", 3) == "abc"
    assert cut("abcd", 3) == "ab" + CUT_MARK
    assert len(cut("x" * 1000, 10)) == 10


def test_a_long_friendly_name_is_cut_to_64_and_other_strings_to_512() -> None:
    got = capped(info("n" * 10_000, "e" * 10_000))
    assert got.identity.friendly_name == "n" * (MAX_FRIENDLY_NAME - 1) + CUT_MARK
    assert got.identity.chip_id == "e" * (MAX_NODE_STRING - 1) + CUT_MARK
    assert got.network.interfaces[0].name == "e" * (MAX_NODE_STRING - 1) + CUT_MARK
    assert got.network.interfaces[0].ip_address == "10.0.0.1"
    assert got.backends == [Backend.MLX_METAL]


def test_strings_at_the_caps_are_kept_whole_and_the_message_is_the_same_object() -> None:
    message = info("n" * MAX_FRIENDLY_NAME, "e" * MAX_NODE_STRING)
    assert capped(message) is message


def test_a_hello_and_a_deletion_reason_are_capped() -> None:
    hello = capped(Hello(node_id="id", name="h" * 600, signature="00"))
    assert hello.name == "h" * (MAX_NODE_STRING - 1) + CUT_MARK
    assert (hello.node_id, hello.signature) == ("id", "00")
    reason = capped(RequestInstanceDeletion(instance_id="i", reason="r" * 513)).reason
    assert len(reason) == MAX_NODE_STRING


def test_mapping_keys_and_values_are_capped() -> None:
    long = "k" * 600
    got = capped(Topology(nodes=[long], connections={long: {}}))
    short = "k" * (MAX_NODE_STRING - 1) + CUT_MARK
    assert got.nodes == [short]
    assert list(got.connections) == [short]


@given(name=st.text(max_size=200), other=st.text(max_size=1200))
def test_every_string_is_within_its_cap_and_a_prefix_of_what_was_sent(
    name: str, other: str
) -> None:
    got = capped(info(name, other))
    for sent, kept, cap in [
        (name, got.identity.friendly_name, MAX_FRIENDLY_NAME),
        (other, got.identity.chip_id, MAX_NODE_STRING),
        (other, got.network.interfaces[0].name, MAX_NODE_STRING),
    ]:
        assert len(kept) <= cap
        if len(sent) <= cap:
            assert kept == sent
        else:
            assert kept == sent[: cap - 1] + CUT_MARK
