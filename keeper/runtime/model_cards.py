"""Load exo model-card TOML files (``--model-cards DIR``) to extend the built-in catalog.

exo keeps one card per model in a ``.toml`` file (snake_case keys, ``[storage_size]
in_bytes``); we read the same files, so a folder copied from an exo checkout just works. A file
that is not TOML or not a card stops the master at start with an error naming the file and
the field, instead of a model silently missing from ``GET /models``.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import ValidationError

from keeper.model.catalog import model_card_from_toml
from keeper.model.state import ModelCard


class ModelCardError(Exception):
    """A model-card folder or file that cannot be used; the message names it."""


def load_model_cards(directory: Path) -> tuple[ModelCard, ...]:
    """Every ``*.toml`` card in ``directory`` (not recursive), in file-name order."""
    if not directory.is_dir():
        raise ModelCardError(f"{directory}: not a directory of model-card .toml files")
    cards: list[ModelCard] = []
    for path in sorted(directory.glob("*.toml")):
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ModelCardError(f"{path}: not a readable TOML file ({exc})") from None
        try:
            cards.append(model_card_from_toml(document))
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(_snake(str(part)) for part in error['loc']) or 'card'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ModelCardError(f"{path}: not an exo model card ({problems})") from None
    return tuple(cards)


def _snake(name: str) -> str:
    # Errors name fields by their JSON (camelCase) alias; the TOML file spells them snake_case.
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def merge_catalogs(
    builtin: tuple[ModelCard, ...], extra: tuple[ModelCard, ...]
) -> tuple[ModelCard, ...]:
    """The built-in cards plus ``extra``; a card in ``extra`` replaces a built-in of its id."""
    by_id = {card.model_id: card for card in builtin}
    by_id.update({card.model_id: card for card in extra})
    return tuple(by_id.values())
