"""Which alert notices a change produces (``keeper.core.alerts``), from States written as events:
each kind, nothing for an unchanged State, ids that stay the same on every look and across a
restart, and the wire shapes read back."""

from __future__ import annotations

import hashlib

import pytest
from keeper_harness import build_instance, card, node_info

from keeper.core.alerts import (
    AlertMemory,
    Observed,
    first_look,
    first_memory,
    notices,
)
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentPlacementFailed,
    DeploymentRepairPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeTimedOut,
    NodeUncordoned,
    RunnerStatusUpdated,
)
from keeper.model.history import TimedEvent, replay
from keeper.model.notices import (
    NOTICE_ADAPTER,
    AnyNotice,
    CantPlace,
    DrainFinished,
    DrainStuck,
    IncidentOpened,
    IncidentResolved,
    InstanceUnhealthy,
    RequestsFailing,
    RequestsRecovered,
    ServingAgain,
    clock_utc_of,
    duration_words,
    iso_utc_of,
    phases_words,
)
from keeper.model.state import (
    Deployment,
    InstanceMove,
    NodeIdentity,
    RecoveryPhases,
    RunnerReady,
    RunnerShutdown,
    ServingRecord,
    State,
)

MODEL = card("m")
DEPLOYMENT = Deployment(deployment_id="d1", model_card=MODEL)
# 2026-12-01 12:03:04 UTC: times a person can check in the texts.
T0 = 1_796_126_584.0


def named(node_id: str, name: str) -> NodeGatheredInfo:
    info = node_info(node_id)
    return info.model_copy(update={"identity": NodeIdentity(friendly_name=name)})


def heard(node_id: str, at: float) -> NodeGatheredInfo:
    """A heartbeat of the node at ``at``: where an incident it causes starts."""
    return NodeGatheredInfo(node_id=node_id, when=iso_utc_of(at))


def ready(instance_id: str, ranks: int) -> list[RunnerStatusUpdated]:
    return [
        RunnerStatusUpdated(runner_id=f"{instance_id}-runner-{r}", runner_status=RunnerReady())
        for r in range(ranks)
    ]


class Cluster:
    """States as a service sees them: events applied with their serving records, and the
    notices between each look and the one before."""

    def __init__(self) -> None:
        self.state = State()
        self.memory = AlertMemory()
        self.last = Observed(self.state)
        self.idx = 0

    def at(self, when: float, *events: AnyEvent) -> Cluster:
        timed = [TimedEvent(idx=self.idx + i, at=when, event=e) for i, e in enumerate(events)]
        self.idx += len(events)
        self.state = replay(timed, self.state)
        return self

    def look(self, at: float, drain_notes: dict[str, str] | None = None) -> list[AnyNotice]:
        now = Observed(self.state, drain_notes or {})
        found, self.memory = notices(self.last, now, at, self.memory)
        self.last = now
        return found


def serving(start: float = T0) -> Cluster:
    """Nodes studio and mini-a; the deployment's instance over both ready at start + 10."""
    cluster = Cluster().at(start, named("n-studio", "studio"), named("n-mini", "mini-a"))
    cluster.at(start, DeploymentCreated(deployment=DEPLOYMENT))
    cluster.at(
        start + 1, InstanceCreated(instance=build_instance(MODEL, ["n-studio", "n-mini"], "i1"))
    )
    cluster.at(start + 10, *ready("i1", 2))
    return cluster


def kinds(found: list[AnyNotice]) -> list[str]:
    return [notice.kind for notice in found]


def test_an_unchanged_state_gives_nothing() -> None:
    cluster = serving()
    cluster.look(T0 + 10)
    assert cluster.look(T0 + 11) == []
    # The same State again with the same notes, and an equal copy of it.
    same = Observed(cluster.state.model_copy())
    assert notices(same, same, T0 + 12, cluster.memory) == ([], cluster.memory)


