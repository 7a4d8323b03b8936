"""The event log: what a crash can leave is recovered, what it cannot explain is refused, and
the State rebuilt from disk (snapshot + tail, or the whole log) is the State the master held."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anyio
import pytest

from keeper.core.placement import place_instance
from keeper.model.apply import apply
from keeper.model.catalog import catalog_by_id
from keeper.model.events import (
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    NodeGatheredInfo,
    NodeTimedOut,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
)
from keeper.model.state import (
    Backend,
    Connection,
    Deployment,
    Memory,
    MemoryUsage,
    Multiaddr,
    RunnerLoading,
    RunnerReady,
    Sharding,
    SocketConnection,
    State,
)
from keeper.runtime import event_log as event_log_module
from keeper.runtime.dir_lock import LOCK_FILE
from keeper.runtime.event_log import (
    LOG_FILE,
    PREVIOUS_SNAPSHOT_FILE,
    SNAPSHOT_FILE,
    EventLog,
    EventLogCorruptError,
)
from keeper.sim.master.service import Master, MasterConfig

CATALOG = catalog_by_id()
QWEN = CATALOG["mlx-community/Qwen3-0.6B-4bit"]
LLAMA = CATALOG["mlx-community/Llama-3.2-1B-Instruct-4bit"]


def story(rounds: int = 3) -> list[AnyEvent]:
    """A varied history: nodes join and link, deployments come and go, instances are placed,
    runners load, a node times out. Each event is valid against the state before it."""
    events: list[AnyEvent] = []
    state = State()

    def add(event: AnyEvent) -> None:
        nonlocal state
        events.append(event)
        state = apply(state, event)

    for round_ in range(rounds):
        nodes = [f"n{round_}-{i}" for i in range(3)]
        for i, node in enumerate(nodes):
            add(
                NodeGatheredInfo(
                    node_id=node,
                    when=f"2026-01-01T00:00:{i:02d}.000Z",
                    memory=MemoryUsage(
                        ram_total=Memory.from_gb(32), ram_available=Memory.from_gb(16 + i)
                    ),
                    backends=[Backend.MLX_METAL],
                )
            )
        for source, sink in zip(nodes, [*nodes[1:], nodes[0]], strict=True):
            edge = SocketConnection(sink_multiaddr=Multiaddr(address="/ip4/10.0.0.1/tcp/1"))
            add(TopologyEdgeCreated(conn=Connection(source=source, sink=sink, edge=edge)))
        for card in (QWEN, LLAMA):
            deployment = Deployment(deployment_id=f"d-{round_}-{card.n_layers}", model_card=card)
            add(DeploymentCreated(deployment=deployment))
            instance = place_instance(state, card, Sharding.PIPELINE, "MlxRing", 1)
            add(InstanceCreated(instance=instance))
            for runner in instance.shard_assignments.node_to_runner.values():
                add(
                    RunnerStatusUpdated(
                        runner_id=runner,
                        runner_status=RunnerLoading(layers_loaded=3, total_layers=card.n_layers),
                    )
                )
                add(RunnerStatusUpdated(runner_id=runner, runner_status=RunnerReady()))
        first_instance = sorted(state.instances)[0]
        add(InstanceDeleted(instance_id=first_instance))
        add(DeploymentDeleted(deployment_id=f"d-{round_}-{QWEN.n_layers}"))
        add(NodeTimedOut(node_id=nodes[0]))
    return events


def write_log(
    data_dir: Path, events: list[AnyEvent], *, batch: int = 4, snapshot_every: int | None = None
) -> State:
    """Append ``events`` as the router would; returns the live State."""
    log = EventLog(data_dir)
    state = log.open().state
    since_snapshot = 0
    for start in range(0, len(events), batch):
        chunk = [
            IndexedEvent(idx=start + offset, event=event)
            for offset, event in enumerate(events[start : start + batch])
        ]
        log.append(chunk)
        for indexed in chunk:
            state = apply(state, indexed.event)
        state = state.model_copy(update={"last_event_applied_idx": chunk[-1].idx})
        since_snapshot += len(chunk)
        if snapshot_every is not None and since_snapshot >= snapshot_every:
            log.write_snapshot(state)
            since_snapshot = 0
    log.close()
    return state


def reopen(data_dir: Path) -> State:
    log = EventLog(data_dir)
    state = log.open().state
    log.close()
    return state


def test_replay_equals_the_live_state(tmp_path: Path) -> None:
    events = story()
    live = write_log(tmp_path, events)
    assert live.deployments and live.instances and live.runners  # the story leaves something
    recovered = EventLog(tmp_path).open()
    assert recovered.state == live
    assert recovered.events_replayed == len(events)
    assert recovered.state.last_event_applied_idx == len(events) - 1


def test_snapshot_plus_tail_equals_full_replay(tmp_path: Path) -> None:
    events = story(rounds=4)
    live = write_log(tmp_path, events, batch=3, snapshot_every=10)
    log = EventLog(tmp_path)
    from_snapshot = log.open()
    log.close()
    assert from_snapshot.snapshot_idx is not None
    assert from_snapshot.events_replayed < 10 + 3  # only the tail
    (tmp_path / SNAPSHOT_FILE).unlink()
    log = EventLog(tmp_path)
    from_previous = log.open()  # the snapshot before it, and a longer tail
    log.close()
    assert from_previous.snapshot_file == PREVIOUS_SNAPSHOT_FILE
    assert from_previous.events_replayed > from_snapshot.events_replayed
    (tmp_path / PREVIOUS_SNAPSHOT_FILE).unlink()
    full = EventLog(tmp_path).open()
    assert full.snapshot_idx is None
    assert full.events_replayed == len(events)
    assert from_snapshot.state == from_previous.state == full.state == live


def test_torn_last_line_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    events = story(rounds=1)
    live = write_log(tmp_path, events)
    path = tmp_path / LOG_FILE
    whole = path.read_bytes()
    torn = IndexedEvent(idx=len(events), event=NodeTimedOut(node_id="x")).model_dump_json()
    path.write_bytes(whole + torn.encode()[:25])  # a write cut short by a crash
    with caplog.at_level(logging.WARNING):
        log = EventLog(tmp_path)
        recovery = log.open()
    assert recovery.state == live
    assert recovery.torn_bytes == 25
    assert "torn" in caplog.text
    assert path.read_bytes() == whole
    # The log goes on from where it was whole.
    log.append([IndexedEvent(idx=len(events), event=NodeTimedOut(node_id="n0-1"))])
    log.close()
    assert "n0-1" not in reopen(tmp_path).topology.nodes


def test_a_complete_line_missing_its_newline_is_torn_too(tmp_path: Path) -> None:
    events = story(rounds=1)
    live = write_log(tmp_path, events)
    path = tmp_path / LOG_FILE
    extra = IndexedEvent(idx=len(events), event=NodeTimedOut(node_id="n0-1")).model_dump_json()
    path.write_bytes(path.read_bytes() + extra.encode())  # no "\n": never acknowledged
    assert reopen(tmp_path) == live


def test_damage_in_the_middle_is_refused_naming_the_file(tmp_path: Path) -> None:
    write_log(tmp_path, story(rounds=1))
    path = tmp_path / LOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    lines[3] = b'{"idx": 3, "event": {"NoSuchEvent": {}}}\n'
    path.write_bytes(b"".join(lines))
    with pytest.raises(EventLogCorruptError, match=r"events\.jsonl.*byte \d+"):
        EventLog(tmp_path).open()


def test_a_gap_in_the_indices_is_refused(tmp_path: Path) -> None:
    write_log(tmp_path, story(rounds=1))
    path = tmp_path / LOG_FILE
    lines = path.read_bytes().splitlines(keepends=True)
    del lines[5]
    path.write_bytes(b"".join(lines))
    with pytest.raises(EventLogCorruptError, match="gap"):
        EventLog(tmp_path).open()


def test_unreadable_snapshots_fall_back_to_the_previous_one_then_to_full_replay(
    tmp_path: Path,
) -> None:
    events = story(rounds=2)
    live = write_log(tmp_path, events, snapshot_every=8)
    (tmp_path / SNAPSHOT_FILE).write_text("{not json")
    log = EventLog(tmp_path)
    recovery = log.open()
    log.close()
    assert recovery.snapshot_file == PREVIOUS_SNAPSHOT_FILE
    assert recovery.state == live
    (tmp_path / PREVIOUS_SNAPSHOT_FILE).write_text("{not json")
    recovery = EventLog(tmp_path).open()  # the log was never compacted: it holds everything
    assert recovery.snapshot_idx is None
    assert recovery.state == live


def test_a_snapshot_that_disagrees_with_the_log_is_ignored(tmp_path: Path) -> None:
    events = story(rounds=2)
    live = write_log(tmp_path, events, snapshot_every=8)
    snapshot = json.loads((tmp_path / SNAPSHOT_FILE).read_text())
    snapshot["logOffset"] += 7  # points into the middle of a line
    (tmp_path / SNAPSHOT_FILE).write_text(json.dumps(snapshot))
    assert reopen(tmp_path) == live


def test_snapshots_are_replaced_atomically(tmp_path: Path) -> None:
    write_log(tmp_path, story(rounds=2), snapshot_every=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        LOG_FILE,
        LOCK_FILE,
        SNAPSHOT_FILE,
        PREVIOUS_SNAPSHOT_FILE,
    ]


def test_in_memory_log_keeps_nothing() -> None:
    log = EventLog(None)
    assert log.open().state == State()
    log.append([IndexedEvent(idx=0, event=NodeTimedOut(node_id="x"))])
    log.write_snapshot(State(last_event_applied_idx=0))
    log.close()


@pytest.mark.anyio
async def test_restart_keeps_deployments(tmp_path: Path) -> None:
    first = Master(tmp_path)
    kept_id: str | None = None
    async with anyio.create_task_group() as group:
        await group.start(first.run)
        kept_id = (await first.create_deployment(QWEN.model_id)).deployment_id
        gone = await first.create_deployment(LLAMA.model_id, min_nodes=2)
        assert gone.deployment_id is not None
        await first.delete_deployment(gone.deployment_id)
        group.cancel_scope.cancel()
    second = Master(tmp_path)
    async with anyio.create_task_group() as group:
        await group.start(second.run)
        assert list(second.state.deployments) == [kept_id]
        assert second.state == first.state
        group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_batched_fsync_loses_no_acknowledged_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fsyncs: list[int] = []
    real_fsync = event_log_module.os.fsync
    monkeypatch.setattr(
        event_log_module.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1]
    )
    master = Master(tmp_path, config=MasterConfig(snapshot_every_events=10**9, compact_log=False))
    acknowledged: list[str] = []
    models = list(CATALOG)
    # Each deployment, its node reports, and each deployment's first serving record.
    expected = 2 * len(models) + 20 * 50
    async with anyio.create_task_group() as group:
        await group.start(master.run)

        async def deploy(model_id: str) -> None:
            response = await master.create_deployment(model_id)
            assert response.deployment_id is not None
            acknowledged.append(response.deployment_id)

        for model_id in models:
            group.start_soon(deploy, model_id)
        # Bursts of node reports go round the router together.
        for burst in range(20):
            await master.emit(
                [
                    NodeGatheredInfo(node_id=f"n{i}", when=f"2026-01-01T00:00:{burst:02d}Z")
                    for i in range(50)
                ]
            )
        with anyio.fail_after(5):
            while master.state.last_event_applied_idx < expected - 1:
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()  # a clean stop right after the acknowledgements
    events_logged = len((tmp_path / LOG_FILE).read_bytes().splitlines())
    assert events_logged == expected
    assert len(fsyncs) < events_logged / 10  # batched, not one fsync per event
    assert sorted(reopen(tmp_path).deployments) == sorted(acknowledged)
    assert len(acknowledged) == len(models)
