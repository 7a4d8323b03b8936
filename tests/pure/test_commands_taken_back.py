"""A command whose write was refused leaves the keeper as it found it.

The keeper notes a command's effect at once (``scale`` the new count, ``delete`` that the
deployment goes, ``drain`` that a drain starts again), because the State trails the events. When
the host cannot record the events (the log refuses them, the store's answer never came, another
bridge wrote first), ``taken_back_unless_recorded`` puts the notes back: asked again, the command
is done again, never answered "scaled" with nothing written.
"""

from __future__ import annotations

import pytest
from keeper_harness import Cluster, simple_place

from keeper.core.keeper import Keeper
from keeper.model.events import DeploymentDeleted, DeploymentScaled, NodeDrainStarted
from keeper.runtime.hosted_keeper import KeeperWrapper, taken_back_unless_recorded

WHEN = "2026-01-01T00:00:00Z"


class RefusedWriteError(Exception):
    """What a host's log raises for a write it did not take."""


def deployed() -> tuple[Cluster, str]:
    cluster = Cluster(place=simple_place)
    cluster.add_nodes("node-a", "node-b")
    return cluster, cluster.deploy("m")


def test_a_refused_scale_is_scaled_again_when_asked_again() -> None:
    cluster, deployment_id = deployed()
    keeper = cluster.keeper
    with pytest.raises(RefusedWriteError), taken_back_unless_recorded(keeper):
        assert keeper.scale(deployment_id, 2, cluster.state) == [
            DeploymentScaled(deployment_id=deployment_id, replicas=2)
        ]
        raise RefusedWriteError
    # Not taken back, the same count would be "already so" and nothing would be written.
    assert keeper.scale(deployment_id, 2, cluster.state) == [
        DeploymentScaled(deployment_id=deployment_id, replicas=2)
    ]
    # Recorded (no exception), it is noted: the same count again writes nothing.
    assert keeper.scale(deployment_id, 2, cluster.state) == []


def test_a_refused_delete_is_deleted_again_when_asked_again() -> None:
    cluster, deployment_id = deployed()
    keeper = cluster.keeper
    with pytest.raises(RefusedWriteError), taken_back_unless_recorded(keeper):
        assert keeper.delete(deployment_id, cluster.state)[0] == DeploymentDeleted(
            deployment_id=deployment_id
        )
        raise RefusedWriteError
    assert keeper.delete(deployment_id, cluster.state)[0] == DeploymentDeleted(
        deployment_id=deployment_id
    )
    assert keeper.delete(deployment_id, cluster.state) == []


def test_a_cancelled_command_keeps_its_notes() -> None:
    # Cancelled while its events were on their way to the log: they may still be recorded.
    class Cancelled(BaseException):
        pass

    cluster, deployment_id = deployed()
    keeper = cluster.keeper
    with pytest.raises(Cancelled), taken_back_unless_recorded(keeper):
        keeper.delete(deployment_id, cluster.state)
        raise Cancelled
    assert keeper.delete(deployment_id, cluster.state) == []


def test_a_recorded_command_is_kept_and_a_refused_one_leaves_the_others_notes() -> None:
    cluster, first = deployed()
    second = cluster.deploy("n")
    keeper = cluster.keeper
    with taken_back_unless_recorded(keeper):
        keeper.scale(first, 2, cluster.state)
    with pytest.raises(RefusedWriteError), taken_back_unless_recorded(keeper):
        keeper.scale(second, 2, cluster.state)
        raise RefusedWriteError
    assert keeper.scale(first, 2, cluster.state) == []
    assert keeper.scale(second, 2, cluster.state) != []


def test_a_drain_whose_end_was_sent_starts_again_after_a_refused_one() -> None:
    keeper = Keeper(0.0)
    memory = keeper.checkpoint()
    keeper._drain_ended.add("node-a")  # pyright: ignore[reportPrivateUsage]
    with_end = keeper.checkpoint()
    state = Cluster(place=simple_place).state
    assert keeper.drain("node-a", False, WHEN, state) == [
        NodeDrainStarted(name="node-a", force=False, when=WHEN)
    ]
    keeper.restore(with_end)
    assert keeper._drain_ended == {"node-a"}  # pyright: ignore[reportPrivateUsage]
    keeper.restore(None)  # nothing taken: nothing changes
    assert keeper._drain_ended == {"node-a"}  # pyright: ignore[reportPrivateUsage]
    keeper.restore(memory)
    assert keeper._drain_ended == set()  # pyright: ignore[reportPrivateUsage]


def test_a_wrapped_keeper_is_taken_back_through_its_wrapper() -> None:
    cluster, deployment_id = deployed()
    wrapped = KeeperWrapper(cluster.keeper)
    with pytest.raises(RefusedWriteError), taken_back_unless_recorded(wrapped):
        wrapped.scale(deployment_id, 3, cluster.state)
        raise RefusedWriteError
    assert wrapped.scale(deployment_id, 3, cluster.state) != []


def test_a_keeper_that_cannot_take_back_is_left_alone() -> None:
    class Plain:
        scaled = 0

    plain = Plain()
    with pytest.raises(RefusedWriteError), taken_back_unless_recorded(plain):  # type: ignore[arg-type]
        plain.scaled = 1
        raise RefusedWriteError
    assert plain.scaled == 1
    assert KeeperWrapper(plain).checkpoint() is None  # type: ignore[arg-type]
