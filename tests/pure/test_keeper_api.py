"""The keeper's read-side API: ``has_instance``, ``deployment_status`` and ``Keeper.timers``.

The master's ``GET /deployments`` and the TUI show these, so each status and each wait reason is
checked with its figures, and ``timers`` is checked to be a pure view: calling it between steps
never changes what the keeper does.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st
from keeper_harness import (
    AFTER_GRACE,
    Cluster,
    RecordingPlace,
    build_instance,
    card,
    numbered_place,
    unplaceable,
)

import keeper
from keeper.core.keeper import MAX_PLACEMENT_ATTEMPTS_PER_STEP, DeploymentTimer, Keeper, PlaceFn
from keeper.model.constants import (
    FIRST_BACKOFF,
    PLACEMENT_TIMEOUT,
    STARTUP_GRACE,
    UNPLACEABLE_RETRY,
)
from keeper.model.events import InstanceCreated, RunnerStatusUpdated
from keeper.model.state import RunnerLoading, RunnerRunning

T = AFTER_GRACE


def deployed_on_node_a(place: PlaceFn | None = None) -> tuple[Cluster, str]:
    """A cluster of ``node-a`` with a deployment of ``m`` (placed by ``numbered_place`` unless
    ``place`` is given): the cluster and the deployment id."""
    cluster = Cluster(place=place or numbered_place())
    cluster.add_nodes("node-a")
    return cluster, cluster.deploy("m")


def test_the_pinned_names_are_exported_from_the_package() -> None:
    assert keeper.Keeper is Keeper
    assert keeper.DeploymentTimer is DeploymentTimer
    assert callable(keeper.has_instance) and callable(keeper.deployment_status)
    assert (keeper.STARTUP_GRACE, keeper.PLACEMENT_TIMEOUT, keeper.UNPLACEABLE_RETRY) == (
        15.0,
        30.0,
        30.0,
    )
    assert (keeper.FIRST_BACKOFF, keeper.MAX_BACKOFF) == (10.0, 60.0)


# --- has_instance --------------------------------------------------------------------------


def test_has_instance_counts_any_instance_of_the_model_however_placed() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a")
    assert not keeper.has_instance(cluster.state, "m")
    cluster.apply(InstanceCreated(instance=build_instance(card("m"), ["node-a"], "manual")))
    assert keeper.has_instance(cluster.state, "m")
    assert not keeper.has_instance(cluster.state, "other")


# --- deployment_status ---------------------------------------------------------------------


def test_status_is_placing_before_anything_happened() -> None:
    cluster = Cluster()
    deployment_id = cluster.deploy("m")
    assert keeper.deployment_status(cluster.deployment(deployment_id), cluster.state) == "placing"


def test_status_is_cant_place_when_placement_failed_and_no_instance_exists() -> None:
    cluster = Cluster(place=unplaceable("No cycles found with sufficient memory"))
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    deployment = cluster.deployment(deployment_id)
    assert deployment.placement_error == "No cycles found with sufficient memory"
    assert keeper.deployment_status(deployment, cluster.state) == "cant_place"


def test_status_is_starting_while_some_runner_is_not_ready() -> None:
    cluster = Cluster(place=numbered_place())
    cluster.add_nodes("node-a", "node-b")
    deployment_id = cluster.deploy("m", min_nodes=2)
    cluster.step(T)
    instance = cluster.instance_of(deployment_id)
    status = keeper.deployment_status
    assert status(cluster.deployment(deployment_id), cluster.state) == "starting"
    first, second = instance.shard_assignments.node_to_runner.values()
    cluster.apply(RunnerStatusUpdated(runner_id=first, runner_status=RunnerRunning()))
    cluster.apply(
        RunnerStatusUpdated(runner_id=second, runner_status=RunnerLoading(layers_loaded=3))
    )
    assert status(cluster.deployment(deployment_id), cluster.state) == "starting"
    cluster.make_ready(instance.instance_id)
    assert status(cluster.deployment(deployment_id), cluster.state) == "serving"


def test_status_is_serving_with_a_ready_instance_placed_some_other_way_despite_an_error() -> None:
    cluster, deployment_id = deployed_on_node_a(unplaceable())
    cluster.step(T)
    cluster.apply(InstanceCreated(instance=build_instance(card("m"), ["node-a"], "manual")))
    deployment = cluster.deployment(deployment_id)
    assert deployment.placement_error is not None
    assert keeper.deployment_status(deployment, cluster.state) == "starting"
    cluster.make_ready("manual")
    assert keeper.deployment_status(deployment, cluster.state) == "serving"


def test_status_ignores_instances_of_other_models() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    cluster.apply(InstanceCreated(instance=build_instance(card("other"), ["node-a"], "x")))
    cluster.make_ready("x")
    assert keeper.deployment_status(cluster.deployment(deployment_id), cluster.state) == "placing"


def test_an_instance_without_runners_is_not_serving() -> None:
    cluster = Cluster()
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    cluster.apply(InstanceCreated(instance=build_instance(card("m"), [], "empty")))
    assert keeper.deployment_status(cluster.deployment(deployment_id), cluster.state) == "starting"


# --- timers --------------------------------------------------------------------------------


def test_timers_during_the_grace_wait_for_its_end() -> None:
    cluster = Cluster(place=numbered_place(), started_at=100.0)
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    assert cluster.keeper.timers(cluster.state, 101.0) == {
        deployment_id: DeploymentTimer(
            failures=0, next_attempt_at=100.0 + STARTUP_GRACE, waiting="grace"
        )
    }
    assert (
        cluster.keeper.timers(cluster.state, 100.0 + STARTUP_GRACE)[deployment_id].waiting is None
    )


def test_timers_wait_for_a_configured_grace() -> None:
    cluster = Cluster(place=numbered_place(), started_at=100.0, startup_grace=2.0)
    cluster.add_nodes("node-a")
    deployment_id = cluster.deploy("m")
    assert cluster.keeper.timers(cluster.state, 101.0) == {
        deployment_id: DeploymentTimer(failures=0, next_attempt_at=102.0, waiting="grace")
    }
    assert cluster.keeper.timers(cluster.state, 102.0)[deployment_id].waiting is None


def test_timers_show_nothing_to_wait_for_when_an_instance_exists_even_in_the_grace() -> None:
    cluster = Cluster(place=numbered_place())
    cluster.add_nodes("node-a")
    cluster.apply(InstanceCreated(instance=build_instance(card("m"), ["node-a"], "manual")))
    deployment_id = cluster.deploy("m")
    expected = DeploymentTimer(failures=0, next_attempt_at=None, waiting=None)
    assert cluster.keeper.timers(cluster.state, 1.0)[deployment_id] == expected
    assert cluster.keeper.timers(cluster.state, T + 1)[deployment_id] == expected


def test_timers_show_a_placement_in_flight_until_its_timeout() -> None:
    cluster, deployment_id = deployed_on_node_a()
    cluster.step_keep(T)
    assert cluster.keeper.timers(cluster.state, T + 3)[deployment_id] == DeploymentTimer(
        failures=0, next_attempt_at=T + PLACEMENT_TIMEOUT, waiting="placement_in_flight"
    )
    timer = cluster.keeper.timers(cluster.state, T + PLACEMENT_TIMEOUT)[deployment_id]
    assert (timer.waiting, timer.next_attempt_at) == (None, None)


def test_timers_show_the_backoff_and_the_failures_in_a_row() -> None:
    cluster, deployment_id = deployed_on_node_a()
    cluster.step(T)
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    cluster.step(T + 2)
    assert cluster.keeper.timers(cluster.state, T + 5)[deployment_id] == DeploymentTimer(
        failures=1, next_attempt_at=T + 2 + FIRST_BACKOFF, waiting="backoff"
    )
    after = cluster.keeper.timers(cluster.state, T + 2 + FIRST_BACKOFF)[deployment_id]
    assert after == DeploymentTimer(failures=1, next_attempt_at=None, waiting=None)


def test_timers_show_a_loss_the_keeper_has_not_stepped_over_yet() -> None:
    cluster, deployment_id = deployed_on_node_a()
    cluster.step(T)
    cluster.step(T + 1)
    cluster.delete_instance(cluster.instance_of(deployment_id).instance_id)
    timer = cluster.keeper.timers(cluster.state, T + 4)[deployment_id]
    assert timer == DeploymentTimer(
        failures=1, next_attempt_at=T + 4 + FIRST_BACKOFF, waiting="backoff"
    )


def test_timers_show_the_unplaceable_retry() -> None:
    cluster, deployment_id = deployed_on_node_a(unplaceable())
    cluster.step(T)
    assert cluster.keeper.timers(cluster.state, T + 1)[deployment_id] == DeploymentTimer(
        failures=0, next_attempt_at=T + UNPLACEABLE_RETRY, waiting="unplaceable_retry"
    )
    cluster.add_node("node-b")  # a change of cluster: due at once
    assert cluster.keeper.timers(cluster.state, T + 1)[deployment_id].waiting is None


def test_timers_show_nothing_for_a_serving_or_deleting_deployment() -> None:
    cluster = Cluster(place=numbered_place())
    cluster.add_nodes("node-a")
    serving = cluster.deploy("m1")
    deleting = cluster.deploy("m2")
    cluster.step(T)
    cluster.make_ready(cluster.instance_of(serving).instance_id)
    cluster.keeper.delete(deleting, cluster.state)  # not applied yet
    timers = cluster.keeper.timers(cluster.state, T + 1)
    idle = DeploymentTimer(failures=0, next_attempt_at=None, waiting=None)
    assert timers == {serving: idle, deleting: idle}


def test_timers_show_deployments_past_the_attempts_cap_as_due() -> None:
    cluster = Cluster(place=unplaceable())
    cluster.add_nodes("node-a")
    ids = [
        cluster.deploy(f"m{i:02d}", deployment_id=f"dep-{i:02d}")
        for i in range(MAX_PLACEMENT_ATTEMPTS_PER_STEP + 1)
    ]
    cluster.step(T)
    timers = cluster.keeper.timers(cluster.state, T + 0.5)
    assert [timers[d].waiting for d in ids] == ["unplaceable_retry"] * (len(ids) - 1) + [None]


# --- timers never change what step does ----------------------------------------------------


@dataclass(frozen=True)
class Action:
    # step | lose | ready | node | kill | deploy | delete | hold; "timers" only lets time pass
    # (with ``look`` every action calls timers, whatever its kind)
    kind: str
    at: float  # seconds after the previous action
    arg: int


# Steps and looks weigh more than faults, so stories reach the waits the faults start.
KINDS = ("step", "step", "step", "timers", "timers", "lose", "ready", "node", "kill")
KINDS_RARE = ("deploy", "delete", "hold")
ACTIONS = st.builds(
    Action,
    kind=st.sampled_from((*KINDS, *KINDS_RARE)),
    at=st.sampled_from([0.0, 0.5, 1.0, 3.0, 9.5, 10.0, 29.9, 30.0, 60.0]),
    arg=st.integers(min_value=0, max_value=5),
)


def _run(actions: list[Action], look: bool) -> list[str]:
    """Play the actions on a fresh cluster; with ``look``, call timers at every action too."""
    recorder = RecordingPlace(inner=numbered_place())
    recorder.failing["m4"] = ValueError("No cycles found with sufficient memory")
    recorder.failing["m5"] = RuntimeError("boom")
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-0", "node-1")
    for model in ("m0", "m4"):
        cluster.deploy(model, deployment_id=f"dep-{model}")
    history: list[str] = []  # every event applied, with the time of the action that caused it
    history.extend(f"0: {event!r}" for event in cluster.log)
    now = 0.0
    for action in actions:
        now += action.at
        if look:
            cluster.keeper.timers(cluster.state, now)
        instances = sorted(cluster.state.instances)
        deployments = sorted(cluster.state.deployments)
        if action.kind == "step":
            cluster.step(now)
        elif action.kind == "hold":
            cluster.step_keep(now)  # emitted, never applied: a lost or slow placement
        elif action.kind == "lose" and instances:
            cluster.delete_instance(instances[action.arg % len(instances)])
        elif action.kind == "ready" and instances:
            cluster.make_ready(instances[action.arg % len(instances)])
        elif action.kind == "node":
            cluster.add_node(f"node-{action.arg + 2}")
        elif action.kind == "kill":
            cluster.kill_node(f"node-{action.arg}")
        elif action.kind == "deploy":
            cluster.deploy(f"m{action.arg}", deployment_id=f"dep-m{action.arg}")
        elif action.kind == "delete" and deployments:
            cluster.delete(deployments[action.arg % len(deployments)])
        history.extend(f"{now:g}: {event!r}" for event in cluster.log[len(history) :])
    return history


@settings(max_examples=60, deadline=None)
@given(st.lists(ACTIONS, min_size=1, max_size=40))
def test_calling_timers_between_steps_never_changes_the_events(actions: list[Action]) -> None:
    assert _run(actions, look=True) == _run(actions, look=False)


def test_calling_timers_never_changes_the_events_in_a_known_story() -> None:
    story = [
        Action("timers", 5.0, 0),
        Action("step", 10.0, 0),  # grace over: m0 placed
        Action("timers", 0.5, 0),
        Action("lose", 0.0, 0),  # lost before ready
        Action("timers", 1.0, 0),
        Action("step", 1.0, 0),  # failure 1
        Action("timers", 5.0, 0),
        Action("step", 4.0, 0),  # backoff counts from the step that saw the loss: not yet
        Action("step", 1.0, 0),  # now it is over: placed again
        Action("ready", 1.0, 0),
        Action("step", 1.0, 0),
        Action("kill", 1.0, 0),
        Action("kill", 0.0, 1),
        Action("timers", 1.0, 0),
        Action("node", 0.0, 0),
        Action("timers", 0.0, 0),
        Action("step", 1.0, 0),
    ]
    looked = _run(story, look=True)
    assert looked == _run(story, look=False)
    assert sum("DeploymentPlaced" in line for line in looked) == 3
    assert any("DeploymentPlacementFailed" in line and "dep-m4" in line for line in looked), (
        "m4 never fits"
    )
