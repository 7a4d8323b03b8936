"""Placing through exo: where exo would place, asked before each step, and the keeper's ``place``.

exo places, not the bridge (docs/bridge.md, "Placement"). The keeper stays the pure, unchanged
one of our master; its placement function is the only seam. Before each step the bridge asks exo
where it would place each deployment the step will try (the keeper's own timers say which: fewer
instances than replicas, nothing to wait for): ``GET {exo}/instance/placement``, or for a model
that already has an instance a preview on other nodes (``keeper.bridge.placement_choice``), else our
placement on exo's State without the nodes serving it, with exo's full card. The step's
synchronous placement function (``Placer.place``) then returns that answer (refused if it uses a
node the keeper left out), read into our model, or raises ``ValueError(<exo's reason>)``, so the
keeper's in-flight, backoff and unplaceable rules (an error event only when the reason changes;
a retry when the usable cluster changes and every 30 s) apply exactly as on our master. An exo
without those endpoints (404/405) gets our placement, with exo's full model card only
(``keeper.bridge.exo_models``).

The ``Placer`` keeps, for one step, the answers asked and the JSON of each instance the keeper
took, to be posted exactly as exo gave it (``posted``); it holds no other state of the bridge's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

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
from keeper.core.keeper import DeploymentTimer
from keeper.core.placement import place_instance
from keeper.core.view import models_instance_counts, node_names, nodes_serving, without_nodes
from keeper.model.state import AnyInstance, Deployment, InstanceMeta, ModelCard, Sharding, State
from keeper.model.wire import JsonObject


class Placer:
    """exo's answers for the coming step, and the keeper's placement function that returns them."""

    def __init__(
        self, exo: Callable[[], ExoApi], cards: ExoCards, whole_state: Callable[[], State]
    ) -> None:
        self._exo = exo  # the exo API in use
        self._cards = cards
        self._whole_state = whole_state  # exo's State with the bridge's deployments, as read
        # Where exo would place each model the keeper may try to place in this step (or why it
        # cannot), asked before the step; and the JSON of the instances the keeper took, by id,
        # to be posted exactly as exo gave them.
        self.answers: dict[str, ExoPlacement | str] = {}
        self._to_post: dict[str, JsonObject] = {}

    async def ask(self, state: State, timers: Mapping[str, DeploymentTimer]) -> None:
        """Ask exo where to place each deployment the keeper will try to place in this step:
        those with fewer instances than replicas and nothing to wait for. Raises
        ``ExoUnavailableError`` when exo does not answer (nothing is then placed)."""
        counts = models_instance_counts(state)
        self.answers.clear()
        self._to_post.clear()
        for deployment_id, deployment in sorted(state.deployments.items()):
            timer = timers.get(deployment_id)
            model_id = deployment.model_card.model_id
            if (
                timer is None
                or timer.waiting is not None
                or counts.get(model_id, 0) >= deployment.replicas
            ):
                continue
            self.answers[model_id] = await self.where_to_place(deployment, state)

    async def where_to_place(self, deployment: Deployment, state: State) -> ExoPlacement | str:
        """Where exo would place a new instance of the deployment on ``state`` (exo's), or why
        not. With an instance of the model already there, one on other nodes: from exo's
        previews, else ours on exo's State without the nodes serving the model; with none,
        exo's own placement; from an exo without these endpoints, ours."""
        model_id = deployment.model_card.model_id
        sharding, meta = deployment.sharding.value, deployment.instance_meta.value
        serving = nodes_serving(state, model_id)
        apart = without_nodes(state, serving)
        exo = self._exo()
        try:
            if serving:
                previews = read_previews(await exo.previews(model_id))
                placement = choose_apart(
                    previews, state, model_id, sharding, meta, deployment.min_nodes
                )
                if placement is None:
                    # exo places by its own preference, which knows nothing of replicas: ours,
                    # on the nodes apart, with exo's full card (its previews carry it).
                    card = preview_card(previews, model_id)
                    if card is not None:
                        self._cards.saw(model_id, card)
                    ours = self._place_ourselves(deployment, apart)
                    if isinstance(ours, str):
                        return (
                            f"exo offers no {sharding}/{meta} placement of {model_id} apart "
                            f"from its other instances, nor does ours: {ours}"
                        )
                    return ours
            else:
                answer = await exo.placement(model_id, sharding, meta, deployment.min_nodes)
                placement = read_placement(answer, model_id, state)
        except ExoRefusedError as exc:
            if exc.status in NO_SUCH_ENDPOINT:
                return self._place_ourselves(deployment, apart)
            return exc.message
        except ValueError as exc:
            return f"exo's placement of {model_id} cannot be used: {exc}"
        self._cards.saw(model_id, placement.card)
        return placement

    def _place_ourselves(self, deployment: Deployment, state: State) -> ExoPlacement | str:
        """Our placement on ``state`` (exo's, without the nodes serving the model), where exo
        cannot tell where it would place: with exo's full card of the model, never one rebuilt
        with exo's sampling and dialect left out."""
        model_id = deployment.model_card.model_id
        card = self._cards.full(model_id)
        if card is None:
            return (
                f"exo at {self._exo().url} does not place for the bridge (no GET "
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

    def place(
        self,
        state: State,
        model_card: ModelCard,
        sharding: Sharding,
        instance_meta: InstanceMeta,
        min_nodes: int,
    ) -> AnyInstance:
        """The keeper's placement: the answer asked of exo before this step (module doc)."""
        answer = self.answers.get(model_card.model_id)
        if answer is None:  # the keeper's timers and its step disagree: a bug, reported as such
            raise RuntimeError(f"no placement of {model_card.model_id} was asked of exo")
        if isinstance(answer, str):
            raise ValueError(answer)
        # The keeper hands placement exo's State without the nodes serving the model; the
        # answer was chosen before, on exo's whole State: it must use none of the nodes left out
        # (a node exo knows and its State does not show yet is exo's to judge).
        whole = self._whole_state()
        left_out = frozenset(whole.topology.nodes) - frozenset(state.topology.nodes)
        used = left_out & answer.instance.shard_assignments.node_to_runner.keys()
        if used:
            raise ValueError(
                f"exo's placement of {model_card.model_id} uses {node_names(whole, used)}, "
                "which the keeper left out (they serve it already)"
            )
        self._to_post[answer.instance.instance_id] = answer.raw
        return answer.instance

    def posted(self, instance_id: str) -> JsonObject | None:
        """exo's JSON of an instance the keeper took in this step, to post (once)."""
        return self._to_post.pop(instance_id, None)