def test_a_start_up_is_no_incident() -> None:
    cluster = Cluster().at(T0, named("n-studio", "studio"))
    cluster.at(T0, DeploymentCreated(deployment=DEPLOYMENT))
    assert cluster.look(T0) == []
    cluster.at(T0 + 1, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    cluster.at(T0 + 5, *ready("i1", 1))
    assert cluster.look(T0 + 5) == []


def test_a_node_lost_opens_an_incident_with_its_cause_and_a_ready_replacement_resolves_it() -> None:
    cluster = serving()
    cluster.look(T0 + 10)
    cluster.at(T0 + 20, heard("n-studio", T0 + 20))  # its last heartbeat
    cluster.at(T0 + 50, NodeTimedOut(node_id="n-studio"))
    (opened,) = cluster.look(T0 + 50.5)
    assert isinstance(opened, IncidentOpened)
    assert (opened.deployment_id, opened.model_id) == ("d1", "m")
    assert opened.cause == "node studio timed out"
    # The incident starts at the lost node's last heartbeat, not at its timeout.
    assert opened.start == iso_utc_of(T0 + 20)
    assert opened.at == iso_utc_of(T0 + 50.5)
    assert opened.text == "exo-deploy: m not serving since 12:03:24 UTC (node studio timed out)"
    cluster.at(T0 + 60, InstanceDeleted(instance_id="i1"))
    assert cluster.look(T0 + 60) == []
    cluster.at(T0 + 61, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    cluster.at(T0 + 80, *ready("i2", 1))
    (resolved,) = cluster.look(T0 + 80)
    assert isinstance(resolved, IncidentResolved)
    assert resolved.cause == "node studio timed out"
    assert (resolved.start, resolved.end) == (iso_utc_of(T0 + 20), iso_utc_of(T0 + 80))
    assert resolved.downtime_s == 60.0
    assert "after 1 min down" in resolved.text
    # Where the minute went: 30 s to the timeout, 11 s to the replacement, 19 s to ready.
    assert resolved.phases == RecoveryPhases(
        detected=30.0, placed=11.0, downloaded=0.0, loaded=19.0
    )
    assert resolved.text.endswith(": detected 30.0 s, placed 11.0 s, loaded 19.0 s")
    assert opened.id != resolved.id


def test_an_incident_that_came_and_went_between_two_looks_is_both_opened_and_resolved() -> None:
    cluster = serving()
    cluster.look(T0 + 10)
    cluster.at(T0 + 20, InstanceDeleted(instance_id="i1"))
    cluster.at(T0 + 21, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    cluster.at(T0 + 25, *ready("i2", 1))
    found = cluster.look(T0 + 26)
    assert kinds(found) == ["incident_opened", "incident_resolved"]
    assert found[0].model_dump()["cause"] == "instance deleted by a user"


def test_incident_ids_are_the_same_on_every_look_and_after_a_restart() -> None:
    """Ids come from the records, not from the look: the service that looks again (a retry of
    its step, a restart with the memory it kept) names the same incident the same way."""
    first = serving()
    first.look(T0 + 10)
    kept = first.memory  # what the outbox dir holds at the stop
    first.at(T0 + 50, heard("n-studio", T0 + 50), NodeTimedOut(node_id="n-studio"))
    (opened,) = first.look(T0 + 50)
    # Another look at the same change, later: the same id.
    again = Cluster()
    again.state = first.state
    again.last = Observed(serving().state)
    again.memory = kept
    (opened_again,) = again.look(T0 + 99)
    assert opened_again.id == opened.id
    assert opened_again.at != opened.at
    # A restart whose memory was kept before the timeout was looked at: the first look says it.
    after = Observed(first.state)
    before = first_look(after, kept)
    found, _ = notices(before, after, T0 + 120, first_memory(after, kept))
    assert [n.id for n in found] == [opened.id]
    # A restart with the memory kept after it: nothing again.
    before = first_look(after, first.memory)
    assert notices(before, after, T0 + 120, first_memory(after, first.memory))[0] == []


def test_a_restart_with_no_memory_says_nothing_of_the_past() -> None:
    cluster = serving()
    cluster.at(T0 + 50, NodeTimedOut(node_id="n-studio"))
    after = Observed(cluster.state)
    assert notices(first_look(after, None), after, T0 + 60, first_memory(after, None))[0] == []


def unplaceable() -> Cluster:
    """Serving, then studio lost and the replacement unplaceable."""
    cluster = serving()
    cluster.look(T0 + 10)
    cluster.at(
        T0 + 50,
        heard("n-studio", T0 + 50),
        NodeTimedOut(node_id="n-studio"),
        InstanceDeleted(instance_id="i1"),
    )
    cluster.look(T0 + 50)
    return cluster


def test_cant_place_is_said_once_until_it_serves_again() -> None:
    cluster = unplaceable()
    error = "No cycles found with sufficient memory"
    cluster.at(T0 + 51, DeploymentPlacementFailed(deployment_id="d1", error=error))
    (cant,) = cluster.look(T0 + 51)
    assert isinstance(cant, CantPlace)
    assert cant.reason == error
    assert cant.down_since == iso_utc_of(T0 + 50)
    assert cant.text == f"exo-deploy: m cannot be placed (not serving since 12:03:54 UTC): {error}"
    # Tried again: placing, then cant_place once more; no second notice.
    cluster.at(T0 + 60, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    assert cluster.look(T0 + 60) == []
    cluster.at(T0 + 61, InstanceDeleted(instance_id="i2"))
    cluster.at(T0 + 62, DeploymentPlacementFailed(deployment_id="d1", error=error))
    assert cluster.look(T0 + 62) == []
    # It serves again: serving_again beside the incident's end.
    cluster.at(T0 + 70, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i3")))
    cluster.at(T0 + 75, *ready("i3", 1))
    found = cluster.look(T0 + 75)
    assert kinds(found) == ["incident_resolved", "serving_again"]
    again = found[1]
    assert isinstance(again, ServingAgain)
    assert again.since == iso_utc_of(T0 + 75)
    assert again.id == f"serving_again:d1:{iso_utc_of(T0 + 75)}"
    # Said once: a later change says nothing more of it.
    cluster.at(T0 + 90, named("n-other", "other"))
    assert cluster.look(T0 + 90) == []


def test_a_deployment_that_can_never_start_is_cant_place() -> None:
    cluster = Cluster().at(T0, named("n-studio", "studio"))
    cluster.look(T0)
    cluster.at(T0, DeploymentCreated(deployment=DEPLOYMENT))
    cluster.at(T0 + 1, DeploymentPlacementFailed(deployment_id="d1", error="too big"))
    found = cluster.look(T0 + 1)
    # The start-up placement explained is an incident (history's rule), and cant_place.
    assert kinds(found) == ["incident_opened", "cant_place"]
    assert found[1].model_dump()["down_since"] == iso_utc_of(T0)  # since its creation
    assert (
        found[1].text == "exo-deploy: m cannot be placed (not serving since 12:03:04 UTC): too big"
    )


def test_cant_place_before_a_record_explains_it_says_no_time_and_keys_on_the_reason() -> None:
    """The bridge records serving from exo's State a tick before its step's look: a deployment
    may read cant_place before its record says why."""
    failed = DEPLOYMENT.model_copy(update={"placement_error": "too big"})
    created = ServingRecord(at=T0, serving=False, begins="created")
    before = Observed(State(deployments={"d1": DEPLOYMENT}, serving_history={"d1": (created,)}))
    after = Observed(before.state.model_copy(update={"deployments": {"d1": failed}}))
    (cant,), memory = notices(before, after, T0 + 1, AlertMemory())
    assert isinstance(cant, CantPlace)
    assert cant.down_since is None
    assert cant.text == "exo-deploy: m cannot be placed: too big"
    assert cant.id == f"cant_place:d1:{hashlib.sha256(b'too big').hexdigest()[:16]}"
    assert memory.cant_place == {"d1"}


def test_a_hand_placed_instance_deleted_under_a_failed_placement_is_cant_place() -> None:
    """Placement failed, then an operator placed the model by hand (serving, the error still on
    the deployment); that instance deleted, the deployment is cant_place at once."""
    cluster = Cluster().at(T0, named("n-studio", "studio"))
    cluster.at(T0, DeploymentCreated(deployment=DEPLOYMENT))
    cluster.at(T0 + 1, DeploymentPlacementFailed(deployment_id="d1", error="too big"))
    cluster.at(T0 + 2, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "by-hand")))
    cluster.at(T0 + 3, *ready("by-hand", 1))
    cluster.look(T0 + 3)
    deployments = cluster.state.deployments
    cluster.at(T0 + 10, InstanceDeleted(instance_id="by-hand"))
    assert cluster.state.deployments is deployments  # only the instances changed
    found = cluster.look(T0 + 10)
    assert kinds(found) == ["incident_opened", "cant_place"]


def test_a_runner_or_a_node_report_alone_reads_no_status() -> None:
    cluster = unplaceable()
    cluster.at(T0 + 51, DeploymentPlacementFailed(deployment_id="d1", error="too big"))
    assert kinds(cluster.look(T0 + 51)) == ["cant_place"]
    cluster.at(T0 + 52, named("n-other", "other"))
    assert cluster.look(T0 + 52) == []


def test_a_restart_while_cant_place_says_serving_again_later_but_not_cant_place() -> None:
    cluster = unplaceable()
    cluster.at(T0 + 51, DeploymentPlacementFailed(deployment_id="d1", error="too big"))
    after = Observed(cluster.state)
    memory = first_memory(after, None)
    assert notices(first_look(after, None), after, T0 + 52, memory)[0] == []
    assert memory.cant_place == {"d1"}
    assert memory.records_seen_until == {"d1": T0 + 50}  # the newest record: the timeout


def test_a_restart_keeps_the_announced_cant_place_of_a_deployment_now_starting() -> None:
    cluster = unplaceable()
    cluster.at(T0 + 51, DeploymentPlacementFailed(deployment_id="d1", error="too big"))
    cluster.look(T0 + 51)
    kept = cluster.memory
    assert kept.cant_place == {"d1"}
    # Stopped; meanwhile placed (starting, not cant_place), then restarted with ``kept``.
    cluster.at(T0 + 60, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    restarted = Cluster()
    restarted.state = cluster.state
    restarted.last = first_look(Observed(cluster.state), kept)
    restarted.memory = first_memory(Observed(cluster.state), kept)
    assert restarted.memory.cant_place == {"d1"}
    assert restarted.look(T0 + 61) == []
    restarted.at(T0 + 65, *ready("i2", 1))
    assert kinds(restarted.look(T0 + 65)) == ["incident_resolved", "serving_again"]


def test_a_restart_never_counts_a_serving_deployment_as_announced() -> None:
    cluster = serving()
    after = Observed(cluster.state)
    memory = first_memory(after, AlertMemory(cant_place=frozenset({"d1", "gone"})))
    assert memory.cant_place == {"d1"}  # kept, and the deleted one forgotten
    fresh = first_memory(after, None)
    assert fresh.cant_place == frozenset()
    cluster.memory, cluster.last = fresh, first_look(after, None)
    cluster.at(T0 + 20, named("n-other", "other"))
    assert cluster.look(T0 + 20) == []


def test_a_deployment_whose_records_were_all_pruned_has_no_time_looked_at() -> None:
    state = State(deployments={"d1": DEPLOYMENT}, serving_history={"d1": ()})
    assert first_memory(Observed(state), None).records_seen_until == {}


def test_each_deployment_is_looked_at_whatever_the_others_did() -> None:
    other = Deployment(deployment_id="d0", model_card=card("other"))
    cluster = Cluster().at(T0, named("n-studio", "studio"), named("n-mini", "mini-a"))
    cluster.at(T0, DeploymentCreated(deployment=other), DeploymentCreated(deployment=DEPLOYMENT))
    cluster.at(T0 + 1, InstanceCreated(instance=build_instance(other.model_card, ["n-mini"], "o1")))
    cluster.at(T0 + 1, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    cluster.at(T0 + 2, *ready("o1", 1), *ready("i1", 1))
    cluster.look(T0 + 2)
    cluster.at(T0 + 50.25, heard("n-studio", T0 + 50.25), NodeTimedOut(node_id="n-studio"))
    (opened,) = cluster.look(T0 + 51)
    assert opened.model_dump()["deployment_id"] == "d1"
    cluster.at(T0 + 52, InstanceDeleted(instance_id="i1"))
    cluster.at(T0 + 53, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    cluster.at(T0 + 80.1234, *ready("i2", 1))
    (resolved,) = cluster.look(T0 + 81)
    assert isinstance(resolved, IncidentResolved)
    assert resolved.downtime_s == 29.873  # to the millisecond


def drained() -> Cluster:
    cluster = serving()
    cluster.at(T0 + 20, NodeDrainStarted(name="studio", when="2026-12-01T12:03:24.000Z"))
    cluster.look(T0 + 20)
    return cluster


def test_a_drain_that_ends_is_finished_and_one_uncordoned_is_not() -> None:
    cluster = drained()
    cluster.at(T0 + 30, NodeDrainEnded(name="studio"))
    (finished,) = cluster.look(T0 + 30)
    assert isinstance(finished, DrainFinished)
    assert (finished.node, finished.started) == ("studio", "2026-12-01T12:03:24.000Z")
    assert finished.id == "drain_finished:studio:2026-12-01T12:03:24.000Z"
    assert (
        finished.text
        == "exo-deploy: drain of studio finished: nothing runs there (it stays cordoned)"
    )
    other = drained()
    other.at(T0 + 30, NodeUncordoned(name="studio"))
    assert other.look(T0 + 30) == []
    cordoned = serving()
    cordoned.look(T0)
    cordoned.at(T0 + 30, NodeCordoned(name="studio"))
    assert cordoned.look(T0 + 30) == []


def test_a_drain_is_stuck_once_per_reason_from_the_keeper_notes() -> None:
    cluster = drained()
    note = "cannot move m off studio (cordoned: studio): No cycles found"
    (stuck,) = cluster.look(T0 + 21, {"studio": note})
    assert isinstance(stuck, DrainStuck)
    assert (stuck.node, stuck.reason, stuck.started) == ("studio", note, "2026-12-01T12:03:24.000Z")
    assert stuck.text == f"exo-deploy: drain of studio stuck: {note}"
    assert cluster.look(T0 + 22, {"studio": note}) == []
    assert cluster.look(T0 + 23, {"studio": note + " (again)"}) == []  # still stuck: no news
    assert cluster.look(T0 + 24) == []  # moving again
    (again,) = cluster.look(T0 + 25, {"studio": note})
    assert again.id == stuck.id  # the same reason, the same id: a receiver drops it
    assert stuck.id == (
        f"drain_stuck:studio:2026-12-01T12:03:24.000Z:{hashlib.sha256(note.encode()).hexdigest()[:16]}"
    )


def test_a_drain_stuck_is_said_whatever_another_drain_was_already() -> None:
    cluster = drained()
    cluster.at(T0 + 21, NodeDrainStarted(name="mini-a", when="2026-12-01T12:03:25.000Z"))
    cluster.look(T0 + 21, {"mini-a": "already"})
    (stuck,) = cluster.look(T0 + 22, {"mini-a": "already", "studio": "no room"})
    assert stuck.model_dump()["node"] == "studio"
    # A note for a node with no drain is none of the drains' business.
    assert cluster.look(T0 + 23, {"mini-a": "already", "studio": "no room", "x": "?"}) == []


@pytest.mark.parametrize(
    "notice",
    [
        IncidentOpened(
            id="a", at="t", text="x", deployment_id="d", model_id="m", cause="c", start="s"
        ),
        IncidentResolved(
            id="a",
            at="t",
            text="x",
            deployment_id="d",
            model_id="m",
            cause="c",
            start="s",
            end="e",
            downtime_s=1.5,
        ),
        CantPlace(
            id="a", at="t", text="x", deployment_id="d", model_id="m", reason="r", down_since=None
        ),
        ServingAgain(id="a", at="t", text="x", deployment_id="d", model_id="m", since="s"),
        DrainFinished(id="a", at="t", text="x", node="n", started="s"),
        DrainStuck(id="a", at="t", text="x", node="n", started="s", reason="r"),
        RequestsFailing(
            id="a",
            at="t",
            text="x",
            deployment_id="d",
            model_id="m",
            failed=3,
            chats=4,
            window_s=60.0,
            since="s",
            status="placing",
        ),
        RequestsRecovered(
            id="a",
            at="t",
            text="x",
            deployment_id="d",
            model_id="m",
            since="s",
            last_failed=None,
            answered=1,
            failed=0,
            window_s=180.0,
        ),
    ],
)
def test_every_notice_reads_back_as_its_kind(notice: AnyNotice) -> None:
    read = NOTICE_ADAPTER.validate_json(notice.model_dump_json())
    assert read == notice
    assert type(read) is type(notice)
    assert notice.model_dump()["kind"] == notice.kind


def test_times_are_written_as_a_person_reads_them() -> None:
    assert iso_utc_of(T0 + 0.25) == "2026-12-01T12:03:04.250Z"
    assert iso_utc_of(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc_of(951_782_400.0) == "2000-02-29T00:00:00.000Z"  # a leap day
    assert iso_utc_of(1_709_251_199.999) == "2024-02-29T23:59:59.999Z"
    assert clock_utc_of(T0) == "12:03:04"
    assert [duration_words(s) for s in (42, 60, 185, 7800, 7200)] == [
        "42 s",
        "1 min",
        "3 min 5 s",
        "2 h 10 min",
        "2 h",
    ]


def test_an_incident_with_no_recovery_to_tell_resolves_without_phases() -> None:
    cluster = Cluster().at(T0, named("n-studio", "studio"))
    cluster.at(T0, DeploymentCreated(deployment=DEPLOYMENT))
    cluster.at(T0 + 1, DeploymentPlacementFailed(deployment_id="d1", error="no room"))
    cluster.look(T0 + 1)
    cluster.at(T0 + 5, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    cluster.at(T0 + 9, *ready("i1", 1))
    resolved = next(n for n in cluster.look(T0 + 9) if isinstance(n, IncidentResolved))
    assert resolved.phases is None
    assert resolved.text.endswith("after 9 s down (unplaceable: no room)")  # since created


def test_phases_in_words_leave_out_what_took_no_time() -> None:
    assert phases_words(RecoveryPhases(detected=8.0, placed=0.05, downloaded=0.0, loaded=3.24)) == (
        "detected 8.0 s, placed 0.05 s, loaded 3.2 s"
    )
    assert phases_words(RecoveryPhases(detected=0.0, placed=0.0, downloaded=125.0, loaded=0.0)) == (
        "downloaded 2 min 5 s"
    )
    assert phases_words(RecoveryPhases(detected=0.0, placed=0.0, downloaded=0.0, loaded=0.0)) == (
        "at once"
    )


def test_a_broken_instance_is_said_once_per_instance_and_problem() -> None:
    state = State(deployments={"d1": Deployment(deployment_id="d1", model_card=card("m/x"))})
    quiet = Observed(state)
    broken = Observed(state, unhealthy={"d1": ("i1", "stalled", "runner on a silent")})
    found, _ = notices(quiet, broken, 0.0, AlertMemory())
    assert [(type(n), n.id, n.text) for n in found] == [
        (
            InstanceUnhealthy,
            "instance_unhealthy:i1:stalled",
            "exo-deploy: m/x: instance i1 stalled: runner on a silent",
        )
    ]
    again = Observed(state, unhealthy={"d1": ("i1", "stalled", "runner on a silent for longer")})
    assert notices(broken, again, 1.0, AlertMemory())[0] == []  # the same problem: once
    other = Observed(state, unhealthy={"d1": ("i1", "hollow", "runner gone")})
    assert [n.id for n in notices(again, other, 2.0, AlertMemory())[0]] == [
        "instance_unhealthy:i1:hollow"
    ]
    assert notices(other, quiet, 3.0, AlertMemory())[0] == []  # healed: nothing to say


def test_a_repaired_broken_instance_resolves_its_incident_naming_it_and_its_problem() -> None:
    cluster = serving()
    cluster.look(T0 + 10)
    gone = RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerShutdown())
    cluster.at(T0 + 20, gone)
    (opened,) = cluster.look(T0 + 20)
    assert isinstance(opened, IncidentOpened)
    assert opened.cause == "runner on studio went away"  # before it is recognised
    move = InstanceMove(deployment_id="d1", old_instance_id="i1", new_instance_id="i2")
    why = "runner on studio lost its status for 5s while studio is alive"
    placed = DeploymentRepairPlaced(deployment_id="d1", move=move, problem="hollow", why=why)
    cluster.at(T0 + 25, placed, InstanceDeleted(instance_id="i1"))
    cluster.at(T0 + 25, InstanceCreated(instance=build_instance(MODEL, ["n-mini"], "i2")))
    cluster.at(T0 + 27, *ready("i2", 1))
    (resolved,) = cluster.look(T0 + 27)
    assert isinstance(resolved, IncidentResolved)
    assert resolved.cause == f"instance i1 hollow on studio, mini-a: {why}"
    assert resolved.problem == "hollow"
    assert resolved.phases == RecoveryPhases(detected=5.0, placed=0.0, downloaded=0.0, loaded=2.0)
    assert f"({resolved.cause}): detected 5.0 s, loaded 2.0 s" in resolved.text
