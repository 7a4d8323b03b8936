"""The moves' part (docs/design.md §5.17), driven by a kind of its own: the rules every kind of
move shares (placement apart and off what the kind avoids, settling, one move per deployment,
one placement per step, waiting while short, the words of a move that does not fit, a forced
kind's deletion, an early end, instances doomed outright), and that a kind shaped like the
failover plugs in with nothing but its own methods."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from keeper_harness import (
    AFTER_GRACE,
    Cluster,
    RecordingPlace,
    shaped_place,
    simple_place,
    unplaceable,
)

from keeper.core.memo import FRESH, DeploymentMemo, placed
from keeper.core.moves import (
    MOVE_SETTLE,
    Candidate,
    Deciding,
    MoveKind,
    Moves,
    deployments_to_move,
    left_out_words,
    replacement_view,
)
from keeper.core.placement import PlaceFn
from keeper.core.view import cluster_signature, models_instance_counts
from keeper.model.constants import UNPLACEABLE_RETRY
from keeper.model.events import (
    AnyEvent,
    DeploymentPlaced,
    DeploymentReplacementPlaced,
    InstanceCreated,
    InstanceDeleted,
    NodeCordoned,
)
from keeper.model.state import InstanceId, InstanceMove, NodeId, Sharding, State

T = AFTER_GRACE


@dataclass
class Suspects(MoveKind):
    """A kind shaped like the failover: the keeper's instances on ``suspect`` nodes are moved
    to nodes not suspect; a ``dead`` move deletes its old instance at once, a move whose node
    was ``heard`` again deletes its replacement; ``doom`` is deleted outright."""

    suspect: frozenset[NodeId]
    moves: list[InstanceMove] = field(default_factory=list[InstanceMove])
    dead: frozenset[InstanceId] = frozenset()
    heard: frozenset[InstanceId] = frozenset()
    doom: tuple[InstanceId, ...] = ()
    force: bool = False
    short_waits: bool = False
    deployments: frozenset[str] | None = None  # None: every deployment's
    # Nodes a model's instances broke on before (as repair would avoid them), by model.
    broke: dict[str, frozenset[NodeId]] = field(default_factory=dict[str, frozenset[NodeId]])
    name = "suspects"

    @property
    def waits_while_short(self) -> bool:  # pyright: ignore[reportIncompatibleVariableOverride]
        return self.short_waits

    def under_way(self, state: State) -> Iterable[InstanceMove]:
        return [move for move in self.moves if move.deployment_id in state.deployments]

    def candidates(self, state: State) -> Iterable[Candidate]:
        for instance_id, instance in sorted(state.instances.items()):
            if set(instance.shard_assignments.node_to_runner) & self.suspect:
                deployment_id = next(
                    d
                    for d, deployment in sorted(state.deployments.items())
                    if instance_id in deployment.placed_instance_ids
                )
                if self.deployments is not None and deployment_id not in self.deployments:
                    continue
                yield Candidate(deployment_id, instance_id, scope="suspects", force=self.force)

    def recorded(self, candidate: Candidate, move: InstanceMove) -> AnyEvent:
        # (Any event will do: the part only passes it on.)
        return DeploymentReplacementPlaced(deployment_id=candidate.deployment_id, move=move)

    def words(self, state: State, candidate: Candidate, left_out: Sequence[str], why: str) -> str:
        return f"cannot fail over {candidate.old} ({'; '.join(left_out)}): {why}"

    def avoids(self, state: State, candidate: Candidate) -> Mapping[str, frozenset[NodeId]]:
        model_id = state.instances[candidate.old].shard_assignments.model_id
        return {
            "suspect": frozenset(n for n in self.suspect if n in state.topology.nodes),
            "broke there": self.broke.get(model_id, frozenset()),
        }

    def early_end(self, state: State, move: InstanceMove) -> InstanceId | None:
        if move.old_instance_id not in state.instances:
            return None  # (the part deletes only what the State holds anyway)
        if move.old_instance_id in self.dead:
            return move.old_instance_id
        if move.old_instance_id in self.heard:
            return move.new_instance_id
        return None

    def doomed(self, state: State) -> Iterable[InstanceId]:
        return self.doom


def serving(*nodes: str, replicas: int = 1) -> tuple[Cluster, str, list[InstanceId]]:
    """``m`` on ``nodes`` (fully linked), ``replicas`` ready instances, each on the freest node
    left: node-a first."""
    cluster = Cluster(place=simple_place)
    cluster.add_nodes(*nodes)
    cluster.add_node("node-a", available_gb=32.0)
    deployment_id = cluster.deploy("m", replicas=replicas)
    for k in range(replicas):
        cluster.step(T + k)
        cluster.make_ready(cluster.instance_of(deployment_id).instance_id)
    return cluster, deployment_id, sorted(cluster.state.instances)


def deciding(
    cluster: Cluster,
    now: float,
    *,
    may_place: bool = True,
    place: PlaceFn = simple_place,
    memos: Mapping[str, DeploymentMemo] | None = None,
    deleting: frozenset[str] = frozenset(),
) -> Deciding:
    state = cluster.state
    return Deciding(
        memos=memos if memos is not None else dict.fromkeys(state.deployments, FRESH),
        deleting=deleting,
        counts=models_instance_counts(state),
        signature=cluster_signature(state),
        now=now,
        may_place=may_place,
        place=place,
    )


def test_a_replacement_goes_off_the_avoided_nodes_and_apart_and_its_move_is_recorded() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b", "node-c", "node-d")
    cluster.add_node("node-b", available_gb=64.0)  # the freest: but suspect
    cluster.add_node("node-c", available_gb=48.0)  # the next: but m broke there before
    kind = Suspects(suspect=frozenset({"node-a", "node-b"}), broke={"m": frozenset({"node-c"})})
    moved = Moves().step(cluster.state, [kind], deciding(cluster, T + 10))
    recorded, created, assigned = moved.events
    assert isinstance(created, InstanceCreated)
    new = created.instance.instance_id
    assert list(created.instance.shard_assignments.node_to_runner) == ["node-d"]
    assert assigned == DeploymentPlaced(deployment_id=deployment_id, instance_id=new)
    move = InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id=new)
    assert recorded == DeploymentReplacementPlaced(deployment_id=deployment_id, move=move)
    assert moved.placed == (deployment_id, new)


def test_the_view_leaves_out_the_other_instances_nodes_not_the_moved_ones() -> None:
    cluster, _, (first, second) = serving("node-a", "node-b", "node-c", replicas=2)
    cluster.apply(NodeCordoned(name="node-c"))
    view = replacement_view(cluster.state, first)
    assert set(view.topology.nodes) == set(cluster.nodes_of(first))
    words = left_out_words(cluster.state, first, {"suspect": frozenset({"node-a"})})
    assert words == [
        "cordoned: node-c",
        "suspect: node-a",
        f"serving it already: {cluster.nodes_of(second)[0]}",
    ]
    assert left_out_words(cluster.state, first, {"quiet": frozenset()}) == [
        "cordoned: node-c",
        f"serving it already: {cluster.nodes_of(second)[0]}",
    ]
    # A node both serving and avoided is said once, for the kind's reason.
    serving_node = cluster.nodes_of(second)[0]
    assert left_out_words(cluster.state, first, {"suspect": frozenset({serving_node})}) == [
        "cordoned: node-c",
        f"suspect: {serving_node}",
    ]


def test_nothing_is_placed_when_the_step_may_not_or_the_deployment_waits() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    kind = Suspects(suspect=frozenset({"node-a"}))
    state = cluster.state
    assert Moves().step(state, [kind], deciding(cluster, T, may_place=False)).events == []
    in_flight = {deployment_id: placed(FRESH, "elsewhere", T)}
    assert Moves().step(state, [kind], deciding(cluster, T, memos=in_flight)).events == []
    being_deleted = frozenset({deployment_id})
    assert Moves().step(state, [kind], deciding(cluster, T, deleting=being_deleted)).events == []
    # A move of the deployment under way, of any kind: none beside it (replicas + 1).
    other = Suspects(
        suspect=frozenset(),
        moves=[InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id="x")],
    )
    assert Moves().step(state, [other, kind], deciding(cluster, T)).events == []
    # A deletion already sent for the old instance: not moved.
    moves = Moves(deleted={old})
    assert moves.step(state, [kind], deciding(cluster, T)).events == []
    assert Moves().step(state, [kind], deciding(cluster, T)).placed is not None


def test_one_placement_per_step_across_kinds_in_their_order() -> None:
    cluster, first, (old,) = serving("node-a", "node-b", "node-c")
    second = cluster.deploy("n")
    cluster.step(T + 5)
    other = cluster.instance_of(second).instance_id
    nodes = frozenset(cluster.nodes_of(old) + cluster.nodes_of(other))
    first_kind = Suspects(suspect=nodes, deployments=frozenset({first}))
    second_kind = Suspects(suspect=nodes, deployments=frozenset({second}))
    moved = Moves().step(cluster.state, [second_kind, first_kind], deciding(cluster, T + 10))
    created = [e for e in moved.events if isinstance(e, InstanceCreated)]
    assert len(created) == 1  # the first kind's instance waits for another step
    assert moved.placed is not None and moved.placed[0] == second
    moved = Moves().step(cluster.state, [first_kind, second_kind], deciding(cluster, T + 10))
    assert moved.placed is not None and moved.placed[0] == first


def test_a_kind_that_waits_while_short_waits() -> None:
    cluster, deployment_id, _ = serving("node-a", "node-b", "node-c", replicas=2)
    cluster.scale(deployment_id, 3)  # short by one
    kind = Suspects(suspect=frozenset({"node-a"}), short_waits=True)
    assert Moves().step(cluster.state, [kind], deciding(cluster, T)).events == []
    kind.short_waits = False
    assert Moves().step(cluster.state, [kind], deciding(cluster, T)).placed


def test_a_move_that_does_not_fit_says_why_and_waits_for_the_cluster_or_the_retry() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    kind = Suspects(suspect=frozenset({"node-a"}))
    place = RecordingPlace(unplaceable())
    moves = Moves()
    assert moves.step(cluster.state, [kind], deciding(cluster, T, place=place)).events == []
    note = f"cannot fail over {old} (suspect: node-a): No cycles found with sufficient memory"
    assert moves.notes("suspects", "suspects") == [note]
    assert moves.notes("suspects", "elsewhere") == [] and moves.notes("other", "suspects") == []
    tried = len(place.calls)
    moves.step(cluster.state, [kind], deciding(cluster, T + UNPLACEABLE_RETRY - 0.5, place=place))
    assert len(place.calls) == tried  # the same cluster, before the retry: not asked
    moves.step(cluster.state, [kind], deciding(cluster, T + UNPLACEABLE_RETRY, place=place))
    assert len(place.calls) == tried + 1
    cluster.add_node("node-c")  # another cluster: asked at once
    moves.step(cluster.state, [kind], deciding(cluster, T + UNPLACEABLE_RETRY + 1, place=place))
    assert len(place.calls) == tried + 2
    # Placed at last: the note goes.
    assert moves.step(cluster.state, [kind], deciding(cluster, T + 100)).placed
    assert moves.notes("suspects", "suspects") == []
    assert deployment_id


def test_a_forced_kind_deletes_what_does_not_fit_once_and_asks_every_step() -> None:
    cluster, _, (old,) = serving("node-a")
    kind = Suspects(suspect=frozenset({"node-a"}), force=True)
    place = RecordingPlace(unplaceable())
    moves = Moves()
    moved = moves.step(cluster.state, [kind], deciding(cluster, T, place=place))
    assert moved.events == [InstanceDeleted(instance_id=old)] and moved.placed is None
    # Sent: not again (nor asked) while the State still shows it.
    assert moves.step(cluster.state, [kind], deciding(cluster, T + 1, place=place)).events == []
    assert len(place.calls) == 1
    # Forced, the note is no reason to wait: asked again on the same cluster.
    moves.deleted = set()
    moves.step(cluster.state, [kind], deciding(cluster, T + 2, place=place))
    assert len(place.calls) == 2
    kind.force = False
    moves.deleted = set()
    assert moves.step(cluster.state, [kind], deciding(cluster, T + 3, place=place)).events == []
    assert len(place.calls) == 2


def test_a_move_settles_once_its_replacement_is_ready_and_deletes_the_old_once() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    kind = Suspects(suspect=frozenset({"node-a"}))
    moves = Moves()
    moved = moves.step(cluster.state, [kind], deciding(cluster, T))
    cluster.apply(*moved.events[:2])
    assert moved.placed is not None
    new = moved.placed[1]
    kind.moves = [
        InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id=new)
    ]
    assert moves.step(cluster.state, [kind], deciding(cluster, T + 1)).events == []  # not ready
    cluster.make_ready(new)
    assert moves.step(cluster.state, [kind], deciding(cluster, T + 2)).events == []
    assert moves.ready_at == {old: T + 2}
    at = T + 2 + MOVE_SETTLE - 0.5
    assert moves.step(cluster.state, [kind], deciding(cluster, at)).events == []
    at = T + 2 + MOVE_SETTLE
    assert moves.step(cluster.state, [kind], deciding(cluster, at)).events == [
        InstanceDeleted(instance_id=old)
    ]
    assert moves.step(cluster.state, [kind], deciding(cluster, at + 1)).events == []
    cluster.delete_instance(old)
    kind.moves = []
    moves.step(cluster.state, [kind], deciding(cluster, at + 2))
    assert moves.deleted == set() and moves.ready_at == {}  # bounded by the State


def test_a_kind_may_end_a_move_early_either_way_and_doom_instances() -> None:
    cluster, deployment_id, (old,) = serving("node-a", "node-b")
    moved = Moves().step(cluster.state, [Suspects(frozenset({"node-a"}))], deciding(cluster, T))
    cluster.apply(*moved.events[:2])
    assert moved.placed is not None
    new = moved.placed[1]
    move = InstanceMove(deployment_id=deployment_id, old_instance_id=old, new_instance_id=new)
    dead = Suspects(frozenset({"node-a"}), moves=[move], dead=frozenset({old}))
    moves = Moves()
    assert moves.step(cluster.state, [dead], deciding(cluster, T + 1)).events == [
        InstanceDeleted(instance_id=old)
    ]
    heard = Suspects(frozenset(), moves=[move], heard=frozenset({old}))
    assert Moves().step(cluster.state, [heard], deciding(cluster, T + 1)).events == [
        InstanceDeleted(instance_id=new)
    ]
    doom = Suspects(frozenset(), doom=(old, "not-in-the-state"))
    moves = Moves()
    assert moves.step(cluster.state, [doom], deciding(cluster, T + 1)).events == [
        InstanceDeleted(instance_id=old)
    ]
    assert moves.step(cluster.state, [doom], deciding(cluster, T + 2)).events == []


def test_the_memory_forgets_a_scope_a_kind_and_everything_at_rest() -> None:
    cluster, _, (old,) = serving("node-a")
    moves = Moves()
    moves.step(cluster.state, [Suspects(frozenset({"node-a"}))], deciding(cluster, T))
    assert moves.notes("suspects", "suspects")
    moves.forget_scope("suspects", "elsewhere")
    assert moves.notes("suspects", "suspects")
    moves.keep_kinds(["suspects"])
    assert moves.notes("suspects", "suspects")
    moves.forget_scope("suspects", "suspects")
    assert moves.stuck == {"suspects": {}}
    moves.step(cluster.state, [Suspects(frozenset({"node-a"}))], deciding(cluster, T))
    moves.keep_kinds(["drain"])
    assert moves.stuck == {}
    moves.step(cluster.state, [Suspects(frozenset({"node-a"}))], deciding(cluster, T))
    moves.deleted.add(old)
    moves.ready_at[old] = T
    moves.at_rest()
    assert moves.stuck == {} and moves.deleted == set() and moves.ready_at == {}
    moves.deleted.add(old)  # any one of them is memory to drop
    moves.at_rest()
    assert moves.deleted == set()
    moves.ready_at[old] = T
    moves.at_rest()
    assert moves.ready_at == {}


def test_two_drains_move_one_deployment_one_instance_at_a_time() -> None:
    # replicas 2 on node-a and node-b, both drained: never more than 3 instances of the model.
    cluster, deployment_id, _ = serving("node-a", "node-b", "node-c", "node-d", replicas=2)
    cluster.drain("node-a")
    cluster.drain("node-b")
    most = 0
    for k in range(40):
        for event in cluster.step(T + 10 + k):
            if isinstance(event, InstanceCreated):
                cluster.make_ready(event.instance.instance_id)
        most = max(most, len(cluster.instances_of_model("m")))
    assert most == 3
    assert cluster.state.drains == {} or all(
        not set(cluster.nodes_of(i.instance_id)) & {"node-a", "node-b"}
        for i in cluster.instances_of_model("m")
    )
    assert len(cluster.instances_of_model("m")) == 2
    assert deployment_id in cluster.state.deployments


def test_the_deployments_to_move_are_the_candidates_without_a_move_under_way() -> None:
    cluster, first, (old,) = serving("node-a", "node-b", "node-c")
    second = cluster.deploy("n")
    cluster.step(T + 5)
    nodes = frozenset(
        cluster.nodes_of(old) + cluster.nodes_of(cluster.instance_of(second).instance_id)
    )
    kind = Suspects(suspect=nodes)
    assert deployments_to_move(cluster.state, [kind]) == {first, second}
    under_way = InstanceMove(deployment_id=first, old_instance_id=old, new_instance_id="x")
    other = Suspects(suspect=frozenset(), moves=[under_way])
    assert deployments_to_move(cluster.state, [kind, other]) == {second}
    assert deployments_to_move(cluster.state, []) == frozenset()
    # A move whose old instance is gone holds nothing: only its record is left to end.
    done = InstanceMove(deployment_id=first, old_instance_id="gone", new_instance_id=old)
    assert deployments_to_move(cluster.state, [kind, Suspects(frozenset(), [done])]) == {
        first,
        second,
    }


def test_a_deployment_being_deleted_settles_no_move_its_deletion_removes_both() -> None:
    cluster = Cluster(place=shaped_place)
    cluster.add_nodes("node-a", "node-b", "node-c", "node-d")
    deployment_id = cluster.deploy("m", min_nodes=2)
    cluster.step(T)
    (old,) = cluster.state.instances
    cluster.make_ready(old)
    cluster.change_options(deployment_id, sharding=Sharding.TENSOR)
    new = next(e for e in cluster.step(T + 10) if isinstance(e, InstanceCreated)).instance
    cluster.make_ready(new.instance_id)
    assert cluster.step(T + 11) == []  # ready: settling
    deleted = cluster.keeper.delete(deployment_id, cluster.state)  # on its way, not applied
    removed = sorted(e.instance_id for e in deleted if isinstance(e, InstanceDeleted))
    assert removed == sorted([old, new.instance_id])
    # Settled meanwhile: the deletion already removes the old instance; not sent twice.
    assert cluster.step(T + 11 + MOVE_SETTLE) == []
