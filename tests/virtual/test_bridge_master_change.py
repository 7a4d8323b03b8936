"""exo's master changing under the bridge (docs/design.md §3.5, "exo's master changed").

On a real cluster, killing exo's master process leaves every node's API serving the old
master's last State until a new master is elected (about 3.4 s later); then each API starts
again from an empty State, fed by the new master's events numbered from 0: every instance gone,
the surviving nodes' runners stopped. Here the stand-in plays both sides through the link
(``ExoLink.state_edit``): first the old master's last State, frozen, then the stand-in's own
State renumbered from the reset on, without the old master's node, the instance deleted. The
bridge must record the master's change as the cause, dated from the old master's last report,
say so in the webhooks, and place the model again at once.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from bridge_harness import bridge_api, exo_with_bridge, wait_until
from model_ids import QWEN
from test_bridge_webhooks import THREE_NODES, Hook, config, serving_node

from keeper.model.notices import unix_seconds_of
from keeper.model.state import nodes_named

# How long exo's nodes took to elect a new master on the real cluster after its master was
# killed: the old State is served meanwhile.
ELECTION_S = 3.4

# Every key of exo's State that is keyed by a node id.
_PER_NODE = (
    "lastSeen",
    "downloads",
    "nodeIdentities",
    "nodeMemory",
    "nodeDisk",
    "nodeSystem",
    "nodeNetwork",
    "nodeThunderbolt",
    "nodeThunderboltBridge",
    "nodeRdmaCtl",
    "nodeBackends",
)


def new_masters_view(reset_at: int, gone: str) -> Any:
    """The stand-in's State as the new master's: its events numbered from ``reset_at`` on, the
    old master's node ``gone`` from it."""

    def edit(document: dict[str, Any]) -> dict[str, Any]:
        document["lastEventAppliedIdx"] = document["lastEventAppliedIdx"] - reset_at
        for key in _PER_NODE:
            document.get(key, {}).pop(gone, None)
        topology = document["topology"]
        topology["nodes"] = [node for node in topology["nodes"] if node != gone]
        topology["connections"] = {
            source: {sink: edges for sink, edges in sinks.items() if sink != gone}
            for source, sinks in topology.get("connections", {}).items()
            if source != gone
        }
        return document

    return edit


@pytest.mark.anyio
async def test_exos_master_changing_is_the_cause_and_the_model_is_placed_again_at_once() -> None:
    hook = Hook()
    async with exo_with_bridge(nodes=THREE_NODES, bridge_config=config(hook)) as h:
        deployment_id, instance_id = await h.serve_qwen()
        serving = serving_node(h)
        master = next(name for name, _ in THREE_NODES if name != serving)
        (master_id,) = nodes_named(h.master.state, master)
        await anyio.sleep(5.0)  # it serves a while: the master reports after it began to

        # The master is killed: its node reports no more, and every API serves its last State.
        old = (await h.exo_api("GET", "/state")).json()
        h.link.state_edit = lambda _: old
        h.nodes.crash(master, down_s=600)
        old_master_heard = unix_seconds_of(old["lastSeen"][master_id])
        assert old_master_heard is not None
        await anyio.sleep(ELECTION_S)  # the election: nothing changes in what exo shows

        # The new master: the instance gone (the surviving node's runner stopped), the State
        # numbered from 0 again, without the old master's node.
        assert (await h.exo_api("DELETE", f"/instance/{instance_id}")).status_code == 200
        await wait_until(lambda: not h.exo_instances(), 10, "the instance gone from exo")
        posted_before = len(h.link.posted_instances())
        h.link.state_edit = new_masters_view(h.master.state.last_event_applied_idx, master_id)
        reset = anyio.current_time()

        await wait_until(lambda: len(h.link.posted_instances()) > posted_before, 10, "placed")
        # At once: the next poll reads the new State, and the step places (no backoff, no grace).
        assert anyio.current_time() - reset <= 2.0
        await wait_until(lambda: "incident_resolved" in hook.kinds(), 60, "serving again")

        async with bridge_api(h.bridge) as api:
            answer = await api.get(f"/deployments/{deployment_id}/history?hours=1")
        (incident,) = answer.json()["incidents"]
        cause = f"exo's master changed (its State started empty; node {master} left)"
        assert incident["cause"] == cause
        # Dated from the old master's last report, not from when the new State was read.
        start = unix_seconds_of(incident["start"])
        assert start is not None and abs(start - old_master_heard) < 0.002

        opened, resolved = hook.bodies
        assert (opened["kind"], opened["model_id"], opened["cause"]) == (
            "incident_opened",
            QWEN,
            cause,
        )
        assert opened["text"].endswith(f"({cause})")
        assert resolved["start"] == opened["start"] == incident["start"]


@pytest.mark.anyio
async def test_an_instance_sent_before_exos_master_changed_is_sent_again_at_once() -> None:
    # Found on a real cluster: the replacement exo took while its master was dying was lost
    # with it, and the bridge sent it again only when its resend came due.
    async with exo_with_bridge(nodes=THREE_NODES, bridge_config=config(Hook())) as h:
        _, instance_id = await h.serve_qwen()
        serving = serving_node(h)
        master = next(name for name, _ in THREE_NODES if name != serving)
        (master_id,) = nodes_named(h.master.state, master)
        h.link.hold_instances = True  # answered, never applied: lost with the old master
        posted = len(h.link.posted_instances())
        assert (await h.exo_api("DELETE", f"/instance/{instance_id}")).status_code == 200
        await wait_until(lambda: len(h.link.posted_instances()) > posted, 10, "placed again")
        (lost,) = h.link.posted_instances()[posted:]

        # The master is killed: every API serves its last State through the election.
        old = (await h.exo_api("GET", "/state")).json()
        h.link.state_edit = lambda _: old
        h.nodes.crash(master, down_s=600)
        await anyio.sleep(1.5)
        h.link.hold_instances = False
        h.link.state_edit = new_masters_view(h.master.state.last_event_applied_idx, master_id)
        changed = anyio.current_time()
        await wait_until(lambda: h.link.posted_instances().count(lost) > 1, 10, "sent again")
        # At the first poll of the new State, not the resend's 5 s after the last POST.
        assert anyio.current_time() - changed <= 1.5
        await wait_until(lambda: lost in h.exo_instances(), 10, "the same instance in exo")
