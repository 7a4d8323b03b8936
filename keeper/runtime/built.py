"""A value built from a few objects, kept until one of them is another object (or it ages).

The master and the bridge serve bodies that many clients poll (``GET /state``,
``GET /deployments``) from States that change far less often than they are asked for. States
are immutable, so "the same State" is "the same object": comparing inputs by identity costs
nothing, where comparing States by value would cost more than rebuilding. A body that also shows
countdowns is kept only ``max_age`` seconds. Both services keep such caches; this is the one
piece they share, so the rule is written once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class LastBuilt(Generic[_T]):
    """The last value built, and the inputs (compared by identity) and time it was built at."""

    def __init__(self) -> None:
        self._inputs: tuple[object, ...] | None = None
        self._value: _T | None = None
        self._at = 0.0

    def get(
        self,
        inputs: tuple[object, ...],
        build: Callable[[], _T],
        *,
        now: float = 0.0,
        max_age: float | None = None,
    ) -> _T:
        """The value last built if it was built from the same ``inputs`` (and, with
        ``max_age``, less than that long before ``now``); else ``build()``, kept."""
        kept = self._inputs
        if (
            kept is not None
            and self._value is not None
            and len(kept) == len(inputs)
            and all(old is new for old, new in zip(kept, inputs, strict=True))
            and (max_age is None or now - self._at < max_age)
        ):
            return self._value
        value = build()
        self._inputs, self._value, self._at = inputs, value, now
        return value
