"""Replicas through a stock exo: the bridge places each replica apart (exo's previews, else ours
on the nodes apart), scales through exo's DELETE, and follows exo's own deletions in its record.

Against the exo stand-in with simulated nodes (``tests/bridge_harness.py``), in virtual time;
the record's rule (``keeper.bridge.vanished``) on its own at the end.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from bridge_harness import ExoWithBridge, exo_with_bridge, wait_until, where_exo_places
from model_ids import QWEN

from keeper.bridge.placement_choice import ExoPlacement
from keeper.bridge.placing import PlacementAnswers
from keeper.bridge.service import ExoDownError
from keeper.bridge.vanished import GONE_AFTER_S, VanishedInstances
from keeper.core.view import without_nodes
from keeper.model.constants import STARTUP_GRACE, UNPLACEABLE_RETRY
from keeper.model.state import Deployment, InstanceMeta, Sharding, State, Topology

THREE_NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))


def deployment(h: ExoWithBridge) -> Deployment:
    (only,) = h.bridge.state.deployments.values()
    return only


def nodes_of(h: ExoWithBridge, instance_id: str) -> frozenset[str]:
    return frozenset(h.master.state.instances[instance_id].shard_assignments.node_to_runner)


def shard_cards(tagged: dict[str, Any]) -> list[dict[str, Any]]:
    """The model card of each shard of an instance in exo's JSON."""
    (body,) = tagged.values()
    return [
        next(iter(shard.values()))["modelCard"]
        for shard in body["shardAssignments"]["runnerToShard"].values()
    ]


def assert_apart(h: ExoWithBridge) -> None:
    taken: set[str] = set()
    for instance_id in h.exo_instances():
        nodes = nodes_of(h, instance_id)
        assert taken.isdisjoint(nodes), (instance_id, nodes, taken)
        taken |= nodes


async def placed(h: ExoWithBridge, count: int, within_s: float = STARTUP_GRACE + 30) -> None:
    """Until exo runs ``count`` instances of the model and the bridge has recorded them all."""
    await wait_until(
        lambda: (
            len(h.exo_instances()) == count
            and set(deployment(h).placed_instance_ids) == set(h.exo_instances())
        ),
        within_s,
        f"{count} instance(s) placed and recorded",
    )


@pytest.mark.anyio
async def test_replicas_are_placed_apart_scaled_down_newest_first_and_up_again_apart() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        created = await h.bridge.create_deployment(QWEN, replicas=2)
        await placed(h, 2)
        assert_apart(h)
        await wait_until(
            lambda: h.bridge.deployments_view().deployments[0].ready_replicas == 2,
            30,
            "both replicas ready",
        )
        oldest, newest = deployment(h).placed_instance_ids

        scaled = await h.bridge.scale_deployment(created.deployment_id or "", 1)
        assert "from 2 to 1" in scaled.message
        assert deployment(h).replicas == 1
        # exo's DELETE of the newest, and the record follows exo's State once it shows it gone.
        await placed(h, 1, within_s=30)
        assert h.exo_instances() == [oldest]
        assert h.link.deleted_instances() == [newest]
        assert deployment(h).placed_instance_ids == (oldest,)
        await anyio.sleep(10)  # nothing placed back: one replica is what is wanted
        assert h.exo_instances() == [oldest]

        await h.bridge.scale_deployment(created.deployment_id or "", 2)
        await placed(h, 2, within_s=30)
        assert_apart(h)
        assert oldest in h.exo_instances()
        assert h.link.deleted_instances() == [newest]  # nothing else removed
        assert deployment(h).placement_error is None


@pytest.mark.anyio
async def test_when_exo_previews_nothing_apart_ours_places_it_with_exo_s_full_card() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        created = await h.bridge.create_deployment(QWEN, replicas=1)
        await placed(h, 1)
        (first,) = h.exo_instances()
        serving = nodes_of(h, first)
        # exo's own previews, as if exo preferred the serving node for every one of them.
        answer = await h.exo_api("GET", f"/instance/previews?model_id={QWEN}")
        entries = [
            entry
            for entry in answer.json()["previews"]
            if entry["instance"] is not None
            and serving
            & set(next(iter(entry["instance"].values()))["shardAssignments"]["nodeToRunner"])
        ]
        assert entries
        h.link.answers[("GET", "/instance/previews")] = lambda _: (200, {"previews": entries})

        await h.bridge.scale_deployment(created.deployment_id or "", 2)
        await placed(h, 2, within_s=30)
        assert_apart(h)
        (second,) = [i for i in h.exo_instances() if i != first]
        assert second not in {next(iter(e["instance"].values()))["instanceId"] for e in entries}
        # Posted with exo's full card (sampling defaults and all), the one exo's shards carry.
        body = next(
            body
            for method, path, body in h.link.calls
            if (method, path) == ("POST", "/instance")
            and next(iter(body["instance"].values()))["instanceId"] == second
        )
        exo_card = shard_cards(entries[0]["instance"])[0]
        assert all(card == exo_card for card in shard_cards(body["instance"]))
        assert shard_cards(body["instance"])[0]["samplingDefaults"]  # not rebuilt from /models


