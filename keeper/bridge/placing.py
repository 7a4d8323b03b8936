"""Placing through exo: each step's placement answers, asked of exo before it, as one value.

exo places, not the bridge (docs/bridge.md, "Placement"). The keeper stays the pure, unchanged
one of our master; its placement function is the only seam. A tick is one explicit plan:

1. ``due_for_placement``: the deployments the step will try to place, read from the keeper's own
   timers (fewer instances than replicas, nothing to wait for); pure;
2. ``ask_exo``: where exo would place each of them, ``GET {exo}/instance/placement``, or for a
   model that already has an instance a preview on other nodes
   (``keeper.bridge.placement_choice``), else our placement on exo's State without the nodes
   serving it, with exo's full card; an exo without those endpoints (404/405) gets our
   placement, with exo's full model card only (``keeper.bridge.exo_models``, which notes the
   full cards exo shows). The step's only I/O;
3. ``PlacementAnswers``: those answers and the State they were asked on, immutable. Its
   ``place`` is the step's synchronous placement function: the answer (refused if it uses a
   node the keeper left out), read into our model, or ``ValueError(<exo's reason>)``, so the
   keeper's in-flight, backoff and unplaceable rules (an error event only when the reason
   changes; a retry when the usable cluster changes and every 30 s) apply exactly as on our
   master. A model with no answer is such a reason too, never a crash. ``raw`` gives the JSON of
   an instance the keeper took, to be posted exactly as exo gave it.

The keeper takes its placement function once, when it is made, and calls it only inside its
synchronous ``step`` (``keeper.core.keeper``, whose memory of each deployment lives across
steps). So the bridge makes it with ``StepPlacement.place`` and steps it through
``StepPlacement.step``, which hands ``place`` that step's answers for that call only: no answer
outlives its step, and nothing here reads the bridge's State.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from keeper.bridge.exo_client import NO_SUCH_ENDPOINT, ExoApi, ExoRefusedError
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.exo_wire import exo_model_card, instance_json
from keeper.bridge.placement_choice import (
    ExoPlacement,
    choose_apart,
    preview_card,
    read_placement,
    read_previews,
)
from keeper.core.failover import failing_over, failover_kind
from keeper.core.keeper import DeploymentTimer, move_kinds
from keeper.core.moves import deployments_to_move
from keeper.core.placement import place_instance
from keeper.core.repair import RepairMoves
from keeper.core.rolling import rolling_deployments
from keeper.core.view import models_instance_counts, node_names, nodes_serving, without_nodes
from keeper.model.events import AnyEvent
from keeper.model.state import (
    AnyInstance,
    Deployment,
    InstanceMeta,
    ModelCard,
    Sharding,
    State,
    cordoned_nodes,
)
from keeper.model.wire import JsonObject
from keeper.runtime.hosted_keeper import KeeperLike


def due_for_placement(
    state: State, timers: Mapping[str, DeploymentTimer], repair: RepairMoves | None = None
) -> list[Deployment]:
    """The deployments the keeper's step on ``state`` will try to place, in id order: those
    with fewer instances of their model than replicas and nothing to wait for (``timers``, the
    keeper's, on the same State and time), and those a move of any kind will place for
    (``repair``: the keeper's repairs, docs/design.md §5.19)."""
    counts = models_instance_counts(state)
    # A move's next replacement places too, whatever its kind (a drain's, a rolling
    # change's, a failover's, a repair's): a candidate with no move of its deployment under way
    # (``keeper.core.moves``).
    failover = failover_kind(state, failing_over(state))
    moving = deployments_to_move(
        state, move_kinds(state, rolling_deployments(state), failover, repair=repair)
    )
    due: list[Deployment] = []
    for deployment_id, deployment in sorted(state.deployments.items()):
        timer = timers.get(deployment_id)
        short = counts.get(deployment.model_card.model_id, 0) < deployment.replicas
        if timer is not None and timer.waiting is None and (short or deployment_id in moving):
            due.append(deployment)
    return due


@dataclass(frozen=True)
class PlacementAnswers:
    """exo's answers for one step, by model id, asked on ``state`` (module doc)."""

    state: State  # exo's whole State, with the bridge's deployments, the answers were asked on
    by_model: Mapping[str, ExoPlacement | str]  # where exo would place the model, or why not

    def answer(self, model_id: str) -> ExoPlacement | str:
        """Where exo would place the model in this step, or why it cannot be placed."""
        answer = self.by_model.get(model_id)
        if answer is None:  # the keeper's timers and its step disagree: said so, as a reason
            return f"no placement of {model_id} was asked of exo for this step"
        return answer

    def place(
        self,
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        """The keeper's placement for this step: the answer asked of exo before it."""
        answer = self.answer(model_card.model_id)
        if isinstance(answer, str):
            raise ValueError(answer)
        # The keeper hands placement exo's State without the nodes serving the model; the
        # answer was chosen before, on exo's whole State: it must use none of the nodes left out
        # (a node exo knows and its State does not show yet is exo's to judge).
        left_out = frozenset(self.state.topology.nodes) - frozenset(state.topology.nodes)
        used = left_out & answer.instance.shard_assignments.node_to_runner.keys()
        if used:
            raise ValueError(
                f"exo's placement of {model_card.model_id} uses {node_names(self.state, used)}, "
                "which the keeper left out (they serve it already)"
            )
        return answer.instance

    def raw(self, instance_id: str) -> JsonObject | None:
        """exo's JSON of an instance placed from these answers, to post as exo gave it."""
        for answer in self.by_model.values():
            if isinstance(answer, ExoPlacement) and answer.instance.instance_id == instance_id:
                return answer.raw
        return None


NO_ANSWERS = PlacementAnswers(State(), MappingProxyType({}))


async def ask_exo(
    exo: ExoApi, cards: ExoCards, state: State, due: Sequence[Deployment]
) -> PlacementAnswers:
    """exo's answers for a step on ``state`` that will try to place ``due``. Raises
    ``ExoUnavailableError`` when exo does not answer (nothing is then placed)."""
    by_model: dict[str, ExoPlacement | str] = {}
    for deployment in due:
        by_model[deployment.model_card.model_id] = await where_to_place(
            exo, cards, deployment, state
        )
    return PlacementAnswers(state, MappingProxyType(by_model))


async def where_to_place(
    exo: ExoApi, cards: ExoCards, deployment: Deployment, state: State
) -> ExoPlacement | str:
    """Where exo would place a new instance of the deployment on ``state`` (exo's), or why
    not. With an instance of the model already there, one on other nodes: from exo's
    previews, else ours on exo's State without the nodes serving the model; with none,
    exo's own placement; from an exo without these endpoints, ours."""
    model_id = deployment.model_card.model_id
    sharding, meta = deployment.sharding.value, deployment.instance_meta.value
    serving = nodes_serving(state, model_id)
    cordoned = cordoned_nodes(state)  # exo knows no cordons: its own placement may use them
    apart = without_nodes(state, serving | cordoned)
    try:
        if serving or cordoned:
            previews = read_previews(await exo.previews(model_id))
            placement = choose_apart(
                previews, state, model_id, sharding, meta, deployment.min_nodes, cordoned
            )
            if placement is None:
                # exo places by its own preference, which knows nothing of replicas: ours,
                # on the nodes apart, with exo's full card (its previews carry it).
                card = preview_card(previews, model_id)
                if card is not None:
                    cards.saw(model_id, card)
                ours = _place_ourselves(exo, cards, deployment, apart)
                if isinstance(ours, str):
                    besides = " and the cordoned nodes" if cordoned else ""
                    return (
                        f"exo offers no {sharding}/{meta} placement of {model_id} apart "
                        f"from its other instances{besides}, nor does ours: {ours}"
                    )
                return ours
        else:
            answer = await exo.placement(model_id, sharding, meta, deployment.min_nodes)
            placement = read_placement(answer, model_id, state)
    except ExoRefusedError as exc:
        if exc.status in NO_SUCH_ENDPOINT:
            return _place_ourselves(exo, cards, deployment, apart)
        return exc.message
    except ValueError as exc:
        return f"exo's placement of {model_id} cannot be used: {exc}"
    cards.saw(model_id, placement.card)
    return placement


def _place_ourselves(
    exo: ExoApi, cards: ExoCards, deployment: Deployment, state: State
) -> ExoPlacement | str:
    """Our placement on ``state`` (exo's, without the nodes serving the model), where exo
    cannot tell where it would place: with exo's full card of the model, never one rebuilt
    with exo's sampling and dialect left out."""
    model_id = deployment.model_card.model_id
    card = cards.full(model_id)
    if card is None:
        return (
            f"exo at {exo.url} does not place for the bridge (no GET "
            "/instance/placement or /instance/previews answer to use) and has shown no model "
            f"card of {model_id} to place it with: start the bridge with --model-cards DIR "
            "holding the model's exo model-card .toml"
        )
    try:
        instance = place_instance(
            state,
            exo_model_card(card),
            deployment.sharding,
            deployment.instance_meta,
            deployment.min_nodes,
        )
    except ValueError as exc:
        return str(exc)
    return ExoPlacement(instance=instance, raw=instance_json(instance, card), card=card)


class StepPlacement:
    """The placement function the bridge makes its keeper with (``place``): the answers of the
    step under way, handed over for that one step (``step``) and dropped when it returns."""

    def __init__(self) -> None:
        self._answers = NO_ANSWERS  # outside a step: none, so every placement is a reason

    def step(
        self, keeper: KeeperLike, answers: PlacementAnswers, state: State, now: float
    ) -> list[AnyEvent]:
        """The keeper's step on ``state``, placing from ``answers`` (and nothing else)."""
        self._answers = answers
        try:
            return keeper.step(state, now)
        finally:
            self._answers = NO_ANSWERS

    def place(
        self,
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        """The keeper's placement: ``PlacementAnswers.place`` of the step under way."""
        return self._answers.place(state, model_card, sharding, instance_meta, min_nodes)
