"""A stock exo's recorded answers (``tests/fixtures/exo_recordings``), read for the TUI's tests.

The recordings are exo's own bytes; the tests read them through this one module so each test
names a recording by its stage (``"state-node-timed-out"``) and gets exactly what exo said.
"""

from __future__ import annotations

from pathlib import Path

from keeper.state import State

RECORDINGS = Path(__file__).parent / "fixtures" / "exo_recordings"


def recorded(name: str) -> bytes:
    """The body of recording ``name`` (without ``.json``), byte for byte."""
    return (RECORDINGS / f"{name}.json").read_bytes()


def recorded_state(name: str) -> State:
    """A recorded ``GET /state``, read by the same tolerant model the TUI reads it with."""
    return State.model_validate_json(recorded(name))


def recorded_content_type(name: str) -> str:
    """The Content-Type exo answered with, from ``<name>-headers.txt``."""
    for line in (RECORDINGS / f"{name}-headers.txt").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip().casefold() == "content-type":
            return value.strip()
    raise LookupError(f"{name}-headers.txt has no Content-Type")