@pytest.mark.anyio
async def test_an_answer_on_a_node_the_keeper_left_out_is_refused_not_posted() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        await h.bridge.create_deployment(QWEN, replicas=1)
        await placed(h, 1)
        state = h.bridge.state
        # exo's answer, asked on the bridge's view of exo's State, as a step's answers ...
        answer = await where_exo_places(h.bridge, deployment(h), state)
        assert isinstance(answer, ExoPlacement)
        answers = PlacementAnswers(state, {QWEN: answer})
        # ... while the keeper's view leaves its node out (it serves the model, there).
        left_out = frozenset(answer.instance.shard_assignments.node_to_runner)
        card = deployment(h).model_card
        with pytest.raises(ValueError, match="which the keeper left out"):
            answers.place(
                without_nodes(state, left_out), card, Sharding.PIPELINE, InstanceMeta.MLX_RING, 1
            )
        # On the nodes it offers, the answer is the keeper's placement.
        offered = answers.place(state, card, Sharding.PIPELINE, InstanceMeta.MLX_RING, 1)
        assert offered == answer.instance


@pytest.mark.anyio
async def test_with_no_room_apart_the_deployment_says_why_and_keeps_serving() -> None:
    async with exo_with_bridge() as h:  # two nodes
        created = await h.bridge.create_deployment(QWEN, replicas=2)
        await placed(h, 2)
        await wait_until(lambda: h.status() == "serving", 30, "serving")
        serving = h.exo_instances()
        posts = len(h.link.posted_instances())

        await h.bridge.scale_deployment(created.deployment_id or "", 3)
        await wait_until(lambda: deployment(h).placement_error is not None, 10, "a placement error")
        error = deployment(h).placement_error or ""
        assert error.startswith(f"no placement apart from the nodes serving {QWEN} (")
        assert "exo offers no Pipeline/MlxRing placement" in error
        assert "nor does ours" in error
        await anyio.sleep(UNPLACEABLE_RETRY + 1)  # retried by the keeper's rules: still nothing
        (view,) = h.bridge.deployments_view().deployments
        assert (view.status, view.replicas, view.ready_replicas) == ("serving", 3, 2)
        assert h.exo_instances() == serving
        assert len(h.link.posted_instances()) == posts
        assert h.link.deleted_instances() == []


@pytest.mark.anyio
async def test_an_instance_exo_deletes_leaves_the_record_and_is_replaced_apart() -> None:
    async with exo_with_bridge(nodes=THREE_NODES) as h:
        await h.bridge.create_deployment(QWEN, replicas=2)
        await placed(h, 2)
        lost = deployment(h).placed_instance_ids[0]
        deleted = await h.exo_api("DELETE", f"/instance/{lost}")  # an operator, past the bridge
        assert deleted.status_code == 200
        await wait_until(lambda: lost not in deployment(h).placed_instance_ids, 30, "forgotten")
        await placed(h, 2, within_s=60)
        assert lost not in h.exo_instances()
        assert_apart(h)
        assert h.link.deleted_instances() == []  # the bridge deleted nothing itself


@pytest.mark.anyio
async def test_scaling_down_waits_for_a_state_to_follow_scaling_up_does_not() -> None:
    async with exo_with_bridge() as h:
        created = await h.bridge.create_deployment(QWEN, replicas=2)
        deployment_id = created.deployment_id or ""
        await placed(h, 2)
        h.link.down = True
        await wait_until(lambda: h.bridge.outage is not None, 5, "exo seen down")
        with pytest.raises(ExoDownError, match=r"Cannot scale .* down while exo's State is not"):
            await h.bridge.scale_deployment(deployment_id, 1)
        assert deployment(h).replicas == 2
        assert h.bridge.doomed_instances == []
        await h.bridge.scale_deployment(deployment_id, 3)  # only a count: nothing is chosen
        assert deployment(h).replicas == 3
        h.link.down = False
        await wait_until(lambda: h.bridge.outage is None, 5, "exo seen again")
        await h.bridge.scale_deployment(deployment_id, 1)
        await placed(h, 1, within_s=30)
        assert len(h.link.deleted_instances()) == 1


