"""What the bridge knows of exo's models: its model list and the full model cards exo showed.

exo places a model with its own card, which carries what ours does not (sampling defaults, the
reasoning dialect): when the bridge must place for exo, or build a deployment's card, it uses
exo's full card, never one rebuilt from exo's ``GET /models`` with those left out
(docs/bridge.md, "Placement"). ``ExoCards`` gathers those cards as exo shows them (in its
State, its placements and previews, its answers to ``POST /instance``), falls back on exo's own
card files (``--model-cards DIR``), and caches exo's model list, re-read when it is older than
``models_max_age_s`` or lacks a model asked for.

It stands apart from the bridge's service so that placing (``keeper.bridge.placing``), creating
(``keeper.bridge.creating``) and the deployment commands share one store of cards through a
narrow interface.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from keeper.bridge.exo_client import ExoApi, ExoModels, ExoRefusedError, ExoUnavailableError
from keeper.bridge.exo_wire import exo_model_card, listed_card
from keeper.bridge.following import ExoDownError
from keeper.bridge.placement_choice import preview_card, read_previews
from keeper.model.refusals import NotFoundError
from keeper.model.state import ModelCard
from keeper.model.wire import JsonObject
from keeper.runtime.deployments import shown

log = logging.getLogger(__name__)


class ExoCards:
    """exo's full model cards, by model id, and exo's model list (module doc)."""

    def __init__(
        self,
        exo: Callable[[], ExoApi],
        monotonic: Callable[[], float],
        *,
        catalog: Mapping[str, ModelCard],
        card_files: Mapping[str, JsonObject],
        models_max_age_s: float,
    ) -> None:
        self._exo = exo  # the exo API in use
        self._monotonic = monotonic
        self._catalog = catalog
        self._card_files = card_files
        self._models_max_age_s = models_max_age_s
        self._seen: dict[str, JsonObject] = {}
        self._models: ExoModels | None = None
        self._models_at = 0.0

    def saw(self, model_id: str, card: JsonObject) -> None:
        """exo showed its full card of the model."""
        self._seen[model_id] = card

    def saw_all(self, cards: Mapping[str, JsonObject]) -> None:
        self._seen.update(cards)

    def full(self, model_id: str) -> JsonObject | None:
        """exo's full card of the model: one exo showed, else its card file."""
        seen = self._seen.get(model_id)
        return seen if seen is not None else self._card_files.get(model_id)

    async def models_body(self) -> bytes:
        """exo's ``GET /models`` answer, passed on (the last one read if exo is down now)."""
        try:
            models = await self._exo().models()
        except ExoUnavailableError as exc:
            if self._models is None:
                raise ExoDownError(f"exo's model list is not available: {exc}") from None
            return self._models.body
        self._models, self._models_at = models, self._monotonic()
        return models.body

    async def deployment_card(self, model_id: str) -> ModelCard:
        """The card a new deployment of the model records, or a 404/503 naming ``model_id``."""
        try:
            models = await self._exo_models(need=model_id)
        except ExoUnavailableError as exc:
            raise ExoDownError(
                f"Cannot check {shown(model_id)} against exo's model list: {exc}",
                param="model_id",
            ) from None
        listed = models.listed.get(model_id)
        if listed is None:
            raise NotFoundError(
                f"Unknown model {shown(model_id)}: exo's GET /models does not list it",
                param="model_id",
            )
        # exo's own card when the bridge has one, else the catalog's, else exo's card from a
        # preview; else only what exo's list gives, the figures it lacks 0 (unknown): exo places
        # the model with its own card whatever this one says (docs/bridge.md, "Placement").
        for card in (self._known_card(model_id), self._catalog.get(model_id)):
            if card is not None:
                return card
        previewed = await self._previewed_card(model_id)
        return previewed if previewed is not None else listed_card(listed)

    def _known_card(self, model_id: str) -> ModelCard | None:
        card = self.full(model_id)
        if card is None:
            return None
        try:
            return exo_model_card(card)
        except ValueError:
            return None

    async def _previewed_card(self, model_id: str) -> ModelCard | None:
        """exo's card of the model from ``GET /instance/previews``, if a preview places it."""
        try:
            card = preview_card(read_previews(await self._exo().previews(model_id)), model_id)
            if card is None:
                return None
            found = exo_model_card(card)
        except (ExoRefusedError, ExoUnavailableError, ValueError) as exc:
            log.info("no model card of %s from exo's placement previews: %s", model_id, exc)
            return None
        self._seen[model_id] = card
        return found

    async def _exo_models(self, need: str | None = None) -> ExoModels:
        now = self._monotonic()
        models = self._models
        if (
            models is None
            or now - self._models_at >= self._models_max_age_s
            or (need is not None and need not in models.listed)
        ):
            models = await self._exo().models()
            self._models, self._models_at = models, now
        return models
