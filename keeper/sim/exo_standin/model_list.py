"""The models the exo stand-in knows: exo 0.3.70's model list and the full cards it has figures for.

A stock exo shows a model two ways: ``GET /models`` lists it without layer counts or sampling
defaults, and its full card (``storageSize``, ``nLayers``, ``hiddenSize``, ``samplingDefaults``,
``reasoningDialect``...) appears only inside the shards it places and in the answer to
``POST /instance``. The stand-in ships both as package data, so the installed
``exo-deploy master --exo-compat`` answers like exo without the test fixtures:

- ``data/models.json``: exo 0.3.70's own ``GET /models`` answer (123 models), byte for byte
  the recording in ``tests/fixtures/exo_recordings/models.json``;
- ``data/cards.json``: full cards, in exo's JSON (camelCase, exo's key order), only for models
  whose every figure comes from exo itself. Where each came from is in ``CARD_SOURCES``; a test
  checks that every card agrees with the model list (size to the MiB, family, capabilities,
  context length...).

A model the list names but no shipped card covers has no known layer count: the stand-in
judges exo's placement rules that need only the list's figures, then refuses to place it,
saying so, rather than invent a layer count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import cast

from keeper.model.state import Memory, ModelCard
from keeper.model.wire import JsonObject

# exo's list gives sizes in whole MiB (``storage_size_megabytes`` is the card's bytes // MiB).
MEBIBYTE = 1024 * 1024

# Where each shipped full card comes from. Cards exo showed in a recording are copied whole;
# the others are exo's own model-card files, completed from exo's list entry.
_FROM_CARD_FILE = "exo's card file (as in tests/fixtures), reasoning dialect from exo's list"
CARD_SOURCES: dict[str, str] = {
    "mlx-community/Qwen3-0.6B-4bit": "recorded: instance-placement-ok.json",
    "mlx-community/Qwen3-30B-A3B-4bit": "recorded: state-two-node-pipeline-ready.json",
    "mlx-community/DeepSeek-V3.1-4bit": _FROM_CARD_FILE,
    "mlx-community/Llama-3.2-1B-Instruct-4bit": _FROM_CARD_FILE,
    "mlx-community/Llama-3.2-3B-Instruct-4bit": (
        "built-in catalog figures (size matches exo's list to the MiB) and exo's list entry; "
        "no sampling defaults known, so every knob is null"
    ),
}


@dataclass(frozen=True)
class ExoModel:
    """What the stand-in knows of one model: exo's list entry, and its full card if shipped."""

    listed: JsonObject
    full_card: JsonObject | None

    @property
    def model_id(self) -> str:
        return str(self.listed["id"])

    @property
    def base_model(self) -> str:
        return str(self.listed.get("base_model") or "")

    @property
    def storage_size(self) -> Memory:
        """The full card's size, else the list's (whole MiB: at most 1 MiB under the truth)."""
        if self.full_card is not None:
            return Memory(in_bytes=int(self.full_card["storageSize"]["inBytes"]))
        return Memory(in_bytes=int(self.listed["storage_size_megabytes"]) * MEBIBYTE)

    def card(self) -> ModelCard | None:
        """Our placement's card, read from the full card; None when no full card is shipped."""
        if self.full_card is None:
            return None
        return ModelCard.model_validate(self.full_card)


def _load(name: str) -> JsonObject:
    text = resources.files("keeper.sim.exo_standin").joinpath("data", name).read_text("utf-8")
    return cast(JsonObject, json.loads(text))


@cache
def exo_models_payload() -> JsonObject:
    """exo's ``GET /models`` answer, as recorded."""
    return _load("models.json")


@cache
def exo_full_cards() -> dict[str, JsonObject]:
    return {str(card["modelId"]): card for card in _load("cards.json")["cards"]}


@cache
def exo_catalog() -> dict[str, ExoModel]:
    """Every model exo lists, by id, each with its full card when one is shipped."""
    cards = exo_full_cards()
    return {
        str(entry["id"]): ExoModel(listed=entry, full_card=cards.get(str(entry["id"])))
        for entry in exo_models_payload()["data"]
    }
