"""The bridge's creations in flight (``keeper.bridge.creating``) across exo's master changing:
what the old master took may be gone with it, so the next tick sends it again at once (the tick
sees the change: tests/virtual/test_bridge_master_change.py)."""

from __future__ import annotations

from typing import Any, cast

import pytest
from keeper_harness import card

from keeper.bridge.creating import Creations
from keeper.bridge.doomed import DoomedInstances
from keeper.bridge.exo_client import ExoApi, ExoState
from keeper.bridge.exo_models import ExoCards
from keeper.bridge.in_flight import RESEND_S
from keeper.model.state import Deployment, State, Topology

DEPLOYMENT = Deployment(deployment_id="d-1", model_card=card("m"))
BODY: dict[str, Any] = {"MlxRingInstance": {"instanceId": "i-1"}}


class Exo:
    """exo's API as the creations use it: every POST /instance answered, none applied."""

    url = "http://exo"

    def __init__(self) -> None:
        self.posted: list[Any] = []

    async def create_instance(self, body: Any) -> dict[str, Any]:
        self.posted.append(body)
        return {"message": "Command received."}


def read(state: State) -> ExoState:
    return ExoState(state=state, raw={}, cards={})


# The old master's State, then the new master's first: numbered from 0 again, nobody heard yet.
OLD_MASTER = State(last_event_applied_idx=120, topology=Topology(nodes=["a", "b", "c"]))
OLD_MASTER_LATER = State(last_event_applied_idx=121, topology=Topology(nodes=["a", "b", "c"]))
NEW_MASTER = State(last_event_applied_idx=2)


def creations(exo: Exo) -> Creations:
    api = cast(ExoApi, exo)
    return Creations(
        exo=lambda: api,
        deployments=lambda: {"d-1": DEPLOYMENT},
        record=lambda _: None,
        fail=lambda _, __: None,
        doomed=DoomedInstances(None),
        cards=cast(ExoCards, None),
        monotonic=lambda: 0.0,
    )


@pytest.mark.anyio
async def test_a_creation_is_sent_again_at_once_when_exos_master_changes() -> None:
    exo = Exo()
    sent = creations(exo)
    await sent.create("i-1", "d-1", BODY, 10.0)
    sent.settle(read(OLD_MASTER), 10.5)
    await sent.resend(read(OLD_MASTER), 10.5)
    assert len(exo.posted) == 1  # the same master: sent again only after RESEND_S
    sent.settle(read(OLD_MASTER_LATER), 11.0)
    await sent.resend(read(OLD_MASTER_LATER), 11.0)
    assert len(exo.posted) == 1
    sent.master_changed()
    sent.settle(read(NEW_MASTER), 11.5)
    await sent.resend(read(NEW_MASTER), 11.5)
    assert len(exo.posted) == 2  # at once, 1.5 s after the first POST
    assert exo.posted[1] == exo.posted[0] == {"instance": BODY}
    sent.settle(read(NEW_MASTER), 12.0)
    await sent.resend(read(NEW_MASTER), 12.0)
    assert len(exo.posted) == 2  # once per change: then every RESEND_S again
    sent.settle(read(NEW_MASTER), 11.5 + RESEND_S)
    await sent.resend(read(NEW_MASTER), 11.5 + RESEND_S)
    assert len(exo.posted) == 3
