"""The host's side of a placement crash: the pure keeper keeps the exception, and the hosted
keeper (the master's and the bridge's, through ``start_keeper``) logs it with its traceback,
once per deployment and distinct error, however many steps see it again."""

from __future__ import annotations

import logging

import pytest
from keeper_harness import AFTER_GRACE, Cluster, RecordingPlace

from keeper.core.keeper import Keeper
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import NodeSuspected
from keeper.runtime.hosted_keeper import HostedKeeper, default_keeper, start_keeper

T = AFTER_GRACE
LOGGER = "keeper.runtime.hosted_keeper"


def crash_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and "placement crashed" in r.message]


def hosted_cluster(recorder: RecordingPlace) -> tuple[Cluster, HostedKeeper]:
    cluster = Cluster(place=recorder)
    cluster.add_nodes("node-a")
    hosted = start_keeper(default_keeper, 0.0, AFTER_GRACE, recorder)
    assert isinstance(hosted, HostedKeeper)
    cluster.keeper = hosted  # type: ignore[assignment]  # the harness steps what it holds
    return cluster, hosted


def test_a_crash_is_logged_once_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    recorder = RecordingPlace()
    recorder.failing["crashy"] = RuntimeError("boom")
    cluster, _ = hosted_cluster(recorder)
    crashy = cluster.deploy("crashy", deployment_id="dep-1")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        for retry in range(4):  # the same crash, attempt after attempt
            cluster.step(T + retry * UNPLACEABLE_RETRY)
    [record] = crash_records(caplog)
    assert crashy in record.message and "RuntimeError: boom" in record.message
    assert record.exc_info is not None and record.exc_info[1] is recorder.failing["crashy"]
    assert "Traceback" in caplog.text and "raise failure" in caplog.text


def test_each_distinct_crash_is_logged_and_a_recovered_one_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = RecordingPlace()
    recorder.failing["crashy"] = RuntimeError("boom")
    recorder.failing["other"] = RuntimeError("boom")
    cluster, _ = hosted_cluster(recorder)
    cluster.deploy("crashy", deployment_id="dep-1")
    cluster.deploy("other", deployment_id="dep-2")
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        cluster.step(T)  # the same error for two deployments: one line each
        recorder.failing["crashy"] = KeyError("node-x")
        cluster.step(T + UNPLACEABLE_RETRY)  # another error for dep-1 only
        recorder.failing["crashy"] = ValueError("No cycles found with sufficient memory")
        cluster.step(T + 2 * UNPLACEABLE_RETRY)  # a reason, not a crash
        recorder.failing["crashy"] = KeyError("node-x")
        cluster.step(T + 3 * UNPLACEABLE_RETRY)  # crashing again after that is news
    logged = [(r.message.split()[4], r.exc_info is not None) for r in crash_records(caplog)]
    assert logged == [
        ("dep-1", True),
        ("dep-2", True),
        ("dep-1", True),
        ("dep-1", True),
    ]


def test_the_hosted_keeper_answers_as_its_keeper() -> None:
    recorder = RecordingPlace()
    cluster, hosted = hosted_cluster(recorder)
    deployment_id = cluster.deploy("m")
    assert isinstance(hosted.inner, Keeper)
    assert hosted.timers(cluster.state, 0.0) == hosted.inner.timers(cluster.state, 0.0)
    assert cluster.step(T)  # placed through the host
    assert hosted.delete(deployment_id, cluster.state) != []


def test_a_failover_held_back_is_logged_once_with_why(caplog: pytest.LogCaptureFixture) -> None:
    # One node: a replacement for its instance, suspect, fits nowhere else.
    recorder = RecordingPlace()
    cluster, _ = hosted_cluster(recorder)
    deployment_id = cluster.deploy("m")
    cluster.step(T)
    (instance_id,) = cluster.state.instances
    cluster.make_ready(instance_id)
    cluster.apply(NodeSuspected(node_id="node-a", last_heard=T, at=T + 3))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for k in range(3):
            cluster.step(T + 4 + k)
    said = [r.message for r in caplog.records if r.name == LOGGER]
    assert len(said) == 1
    assert said[0].startswith(f"deployment {deployment_id}: cannot place a replacement for")
