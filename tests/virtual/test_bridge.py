"""The bridge against ``master --exo-compat`` with simulated nodes, in virtual time.

Each test tells one of the issue's stories through exo's API only: what the bridge POSTs and
DELETEs is recorded by the link (``tests/bridge_harness.py``), what exo holds is read from the
stand-in's State. Waits are on conditions with virtual-time deadlines.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from bridge_harness import EXO_URL, exo_with_bridge, wait_until
from model_ids import QWEN

from keeper.bridge.exo_client import ExoClient
from keeper.bridge.in_flight import RESEND_S
from keeper.bridge.service import Bridge
from keeper.core.keeper import Keeper
from keeper.model.constants import FIRST_BACKOFF, PLACEMENT_TIMEOUT, STARTUP_GRACE
from keeper.model.events import AnyEvent
from keeper.model.state import State
from keeper.sim.exo_standin.app import ExoCreateInstance

REFUSAL = "Insufficient memory to create instance. Required: 0.3GB, Available: 0.1GB"


@pytest.mark.anyio
async def test_deploy_lose_replace_delete_through_exo_s_api() -> None:
    async with exo_with_bridge() as h:
        started = anyio.current_time()
        created = await h.bridge.create_deployment(QWEN)
        deployment_id = created.deployment_id
        assert deployment_id is not None

        # Placed after the grace, through POST /instance, with the id the keeper chose.
        await wait_until(h.serving, STARTUP_GRACE + 10, "the deployment serving")
        assert anyio.current_time() - started >= STARTUP_GRACE
        (first,) = h.exo_instances()
        assert h.link.posted_instances() == [first]
        assert h.bridge.state.deployments[deployment_id].instance_id == first
        (_, _, body) = next(c for c in h.link.calls if c[1] == "/instance")
        ExoCreateInstance.model_validate(body)  # what was sent is what exo's parser takes

        # Someone deletes it in exo: the bridge places it again at once (it had been ready).
        await anyio.sleep(1.5)
        deleted = await h.exo_api("DELETE", f"/instance/{first}")
        assert deleted.status_code == 200
        took = await wait_until(
            lambda: bool(h.exo_instances()) and first not in h.exo_instances(),
            5,
            "a new instance in exo",
        )
        assert took < FIRST_BACKOFF  # no backoff: it was lost after it was ready
        (second,) = h.exo_instances()
        assert h.link.posted_instances() == [first, second]
        await wait_until(h.serving, 10, "serving again")
        assert h.bridge.state.deployments[deployment_id].instance_id == second

        # Deleting the deployment deletes exo's instance, and nothing comes back.
        await h.bridge.delete_deployment(deployment_id)
        await wait_until(lambda: not h.exo_instances(), 3, "exo's instance deleted")
        assert h.link.deleted_instances() == [second]
        await anyio.sleep(120)
        assert h.exo_instances() == []
        assert h.link.posted_instances() == [first, second]
        assert h.bridge.deployments_view().deployments == []
        assert h.bridge.doomed_instances == []


@pytest.mark.anyio
async def test_no_placement_while_exo_is_unreachable_then_recovery() -> None:
    async with exo_with_bridge() as h:
        await h.bridge.create_deployment(QWEN)
        await wait_until(h.serving, STARTUP_GRACE + 10, "the deployment serving")
        await anyio.sleep(1.5)
        (first,) = h.exo_instances()

        h.link.down = True
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        # Meanwhile exo loses the instance; the bridge cannot see it and must not guess.
        await h.master.delete_instance(first)
        await anyio.sleep(90)
        assert h.exo_instances() == []
        assert h.link.posted_instances() == [first]
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is not None
        assert re.fullmatch(
            r"exo unreachable since \d\d:\d\d:\d\d: GET /state: cannot reach exo at "
            r"http://exo\.test \(connection refused\)",
            view.detail,
        ), view.detail
        # The last State read is still served, deployments merged in.
        assert b'"deployments"' in h.bridge.state_json()

        h.link.down = False
        took = await wait_until(lambda: bool(h.exo_instances()), 5, "placed again once exo answers")
        assert took <= 2.5
        await wait_until(h.serving, 10, "serving again")
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is None
        assert h.bridge.outage is None


@pytest.mark.anyio
async def test_a_bridge_restart_keeps_deployments_and_places_no_duplicate(
    tmp_path: Path,
) -> None:
    async with exo_with_bridge(data_dir=tmp_path) as h:
        deployment_id, first = await h.serve_qwen()

        bridge = await h.restart_bridge(tmp_path)
        assert deployment_id in bridge.state.deployments
        assert bridge.state.deployments[deployment_id or ""].instance_id == first
        await anyio.sleep(STARTUP_GRACE + 30)
        assert h.exo_instances() == [first]
        assert h.link.posted_instances() == [first]
        assert h.serving()


@pytest.mark.anyio
async def test_exo_s_refusal_becomes_the_placement_error_and_is_retried() -> None:
    async with exo_with_bridge() as h:
        h.link.refuse_instances = REFUSAL
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: h.status() == "cant_place", STARTUP_GRACE + 5, "cant_place")
        (view,) = h.bridge.deployments_view().deployments
        assert view.deployment.placement_error == REFUSAL
        assert view.waiting == "unplaceable_retry"
        assert view.failures == 0
        first_try = len(h.link.posted_instances())
        await anyio.sleep(2 * PLACEMENT_TIMEOUT + 1)
        # Tried again on the keeper's placement timeout, not every second.
        assert len(h.link.posted_instances()) - first_try == 2
        assert h.exo_instances() == []

        h.link.refuse_instances = None
        await wait_until(h.serving, PLACEMENT_TIMEOUT + 10, "placed once exo accepts")
        (view,) = h.bridge.deployments_view().deployments
        assert view.deployment.placement_error is None


@pytest.mark.anyio
async def test_an_instance_exo_applies_late_is_waited_for_and_deleted_with_its_deployment() -> None:
    async with exo_with_bridge() as h:
        h.link.hold_instances = True
        created = await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(h.link.held), STARTUP_GRACE + 5, "an instance sent")
        (sent,) = h.link.posted_instances()
        await anyio.sleep(5)
        # Accepted but not applied: resent as itself, no second placement, the operator is told.
        assert set(h.link.posted_instances()) == {sent}
        (view,) = h.bridge.deployments_view().deployments
        assert view.waiting == "placement_in_flight"
        assert view.detail == f"instance {sent[:8]} sent to exo; waiting for exo's State to show it"

        await h.bridge.delete_deployment(created.deployment_id or "")
        assert h.bridge.doomed_instances == [sent]
        await h.link.release()  # exo applies the creation only now
        await wait_until(lambda: sent in h.exo_instances(), 2, "exo applied it")
        await wait_until(lambda: not h.exo_instances(), 3, "deleted once it showed")
        await anyio.sleep(PLACEMENT_TIMEOUT + 5)
        assert h.exo_instances() == []
        assert h.bridge.doomed_instances == []
        assert set(h.link.posted_instances()) == {sent}


@pytest.mark.anyio
async def test_an_instance_exo_never_applies_is_sent_again_as_itself_without_a_failure() -> None:
    async with exo_with_bridge() as h:
        h.link.hold_instances = True
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(h.link.held), STARTUP_GRACE + 5, "an instance sent")
        h.link.held.clear()  # exo lost it (its master moved, say)
        h.link.hold_instances = False
        took = await wait_until(
            lambda: len(h.link.posted_instances()) == 2, PLACEMENT_TIMEOUT + 3, "a second try"
        )
        assert RESEND_S - 1 <= took <= RESEND_S + 1  # not the keeper's 30 s: the same instance
        (sent, again) = h.link.posted_instances()
        assert again == sent
        await wait_until(h.serving, 10, "serving")
        (view,) = h.bridge.deployments_view().deployments
        assert view.failures == 0
        assert h.exo_instances() == [sent]
        assert h.bridge.state.deployments[view.deployment.deployment_id].instance_id == sent


@pytest.mark.anyio
async def test_a_deletion_while_exo_is_down_is_carried_out_when_it_is_back(
    tmp_path: Path,
) -> None:
    async with exo_with_bridge(data_dir=tmp_path) as h:
        deployment_id, instance = await h.serve_qwen()
        h.link.down = True
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        await h.bridge.delete_deployment(deployment_id or "")
        assert h.bridge.deployments_view().deployments == []
        # The bridge restarts before exo is back: the doomed instance is remembered.
        bridge = await h.restart_bridge(tmp_path)
        assert bridge.doomed_instances == [instance]
        await anyio.sleep(5)
        assert h.exo_instances() == [instance]
        h.link.down = False
        await wait_until(lambda: not h.exo_instances(), 5, "exo's instance deleted")
        await wait_until(lambda: bridge.doomed_instances == [], 3, "nothing left to delete")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "body", "reason"),
    [
        (500, {"error": {"message": "boom"}}, "GET /state: exo answered HTTP 500: boom"),
        (404, {"detail": "Not Found"}, "GET /state: exo at http://exo.test answered HTTP 404"),
        (200, b"<html>", "GET /state: exo's answer is not JSON"),
        (200, [1, 2], "GET /state: exo's answer is not a JSON object"),
        (200, {"runners": {"r": {"RunnerDancing": {}}}}, 'exo\'s State has no "instances"'),
    ],
)
async def test_exo_answering_what_cannot_be_used_is_an_outage_with_its_reason(
    status: int, body: Any, reason: str
) -> None:
    async with exo_with_bridge() as h:
        await h.bridge.create_deployment(QWEN)
        h.link.state_answer = (status, body)
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        outage = h.bridge.outage
        assert outage is not None
        assert reason in outage.reason, outage.reason
        await anyio.sleep(STARTUP_GRACE + 10)
        assert h.link.posted_instances() == []  # nothing placed on what cannot be read
        h.link.state_answer = None
        await wait_until(lambda: h.bridge.outage is None, 3, "exo followed again")
        await wait_until(h.serving, 10, "placed once exo's State can be read")


@pytest.mark.anyio
async def test_a_failing_step_is_logged_once_and_the_bridge_carries_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failing_until = anyio.current_time() + STARTUP_GRACE + 20

    class FlakyKeeper(Keeper):
        def step(self, state: State, now: float) -> list[AnyEvent]:
            if anyio.current_time() < failing_until:
                raise RuntimeError("keeper bug")
            return super().step(state, now)

    async with exo_with_bridge() as h:
        bridge = Bridge(
            ExoClient(EXO_URL, transport=h.link),
            None,
            keeper_factory=FlakyKeeper,
        )
        h.bridge_scope.cancel()
        h.bridge = bridge
        await h.group.start(bridge.run)
        await bridge.create_deployment(QWEN)
        await anyio.sleep(STARTUP_GRACE + 10)
        assert h.link.posted_instances() == []
        await wait_until(h.serving, 20, "serving once the step works")
        failures = [r for r in caplog.records if "a step of the bridge failed" in r.getMessage()]
        assert len(failures) == 1
