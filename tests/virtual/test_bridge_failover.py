"""Fast failover through the bridge, in virtual time, on the stand-in for a stock exo with
in-process nodes (docs/design.md §5.18): liveness from exo's ``lastSeen`` moving between the
bridge's polls; a frozen node is suspected, a replacement placed on another through exo's API,
and once it is confirmed dead (silent ``--dead-after-s`` while the others are heard) its
instance deleted with exo's ``DELETE /instance/{id}`` — long before exo's own 30 s timeout. A
State without ``lastSeen`` turns fast failover off and ``/healthz`` says why."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from bridge_harness import exo_with_bridge, wait_until

from keeper.bridge.node_liveness import NO_LAST_SEEN, BridgeLiveness, last_seen_refusal, parsed
from keeper.bridge.service import BridgeConfig
from keeper.model.liveness import LivenessConfig
from keeper.model.state import State, Topology

FAST = BridgeConfig(liveness=LivenessConfig(3.0, 8.0))
NODES = (("a", 32.0), ("b", 32.0), ("c", 32.0))


@pytest.mark.anyio
async def test_a_frozen_node_fails_over_through_exos_api_in_seconds() -> None:
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST) as h:
        _, first = await h.serve_qwen()
        holder = next(iter(h.master.state.instances[first].shard_assignments.node_to_runner))
        name = h.master.state.node_identities[holder].friendly_name
        h.nodes.freeze(name, 30.0)
        frozen_at = anyio.current_time()
        await wait_until(lambda: len(h.exo_instances()) == 2, 8, "a replacement in exo")
        placed_s = anyio.current_time() - frozen_at
        (view,) = h.bridge.deployments_view().deployments
        assert view.failover is not None and view.failover.phase in ("replacing", "confirmed")
        await wait_until(lambda: first not in h.exo_instances(), 10, "the old one deleted")
        deleted_s = anyio.current_time() - frozen_at
        assert first in h.link.deleted_instances()  # by exo's DELETE /instance/{id}
        assert placed_s <= 6 and deleted_s <= 12  # exo's own timeout: 30 s, then its sweep
        assert holder in h.master.state.topology.nodes  # exo itself has not timed it out
        nodes = h.bridge.nodes_view().nodes
        (frozen,) = [n for n in nodes if n.name == name]
        assert frozen.liveness == "dead" and frozen.silent_s is not None
        assert h.bridge.health().fast_failover == "on"


@pytest.mark.anyio
async def test_off_keeps_exos_rule() -> None:
    async with exo_with_bridge(nodes=NODES) as h:  # BridgeConfig's default: off
        _, first = await h.serve_qwen()
        holder = next(iter(h.master.state.instances[first].shard_assignments.node_to_runner))
        h.nodes.freeze(h.master.state.node_identities[holder].friendly_name, 15.0)
        await anyio.sleep(12)
        assert h.exo_instances() == [first]
        assert h.bridge.health().fast_failover.startswith("off")


def test_a_state_without_last_seen_or_with_bad_dates_turns_it_off() -> None:
    state = State(topology=Topology(nodes=["a"]), last_seen={"a": "2026-12-01T12:00:00Z"})
    raw: dict[str, Any] = {"lastSeen": {"a": "2026-12-01T12:00:00Z"}}
    assert last_seen_refusal(state, raw) is None
    assert last_seen_refusal(state, {}) == NO_LAST_SEEN
    bad = state.model_copy(update={"last_seen": {"a": "yesterday"}})
    refusal = last_seen_refusal(bad, raw)
    assert refusal is not None and "not a date" in refusal and "'yesterday'" in refusal
    unzoned = state.model_copy(update={"last_seen": {"a": "2026-12-01T12:00:00"}})
    assert last_seen_refusal(unzoned, raw) is not None
    missing = state.model_copy(update={"last_seen": {}})
    refusal = last_seen_refusal(missing, raw)
    assert refusal is not None and "no lastSeen for node a" in refusal
    assert parsed("2026-12-01T12:00:00Z") == 1796126400.0
    liveness = BridgeLiveness(LivenessConfig())
    liveness.observe(state, {}, 0.0, 0.0)
    assert liveness.off_why == NO_LAST_SEEN and liveness.verdicts == {}
    liveness.observe(state, raw, 1.0, 1.0)
    assert liveness.off_why is None
