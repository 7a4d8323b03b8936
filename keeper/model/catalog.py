"""The built-in model catalog: real exo models with their real sizes and layer counts.

``GET /models`` and the TUI's picker read it; deployments copy the card they name. It is data
only; reading model-card TOML files from disk lives in the master (``--model-cards DIR``), and
``model_card_from_toml`` here only turns an already-parsed TOML document into a card.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from keeper.model.state import Backend, Memory, ModelCard

_ALL_BACKENDS = (Backend.MLX_METAL, Backend.MLX_CUDA, Backend.MLX_CPU)


def _card(
    model_id: str,
    size_bytes: int,
    n_layers: int,
    hidden_size: int,
    kv_heads: int,
    base_model: str,
    *,
    supports_tensor: bool = True,
) -> ModelCard:
    return ModelCard(
        model_id=model_id,
        storage_size=Memory(in_bytes=size_bytes),
        n_layers=n_layers,
        hidden_size=hidden_size,
        supports_tensor=supports_tensor,
        tasks=("TextGeneration",),
        backends=_ALL_BACKENDS,
        num_key_value_heads=kv_heads,
        base_model=base_model,
    )


# Sizes and tensor support as exo 0.3.70 gives them (its `GET /models` and its placement's cards,
# tests/fixtures/exo_recordings); where exo gives megabytes only, the size is that many MiB.
BUILTIN_MODEL_CARDS: tuple[ModelCard, ...] = (
    _card(
        "mlx-community/Qwen3-0.6B-4bit",
        342_884_352,
        28,
        1024,
        8,
        "Qwen3 0.6B",
        supports_tensor=False,
    ),
    _card("mlx-community/Llama-3.2-1B-Instruct-4bit", 729_808_896, 16, 2048, 8, "Llama 3.2 1B"),
    _card("mlx-community/Llama-3.2-3B-Instruct-4bit", 1_863_319_552, 28, 3072, 8, "Llama 3.2 3B"),
    _card("mlx-community/Qwen3-8B-4bit", 4_617_089_024, 36, 4096, 8, "Qwen3 8B"),
    _card("mlx-community/Qwen3-30B-A3B-4bit", 17_612_931_072, 48, 2048, 4, "Qwen3 30B"),
    _card(
        "mlx-community/Llama-3.3-70B-Instruct-4bit",
        38_769 * 1024 * 1024,
        80,
        8192,
        8,
        "Llama 3.3 70B",
    ),
    _card("mlx-community/DeepSeek-V3.1-4bit", 405_874_409_472, 61, 7168, 128, "DeepSeek V3.1"),
)


def model_card_from_toml(doc: Mapping[str, Any]) -> ModelCard:
    """Read one of exo's model-card TOML documents (snake_case keys, ``[storage_size]``)."""
    return ModelCard.model_validate(doc)


def catalog_by_id(cards: tuple[ModelCard, ...] = BUILTIN_MODEL_CARDS) -> dict[str, ModelCard]:
    return {card.model_id: card for card in cards}