@pytest.mark.anyio
async def test_an_unreadable_state_never_erases_the_record() -> None:
    async with exo_with_bridge() as h:
        await h.bridge.create_deployment(QWEN, replicas=1)
        await placed(h, 1)
        record = deployment(h).placed_instance_ids
        # exo's State comes back without its instances: fail closed, nothing recorded or placed.
        h.link.state_edit = lambda raw: {k: v for k, v in raw.items() if k != "instances"}
        await anyio.sleep(4 * GONE_AFTER_S)
        assert deployment(h).placed_instance_ids == record
        assert h.bridge.outage is not None
        h.link.state_edit = None
        await anyio.sleep(4 * GONE_AFTER_S)
        assert deployment(h).placed_instance_ids == record
        assert len(h.link.posted_instances()) == 1


# --- the record's rule ------------------------------------------------------------------------


def exo_state(index: int, *instance_ids: str) -> State:
    holder = State.model_validate(
        {
            "instances": {
                i: {
                    "MlxRingInstance": {
                        "instanceId": i,
                        "shardAssignments": {
                            "modelId": QWEN,
                            "runnerToShard": {},
                            "nodeToRunner": {},
                        },
                        "hostsByNode": {},
                        "ephemeralPort": 1,
                    }
                }
                for i in instance_ids
            },
        }
    )
    # A node in the topology: a lower index is then an older copy of the same log, not a new
    # master's (``keeper.model.master_change``).
    return holder.model_copy(
        update={"last_event_applied_idx": index, "topology": Topology(nodes=["n"])}
    )


def test_an_absence_is_believed_only_once_it_lasts_on_states_not_older_than_a_sighting() -> None:
    vanished = VanishedInstances()
    assert vanished.gone(["i"], exo_state(10, "i"), 0.0) == []
    # Missing: believed only after GONE_AFTER_S of reads that all lack it.
    assert vanished.gone(["i"], exo_state(11), 1.0) == []
    assert vanished.gone(["i"], exo_state(12), 1.0 + GONE_AFTER_S - 0.1) == []
    assert vanished.gone(["i"], exo_state(12, "i"), 5.0) == []  # back: the count starts again
    assert vanished.gone(["i"], exo_state(13), 6.0) == []
    # A State older than the last one that showed it (a node replaying its log) says nothing.
    assert vanished.gone(["i"], exo_state(3), 6.0 + GONE_AFTER_S) == []
    assert vanished.gone(["i"], exo_state(14), 7.0 + GONE_AFTER_S) == []
    assert vanished.gone(["i"], exo_state(14), 7.0 + 2 * GONE_AFTER_S) == ["i"]


def test_another_exo_url_counts_every_absence_again_and_forgotten_ids_are_dropped() -> None:
    vanished = VanishedInstances()
    assert vanished.gone(["i", "j"], exo_state(5), 0.0) == []  # no sighting since a restart
    vanished.restart_counts()
    assert vanished.gone(["i", "j"], exo_state(5), GONE_AFTER_S) == []
    assert vanished.gone(["i", "j"], exo_state(6), 2 * GONE_AFTER_S) == ["i", "j"]
    vanished.forget(["i"])
    assert vanished.gone(["j"], exo_state(6), 3 * GONE_AFTER_S) == ["j"]
    assert vanished.gone([], exo_state(6), 4 * GONE_AFTER_S) == []
    assert vanished.gone(["i"], exo_state(7), 4 * GONE_AFTER_S) == []  # a new count for "i"


def test_a_new_masters_log_is_not_older_than_the_last_sighting() -> None:
    # exo's master changed: the new master numbers its events from 0, its State shows none of
    # the old instances and no node yet. Its low index is another log's, not an older State.
    vanished = VanishedInstances()
    assert vanished.gone(["i"], exo_state(5000, "i"), 0.0) == []
    vanished.master_changed()  # as the tick sees it (keeper.model.master_change)
    new_master = exo_state(3).model_copy(update={"topology": Topology()})
    assert vanished.gone(["i"], new_master, 1.0) == []
    assert vanished.gone(["i"], exo_state(4), 1.0 + GONE_AFTER_S) == ["i"]
