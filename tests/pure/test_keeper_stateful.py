"""The keeper under arbitrary interleavings of what users, nodes and the router can do.

A hypothesis state machine drives a ``SimCluster`` (state lagging the events by up to 10 s)
with one rule per thing that can happen, in any order: deployments created, scaled and deleted
(also twice, and unknown ids), nodes killed and revived, instances deleted or placed by hand,
runners failing, placement crashing, the master restarting, time passing, lagged events
arriving early.
After every rule the invariants hold: no placement ever left a model with more instances than
its deployment's replicas or two instances of a model on one node, the keeper never deleted an
instance it did not place (the hand-placed ones give it the chance), it followed the keeper's
timing (docs/design.md §5), and its memory stays within a bound set by the deployments it
currently knows and their replicas, never by history."""

from __future__ import annotations

import dataclasses

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from pydantic import BaseModel
from sim_checks import LivenessReferee, SafetyChecks
from sim_cluster import DeploymentSpec, NodeSpec, SimCluster, instances_of

from keeper import STARTUP_GRACE, Keeper
from keeper.model.catalog import catalog_by_id
from keeper.model.state import MAX_REPLICAS, State

CATALOG = catalog_by_id()
MODELS = (
    # Small enough for one replica per node.
    DeploymentSpec(CATALOG["mlx-community/Qwen3-0.6B-4bit"], replicas=3),
    DeploymentSpec(CATALOG["mlx-community/Llama-3.2-3B-Instruct-4bit"], replicas=2),
    DeploymentSpec(CATALOG["mlx-community/Llama-3.2-1B-Instruct-4bit"], min_nodes=2),
    DeploymentSpec(CATALOG["mlx-community/Qwen3-30B-A3B-4bit"]),
    # Needs two of these nodes, so it comes and goes with them.
    DeploymentSpec(CATALOG["mlx-community/Llama-3.3-70B-Instruct-4bit"]),
    # Never fits.
    DeploymentSpec(CATALOG["mlx-community/DeepSeek-V3.1-4bit"]),
)
NODES = [NodeSpec("a", 32), NodeSpec("b", 24), NodeSpec("c", 16), NodeSpec("d", 16)]
MAX_LAG_S = 10.0
# Keeper memory per deployment it knows: a handful of fields, its own instances (each watched
# or being removed: a few entries apiece, at most a count's worth), plus, for an unplaceable
# one, the cluster signature it failed on (a few entries per node and per link).
ENTRIES_PER_DEPLOYMENT = (
    32 + 4 * 2 * MAX_REPLICAS + 8 * (len(NODES) + len(NODES) * (len(NODES) - 1))
)
# A keeper's own attributes, one entry each (17 now), the fields of its repair memory (about
# 20: the marks' four mappings, its own ten, the five parts of the State it last read), with
# room for a few more.
ENTRIES_AT_REST = 42
# The repair marks of each instance in the State and each node (docs/design.md §5.19): an
# instance's mark and its progress (its runners' statuses and download bytes: a few entries per
# node it runs on), each runner's mark, status and failures, each node's two rates.
ENTRIES_PER_INSTANCE = 16 + 12 * len(NODES)
ENTRIES_PER_NODE = 4
# The keeper's attributes that only refer to the State its last step read (``Keeper.step``).
NOT_MEMORY = frozenset({"_state_read"})


def memory_entries(root: object) -> int:
    """Every container entry and dataclass field reachable from the keeper's attributes, counted
    once per object; data-model values (pydantic) count as one entry each."""
    seen: set[int] = set()
    count = 0
    # Not the keeper's memory: references to the State the last step read (one State).
    owned = {name: value for name, value in vars(root).items() if name not in NOT_MEMORY}
    stack: list[object] = [owned]
    while stack:
        item = stack.pop()
        if id(item) in seen or isinstance(item, str | int | float | bool | BaseModel | None):
            continue
        seen.add(id(item))
        if isinstance(item, dict):
            count += len(item)  # pyright: ignore[reportUnknownArgumentType]
            stack.extend(item.keys())  # pyright: ignore[reportUnknownArgumentType]
            stack.extend(item.values())  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(item, list | tuple | set | frozenset):
            count += len(item)  # pyright: ignore[reportUnknownArgumentType]
            stack.extend(item)  # pyright: ignore[reportUnknownArgumentType]
        elif dataclasses.is_dataclass(item):
            fields = dataclasses.fields(item)
            count += len(fields)
            stack.extend(getattr(item, f.name) for f in fields)
    return count


