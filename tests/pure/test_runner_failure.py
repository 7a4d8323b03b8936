"""A failed runner in a few words (``keeper.model.runner_failure``), and everyone who says it:
the deployment's health ``why``, an incident's cause, the ``instance_unhealthy`` webhook, the
TUI's runner rows and timeline. The real case is a runner of a real exo cluster that could not
render its chat template: a sixty-line traceback in ``errorMessage``."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st
from keeper_harness import build_instance, card
from recorded_exo import cluster_recorded

from exo_deploy_tui.model.derive import derive, instance_rows
from exo_deploy_tui.model.timeline import entries_for_event
from keeper.core.alerts import AlertMemory, Observed, notices
from keeper.model.apply import apply
from keeper.model.events import DeploymentCreated, InstanceCreated, RunnerStatusUpdated
from keeper.model.exo_state import ExoRead, read_exo_state
from keeper.model.history import serving_changes
from keeper.model.instance_health import FAILED_STILL_S, NO_MARKS, track, verdict
from keeper.model.notices import InstanceUnhealthy
from keeper.model.runner_failure import (
    MAX_FAILURE_CHARS,
    NO_MESSAGE,
    diagnostic_words,
    error_words,
    failure_words,
)
from keeper.model.state import (
    Deployment,
    NodeIdentity,
    RunnerFailed,
    RunnerReady,
    State,
    Topology,
)

JINJA = (
    "ImportError: apply_chat_template requires jinja2 to be installed. "
    "Please install it using `pip install jinja2`."
)


def recorded_failure() -> RunnerFailed:
    got = read_exo_state(json.loads(cluster_recorded("state-runner-failed")))
    assert isinstance(got, ExoRead)
    (status,) = got.state.runners.values()
    assert isinstance(status, RunnerFailed) and status.error_message is not None
    assert len(status.error_message.splitlines()) > 40  # the whole traceback
    return status


def test_a_real_runners_traceback_is_said_by_its_last_line() -> None:
    assert failure_words(recorded_failure()) == JINJA


def test_a_message_without_a_traceback_is_kept_its_lines_joined() -> None:
    assert error_words("Terminated (exitcode=1\nRunner error: boom)") == (
        "Terminated (exitcode=1 Runner error: boom)"
    )
    assert failure_words(RunnerFailed(error_message="Metal out of memory")) == (
        "Metal out of memory"
    )
    assert failure_words(RunnerFailed()) == NO_MESSAGE
    assert failure_words(RunnerFailed(error_message=" \n)\n")) == NO_MESSAGE


def test_a_traceback_with_no_error_line_after_it_keeps_the_message() -> None:
    # Only frames (indented) after the traceback's head: nothing names the error.
    message = 'Terminated (exitcode=1\nTraceback (most recent call last):\n  File "x", line 1\n)'
    assert error_words(message) == (
        'Terminated (exitcode=1 Traceback (most recent call last): File "x", line 1'
    )
    # The last traceback's error, when the message holds two (one raised handling the other).
    chained = (
        "Traceback (most recent call last):\nKeyError: 1\n\nTraceback (most recent call last):\n"
    )
    chained += '  File "y", line 2\nValueError: bad'
    assert error_words(chained) == "ValueError: bad"


def test_diagnostics_follow_the_error_by_their_message() -> None:
    timeout = json.dumps({"RunnerMetalGpuTimeout": {"message": "[METAL] GPU Timeout"}})
    status = RunnerFailed(error_message="Terminated (exitcode=1)", diagnostics=(timeout, "raw"))
    assert failure_words(status) == "Terminated (exitcode=1); [METAL] GPU Timeout; raw"
    assert failure_words(RunnerFailed(diagnostics=(timeout,))) == "[METAL] GPU Timeout"
    # Anything else exo may send is said as it came, on one line.
    assert diagnostic_words('{"A": {"message": "  "}}') == '{"A": {"message": " "}}'
    assert diagnostic_words('{"A": 1}') == '{"A": 1}'
    assert diagnostic_words('{"A": {}, "B": {}}') == '{"A": {}, "B": {}}'
    assert diagnostic_words('["x"]') == '["x"]'
    assert diagnostic_words("two\nlines") == "two lines"


def test_long_words_are_cut_at_the_cap_with_an_ellipsis() -> None:
    exact = "x" * MAX_FAILURE_CHARS
    assert failure_words(RunnerFailed(error_message=exact)) == exact
    cut = failure_words(RunnerFailed(error_message=exact + "y"))
    assert cut == "x" * (MAX_FAILURE_CHARS - 1) + "…"


@given(st.text(), st.lists(st.text(), max_size=3))
def test_the_words_are_one_line_within_the_cap(message: str, diagnostics: list[str]) -> None:
    words = failure_words(RunnerFailed(error_message=message, diagnostics=tuple(diagnostics)))
    assert 0 < len(words) <= MAX_FAILURE_CHARS
    assert "\n" not in words and "\r" not in words


# --- everyone who says it ----------------------------------------------------------------------

MODEL = card("m")


def failed_on_studio() -> tuple[State, State]:
    """studio serving i1 alone, then its runner failing as the real one did."""
    state = State(
        topology=Topology(nodes=["n-studio"]),
        node_identities={"n-studio": NodeIdentity(friendly_name="studio")},
    )
    state = apply(
        state, DeploymentCreated(deployment=Deployment(deployment_id="d1", model_card=MODEL))
    )
    state = apply(state, InstanceCreated(instance=build_instance(MODEL, ["n-studio"], "i1")))
    ready = apply(state, RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=RunnerReady()))
    (change,) = serving_changes(state, ready, 10.0)
    ready = apply(ready, change)
    failed = RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=recorded_failure())
    return ready, apply(ready, failed)


def test_the_incident_a_failed_runner_caused_names_its_error() -> None:
    ready, failed = failed_on_studio()
    (change,) = serving_changes(ready, failed, 20.0)
    assert change.record.cause == f"runner failed on studio: {JINJA}"


def test_the_health_why_and_the_unhealthy_webhook_name_its_error() -> None:
    _, failed = failed_on_studio()
    marks = track(NO_MARKS, failed, 20.0)
    found = verdict(failed.instances["i1"], failed, marks, 20.0 + FAILED_STILL_S)
    assert found is not None
    assert found.why == f"runner on studio failed 1m00s ago: {JINJA}"
    before = Observed(state=failed)
    after = Observed(state=failed, unhealthy={"d1": ("i1", found.problem, found.why)})
    sent, _ = notices(before, after, 80.0, AlertMemory())
    (unhealthy,) = [notice for notice in sent if isinstance(notice, InstanceUnhealthy)]
    assert unhealthy.why == found.why
    assert JINJA in unhealthy.text and len(unhealthy.text) < 400


def test_the_tui_says_the_same_words() -> None:
    ready, failed = failed_on_studio()
    (instance,) = instance_rows(
        failed, derive(failed, {}), quiet_for=lambda _: None, broken=lambda _: None
    )
    (row,) = instance.runners
    assert row.error == JINJA
    event = RunnerStatusUpdated(runner_id="i1-runner-0", runner_status=recorded_failure())
    (entry,) = entries_for_event(event, ready, failed, 20.0, {}, {})
    assert entry.text.endswith(f": {JINJA}")


def test_a_line_indented_by_one_space_after_the_error_is_not_the_error() -> None:
    message = "Traceback (most recent call last):\n  File x\nValueError: boom\n x"
    assert error_words(message) == "ValueError: boom"


def test_words_cut_at_a_space_end_on_the_word_before_it() -> None:
    message = "x" * (MAX_FAILURE_CHARS - 2) + " " + "y" * 10
    words = failure_words(RunnerFailed(error_message=message))
    assert words == "x" * (MAX_FAILURE_CHARS - 2) + "…"
