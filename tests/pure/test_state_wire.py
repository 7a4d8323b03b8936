"""The data model reads and writes exo's JSON: camelCase, tagged unions, unknown keys ignored."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from pydantic import ValidationError
from recorded_exo import FIXTURES

from keeper.model.catalog import BUILTIN_MODEL_CARDS, catalog_by_id, model_card_from_toml
from keeper.model.events import (
    EVENT_ADAPTER,
    AnyEvent,
    DeploymentCreated,
    DeploymentDeleted,
    DeploymentOptionsChanged,
    DeploymentPlaced,
    DeploymentPlacementFailed,
    DeploymentPriorityChanged,
    DeploymentRepairChanged,
    DeploymentRepairPlaced,
    DeploymentReplacementPlaced,
    DeploymentScaled,
    DeploymentServingChanged,
    DeploymentStandbyChanged,
    DownloadDeletionRequested,
    DownloadRequested,
    DrainReplacementPlaced,
    FailoverReplacementPlaced,
    IndexedEvent,
    InstanceCreated,
    InstanceDeleted,
    InstanceFoundBroken,
    NodeConfirmedDead,
    NodeCordoned,
    NodeDownloadProgress,
    NodeDrainEnded,
    NodeDrainStarted,
    NodeGatheredInfo,
    NodeHeardAgain,
    NodeSuspected,
    NodeTimedOut,
    NodeUncordoned,
    RepairIncidentsExpired,
    RunnerStatusUpdated,
    TopologyEdgeCreated,
    TopologyEdgeDeleted,
)
from keeper.model.state import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MAX_REPLICAS,
    Backend,
    Connection,
    Deployment,
    DiskUsage,
    InstanceMeta,
    InstanceMove,
    Memory,
    MemoryUsage,
    MlxJacclInstance,
    MlxRingInstance,
    Multiaddr,
    NodeIdentity,
    PipelineShardMetadata,
    RDMAConnection,
    RunnerFailed,
    RunnerLoading,
    RunnerReady,
    RunnerRunning,
    ServingRecord,
    Sharding,
    SocketConnection,
    State,
    SystemVitals,
    TensorShardMetadata,
)
from keeper.model.wire import first_validation_error
from keeper.sim.link.protocol import (
    MASTER_MESSAGE,
    NODE_MESSAGE,
    ChatChunk,
    ChatRequest,
    Hello,
    LinkUp,
    RunnerStatusReport,
    Welcome,
)

STUDIO = "12D3KooWstudioxxxx"
ULTRA2 = "12D3KooWultra2xxxx"


@pytest.fixture(scope="module")
def exo_json() -> dict[str, Any]:
    return json.loads((FIXTURES / "exo_state.json").read_text())


@pytest.fixture(scope="module")
def state(exo_json: dict[str, Any]) -> State:
    return State.model_validate(exo_json)


def test_exo_state_parses_every_kind_it_holds(state: State) -> None:
    kinds = {type(i) for i in state.instances.values()}
    assert kinds == {MlxRingInstance, MlxJacclInstance}
    shard_kinds = {
        type(shard)
        for instance in state.instances.values()
        for shard in instance.shard_assignments.runner_to_shard.values()
    }
    assert shard_kinds == {PipelineShardMetadata, TensorShardMetadata}
    runner_kinds = {type(r).__name__ for r in state.runners.values()}
    assert runner_kinds == {
        "RunnerReady",
        "RunnerLoading",
        "RunnerRunning",
        "RunnerFailed",
        "RunnerIdle",
        "RunnerWarmingUp",
    }
    edges = state.topology.connections[STUDIO][ULTRA2]
    assert [type(e) for e in edges] == [RDMAConnection, SocketConnection]
    assert state.node_backends[ULTRA2] == [Backend.MLX_METAL, Backend.MLX_CPU]
    assert state.node_rdma_ctl[STUDIO].enabled is True
    assert state.last_event_applied_idx == 1842
    assert len(state.deployments) == 2


def test_exo_state_field_values(state: State) -> None:
    ring = state.instances["d1e5a83e-505d-463e-bf4a-3ccaca50978f"]
    assert isinstance(ring, MlxRingInstance)
    shard = ring.shard_assignments.runner_to_shard["e1f3ce9b-bec1-4d9c-bb56-093c30a5668d"]
    assert (shard.start_layer, shard.end_layer, shard.n_layers) == (10, 48, 48)
    assert shard.model_card.storage_size.in_bytes == 17_612_931_072
    assert ring.hosts_by_node["12D3KooWminibxxxxx"][1].ip == "192.0.2.10"
    loading = state.runners["e1f3ce9b-bec1-4d9c-bb56-093c30a5668d"]
    assert loading == RunnerLoading(layers_loaded=9, total_layers=38)
    failed = state.runners["6b1daf2e-3c4a-4d5e-9f70-8b9cad1e2f30"]
    assert isinstance(failed, RunnerFailed)
    assert failed.error_message == "Metal out of memory while loading layer 41"
    socket_edge = state.topology.connections[STUDIO]["12D3KooWminiaxxxxx"][0]
    assert isinstance(socket_edge, SocketConnection)
    assert socket_edge.sink_multiaddr.ip_address == "192.0.2.11"
    assert socket_edge.sink_multiaddr.port == 52415
    unplaceable = state.deployments["7d9e0f1a-2b3c-4d5e-8f60-718293a4b5c6"]
    assert unplaceable.placement_error == "No cycles found with sufficient memory"
    assert unplaceable.instance_id is None
    assert unplaceable.sharding is Sharding.PIPELINE
    assert unplaceable.instance_meta is InstanceMeta.MLX_RING


def test_exo_state_round_trips(state: State) -> None:
    dumped = state.model_dump_json()
    assert State.model_validate_json(dumped) == state
    again = json.loads(dumped)
    # exo's spelling: camelCase keys, tagged unions, memory as inBytes.
    assert "lastEventAppliedIdx" in again and "nodeMemory" in again
    ring = again["instances"]["d1e5a83e-505d-463e-bf4a-3ccaca50978f"]
    assert list(ring) == ["MlxRingInstance"]
    runner_to_shard = ring["MlxRingInstance"]["shardAssignments"]["runnerToShard"]
    assert all(list(s) == ["PipelineShardMetadata"] for s in runner_to_shard.values())
    assert again["runners"]["8e7c4d07-3cb9-4365-ba1c-511f30a8ae50"] == {"RunnerReady": {}}
    assert again["nodeMemory"][STUDIO]["ramTotal"] == {"inBytes": 103079215104}
    assert again["topology"]["connections"][STUDIO][ULTRA2][0] == {
        "sourceRdmaIface": "rdma_en3",
        "sinkRdmaIface": "rdma_en4",
    }
    # The multiaddr carries exo's parsed parts, in exo's own (snake_case) spelling.
    assert again["topology"]["connections"][STUDIO]["12D3KooWminiaxxxxx"][0] == {
        "sinkMultiaddr": {
            "address": "/ip4/192.0.2.11/tcp/52415",
            "address_type": "ip4",
            "ip_address": "192.0.2.11",
            "port": 52415,
        }
    }


def test_unknown_keys_are_ignored_not_kept(state: State, exo_json: dict[str, Any]) -> None:
    assert "clusterName" in exo_json
    dumped = state.model_dump(mode="json")
    assert "clusterName" not in dumped and "thunderboltBridgeCycles" not in dumped
    card = dumped["deployments"]["0c5b6a3e-8f1d-4b8e-9a57-1f2e3d4c5b6a"]["modelCard"]
    assert "samplingDefaults" not in card


def test_snake_case_input_is_accepted() -> None:
    memory = MemoryUsage.model_validate(
        {"ram_total": {"in_bytes": 10}, "ramAvailable": {"inBytes": 4}}
    )
    assert memory.ram_total.in_bytes == 10
    assert memory.ram_available.in_bytes == 4


def test_an_empty_document_is_an_empty_state() -> None:
    state = State.model_validate({})
    assert state.instances == {} and state.topology.nodes == []
    assert state.last_event_applied_idx == -1


def test_a_tag_naming_another_kind_is_refused_with_its_name() -> None:
    with pytest.raises(ValidationError, match="MlxFancyInstance"):
        State.model_validate(
            {"instances": {"i": {"MlxFancyInstance": {"instanceId": "i", "shardAssignments": {}}}}}
        )
    with pytest.raises(ValidationError, match="expected a RunnerReady, got a RunnerLoading"):
        RunnerReady.model_validate({"RunnerLoading": {"layersLoaded": 1}})


def test_model_cards_from_exo_toml_files() -> None:
    catalog = catalog_by_id()
    for path in sorted(FIXTURES.glob("*.toml")):
        card = model_card_from_toml(tomllib.loads(path.read_text()))
        assert card == catalog[card.model_id], path.name


def test_catalog_holds_the_pinned_models() -> None:
    ids = {card.model_id for card in BUILTIN_MODEL_CARDS}
    assert {
        "mlx-community/Qwen3-0.6B-4bit",
        "mlx-community/Llama-3.2-1B-Instruct-4bit",
        "mlx-community/Qwen3-30B-A3B-4bit",
        "mlx-community/Llama-3.3-70B-Instruct-4bit",
        "mlx-community/DeepSeek-V3.1-4bit",
    } <= ids
    assert len(ids) == len(BUILTIN_MODEL_CARDS)


def test_enums_accept_their_string_values() -> None:
    deployment = Deployment.model_validate(
        {
            "deploymentId": "d",
            "modelCard": BUILTIN_MODEL_CARDS[0].model_dump(),
            "sharding": "Tensor",
            "instanceMeta": "MlxJaccl",
        }
    )
    assert deployment.sharding is Sharding.TENSOR
    assert deployment.instance_meta is InstanceMeta.MLX_JACCL
    assert Sharding("Pipeline") == "Pipeline"


def _every_event(state: State) -> list[AnyEvent]:
    deployment = state.deployments["0c5b6a3e-8f1d-4b8e-9a57-1f2e3d4c5b6a"]
    ring = state.instances["d1e5a83e-505d-463e-bf4a-3ccaca50978f"]
    jaccl = state.instances["f2a7c3d4-6e5b-4a98-b1c2-d3e4f5a6b7c8"]
    socket = Connection(
        source="a",
        sink="b",
        edge=SocketConnection(sink_multiaddr=Multiaddr(address="/ip4/1/tcp/2")),
    )
    rdma = Connection(
        source="a", sink="b", edge=RDMAConnection(source_rdma_iface="x", sink_rdma_iface="y")
    )
    return [
        DeploymentCreated(deployment=deployment),
        DeploymentDeleted(deployment_id="d"),
        DeploymentPlaced(deployment_id="d", instance_id="i"),
        DeploymentPlacementFailed(
            deployment_id="d", error="No cycles found with sufficient memory"
        ),
        DeploymentScaled(deployment_id="d", replicas=3),
        DeploymentStandbyChanged(deployment_id="d", standby=2),
        DeploymentPriorityChanged(deployment_id="d", priority=900, preempt=True),
        DownloadRequested(
            deployment_id="d",
            node_id="a",
            shard_metadata=next(iter(ring.shard_assignments.runner_to_shard.values())),
        ),
        DownloadDeletionRequested(deployment_id="d", node_id="a", model_id="m"),
        DeploymentServingChanged(
            deployment_id="d",
            record=ServingRecord(
                at=1_796_000_000.5, serving=False, cause="node studio timed out", begins="created"
            ),
        ),
        InstanceCreated(instance=ring),
        InstanceCreated(instance=jaccl),
        InstanceDeleted(instance_id="i"),
        RunnerStatusUpdated(runner_id="r", runner_status=RunnerLoading(layers_loaded=3)),
        RunnerStatusUpdated(runner_id="r", runner_status=RunnerFailed(error_message="boom")),
        RunnerStatusUpdated(runner_id="r", runner_status=RunnerRunning()),
        NodeGatheredInfo(
            node_id="a",
            when="2026-11-29T20:15:02.114000Z",
            memory=MemoryUsage(ram_total=Memory.from_gb(64), ram_available=Memory.from_gb(60)),
            backends=[Backend.MLX_METAL],
            identity=NodeIdentity(friendly_name="studio"),
        ),
        NodeGatheredInfo(node_id="a", when="2026-11-29T20:15:03Z"),
        NodeGatheredInfo(
            node_id="a",
            when="2026-11-29T20:15:04Z",
            disk=DiskUsage(total=Memory.from_gb(500), available=Memory.from_gb(320)),
            system=SystemVitals(gpu_usage=0.62, temp=58.0, sys_power=95.0),
        ),
        *[
            NodeDownloadProgress(download_progress=entry)
            for entries in state.downloads.values()
            for entry in entries
        ],
        TopologyEdgeCreated(conn=socket),
        TopologyEdgeCreated(conn=rdma),
        TopologyEdgeDeleted(conn=socket),
        NodeTimedOut(node_id="a"),
        NodeSuspected(node_id="a", last_heard=1.5, at=4.5),
        NodeConfirmedDead(node_id="a", last_heard=1.5, at=9.5, why="session closed"),
        NodeHeardAgain(node_id="a", at=5.0),
        NodeCordoned(name="studio"),
        NodeUncordoned(name="studio"),
        NodeDrainStarted(name="studio", force=True, when="2026-12-01T12:00:00.000Z"),
        DrainReplacementPlaced(
            name="studio",
            move=InstanceMove(deployment_id="d", old_instance_id="i", new_instance_id="j"),
        ),
        NodeDrainEnded(name="studio"),
        FailoverReplacementPlaced(
            deployment_id="d",
            move=InstanceMove(deployment_id="d", old_instance_id="i", new_instance_id="j"),
            at=4.5,
        ),
        DeploymentOptionsChanged(
            deployment_id="d",
            sharding=Sharding.TENSOR,
            instance_meta=InstanceMeta.MLX_JACCL,
            min_nodes=2,
            replace=("i",),
        ),
        DeploymentReplacementPlaced(
            deployment_id="d",
            move=InstanceMove(deployment_id="d", old_instance_id="i", new_instance_id="j"),
        ),
        DeploymentRepairPlaced(
            deployment_id="d",
            move=InstanceMove(deployment_id="d", old_instance_id="i", new_instance_id="j"),
            problem="stalled",
            why="runner on mini-b silent in RunnerWarmingUp for 4m12s",
        ),
        DeploymentRepairChanged(deployment_id="d", repair="report"),
        InstanceFoundBroken(
            instance_id="i", model_id="m", node_ids=("a", "b"), problem="hollow", at=1.5
        ),
        RepairIncidentsExpired(before=2.5),
    ]


def test_every_event_round_trips_as_tagged_json(state: State) -> None:
    events = _every_event(state)
    assert {type(e) for e in events} >= set(AnyEvent.__args__)
    for event in events:
        raw = EVENT_ADAPTER.dump_json(event)
        assert list(json.loads(raw)) == [type(event).__name__]
        assert EVENT_ADAPTER.validate_json(raw) == event
        indexed = IndexedEvent(idx=7, event=event)
        assert IndexedEvent.model_validate_json(indexed.model_dump_json()) == indexed


def test_event_fields_are_camel_case_on_the_wire() -> None:
    raw = json.loads(EVENT_ADAPTER.dump_json(DeploymentPlaced(deployment_id="d", instance_id="i")))
    assert raw == {"DeploymentPlaced": {"deploymentId": "d", "instanceId": "i"}}


def test_deployment_scaled_is_camel_case_on_the_wire_and_bounded() -> None:
    raw = json.loads(EVENT_ADAPTER.dump_json(DeploymentScaled(deployment_id="d", replicas=2)))
    assert raw == {"DeploymentScaled": {"deploymentId": "d", "replicas": 2}}
    for bad in (0, MAX_REPLICAS + 1):
        with pytest.raises(ValidationError):
            EVENT_ADAPTER.validate_python(
                {"DeploymentScaled": {"deploymentId": "d", "replicas": bad}}
            )
    top = EVENT_ADAPTER.validate_python(
        {"DeploymentScaled": {"deploymentId": "d", "replicas": MAX_REPLICAS}}
    )
    assert isinstance(top, DeploymentScaled) and top.replicas == MAX_REPLICAS


def test_deployment_priority_changed_is_camel_case_on_the_wire_and_bounded() -> None:
    event = DeploymentPriorityChanged(deployment_id="d", priority=900, preempt=True)
    raw = json.loads(EVENT_ADAPTER.dump_json(event))
    fields = {"deploymentId": "d", "priority": 900, "preempt": True}
    assert raw == {"DeploymentPriorityChanged": fields}
    for bad in (-1, MAX_PRIORITY + 1):
        with pytest.raises(ValidationError):
            EVENT_ADAPTER.validate_python(
                {"DeploymentPriorityChanged": {**fields, "priority": bad}}
            )


def test_a_deployment_written_before_priorities_reads_as_500_and_no_preemption() -> None:
    old = {"deploymentId": "d", "modelCard": BUILTIN_MODEL_CARDS[0].model_dump(), "replicas": 2}
    deployment = Deployment.model_validate_json(json.dumps(old))
    assert (deployment.priority, deployment.preempt) == (DEFAULT_PRIORITY, False) == (500, False)
    raw = json.loads(deployment.model_dump_json(by_alias=True))
    assert (raw["priority"], raw["preempt"]) == (500, False)
    for bad in (-1, MAX_PRIORITY + 1):
        with pytest.raises(ValidationError):
            Deployment.model_validate_json(json.dumps({**old, "priority": bad}))


def test_a_deployment_written_before_replicas_reads_as_one_replica_and_no_record() -> None:
    old = {"deploymentId": "d", "modelCard": BUILTIN_MODEL_CARDS[0].model_dump(), "instanceId": "i"}
    deployment = Deployment.model_validate_json(json.dumps(old))
    assert (deployment.replicas, deployment.placed_instance_ids) == (1, ())
    raw = json.loads(deployment.model_dump_json(by_alias=True))
    assert (raw["replicas"], raw["placedInstanceIds"]) == (1, [])
    scaled = deployment.model_copy(update={"replicas": 3, "placed_instance_ids": ("i", "j")})
    assert Deployment.model_validate_json(scaled.model_dump_json(by_alias=True)) == scaled


def test_protocol_messages_round_trip(state: State) -> None:
    for message in [
        Hello(node_id="n", name="studio", signature="ab", running_instances=["i"]),
        RunnerStatusReport(runner_id="r", runner_status=RunnerReady()),
        LinkUp(sink="m", edge=RDMAConnection(source_rdma_iface="a", sink_rdma_iface="b")),
        ChatChunk(request_id="q", text="hi", finish_reason="stop"),
    ]:
        assert NODE_MESSAGE.validate_json(NODE_MESSAGE.dump_json(message)) == message
    for message in [
        Welcome(state=state),
        ChatRequest(request_id="q", instance_id="i", messages=[]),
    ]:
        assert MASTER_MESSAGE.validate_json(MASTER_MESSAGE.dump_json(message)) == message


def test_the_first_validation_error_names_its_field() -> None:
    with pytest.raises(ValidationError) as bad:
        MemoryUsage.model_validate({"ramTotal": {"inBytes": "lots"}})
    assert first_validation_error(bad.value).startswith("ramTotal.inBytes: Input should be")
