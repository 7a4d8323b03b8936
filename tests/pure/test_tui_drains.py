"""Cordons and drains in the dashboard's pure parts: the model's node and deployment rows (from
the State, and from GET /nodes only for the drain it is about), the drain confirm's plan, and
the lines under a node, wrapped inside the table's width."""

from __future__ import annotations

from model_ids import LLAMA, QWEN
from tui_clusters import three_nodes

from exo_deploy_tui.model.cluster import ClusterModel, NodeRow
from exo_deploy_tui.model.draining import DrainProgress, progress_words
from exo_deploy_tui.model.updates import ConnectionUpdate, EventUpdate, NodesUpdate
from exo_deploy_tui.testing import FROZEN_NOW, ClusterBuilder, iso, node_id_for
from exo_deploy_tui.view.cells import next_text, node_columns, node_table_rows, status_text
from keeper.model.events import (
    AnyEvent,
    DeploymentOptionsChanged,
    DeploymentReplacementPlaced,
    DrainReplacementPlaced,
    IndexedEvent,
    InstanceDeleted,
    NodeDrainStarted,
    NodeTimedOut,
    NodeUncordoned,
)
from keeper.model.state import InstanceMeta, InstanceMove, Sharding

QWEN_DEPLOYMENT = "dep-qwen3-0.6b-4bit"
STUCK = (
    "cannot move mlx-community/Llama-3.2-1B-Instruct-4bit off mini-a (cordoned: mini-a; "
    "serving it already: mini-b): No cycles found with sufficient memory"
)


def on_mini_a() -> ClusterBuilder:
    """Qwen and Llama on mini-a, both the keeper's placements."""
    return (
        three_nodes()
        .deployment(QWEN, on=["mini-a"], by_keeper=True)
        .deployment(LLAMA, on=["mini-a"], by_keeper=True)
    )


def connected(builder: ClusterBuilder) -> ClusterModel:
    model = ClusterModel()
    model.handle([builder.snapshot(), ConnectionUpdate("live")], FROZEN_NOW)
    return model


def feed(model: ClusterModel, *events: AnyEvent) -> None:
    first = model.state.last_event_applied_idx + 1
    model.handle(
        [EventUpdate(IndexedEvent(idx=first + i, event=e)) for i, e in enumerate(events)],
        FROZEN_NOW,
    )


def node(model: ClusterModel, name: str) -> NodeRow:
    (found,) = [r for r in model.node_rows(FROZEN_NOW) if r.name == name]
    return found


def draining(model: ClusterModel, model_id: str) -> bool:
    (found,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == model_id]
    return found.draining


def test_a_drain_and_its_moves_show_as_the_events_come() -> None:
    model = connected(on_mini_a())
    started = iso(FROZEN_NOW - 5)
    feed(model, NodeDrainStarted(name="mini-a", when=started))
    mini_a = node(model, "mini-a")
    assert mini_a.cordoned and mini_a.handle == "mini-a"
    assert mini_a.drain == DrainProgress(moving=0, to_move=None, left_alone=None, stuck=None)
    assert not draining(model, QWEN)

    move = InstanceMove(
        deployment_id=QWEN_DEPLOYMENT,
        old_instance_id="inst-qwen3-0.6b-4bit",
        new_instance_id="inst-qwen3-0.6b-4bit-new",
    )
    feed(model, DrainReplacementPlaced(name="mini-a", move=move))
    assert node(model, "mini-a").drain == DrainProgress(1, None, None, None)
    assert draining(model, QWEN) and not draining(model, LLAMA)
    (qwen,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN]
    assert qwen.moving_off == "mini-a" and qwen.status == "serving"  # the old one still serves
    assert status_text(qwen) == "⇢ draining" and qwen.matches("draining")

    feed(model, InstanceDeleted(instance_id="inst-qwen3-0.6b-4bit"))  # the move is done
    assert not draining(model, QWEN)
    feed(model, NodeUncordoned(name="mini-a"))  # ends the drain and the cordon
    mini_a = node(model, "mini-a")
    assert not mini_a.cordoned and mini_a.drain is None


def test_get_nodes_speaks_only_for_the_drain_it_is_about() -> None:
    builder = on_mini_a().drain("mini-a")
    model = connected(builder)
    answer = builder.nodes_answer(stuck={"mini-a": STUCK})
    model.handle(NodesUpdate(tuple(answer.nodes)), FROZEN_NOW)
    assert node(model, "mini-a").drain == DrainProgress(0, 2, 0, STUCK)
    assert node(model, "mini-b").drain is None  # the answer's other nodes drain nothing

    # An answer about an earlier drain of the node (another start) says nothing of this one.
    earlier = on_mini_a().drain("mini-a", started_ago_s=600).nodes_answer(stuck={"mini-a": "x"})
    model.handle(NodesUpdate(tuple(earlier.nodes)), FROZEN_NOW)
    assert node(model, "mini-a").drain == DrainProgress(0, None, None, None)
    # Nor one from before the drain's latest move: until the next read, the State's word.
    moved = InstanceMove(
        deployment_id=QWEN_DEPLOYMENT,
        old_instance_id="inst-qwen3-0.6b-4bit",
        new_instance_id="inst-qwen3-0.6b-4bit-new",
    )
    feed(model, DrainReplacementPlaced(name="mini-a", move=moved))
    assert node(model, "mini-a").drain == DrainProgress(1, None, None, None)
    model.handle(NodesUpdate(tuple(answer.nodes)), FROZEN_NOW)  # the answer before the move
    assert node(model, "mini-a").drain == DrainProgress(1, None, None, None)
    builder.state = model.state
    after = builder.nodes_answer(stuck={"mini-a": STUCK})
    model.handle(NodesUpdate(tuple(after.nodes)), FROZEN_NOW)
    assert node(model, "mini-a").drain == DrainProgress(1, 1, 0, STUCK)
    # Nor does a read that failed: the State's word stands alone.
    model.handle(NodesUpdate(None, "cannot connect"), FROZEN_NOW)
    assert node(model, "mini-a").drain == DrainProgress(1, None, None, None)


