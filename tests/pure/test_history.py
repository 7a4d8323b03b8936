"""A deployment's recovery history (``keeper.model.history``), from event sequences written by hand:
availability, incidents with their cause, MTTR, a restart in the middle, an ongoing incident and
a window that cuts an incident."""

from __future__ import annotations

import pytest
from keeper_harness import build_instance, card, node_info

from keeper.model.apply import apply
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentPlacementFailed,
    DeploymentServingChanged,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.history import (
    UNKNOWN_CAUSE,
    Incident,
    TimedEvent,
    deployment_history,
    may_change_serving,
    replay,
    serving_changes,
    serving_since,
    summarize,
)
from keeper.model.state import (
    Deployment,
    NodeIdentity,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerShutdown,
    ServingRecord,
    State,
)

MODEL = card("m")
DEPLOYMENT = Deployment(deployment_id="d1", model_card=MODEL)


class Log:
    """Events with times, numbered as the log numbers them."""

    def __init__(self) -> None:
        self.events: list[TimedEvent] = []

    def at(self, when: float | None, *events: AnyEvent) -> Log:
        for event in events:
            self.events.append(TimedEvent(idx=len(self.events), at=when, event=event))
        return self


def named(node_id: str, name: str) -> NodeGatheredInfo:
    info = node_info(node_id)
    return info.model_copy(update={"identity": NodeIdentity(friendly_name=name)})


def ready(instance_id: str, ranks: int) -> list[RunnerStatusUpdated]:
    return [
        RunnerStatusUpdated(runner_id=f"{instance_id}-runner-{r}", runner_status=RunnerReady())
        for r in range(ranks)
    ]


