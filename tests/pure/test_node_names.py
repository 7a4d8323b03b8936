"""A node as an operator knows it: namesakes stay apart (docs/design.md §5.15).

exo keys nodes by random ids, new at every restart, and reports a display name that several
machines often share ("Mac Studio"; every node of a cluster on one host). Keyed by the name
alone, namesakes merged into one row of ``GET /nodes``, one cordon and one history entry. Each
case builds the State exo would report and checks the name each node goes by, and that cordons
and the operator's NODE follow it.
"""

from __future__ import annotations

import json

import pytest
from recorded_exo import cluster_recorded

from keeper.model.exo_state import ExoRead, read_exo_state
from keeper.model.refusals import ConflictError
from keeper.model.state import (
    NetworkInterface,
    NodeIdentity,
    NodeNetwork,
    State,
    Topology,
    cordoned_nodes,
    node_address,
    node_name,
    nodes_named,
)
from keeper.runtime.nodes import node_name_for, nodes_response


def cluster(*nodes: tuple[str, str, tuple[str, ...]]) -> State:
    """(id, friendly name, addresses) per node, all in the topology."""
    return State(
        topology=Topology(nodes=[node_id for node_id, _, _ in nodes]),
        node_identities={n: NodeIdentity(friendly_name=name) for n, name, _ in nodes},
        node_network={
            n: NodeNetwork(
                interfaces=[NetworkInterface(name="en0", ip_address=a) for a in addresses]
            )
            for n, _, addresses in nodes
        },
    )


STUDIOS = cluster(
    ("aaaa1111", "Mac Studio", ("127.0.0.1", "fe80::1", "192.0.2.12")),
    ("bbbb2222", "Mac Studio", ("127.0.0.1", "192.0.2.11")),
    ("cccc3333", "mini", ("192.0.2.13",)),
)


def test_a_name_no_other_node_goes_by_is_the_name() -> None:
    assert node_name(STUDIOS, "cccc3333") == "mini"


def test_namesakes_go_by_name_and_address() -> None:
    assert node_name(STUDIOS, "aaaa1111") == "Mac Studio@192.0.2.12"
    assert node_name(STUDIOS, "bbbb2222") == "Mac Studio@192.0.2.11"


def test_namesakes_at_one_address_go_by_name_and_the_end_of_their_id() -> None:
    state = cluster(("peer-aaaaaa", "vm", ("10.0.0.2",)), ("peer-bbbbbb", "vm", ("10.0.0.2",)))
    assert [node_name(state, n) for n in ("peer-aaaaaa", "peer-bbbbbb")] == [
        "vm#aaaaaa",
        "vm#bbbbbb",
    ]


def test_a_node_without_a_name_goes_by_its_id() -> None:
    state = cluster(("n1", "", ()))
    assert node_name(state, "n1") == "n1"


def test_a_restarted_node_keeps_its_name_and_address_under_a_new_id() -> None:
    before = STUDIOS
    after = cluster(
        ("aaaa1111-new", "Mac Studio", ("192.0.2.12",)),
        ("bbbb2222", "Mac Studio", ("192.0.2.11",)),
    )
    assert node_name(before, "aaaa1111") == node_name(after, "aaaa1111-new")


def test_the_address_is_the_first_ipv4_not_loopback_or_link_local_else_ipv6() -> None:
    assert node_address(STUDIOS, "aaaa1111") == "192.0.2.12"
    v6 = cluster(("n", "x", ("::1", "fe80::2", "fd00::2", "169.254.1.1", "127.0.0.1")))
    assert node_address(v6, "n") == "fd00::2"
    assert node_address(cluster(("n", "x", ())), "n") is None
    assert node_address(State(), "n") is None


def test_a_cordon_by_a_namesakes_name_holds_that_node_only() -> None:
    state = STUDIOS.model_copy(update={"cordoned": ("Mac Studio@192.0.2.11",)})
    assert cordoned_nodes(state) == {"bbbb2222"}


def test_a_cordon_by_the_shared_name_holds_every_namesake() -> None:
    state = STUDIOS.model_copy(update={"cordoned": ("Mac Studio",)})
    assert cordoned_nodes(state) == {"aaaa1111", "bbbb2222"}
    assert nodes_named(STUDIOS, "mini") == {"cccc3333"}


def test_an_operator_naming_a_shared_name_is_asked_which() -> None:
    with pytest.raises(ConflictError) as refused:
        node_name_for(STUDIOS, "Mac Studio")
    assert str(refused.value) == (
        "2 nodes are named 'Mac Studio': Mac Studio@192.0.2.11, Mac Studio@192.0.2.12; "
        "name one of them"
    )
    assert node_name_for(STUDIOS, "Mac Studio@192.0.2.11") == "Mac Studio@192.0.2.11"
    assert node_name_for(STUDIOS, "bbbb2222") == "Mac Studio@192.0.2.11"


def test_a_real_clusters_three_vms_stay_three() -> None:
    read = read_exo_state(json.loads(cluster_recorded("state-3-nodes-idle")))
    assert isinstance(read, ExoRead)
    state = read.state
    names = {node_name(state, n) for n in state.topology.nodes}
    assert len(names) == 3
    assert all(name.startswith("vm#") for name in names)


class NoDrains:
    def drain_note(self, name: str) -> str | None:
        return None


def test_get_nodes_lists_namesakes_apart_with_their_cordons() -> None:
    state = STUDIOS.model_copy(update={"cordoned": ("Mac Studio@192.0.2.11",)})
    views = nodes_response(state, NoDrains()).nodes  # type: ignore[arg-type]
    assert [(v.name, v.node_ids, v.cordoned) for v in views] == [
        ("Mac Studio@192.0.2.11", ["bbbb2222"], True),
        ("Mac Studio@192.0.2.12", ["aaaa1111"], False),
        ("mini", ["cccc3333"], False),
    ]


def test_get_nodes_shows_a_cordon_by_the_shared_name_on_every_namesake() -> None:
    state = STUDIOS.model_copy(update={"cordoned": ("Mac Studio",)})
    views = nodes_response(state, NoDrains()).nodes  # type: ignore[arg-type]
    assert [(v.name, v.cordoned) for v in views] == [
        ("Mac Studio@192.0.2.11", True),
        ("Mac Studio@192.0.2.12", True),
        ("mini", False),
    ]
