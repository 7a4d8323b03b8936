"""A stock exo's recorded answers (``tests/fixtures/exo_recordings``), read for the TUI's tests.

The recordings are exo's own bytes; the tests read them through this one module so each test
names a recording by its stage (``"state-node-timed-out"``) and gets exactly what exo said.
"""

from __future__ import annotations

import gzip
from pathlib import Path

from keeper.model.state import State

FIXTURES = Path(__file__).parent / "fixtures"
RECORDINGS = FIXTURES / "exo_recordings"


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


# The node that times out in the recordings, and the instance it held then.
TIMED_OUT_NODE = "3c018300-0485-4175-ad91-d7a662574ccb"
TIMED_OUT_INSTANCE = "32569048-4ef3-4bf0-92af-a979c4cd12d6"


def before_the_timeout() -> State:
    """``state-node-timed-out`` a moment earlier: its node still in the topology and reporting
    like the others. exo was not asked at that moment, so it is rebuilt from the recordings: the
    topology and node1's memory of ``state-3-nodes-idle`` (the same three nodes), the rest as it
    was recorded."""
    timed_out = recorded_state("state-node-timed-out")
    idle = recorded_state("state-3-nodes-idle")
    newest = max(timed_out.last_seen.values())
    return timed_out.model_copy(
        update={
            "topology": idle.topology,
            "node_memory": {
                **timed_out.node_memory,
                TIMED_OUT_NODE: idle.node_memory[TIMED_OUT_NODE],
            },
            "last_seen": {**timed_out.last_seen, TIMED_OUT_NODE: newest},
        }
    )


# Answers recorded from a real exo cluster (three unmodified exo processes with real runners:
# ``tests/fixtures/exo_cluster/README.md`` says which request produced each). The States are
# gzipped: exo lists every model it knows as a download entry of every node, ~430 kB a State.
CLUSTER = FIXTURES / "exo_cluster"


def cluster_recorded(name: str) -> bytes:
    """The body of real-cluster recording ``name`` (without ``.json`` or ``.json.gz``)."""
    plain = CLUSTER / f"{name}.json"
    if plain.exists():
        return plain.read_bytes()
    return gzip.decompress((CLUSTER / f"{name}.json.gz").read_bytes())