class KeeperMachine(RuleBasedStateMachine):
    sim: SimCluster
    safety: SafetyChecks
    liveness: LivenessReferee

    @initialize(seed=st.integers(0, 2**32 - 1))
    def start(self, seed: int) -> None:
        self.sim = SimCluster(NODES, seed=seed, max_lag_s=MAX_LAG_S)
        self.safety = SafetyChecks(self.sim)
        self.liveness = LivenessReferee(self.sim)
        self.hand_placed: set[str] = set()
        # The keeper forgets a deployment at its first step after the state drops it, so until
        # then it may hold any deployment its state showed since its last step.
        self.known_since_last_step = 0
        self.sim.observers.on_step.append(self._remember_known)
        self.sim.run(int(STARTUP_GRACE))  # most rules are about a keeper that is placing

    def _remember_known(self, view: State, now: float, events: object) -> None:
        self.known_since_last_step = len(view.deployments)

    # --- users ------------------------------------------------------------------------------

    @rule(spec=st.sampled_from(MODELS))
    def create_deployment(self, spec: DeploymentSpec) -> None:
        self.sim.create_deployment(spec)

    @rule(data=st.data(), twice=st.booleans())
    def delete_deployment(self, data: st.DataObject, twice: bool) -> None:
        known = [*sorted(self.sim.view.deployments), "dep-unknown"]
        deployment_id = data.draw(st.sampled_from(known))
        self.sim.delete_deployment(deployment_id)
        if twice:
            assert self.sim.delete_deployment(deployment_id) == []

    @rule(data=st.data(), replicas=st.integers(1, 4), twice=st.booleans())
    def scale_deployment(self, data: st.DataObject, replicas: int, twice: bool) -> None:
        """PATCH /deployments/{id}: up (the steps add replicas, apart from the others) or down
        (the keeper's newest instances go, even one on its way); the same count again is a
        no-op."""
        known = [*sorted(self.sim.view.deployments), "dep-unknown"]
        deployment_id = data.draw(st.sampled_from(known))
        self.sim.scale_deployment(deployment_id, replicas)
        if twice:
            assert self.sim.scale_deployment(deployment_id, replicas) == []

    @rule(spec=st.sampled_from(MODELS))
    def place_by_hand(self, spec: DeploymentSpec) -> None:
        """POST /place_instance for a model nobody deploys (placing by hand a model the keeper
        also keeps would make a duplicate the keeper is not to blame for)."""
        model_id = spec.card.model_id
        for state in (self.sim.view, self.sim.true_state):
            if any(d.model_card.model_id == model_id for d in state.deployments.values()):
                return
        if instances_of(self.sim.true_state, model_id):
            return
        instance = self.sim.place_by_hand(spec)
        if instance is not None:
            self.hand_placed.add(instance.instance_id)

    @precondition(lambda self: bool(self._hand_placed_models()))
    @rule(data=st.data())
    def deploy_a_model_running_by_hand(self, data: st.DataObject) -> None:
        """A deployment of a model that already runs: the keeper must adopt nothing and, when
        the deployment is deleted, leave the hand-placed instance running."""
        model_id = data.draw(st.sampled_from(self._hand_placed_models()))
        self.sim.create_deployment(next(m for m in MODELS if m.card.model_id == model_id))

    def _hand_placed_models(self) -> list[str]:
        return sorted(
            instance.shard_assignments.model_id
            for instance_id, instance in self.sim.view.instances.items()
            if instance_id in self.hand_placed
        )

    @precondition(lambda self: bool(self.sim.true_state.instances))
    @rule(data=st.data())
    def delete_instance(self, data: st.DataObject) -> None:
        self.sim.delete_instance(data.draw(st.sampled_from(sorted(self.sim.true_state.instances))))

    # --- nodes and runners -----------------------------------------------------------------

    @precondition(lambda self: bool(self.sim.alive_nodes()))
    @rule(data=st.data(), silent_s=st.integers(0, 30))
    def kill_node(self, data: st.DataObject, silent_s: int) -> None:
        self.sim.kill_node(data.draw(st.sampled_from(self.sim.alive_nodes())), silent_s)

    @precondition(lambda self: bool(self.sim.dead_nodes()))
    @rule(data=st.data())
    def revive_node(self, data: st.DataObject) -> None:
        self.sim.revive_node(data.draw(st.sampled_from(self.sim.dead_nodes())))

    @rule(spec=st.sampled_from(MODELS), count=st.integers(1, 3))
    def fail_next_runners(self, spec: DeploymentSpec, count: int) -> None:
        self.sim.doom_next_instances(spec.card.model_id, count)

    @rule(spec=st.sampled_from(MODELS), count=st.integers(1, 3))
    def crash_next_placements(self, spec: DeploymentSpec, count: int) -> None:
        self.sim.crash_next_placements(spec.card.model_id, count)

    # --- the master -------------------------------------------------------------------------

    @rule(seconds=st.integers(1, 90))
    def advance_time(self, seconds: int) -> None:
        self.sim.run(seconds)

    @rule(count=st.integers(1, 40))
    def deliver_lagged_events(self, count: int) -> None:
        self.sim.deliver(count)

    @rule()
    def restart_master(self) -> None:
        self.sim.restart_master()

    # --- invariants -------------------------------------------------------------------------

    @invariant()
    def no_duplicate_instance_and_only_own_deletions(self) -> None:
        assert self.safety.violations == []

    @invariant()
    def keeper_timing_follows_the_spec(self) -> None:
        assert self.liveness.violations == []

    @invariant()
    def keeper_memory_is_bounded_by_what_it_knows(self) -> None:
        keeper: Keeper = self.sim.keeper
        self.known_since_last_step = max(self.known_since_last_step, len(self.sim.view.deployments))
        known = self.known_since_last_step
        entries = memory_entries(keeper)
        state = self.sim.view
        marks = ENTRIES_PER_INSTANCE * len(state.instances) + ENTRIES_PER_NODE * len(NODES)
        bound = ENTRIES_AT_REST + ENTRIES_PER_DEPLOYMENT * known + (marks if known else 0)
        assert entries <= bound, (entries, known, len(state.instances))


KeeperMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_keeper_state_machine = KeeperMachine.TestCase
