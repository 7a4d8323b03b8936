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
    DeploymentRepairPlaced,
    DeploymentServingChanged,
    FailoverReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeConfirmedDead,
    NodeDownloadProgress,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    RunnerStatusUpdated,
)
from keeper.model.history import (
    UNKNOWN_CAUSE,
    Incident,
    TimedEvent,
    broken_instance_cause,
    deployment_history,
    down_stretch,
    may_change_serving,
    recovery_phases,
    replay,
    serving_changes,
    serving_since,
    summarize,
)
from keeper.model.master_change import MASTER_CHANGED
from keeper.model.notices import iso_utc_of, unix_seconds_of
from keeper.model.state import (
    Deployment,
    DownloadCompleted,
    DownloadPending,
    InstanceMove,
    Memory,
    NodeIdentity,
    RecoveryPhases,
    RepairNote,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerShutdown,
    ServingRecord,
    State,
    Topology,
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


def repair_placed(old: str, new: str, problem: str = "hollow") -> DeploymentRepairPlaced:
    return DeploymentRepairPlaced(
        deployment_id="d1",
        move=InstanceMove(deployment_id="d1", old_instance_id=old, new_instance_id=new),
        problem=problem,
        why="runner on studio went RunnerShutdown for 5s while studio is alive",
    )


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
        (repair_placed("i1", "i2"), True),  # may name a broken instance as the cause
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


# --- honest clocks: a stop caused by a node starts at its last heartbeat (§5.18) ---------------


def heard(node_id: str, at: float) -> NodeGatheredInfo:
    """A report of the node at ``at`` (its ``lastSeen``)."""
    return NodeGatheredInfo(node_id=node_id, when=iso_utc_of(at))


def dead(node_id: str, last_heard: float, at: float, why: str = "session closed") -> AnyEvent:
    return NodeConfirmedDead(node_id=node_id, last_heard=last_heard, at=at, why=why)


def records_of(log: Log) -> tuple[ServingRecord, ...]:
    return replay(log.events).serving_history["d1"]


def completed(node_id: str, model_id: str = "m") -> NodeDownloadProgress:
    instance = build_instance(card(model_id), [node_id], "shard-source")
    shard = next(iter(instance.shard_assignments.runner_to_shard.values()))
    return NodeDownloadProgress(
        download_progress=DownloadCompleted(
            node_id=node_id, shard_metadata=shard, total=Memory(in_bytes=100)
        )
    )


def test_a_node_confirmed_dead_stops_serving_from_its_last_heartbeat() -> None:
    log = serving_from(0.0, 10.0)
    log.at(52.0, dead("n-studio", last_heard=44.0, at=52.0))
    stop = records_of(log)[-1]
    assert stop == ServingRecord(
        at=44.0,
        serving=False,
        cause="node studio confirmed dead (session closed)",
        noticed=52.0,
    )
    log.at(53.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(56.5, *ready("i2", 1))
    history = deployment_history("d1", log.events, window_start=0.0, window_end=100.0)
    (incident,) = history.incidents
    assert (incident.start, incident.end, incident.downtime_s) == (44.0, 56.5, 12.5)
    assert history.mttr_s == 12.5
    assert incident.phases == RecoveryPhases(detected=8.0, placed=1.0, downloaded=0.0, loaded=3.5)


def test_a_node_dead_without_a_second_sign_named_and_several_signs_joined() -> None:
    state = replay(serving_from(0.0, 10.0).events)
    after = apply(state, dead("n-studio", 40.0, 50.0, why=""))
    (change,) = serving_changes(state, after, 50.0)
    assert change.record.cause == "node studio confirmed dead"
    both = apply(apply(state, dead("n-studio", 40.0, 50.0, "b")), dead("n-mini", 41.0, 50.0, "a"))
    (change,) = serving_changes(state, both, 50.0)
    assert change.record.cause == "node studio, mini-a confirmed dead (a; b)"
    # The ring stopped when its first node went quiet.
    assert change.record.at == 40.0


def test_a_node_that_timed_out_with_no_verdict_starts_at_its_last_seen() -> None:
    log = serving_from(0.0, 10.0)
    log.at(20.0, heard("n-studio", 20.0))
    log.at(50.0, NodeTimedOut(node_id="n-studio"))
    log.at(60.0, InstanceDeleted(instance_id="i1"))
    stop = records_of(log)[-1]
    assert (stop.at, stop.noticed, stop.cause) == (20.0, 50.0, "node studio timed out")
    log.at(61.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(80.0, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert (incident.start, incident.downtime_s) == (20.0, 60.0)
    assert incident.phases == RecoveryPhases(
        detected=30.0, placed=11.0, downloaded=0.0, loaded=19.0
    )


def test_a_timeout_after_a_verdict_takes_the_verdicts_heartbeat_newest_first() -> None:
    base = replay(serving_from(0.0, 10.0).at(20.0, heard("n-studio", 20.0)).events)
    suspected = apply(base, NodeSuspected(node_id="n-studio", last_heard=30.0, at=33.0))
    assert serving_changes(base, suspected, 33.0) == []  # suspect still serves
    # The timeout clears the verdict: ``before`` still holds its heartbeat, kept over lastSeen.
    gone = apply(suspected, NodeTimedOut(node_id="n-studio"))
    (change,) = serving_changes(suspected, gone, 50.0)
    assert (change.record.at, change.record.noticed) == (30.0, 50.0)
    # Confirmed dead with a newer heartbeat than the suspicion had: the newer one, in ``after``.
    confirmed = apply(suspected, dead("n-studio", 31.0, 40.0))
    (change,) = serving_changes(suspected, confirmed, 40.0)
    assert change.record.at == 31.0


def test_a_lost_node_with_no_date_leaves_the_stop_when_it_was_seen() -> None:
    state = replay(serving_from(0.0, 10.0).at(20.0, heard("n-studio", 20.0)).events)
    undated = state.model_copy(update={"last_seen": {"n-studio": "yesterday"}})
    (change,) = serving_changes(undated, apply(undated, NodeTimedOut(node_id="n-studio")), 50.0)
    assert (change.record.at, change.record.noticed) == (50.0, None)


def test_a_heartbeat_older_than_the_newest_record_dates_the_stop_at_that_record() -> None:
    """Records stay in order: a node last heard before the deployment began serving on it (it
    came up on a node already quiet) stops it at the serving record, not before."""
    log = serving_from(0.0, 10.0)
    log.at(30.0, dead("n-studio", last_heard=5.0, at=30.0))
    served, stop = records_of(log)[-2:]
    assert (served.at, stop.at, stop.noticed) == (10.0, 10.0, 30.0)


def test_a_heartbeat_after_the_moment_seen_is_not_trusted_past_it() -> None:
    state = replay(serving_from(0.0, 10.0).events)
    (change,) = serving_changes(state, apply(state, dead("n-studio", 60.0, 50.0)), 50.0)
    assert (change.record.at, change.record.noticed) == (50.0, None)


def test_replicas_lost_together_stop_when_the_last_of_them_went_quiet() -> None:
    log = Log().at(0.0, named("n-a", "a"), named("n-b", "b"), named("n-c", "c"))
    log.at(0.0, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-a"], "i1")))
    log.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-b", "n-c"], "i2")))
    log.at(5.0, *ready("i1", 1), *ready("i2", 2))
    state = replay(log.events)
    # i1 quiet since 20; i2 since 24 (its first node: a ring needs all of them).
    lost = apply(
        apply(apply(state, dead("n-a", 20.0, 40.0)), dead("n-b", 24.0, 40.0)),
        dead("n-c", 30.0, 40.0),
    )
    (change,) = serving_changes(state, lost, 40.0)
    assert change.record.at == 24.0
    # One lost with its node, the other deleted at the moment seen: that moment.
    deleted = apply(apply(state, dead("n-a", 20.0, 40.0)), InstanceDeleted(instance_id="i2"))
    (change,) = serving_changes(state, deleted, 40.0)
    assert (change.record.at, change.record.noticed) == (40.0, None)


def test_a_stop_not_caused_by_a_node_is_dated_when_seen_with_a_phase_of_no_detection() -> None:
    log = serving_from(0.0, 10.0)
    log.at(40.0, InstanceDeleted(instance_id="i1"))
    log.at(41.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(45.0, *ready("i2", 1))
    stop = records_of(log)[-3]
    assert (stop.at, stop.noticed, stop.instance_id) == (40.0, None, None)
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert incident.phases == RecoveryPhases(detected=0.0, placed=1.0, downloaded=0.0, loaded=4.0)


# --- the steps of a recovery -----------------------------------------------------------------


def test_the_first_replacement_and_its_download_are_steps_recorded_once() -> None:
    log = serving_from(0.0, 10.0)
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(32.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i3")))  # no step
    log.at(50.0, completed("n-mini"))
    log.at(51.0, completed("n-mini"))  # already complete: no step
    steps = [(r.at, r.serving, r.step, r.instance_id, r.cause) for r in records_of(log)[2:]]
    cause = "node studio confirmed dead (session closed)"
    assert steps == [
        (22.0, False, None, None, cause),
        (31.0, False, "placed", "i2", cause),
        (50.0, False, "downloaded", None, cause),
    ]
    log.at(58.0, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert (incident.start, incident.downtime_s, incident.cause) == (22.0, 36.0, cause)
    assert incident.phases == RecoveryPhases(detected=8.0, placed=1.0, downloaded=19.0, loaded=8.0)
    # Steps change nothing else: availability counts them as the down time they are in.
    history = deployment_history("d1", log.events, window_start=10.0, window_end=70.0)
    assert history.availability == pytest.approx(24.0 / 60.0)


def test_a_download_of_a_model_on_disk_already_is_no_step_and_takes_no_time() -> None:
    log = serving_from(0.0, 10.0).at(5.0, completed("n-mini"))
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(32.0, completed("n-mini"))
    log.at(35.0, *ready("i2", 1))
    assert [r.step for r in records_of(log)[2:]] == [None, "placed", None]
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert incident.phases == RecoveryPhases(detected=8.0, placed=1.0, downloaded=0.0, loaded=4.0)


def test_a_download_of_another_model_or_node_is_not_the_replacements() -> None:
    log = Log().at(0.0, named("n-studio", "studio"), named("n-mini", "mini-a"), named("n-x", "x"))
    log.at(0.0, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    log.at(10.0, *ready("i1", 1))
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini", "n-x"], "i2")))
    log.at(40.0, completed("n-mini", "other"), completed("n-x"))
    assert [r.step for r in records_of(log)[2:]] == [None, "placed"]
    log.at(45.0, completed("n-mini"))  # the last of its nodes
    assert [r.step for r in records_of(log)[2:]] == [None, "placed", "downloaded"]


def test_a_replacement_under_way_at_the_stop_is_named_by_it_and_took_no_placing() -> None:
    """Make-before-break: the replacement was placed while the node was only suspect."""
    log = serving_from(0.0, 10.0)
    log.at(25.0, NodeSuspected(node_id="n-studio", last_heard=22.0, at=25.0))
    log.at(25.5, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    assert records_of(log)[-1].serving  # suspect: still serving, no step
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    stop = records_of(log)[-1]
    assert (stop.at, stop.noticed, stop.instance_id, stop.step) == (22.0, 30.0, "i2", None)
    log.at(33.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i3")))  # no step
    log.at(34.0, completed("n-mini"))
    assert [r.step for r in records_of(log)[3:]] == ["downloaded"]
    log.at(36.0, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert incident.phases == RecoveryPhases(detected=8.0, placed=0.0, downloaded=4.0, loaded=2.0)


def test_an_instance_lost_with_the_node_is_no_replacement_under_way() -> None:
    log = serving_from(0.0, 10.0)
    log.at(11.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i-same-node")))
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    assert records_of(log)[-1].instance_id is None


def test_no_steps_outside_an_incident_nor_without_a_state_before() -> None:
    start_up = Log().at(0.0, named("n-studio", "studio"), DeploymentCreated(deployment=DEPLOYMENT))
    start_up.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    start_up.at(2.0, completed("n-studio"))
    assert [r.step for r in records_of(start_up)] == [None]
    start_up.at(3.0, *ready("i1", 1))
    assert records_of(start_up)[-1].phases is None  # a start-up is no recovery
    down = replay(serving_from(0.0, 10.0).at(30.0, InstanceDeleted(instance_id="i1")).events)
    placed = apply(down, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    assert serving_changes(None, placed, 31.0) == []
    (step,) = serving_changes(down, placed, 31.0)
    assert (step.record.step, step.record.instance_id) == ("placed", "i2")
    assert serving_changes(down, down, 32.0) == []  # nothing new: no step


def test_a_placement_error_while_down_keeps_its_record_before_any_step() -> None:
    log = serving_from(0.0, 10.0)
    log.at(30.0, InstanceDeleted(instance_id="i1"))
    log.at(31.0, DeploymentPlacementFailed(deployment_id="d1", error="no room"))
    assert [(r.step, r.cause) for r in records_of(log)[2:]] == [
        (None, "instance deleted by a user")
    ]


def test_phases_add_up_to_the_down_time_whatever_the_records_order() -> None:
    """``recovery_phases`` over records as they are written, and over records a clock that went
    back wrote out of order: no phase is negative, and they add up to the down time."""
    stretch = (
        ServingRecord(at=0.0, serving=True),
        ServingRecord(at=10.0, serving=False, cause="x", noticed=18.0),
        ServingRecord(at=20.0, serving=False, step="placed", instance_id="i2"),
        ServingRecord(at=26.0, serving=False, step="downloaded"),
    )
    assert recovery_phases(stretch, 30.0) == RecoveryPhases(
        detected=8.0, placed=2.0, downloaded=6.0, loaded=4.0
    )
    skewed = (
        ServingRecord(at=0.0, serving=True),
        ServingRecord(at=10.0, serving=False, cause="x", noticed=18.0),
        ServingRecord(at=15.0, serving=False, step="placed", instance_id="i2"),
        ServingRecord(at=12.0, serving=False, step="downloaded"),
    )
    assert recovery_phases(skewed, 17.0) == RecoveryPhases(
        detected=8.0, placed=0.0, downloaded=0.0, loaded=0.0
    )
    assert recovery_phases(skewed, 40.0) == RecoveryPhases(
        detected=8.0, placed=0.0, downloaded=0.0, loaded=22.0
    )
    assert recovery_phases(stretch[:1], 30.0) is None  # serving: no incident
    assert recovery_phases(stretch[1:], 30.0) is None  # never served: a start-up


def test_the_down_stretch_is_what_follows_the_newest_serving_record() -> None:
    served = ServingRecord(at=0.0, serving=True)
    down = ServingRecord(at=5.0, serving=False)
    step = ServingRecord(at=6.0, serving=False, step="placed")
    assert down_stretch((down, served, down, step)) == (down, step)
    assert down_stretch((down, served)) is None
    assert down_stretch((down,)) is None
    assert down_stretch(()) is None


def test_an_ongoing_incident_has_no_phases_yet() -> None:
    log = serving_from(0.0, 10.0).at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert (incident.start, incident.end, incident.phases) == (22.0, None, None)


def test_heard_again_after_dead_serves_again_with_its_phases() -> None:
    log = serving_from(0.0, 10.0).at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(33.0, NodeHeardAgain(node_id="n-studio", at=33.0))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert (incident.start, incident.end) == (22.0, 33.0)
    assert incident.phases == RecoveryPhases(detected=8.0, placed=0.0, downloaded=0.0, loaded=3.0)


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (dead("n-studio", 1.0, 2.0), True),
        (NodeHeardAgain(node_id="n-studio", at=3.0), True),
        (NodeSuspected(node_id="n-studio", last_heard=1.0, at=2.0), False),  # still serves
        (completed("n-mini"), True),  # may end a recovery's download
        (
            NodeDownloadProgress(
                download_progress=DownloadPending(
                    node_id="n-mini",
                    shard_metadata=completed("n-mini").download_progress.shard_metadata,
                    total=Memory(in_bytes=100),
                )
            ),
            False,
        ),
    ],
)
def test_which_verdicts_and_downloads_can_change_serving(event: AnyEvent, expected: bool) -> None:
    state = replay(serving_from(0.0, 10.0).events)
    assert may_change_serving(event, state) is expected


def test_unix_seconds_of_reads_exos_last_seen_and_refuses_what_has_no_zone() -> None:
    assert unix_seconds_of("1970-01-01T00:00:45.000Z") == 45.0
    assert unix_seconds_of("2026-12-01T09:39:22.568449Z") == pytest.approx(1_796_117_962.568449)
    assert unix_seconds_of("2024-02-29T23:59:59.5+02:00") == 1_709_243_999.5
    assert unix_seconds_of("1999-12-31 10:00:00-05:30") == 946_654_200.0
    assert unix_seconds_of(iso_utc_of(1_796_126_584.25)) == 1_796_126_584.25
    for bad in (None, "", "yesterday", "2026-01-01T00:00:00", "2026-13-01T00:00:00Z"):
        assert unix_seconds_of(bad) is None, bad


def test_a_stop_seen_with_nothing_serving_before_is_dated_when_seen() -> None:
    """The records say serving, yet ``before`` served nothing (a service's first look at exo):
    no lost node to date it by."""
    state = replay(serving_from(0.0, 10.0).events)
    unready = apply(state, InstanceDeleted(instance_id="i1"))
    (change,) = serving_changes(unready, unready, 40.0)
    assert (change.record.at, change.record.noticed, change.record.serving) == (40.0, None, False)


def test_a_download_is_the_replacements_only_while_it_exists_and_counts_once() -> None:
    log = serving_from(0.0, 10.0)
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(40.0, completed("n-mini"))
    shard = completed("n-mini").download_progress.shard_metadata
    again = DownloadPending(node_id="n-mini", shard_metadata=shard, total=Memory(in_bytes=100))
    log.at(41.0, NodeDownloadProgress(download_progress=again), completed("n-mini"))
    assert [r.step for r in records_of(log)[2:]] == [None, "placed", "downloaded"]
    gone = serving_from(0.0, 10.0).at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    gone.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    gone.at(35.0, InstanceDeleted(instance_id="i2"))
    gone.at(40.0, completed("n-mini"))
    assert [r.step for r in records_of(gone)[2:]] == [None, "placed"]


def test_phases_are_to_the_millisecond() -> None:
    stretch = (
        ServingRecord(at=0.0, serving=True),
        ServingRecord(at=10.0, serving=False, cause="x", noticed=11.23456),
        ServingRecord(at=12.5, serving=False, step="placed", instance_id="i2"),
    )
    assert recovery_phases(stretch, 15.00049) == RecoveryPhases(
        detected=1.235, placed=1.265, downloaded=0.0, loaded=2.5
    )


def test_the_instance_that_stopped_serving_is_not_its_own_replacement_under_way() -> None:
    log = serving_from(0.0, 10.0)
    failed = RunnerFailed(error_message="out of memory")
    log.at(30.0, RunnerStatusUpdated(runner_id="i1-runner-1", runner_status=failed))
    stop = records_of(log)[-1]
    assert (stop.serving, stop.at, stop.instance_id) == (False, 30.0, None)


def test_no_down_stretch_while_the_newest_record_serves() -> None:
    served = ServingRecord(at=0.0, serving=True)
    down = ServingRecord(at=5.0, serving=False)
    assert down_stretch((served, served)) is None
    assert down_stretch((served, down, served)) is None


# --- a broken instance names itself as the cause (§5.19) ---------------------------------------


HOLLOW_CAUSE = (
    "instance i1 hollow on studio, mini-a: "
    "runner on studio went RunnerShutdown for 5s while studio is alive"
)


def test_a_repaired_hollow_instance_is_the_incidents_cause_and_its_recognition_the_detection() -> (
    None
):
    log = serving_from(0.0, 10.0)
    log.at(20.0, RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerShutdown()))
    assert records_of(log)[-1].cause == "runner on studio went away"
    log.at(25.0, repair_placed("i1", "i2"), InstanceDeleted(instance_id="i1"))
    log.at(25.5, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    diagnosis, placed = records_of(log)[-2:]
    assert diagnosis == ServingRecord(
        at=25.0, serving=False, cause=HOLLOW_CAUSE, step="diagnosed", problem="hollow"
    )
    assert (placed.step, placed.instance_id, placed.cause) == ("placed", "i2", HOLLOW_CAUSE)
    log.at(27.0, *ready("i2", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=50.0).incidents
    assert (incident.cause, incident.problem) == (HOLLOW_CAUSE, "hollow")
    assert (incident.start, incident.end) == (20.0, 27.0)
    assert incident.phases == RecoveryPhases(detected=5.0, placed=0.5, downloaded=0.0, loaded=1.5)


def test_a_diagnosis_and_its_replacement_in_one_change_are_two_records_in_order() -> None:
    log = serving_from(0.0, 10.0)
    log.at(20.0, RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerShutdown()))
    down = replay(log.events)
    after = apply(
        apply(apply(down, repair_placed("i1", "i2")), InstanceDeleted(instance_id="i1")),
        InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")),
    )
    changes = serving_changes(down, after, 25.0)
    assert [(c.record.step, c.record.cause) for c in changes] == [
        ("diagnosed", HOLLOW_CAUSE),
        ("placed", HOLLOW_CAUSE),
    ]
    # The same note seen again is no second diagnosis.
    assert serving_changes(after, after.model_copy(update={"instances": {}}), 26.0) == []


def test_a_diagnosis_needs_an_incident_a_new_note_and_no_replacement_of_this_incident() -> None:
    serving = replay(serving_from(0.0, 10.0).events)
    # Serving: a repair (failing chats, make-before-break) writes nothing.
    assert serving_changes(serving, apply(serving, repair_placed("i1", "i2")), 20.0) == []
    # A node's incident whose replacement broke in turn keeps the node as its cause.
    log = serving_from(0.0, 10.0).at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    log.at(31.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    log.at(95.0, repair_placed("i2", "i3", problem="stalled"))
    assert [r.step for r in records_of(log)[2:]] == [None, "placed"]
    log.at(96.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i3")))
    log.at(99.0, *ready("i3", 1))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=99.0).incidents
    assert incident.cause == "node studio confirmed dead (session closed)"
    assert incident.problem is None
    # No State before: nothing to compare, no diagnosis.
    down = replay(serving_from(0.0, 10.0).at(20.0, InstanceDeleted(instance_id="i1")).events)
    assert serving_changes(None, apply(down, repair_placed("i1", "i2")), 25.0) == []


def test_a_broken_instance_gone_from_both_states_is_named_without_its_nodes() -> None:
    state = State()
    note = RepairNote(instance_id="0123456789abcdef", problem="stalled", why="silent")
    assert broken_instance_cause(state, state, note) == "instance 01234567 stalled: silent"


def test_only_the_first_diagnosis_of_an_incident_names_it() -> None:
    records = [
        ServingRecord(at=0.0, serving=True),
        ServingRecord(at=10.0, serving=False, cause="runner on a went away"),
        ServingRecord(at=12.0, serving=False, cause="first", step="diagnosed", problem="hollow"),
        ServingRecord(at=13.0, serving=False, cause="second", step="diagnosed", problem="stalled"),
        ServingRecord(at=15.0, serving=True),
    ]
    (incident,) = summarize("d1", records, window_start=0.0, window_end=20.0).incidents
    assert (incident.cause, incident.problem) == ("first", "hollow")
    assert recovery_phases(records[:-1], 15.0) == RecoveryPhases(
        detected=2.0, placed=0.0, downloaded=0.0, loaded=3.0
    )


def test_the_repair_note_outlives_its_move_and_goes_with_its_deployment() -> None:
    state = replay(serving_from(0.0, 10.0).events)
    placed = apply(apply(state, repair_placed("i1", "i2")), InstanceDeleted(instance_id="i1"))
    assert placed.deployments["d1"].repairing is None  # the broken one's deletion ended the move
    assert placed.repair_notes["d1"] == RepairNote(
        instance_id="i1", problem="hollow", why=repair_placed("i1", "i2").why
    )
    assert apply(placed, DeploymentDeleted(deployment_id="d1")).repair_notes == {}
    # A repair refused (one under way already) leaves the note as it was.
    again = apply(apply(state, repair_placed("i1", "i2")), repair_placed("i9", "i8", "stalled"))
    assert again.repair_notes["d1"].instance_id == "i1"


# --- a single replica's failover writes the incident its replacement hid (§5.18) --------------


def failing_over(log: Log) -> Log:
    """studio suspected at 25 (last heard at 22), the failover's replacement i2 on spare placed
    at 25.5 and ready at 27, while i1 (on studio) still reads ready."""
    log.at(0.0, named("n-spare", "spare"))
    log.at(25.0, NodeSuspected(node_id="n-studio", last_heard=22.0, at=25.0))
    move = InstanceMove(deployment_id="d1", old_instance_id="i1", new_instance_id="i2")
    log.at(25.5, FailoverReplacementPlaced(deployment_id="d1", move=move, at=25.5))
    log.at(25.5, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i2")))
    return log.at(27.0, *ready("i2", 1))


COVERED_PHASES = RecoveryPhases(detected=3.0, placed=0.5, downloaded=0.0, loaded=1.5)


def test_a_replacement_ready_for_a_suspect_single_replica_is_a_covered_record() -> None:
    log = failing_over(serving_from(0.0, 10.0))
    covered = records_of(log)[-1]
    assert covered == ServingRecord(
        at=27.0, serving=True, step="covered", instance_id="i2", phases=COVERED_PHASES
    )
    history = deployment_history("d1", log.events, window_start=0.0, window_end=40.0)
    assert (history.incidents, history.availability) == ((), 1.0)  # not confirmed: no incident


def test_the_node_confirmed_dead_writes_the_hidden_stop_dated_back_to_its_last_heartbeat() -> None:
    log = failing_over(serving_from(0.0, 10.0))
    log.at(30.0, dead("n-studio", last_heard=22.0, at=30.0))
    stop, covered = records_of(log)[-2:]
    assert stop == ServingRecord(
        at=22.0,
        serving=False,
        cause="node studio confirmed dead (session closed)",
        noticed=25.0,
        instance_id="i2",
    )
    assert covered.step == "covered"
    # Written once: the timeout and the sweep after add nothing.
    log.at(31.0, InstanceDeleted(instance_id="i1"))
    log.at(60.0, NodeTimedOut(node_id="n-studio"))
    assert records_of(log)[-2:] == (stop, covered)
    history = deployment_history("d1", log.events, window_start=0.0, window_end=70.0)
    (incident,) = history.incidents
    assert (incident.start, incident.end, incident.downtime_s) == (22.0, 27.0, 5.0)
    assert incident.phases == COVERED_PHASES
    assert history.mttr_s == 5.0
    assert history.availability == pytest.approx(55.0 / 60.0)


def test_a_node_heard_again_after_its_replacement_was_ready_writes_no_incident() -> None:
    log = failing_over(serving_from(0.0, 10.0))
    log.at(28.0, NodeHeardAgain(node_id="n-studio", at=28.0))
    log.at(29.0, InstanceDeleted(instance_id="i2"))  # the surplus goes
    history = deployment_history("d1", log.events, window_start=0.0, window_end=40.0)
    assert history.incidents == ()


def test_a_timeout_with_no_verdict_after_covering_also_writes_the_stop() -> None:
    log = failing_over(serving_from(0.0, 10.0)).at(55.0, NodeTimedOut(node_id="n-studio"))
    (incident,) = deployment_history("d1", log.events, window_start=0.0, window_end=70.0).incidents
    assert (incident.start, incident.end, incident.cause) == (22.0, 27.0, "node studio timed out")


def test_no_covering_while_another_replica_serves_apart_or_with_nothing_new_ready() -> None:
    log = serving_from(0.0, 10.0).at(0.0, named("n-spare", "spare"))
    log.at(5.0, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i0")))
    log.at(6.0, *ready("i0", 1))
    failing_over(log)  # i0 on spare served all along: the deployment was never untrusted
    assert all(r.step is None for r in records_of(log))
    # The same instance ready again on a node no longer suspect is no replacement either.
    log = serving_from(0.0, 10.0).at(
        25.0, NodeSuspected(node_id="n-studio", last_heard=22.0, at=25.0)
    )
    log.at(26.0, NodeHeardAgain(node_id="n-studio", at=26.0))
    assert all(r.step is None for r in records_of(log))


def test_a_heartbeat_older_than_the_newest_record_dates_the_covered_stop_at_that_record() -> None:
    log = serving_from(0.0, 10.0)
    log.at(0.0, named("n-spare", "spare"))
    log.at(12.0, NodeSuspected(node_id="n-studio", last_heard=8.0, at=12.0))
    move = InstanceMove(deployment_id="d1", old_instance_id="i1", new_instance_id="i2")
    log.at(12.0, FailoverReplacementPlaced(deployment_id="d1", move=move, at=12.0))
    log.at(12.0, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i2")))
    log.at(14.0, *ready("i2", 1), dead("n-studio", last_heard=8.0, at=14.0))
    stop, covered = records_of(log)[-2:]
    assert (stop.at, covered.at) == (10.0, 14.0)  # the record before: serving since 10
    assert covered.phases == RecoveryPhases(detected=2.0, placed=0.0, downloaded=0.0, loaded=2.0)


def test_the_first_node_to_go_quiet_dates_a_covered_record_whose_instance_has_two_suspects() -> (
    None
):
    log = serving_from(0.0, 10.0).at(0.0, named("n-spare", "spare"))
    log.at(25.0, NodeSuspected(node_id="n-studio", last_heard=21.0, at=25.0))
    log.at(26.0, NodeSuspected(node_id="n-mini", last_heard=23.0, at=26.0))
    move = InstanceMove(deployment_id="d1", old_instance_id="i1", new_instance_id="i2")
    log.at(26.5, FailoverReplacementPlaced(deployment_id="d1", move=move, at=26.5))
    log.at(26.5, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i2")))
    log.at(28.0, *ready("i2", 1))
    # studio, heard last at 21 and suspected at 25 (not mini-a, heard at 23, suspected at 26).
    assert records_of(log)[-1].phases == RecoveryPhases(
        detected=4.0, placed=1.5, downloaded=0.0, loaded=1.5
    )


def test_a_replacement_ready_with_no_failover_placed_counts_no_placement_time() -> None:
    log = serving_from(0.0, 10.0).at(0.0, named("n-spare", "spare"))
    log.at(25.0, NodeSuspected(node_id="n-studio", last_heard=22.0, at=25.0))
    log.at(25.5, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i2")))
    log.at(27.0, *ready("i2", 1))
    covered = records_of(log)[-1]
    assert (covered.step, covered.instance_id) == ("covered", "i2")
    assert covered.phases == RecoveryPhases(detected=3.0, placed=0.0, downloaded=0.0, loaded=2.0)


def test_a_covered_records_phases_are_to_the_millisecond() -> None:
    log = serving_from(0.0, 10.0).at(0.0, named("n-spare", "spare"))
    log.at(25.0, NodeSuspected(node_id="n-studio", last_heard=21.74951, at=25.0))
    move = InstanceMove(deployment_id="d1", old_instance_id="i1", new_instance_id="i2")
    log.at(25.50049, FailoverReplacementPlaced(deployment_id="d1", move=move, at=25.50049))
    log.at(25.50049, InstanceCreated(instance=build_instance(MODEL, ["n-spare"], "i2")))
    log.at(27.0, *ready("i2", 1))
    assert records_of(log)[-1].phases == RecoveryPhases(
        detected=3.25, placed=0.5, downloaded=0.0, loaded=1.5
    )


# The covered stop from hand-written histories: any covered record, whatever came before it.


def covered_record(
    at: float = 27.0, detected: float = 3.0, downloaded: float = 0.0
) -> ServingRecord:
    phases = RecoveryPhases(detected=detected, placed=0.5, downloaded=downloaded, loaded=1.5)
    return ServingRecord(at=at, serving=True, step="covered", instance_id="i2", phases=phases)


def covered_stop(*records: ServingRecord, before: State | None = None) -> list[ServingRecord]:
    """The records written when studio is confirmed dead (or ``before`` changes, if given)
    under ``records``, during ``failing_over``."""
    suspect = replay(failing_over(serving_from(0.0, 10.0)).events)
    start = before if before is not None else suspect
    after = apply(start, dead("n-studio", last_heard=22.0, at=30.0))
    if before is not None:
        after = apply(before, named("n-other", "other"))
    history = {"d1": records}
    changes = serving_changes(
        start.model_copy(update={"serving_history": history}),
        after.model_copy(update={"serving_history": history}),
        30.0,
    )
    return [change.record for change in changes]


STUDIO_DEAD = "node studio confirmed dead (session closed)"


def test_a_covered_stop_is_dated_back_by_the_covered_records_phases() -> None:
    # A history that begins with the covered record: nothing before it to keep in order.
    assert covered_stop(covered_record()) == [
        ServingRecord(at=22.0, serving=False, cause=STUDIO_DEAD, noticed=25.0, instance_id="i2")
    ]
    # Every phase adds to the down time, the download too.
    (stop,) = covered_stop(ServingRecord(at=0.0, serving=True), covered_record(downloaded=1.0))
    assert (stop.at, stop.noticed) == (21.0, 24.0)


def test_a_covered_stop_never_dates_before_the_record_before_the_covered_one() -> None:
    (stop,) = covered_stop(ServingRecord(at=24.0, serving=True), covered_record())
    assert (stop.at, stop.noticed) == (24.0, 27.0)


def test_a_covered_stop_is_written_once_and_only_for_a_node_newly_lost() -> None:
    # The record before the covered one is a stop already: it is that one, written.
    down = ServingRecord(at=22.0, serving=False, cause=STUDIO_DEAD)
    assert covered_stop(down, covered_record()) == []
    # studio confirmed dead already before this change: nothing newly lost.
    already = apply(
        replay(failing_over(serving_from(0.0, 10.0)).events),
        dead("n-studio", last_heard=22.0, at=30.0),
    )
    assert covered_stop(ServingRecord(at=0.0, serving=True), covered_record(), before=already) == []


def test_a_covered_stops_dates_are_to_the_millisecond() -> None:
    served = ServingRecord(at=0.0, serving=True)
    (stop,) = covered_stop(served, covered_record(at=27.12395, detected=3.00049))
    assert (stop.at, stop.noticed) == (22.123, 25.123)  # from 22.12346 and 25.12349


def test_a_covered_stop_is_noticed_after_any_detection_and_not_without_one() -> None:
    served = ServingRecord(at=0.0, serving=True)
    (quick,) = covered_stop(served, covered_record(detected=0.5))
    assert (quick.at, quick.noticed) == (24.5, 25.0)
    (none,) = covered_stop(served, covered_record(detected=0.0))
    assert (none.at, none.noticed) == (25.0, None)


def test_no_diagnosis_for_a_deployment_that_never_served() -> None:
    log = Log().at(0.0, named("n-studio", "studio"), named("n-mini", "mini-a"))
    log.at(0.0, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-studio", "n-mini"], "i1")))
    log.at(20.0, repair_placed("i1", "i2", problem="stalled"))
    assert replay(log.events).repair_notes["d1"].instance_id == "i1"  # the note is there
    assert [(r.serving, r.step) for r in records_of(log)] == [(False, None)]


def test_a_broken_instance_only_the_state_after_holds_is_named_with_its_nodes() -> None:
    down = replay(serving_from(0.0, 10.0).at(20.0, InstanceDeleted(instance_id="i1")).events)
    created = apply(down, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i5")))
    after = apply(created, repair_placed("i5", "i6", problem="stalled"))
    diagnosis = serving_changes(down, after, 25.0)[0].record
    assert (diagnosis.step, diagnosis.cause) == (
        "diagnosed",
        "instance i5 stalled on mini-a: "
        "runner on studio went RunnerShutdown for 5s while studio is alive",
    )


# --- exo's master changed ------------------------------------------------------------------


def exo_master_changed(serving: State, survivors: tuple[str, ...], at: float) -> State:
    """exo's State from a new master, as the bridge merges it: the event index from 0 again, no
    instance or runner, only ``survivors`` reporting (heard at ``at``), the deployments and
    their records the bridge's own."""
    return State(
        last_event_applied_idx=4,
        topology=Topology(nodes=list(survivors)),
        last_seen={node: iso_utc_of(at) for node in survivors},
        node_identities={node: serving.node_identities[node] for node in survivors},
        deployments=serving.deployments,
        serving_history=serving.serving_history,
    )


def old_master_serving() -> State:
    """studio (exo's master, last heard at 30) and mini-a (at 31) serving i1 over both."""
    log = serving_from(0.0, 10.0).at(30.0, heard("n-studio", 30.0)).at(31.0, heard("n-mini", 31.0))
    return replay(log.events).model_copy(update={"last_event_applied_idx": 5000})


def test_exos_master_changing_is_the_cause_dated_from_the_old_masters_last_report() -> None:
    """The old master's node (studio) went with it; mini-a serves on in the new master's State
    but its instance is gone: the stop is the master's, from studio's last report, not a node
    timing out when the new State was read."""
    before = old_master_serving()
    after = exo_master_changed(before, ("n-mini",), at=35.0)
    (change,) = serving_changes(before, after, 36.0)
    assert change.record == ServingRecord(
        at=30.0,
        serving=False,
        cause="exo's master changed (its State started empty; node studio left)",
        noticed=36.0,
    )


def test_exos_master_changing_with_every_node_present_is_not_a_deletion_by_a_user() -> None:
    """The instance was on mini-a alone, which reports to the new master: today's reading of an
    instance gone with its nodes present would blame a user."""
    log = Log().at(0.0, named("n-studio", "studio"), named("n-mini", "mini-a"))
    log.at(0.0, DeploymentCreated(deployment=DEPLOYMENT))
    log.at(1.0, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i1")))
    log.at(10.0, *ready("i1", 1))
    log.at(30.0, heard("n-studio", 30.0)).at(31.0, heard("n-mini", 31.5))
    before = replay(log.events).model_copy(update={"last_event_applied_idx": 5000})
    # Read before any node reported to the new master: no node, and which was master is unknown.
    (change,) = serving_changes(before, exo_master_changed(before, (), at=35.0), 37.0)
    assert (change.record.at, change.record.cause) == (
        31.5,
        "exo's master changed (its State started empty)",
    )
    # Read once both reported: nobody left (the master stepped down alive).
    both = exo_master_changed(before, ("n-studio", "n-mini"), at=35.0)
    (change,) = serving_changes(before, both, 37.0)
    assert (change.record.at, change.record.cause) == (31.5, MASTER_CHANGED)


def test_exos_master_changing_with_no_report_dated_stops_when_seen() -> None:
    before = old_master_serving()
    undated = before.model_copy(update={"last_seen": {}})
    (change,) = serving_changes(undated, exo_master_changed(undated, (), at=35.0), 36.0)
    assert (change.record.at, change.record.noticed, change.record.cause) == (
        36.0,
        None,
        MASTER_CHANGED,
    )


def test_exos_master_changing_after_its_node_was_confirmed_dead_says_both() -> None:
    """exo's master held the instance: the bridge confirms its node dead first (its API
    refuses), exo elects another master seconds later. The incident keeps its start (the dead
    node's last heartbeat) and its cause says both, once."""
    log = serving_from(0.0, 10.0).at(30.0, heard("n-studio", 30.0)).at(31.0, heard("n-mini", 31.0))
    log.at(32.0, dead("n-studio", last_heard=30.0, at=32.0, why="refused"))
    before = replay(log.events).model_copy(update={"last_event_applied_idx": 5000})
    after = exo_master_changed(before, ("n-mini",), at=34.0)
    (change,) = serving_changes(before, after, 34.5)
    assert change.record == ServingRecord(
        at=34.5,
        serving=False,
        cause="node studio confirmed dead (refused); then exo's master changed (its State "
        "started empty; node studio left)",
        step="explained",
    )
    records = (*before.serving_history["d1"], change.record)
    history = summarize("d1", records, window_start=0.0, window_end=40.0)
    (incident,) = history.incidents
    assert (incident.start, incident.cause) == (30.0, change.record.cause)
    # Said once: a second change in the same incident adds nothing.
    explained = after.model_copy(
        update={"serving_history": {"d1": records}, "last_event_applied_idx": 5000}
    )
    assert serving_changes(explained, exo_master_changed(explained, ("n-mini",), 36.0), 37.0) == []


def test_a_master_change_that_was_the_stop_is_not_said_twice() -> None:
    before = old_master_serving()
    after = exo_master_changed(before, ("n-mini",), at=35.0)
    (stop,) = serving_changes(before, after, 36.0)
    down = after.model_copy(
        update={
            "serving_history": {"d1": (*before.serving_history["d1"], stop.record)},
            "last_event_applied_idx": 5000,
        }
    )
    assert serving_changes(down, exo_master_changed(down, ("n-mini",), 40.0), 41.0) == []