def serving_from(start: float, ready_at: float) -> Log:
    """Nodes studio and mini-a; the deployment created at ``start``; its instance over both
    nodes ready at ``ready_at``."""
    log = Log().at(start, named("n-studio", "studio"), named("n-mini", "mini-a"))
    log.at(start, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(start + 1, InstanceCreated(instance=build_instance(MODEL, ["n-studio", "n-mini"], "i1")))
    return log.at(ready_at, *ready("i1", 2))


def test_a_deployment_serving_all_along_is_fully_available_with_no_incident() -> None:
    log = serving_from(0.0, 10.0)
    history = deployment_history("d1", log.events, window_start=10.0, window_end=100.0)
    assert history.availability == 1.0
    assert history.incidents == ()
    assert history.mttr_s is None


def test_the_start_up_is_neither_down_time_nor_an_incident() -> None:
    log = serving_from(0.0, 10.0)
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    assert history.availability == 1.0
    assert history.incidents == ()
    # Before it first served, nothing is known of its availability.
    loading = deployment_history("d1", log.events, window_start=0.0, window_end=9.0)
    assert (loading.availability, loading.incidents) == (None, ())


def test_a_node_timeout_is_an_incident_named_by_the_node_until_a_new_instance_is_ready() -> None:
    log = serving_from(0.0, 10.0)
    log.at(50.0, NodeTimedOut(node_id="n-studio"))
    log.at(60.0, InstanceDeleted(instance_id="i1"))
    log.at(61.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(80.0, *ready("i2", 1))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    (incident,) = history.incidents
    assert incident.cause == "node studio timed out"
    assert (incident.start, incident.end, incident.downtime_s) == (50.0, 80.0, 30.0)
    assert history.mttr_s == 30.0
    assert history.availability == pytest.approx(60.0 / 90.0)


def test_an_instance_deleted_with_its_nodes_present_was_deleted_by_a_user() -> None:
    log = serving_from(0.0, 10.0)
    log.at(40.0, InstanceDeleted(instance_id="i1"))
    log.at(41.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(45.0, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert incident.cause == "instance deleted by a user"
    assert incident.downtime_s == 5.0


def test_an_instance_the_keeper_deleted_for_a_higher_priority_says_who_took_it() -> None:
    log = serving_from(0.0, 10.0)
    # The keeper tells the deployment first, then deletes its instance.
    log.at(40.0, DeploymentPlacementFailed(deployment_id="d1", error="preempted by big/model"))
    log.at(40.0, InstanceDeleted(instance_id="i1"))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert incident.cause == "preempted by big/model"
    assert incident.end is None
    # Any other error is no reason for a deletion: a user did it.
    log = serving_from(0.0, 10.0)
    log.at(40.0, DeploymentPlacementFailed(deployment_id="d1", error="not enough memory"))
    log.at(40.0, InstanceDeleted(instance_id="i1"))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert incident.cause == "instance deleted by a user"


def test_a_failed_runner_names_its_node_and_message() -> None:
    log = serving_from(0.0, 10.0)
    failed = RunnerFailed(error_message="out of memory")
    log.at(30.0, RunnerStatusUpdated(runner_id="i1-runner-1", runner_status=failed))
    log.at(35.0, RunnerStatusUpdated(runner_id="i1-runner-1", runner_status=RunnerLoading()))
    log.at(42.0, *ready("i1", 2))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert incident.cause == "runner failed on mini-a: out of memory"
    assert incident.downtime_s == 12.0


def test_a_deployment_that_cannot_be_placed_is_an_ongoing_unplaceable_incident() -> None:
    log = Log().at(0.0, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(5.0, DeploymentPlacementFailed(deployment_id="d1", error="not enough memory"))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    (incident,) = history.incidents
    assert incident.cause == "unplaceable: not enough memory"
    assert (incident.start, incident.end, incident.downtime_s) == (0.0, None, 100.0)
    assert history.availability == 0.0
    assert history.mttr_s is None


def test_an_incident_ongoing_at_the_end_of_the_window_has_no_end() -> None:
    log = serving_from(0.0, 10.0)
    log.at(70.0, NodeTimedOut(node_id="n-mini"))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    (incident,) = history.incidents
    assert incident.cause == "node mini-a timed out"
    assert (incident.end, incident.downtime_s) == (None, 30.0)
    assert history.mttr_s is None


def test_an_incident_across_a_master_restart_comes_out_whole() -> None:
    # The master stops at 55 and a new one starts at 200: the log goes on with the nodes
    # reporting afresh and their runners loading again, all logged with the new times.
    log = serving_from(0.0, 10.0)
    log.at(50.0, NodeTimedOut(node_id="n-studio"))
    log.at(55.0, InstanceDeleted(instance_id="i1"))
    log.at(200.0, named("n-studio", "studio"))
    log.at(201.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio", "n-mini"], "i2")))
    log.at(230.0, *ready("i2", 2))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=300.0)
    (incident,) = history.incidents
    assert (incident.start, incident.end, incident.downtime_s) == (50.0, 230.0, 180.0)
    assert incident.cause == "node studio timed out"


def test_a_window_that_cuts_an_incident_keeps_its_start_and_counts_only_inside() -> None:
    log = serving_from(0.0, 10.0)
    log.at(50.0, NodeTimedOut(node_id="n-studio"))
    log.at(60.0, InstanceDeleted(instance_id="i1"))
    log.at(61.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(80.0, *ready("i2", 1))
    history = deployment_history("d1", log.events, window_start=70.0, window_end=120.0)
    (incident,) = history.incidents
    assert (incident.start, incident.end) == (50.0, 80.0)
    assert history.availability == pytest.approx(40.0 / 50.0)
    # A window after the incident sees none.
    later = deployment_history("d1", log.events, window_start=90.0, window_end=120.0)
    assert (later.incidents, later.availability) == ((), 1.0)


def test_events_without_a_time_take_the_last_known_one() -> None:
    log = serving_from(0.0, 10.0)
    log.at(50.0, NodeTimedOut(node_id="n-studio"))
    log.at(None, InstanceDeleted(instance_id="i1"))
    log.at(70.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(None, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=100.0).incidents
    assert (incident.start, incident.end) == (50.0, 70.0)


def test_a_deleted_deployment_takes_its_history_with_it() -> None:
    log = serving_from(0.0, 10.0)
    log.at(50.0, InstanceDeleted(instance_id="i1"))
    log.at(60.0, DeploymentDeleted(deployment_id="d1"))
    state = replay(log.events)
    assert "d1" not in state.serving_history
    history = deployment_history("d1", log.events, window_start=10.0, window_end=100.0)
    assert (history.availability, history.incidents) == (None, ())


def test_a_deployment_first_seen_after_the_window_began_says_from_when_it_is_complete() -> None:
    # A State from a log older than serving records: the deployment is there, with no record.
    before = replay(serving_from(0.0, 10.0).events)
    initial = before.model_copy(update={"serving_history": {}})
    log = Log().at(500.0, named("n-studio", "studio"))  # changes nothing the history reads
    history = deployment_history(
        "d1", log.events, window_start=0.0, window_end=1000.0, initial=initial
    )
    assert history.complete_from == 500.0
    assert history.availability == 1.0
    whole = deployment_history(
        "d1", log.events, window_start=600.0, window_end=1000.0, initial=initial
    )
    assert whole.complete_from is None


def test_a_deployment_created_inside_the_window_is_complete() -> None:
    history = deployment_history(
        "d1", serving_from(500.0, 510.0).events, window_start=0.0, window_end=1000.0
    )
    assert history.complete_from is None
    assert history.availability == 1.0


def test_one_replica_lost_is_no_incident_and_the_last_one_names_the_cause() -> None:
    log = serving_from(0.0, 10.0)
    log.at(11.0, InstanceCreated(instance=build_instance(MODEL, ["n-other"], "i2")))
    log.at(11.0, named("n-other", "mini-b"))
    log.at(12.0, *ready("i2", 1))
    log.at(50.0, NodeTimedOut(node_id="n-studio"))  # i1 lost; i2 still serves
    assert deployment_history("d1", log.events, window_start=0.0, window_end=60.0).incidents == ()
    log.at(55.0, NodeTimedOut(node_id="n-other"))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=60.0).incidents
    assert (incident.start, incident.cause) == (55.0, "node mini-b timed out")


def test_a_later_placement_failure_keeps_the_cause_the_incident_began_with() -> None:
    log = serving_from(0.0, 10.0)
    # The instance is deleted, then placement fails too: the incident keeps its first cause.
    log.at(20.0, InstanceDeleted(instance_id="i1"))
    log.at(21.0, NodeTimedOut(node_id="n-mini"))
    log.at(22.0, DeploymentPlacementFailed(deployment_id="d1", error="not enough memory"))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=60.0).incidents
    assert incident.cause == "instance deleted by a user"
    records = replay(log.events).serving_history["d1"]
    assert [r.cause for r in records] == [None, None, "instance deleted by a user"]


def test_a_service_without_a_previous_state_records_an_unknown_cause() -> None:
    state = replay(serving_from(0.0, 10.0).events)
    down = apply(state, NodeTimedOut(node_id="n-studio"))
    (change,) = serving_changes(None, down, 99.0)
    assert change.record == ServingRecord(at=99.0, serving=False, cause=UNKNOWN_CAUSE)
    # With the State before, the same change is explained.
    (explained,) = serving_changes(state, down, 99.0)
    assert explained.record.cause == "node studio timed out"


def test_a_runner_that_leaves_ready_without_failing_says_what_it_went_to() -> None:
    log = serving_from(0.0, 10.0)
    log.at(30.0, RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerLoading()))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert incident.cause == "runner on studio went RunnerLoading"


def test_nothing_is_recorded_while_serving_does_not_change() -> None:
    state = replay(serving_from(0.0, 10.0).events)
    assert [r.serving for r in state.serving_history["d1"]] == [False, True]
    assert serving_changes(state, state, 20.0) == []


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (named("n-studio", "studio"), False),  # a report of a node already in the topology
        (named("n-new", "new"), True),  # a node joining
        (NodeTimedOut(node_id="n-studio"), True),
        (DeploymentDeleted(deployment_id="d1"), False),  # the records go with it
        (
            DeploymentServingChanged(
                deployment_id="d1", record=ServingRecord(at=1.0, serving=True)
            ),
            False,
        ),
    ],
)
def test_which_events_can_change_serving(event: AnyEvent, expected: bool) -> None:
    state = replay(serving_from(0.0, 10.0).events)
    assert may_change_serving(event, state) is expected


def test_summary_of_records_alone() -> None:
    records = [
        ServingRecord(at=0.0, serving=False, begins="created"),
        ServingRecord(at=10.0, serving=True),
        ServingRecord(at=40.0, serving=False, cause="node a timed out"),
        ServingRecord(at=45.0, serving=False, cause="unplaceable: later"),
        ServingRecord(at=50.0, serving=True),
        ServingRecord(at=500.0, serving=False, cause="after the window"),
    ]
    history = summarize("d1", records, window_start=0.0, window_end=100.0)
    (incident,) = history.incidents
    assert incident == Incident(start=40.0, end=50.0, downtime_s=10.0, cause="node a timed out")
    assert history.availability == pytest.approx(80.0 / 90.0)
    assert history.mttr_s == 10.0
    assert summarize("d1", [], window_start=0.0, window_end=1.0).availability is None


def test_an_unknown_deployment_has_no_availability() -> None:
    history = deployment_history(
        "nope", serving_from(0.0, 10.0).events, window_start=0.0, window_end=100.0
    )
    assert (history.availability, history.incidents) == (None, ())


# --- edges the rules must get right (each pins one condition) ------------------------------


def two_node_serving() -> State:
    return replay(serving_from(0.0, 10.0).events)


def test_a_first_record_of_a_deployment_that_cannot_be_placed_says_why() -> None:
    state = two_node_serving()
    unplaced = state.deployments["d1"].model_copy(update={"placement_error": "no room"})
    fresh = state.model_copy(
        update={"serving_history": {}, "deployments": {"d1": unplaced}, "instances": {}}
    )
    (change,) = serving_changes(None, fresh, 5.0)
    assert change.record == ServingRecord(
        at=5.0, serving=False, cause="unplaceable: no room", begins="observed"
    )
    # Serving (one replica placed, another not): the error is no cause of anything.
    serving = state.model_copy(update={"serving_history": {}, "deployments": {"d1": unplaced}})
    (change,) = serving_changes(None, serving, 5.0)
    assert (change.record.serving, change.record.cause) == (True, None)


def test_causes_name_every_node_lost_and_fall_back_to_the_node_id() -> None:
    state = two_node_serving()
    unnamed = state.model_copy(
        update={
            "node_identities": {
                **state.node_identities,
                "n-mini": NodeIdentity(friendly_name=""),
            }
        }
    )
    both_gone = apply(
        apply(unnamed, NodeTimedOut(node_id="n-studio")), NodeTimedOut(node_id="n-mini")
    )
    (change,) = serving_changes(unnamed, both_gone, 50.0)
    assert change.record.cause == "node studio, n-mini timed out"


def test_a_failed_runner_without_a_message_and_a_runner_that_went_away() -> None:
    state = two_node_serving()
    failed = apply(
        state,
        RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerFailed(error_message="")),
    )
    (change,) = serving_changes(state, failed, 20.0)
    assert change.record.cause == "runner failed on studio: no message"
    shut = apply(
        state, RunnerStatusUpdated(runner_id="i1-runner-1", runner_status=RunnerShutdown())
    )
    (change,) = serving_changes(state, shut, 20.0)
    assert change.record.cause == "runner on mini-a went away"


def test_summary_edges_of_the_window() -> None:
    created = ServingRecord(at=0.0, serving=False, begins="created")
    served = ServingRecord(at=10.0, serving=True)
    lost = ServingRecord(at=100.0, serving=False, cause="node a timed out")
    back = ServingRecord(at=110.0, serving=True)
    # A change at the very end of the window is in it: ongoing, no down time yet.
    history = summarize("d1", [created, served, lost], window_start=0.0, window_end=100.0)
    assert history.incidents == (
        Incident(start=100.0, end=None, downtime_s=0.0, cause="node a timed out"),
    )
    assert (history.deployment_id, history.window_start, history.window_end) == ("d1", 0.0, 100.0)
    # An incident that ended exactly when the window starts is not in it.
    after = summarize("d1", [created, served, lost, back], window_start=110.0, window_end=200.0)
    assert (after.incidents, after.availability) == ((), 1.0)
    # Under a second of known time is still known.
    short = summarize("d1", [created, served], window_start=10.0, window_end=10.5)
    assert short.availability == 1.0


def test_summary_of_a_deployment_first_observed_serving() -> None:
    observed = ServingRecord(at=50.0, serving=True, begins="observed")
    lost = ServingRecord(at=60.0, serving=False, cause="instance deleted by a user")
    back = ServingRecord(at=70.0, serving=True)
    lost_again = ServingRecord(at=80.0, serving=False, cause="node a timed out")
    back_again = ServingRecord(at=110.0, serving=True)
    records = [observed, lost, back, lost_again, back_again]
    history = summarize("d1", records, window_start=50.0, window_end=120.0)
    assert [incident.downtime_s for incident in history.incidents] == [10.0, 30.0]
    assert history.mttr_s == 20.0
    assert history.complete_from is None  # known from exactly the window's start
    assert summarize("d1", records, window_start=0.0, window_end=120.0).complete_from == 50.0


def test_events_before_any_time_are_older_than_every_window() -> None:
    log = Log().at(None, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(None, named("n-studio", "studio"))
    log.at(10.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    log.at(10.0, *ready("i1", 1))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    # The creation is known (untimed, so before the window): the history is complete.
    assert (history.complete_from, history.availability) == (None, 1.0)
    assert history.deployment_id == "d1"


def test_serving_since_is_the_newest_record_when_it_serves() -> None:
    # What GET /metrics exports as seconds serving (keeper.runtime.metrics).
    assert serving_since(()) is None
    up = ServingRecord(at=10.0, serving=True, begins="created")
    down = ServingRecord(at=20.0, serving=False, cause="node a timed out")
    again = ServingRecord(at=35.0, serving=True)
    assert serving_since((up,)) == 10.0
    assert serving_since((up, down)) is None
    assert serving_since((up, down, again)) == 35.0