def test_a_name_cordoned_while_away_is_listed_and_a_node_seen_leaving_keeps_its_cordon() -> None:
    model = connected(on_mini_a().cordon("mini-c").cordon("studio"))
    away = node(model, "mini-c")
    assert (away.liveness, away.cordoned, away.handle) == ("away", True, "mini-c")
    assert model.summary(FROZEN_NOW).nodes_away == 1

    feed(model, NodeTimedOut(node_id=node_id_for("studio")))
    studio = node(model, "studio")  # one row: the node that left, still cordoned by name
    assert studio.liveness == "gone" and studio.cordoned
    assert model.summary(FROZEN_NOW).nodes_away == 1


def test_the_drain_plan_moves_the_keepers_instances_and_leaves_the_others() -> None:
    builder = three_nodes().deployment(QWEN, on=["mini-a", "mini-b"], by_keeper=True)
    model = connected(
        builder.instance(LLAMA, on=["mini-a"]).instance(LLAMA, on=["studio"], suffix="-s")
    )
    plan = model.drain_plan("mini-a")
    assert [(p.instance_id, p.nodes) for p in plan.moved] == [
        ("inst-qwen3-0.6b-4bit", ("mini-a", "mini-b"))
    ]
    assert [p.instance_id for p in plan.left_alone] == ["inst-llama-3.2-1b-instruct-4bit"]
    assert model.drain_plan("nowhere").moved == ()


def test_progress_words() -> None:
    assert progress_words(DrainProgress(1, None, None, None)) == "draining · 1 moving"
    assert (
        progress_words(DrainProgress(1, 2, 1, "why", force=True))
        == "draining (forced) · 1 moving, 2 to move, 1 not the keeper's (left alone)"
    )


def test_the_lines_under_a_node_wrap_inside_the_table() -> None:
    model = connected(on_mini_a().drain("mini-a").cordon("studio"))
    builder = on_mini_a().drain("mini-a")
    answer = builder.nodes_answer(stuck={"mini-a": STUCK + " " + STUCK})  # past three lines
    model.handle(NodesUpdate(tuple(answer.nodes)), FROZEN_NOW)
    for width in (80, 60):
        columns = node_columns(width)
        span = sum(c.width for c in columns)
        rows = node_table_rows(model.node_rows(FROZEN_NOW), columns)
        lines = {key: "".join(t for t, _ in cells) for key, cells in rows}
        under = [text for key, text in lines.items() if " cordon " in key]
        assert all(len(text) <= span - 1 for text in under), under
        drain = [t for k, t in lines.items() if k.startswith("alive:12D3KooWmini-a cordon")]
        assert drain[0].startswith(" └ ⇢ draining · 0 moving, 2 to move")
        assert len(drain) == 1 + 3 and drain[-1].endswith("…")  # the reason's 3 lines at most
        said = " ".join(t.strip() for t in drain[1:])
        assert said.startswith(f"stuck: {STUCK[:60]}")
        assert [t for k, t in lines.items() if k.startswith("alive:12D3KooWstudio cordon")] == [
            " └ ⊘ cordoned: nothing new is placed here"
        ]


def test_a_rolling_change_shows_in_status_next_and_the_timeline() -> None:
    model = connected(on_mini_a())
    (qwen,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN]
    instance = "inst-qwen3-0.6b-4bit"
    feed(
        model,
        DeploymentOptionsChanged(
            deployment_id=QWEN_DEPLOYMENT,
            sharding=Sharding.PIPELINE,
            instance_meta=InstanceMeta.MLX_RING,
            min_nodes=2,
            replace=(instance,),
        ),
    )
    (qwen,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN]
    assert qwen.updating == (0, 1)
    assert (status_text(qwen), next_text(qwen)) == ("⟳ updating", "updated 0/1")
    assert qwen.matches("updating")
    move = InstanceMove(
        deployment_id=QWEN_DEPLOYMENT, old_instance_id=instance, new_instance_id="inst-new"
    )
    feed(model, DeploymentReplacementPlaced(deployment_id=QWEN_DEPLOYMENT, move=move))
    feed(model, InstanceDeleted(instance_id=instance))
    (qwen,) = [r for r in model.deployment_rows(FROZEN_NOW) if r.model_id == QWEN]
    assert qwen.updating is None and status_text(qwen) != "⟳ updating"
    told = [e.text for e in model.timeline]
    assert (
        "Qwen3-0.6B-4bit now Pipeline/MlxRing, min 2 nodes (was Pipeline/MlxRing, min 1 node): "
        "replacing 1 instance(s), one at a time"
    ) in told
    assert "updating Qwen3-0.6B-4bit: replacing instance inst-qwe -> inst-new" in told
