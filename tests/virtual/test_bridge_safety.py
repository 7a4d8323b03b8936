"""The bridge fails closed: on a State it cannot trust, through elections, across exo URLs.

Each test runs the bridge against the ``--exo-compat`` stand-in (``tests/bridge_harness.py``) in
virtual time, and breaks what a real exo was seen to break: a State missing a key the keeper
decides on, commands held for seconds while exo elects a master (and applied afterwards even
when the bridge gave up waiting), the exo node in use leaving. What exo ends up running is read
from the stand-in's State; what the bridge sent, from the link's record of calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, ExoLink, ExoWithBridge, exo_with_bridge, wait_until
from model_ids import LLAMA, QWEN

from keeper.bridge.api import create_bridge_app
from keeper.bridge.exo_client import COMMAND_TIMEOUT_S, ExoClient
from keeper.bridge.service import STATE_UNREADABLE, Bridge, BridgeConfig
from keeper.cli import EXIT_USAGE, build_parser, main
from keeper.model.api_models import DeploymentView
from keeper.model.constants import PLACEMENT_TIMEOUT, STARTUP_GRACE
from keeper.sim.exo_standin.app import create_exo_compat_app

SECOND_URL = "http://exo-2.test"
Edit = Callable[[dict[str, Any]], dict[str, Any]]


def without(key: str) -> Edit:
    def edit(state: dict[str, Any]) -> dict[str, Any]:
        del state[key]
        return state

    return edit


def renamed_instances(state: dict[str, Any]) -> dict[str, Any]:
    state["instanceMap"] = state.pop("instances")
    return state


def broken_instance_tag(model_id: str) -> Edit:
    """Each instance of ``model_id`` under a kind this bridge does not know."""

    def edit(state: dict[str, Any]) -> dict[str, Any]:
        for instance_id, tagged in list(state["instances"].items()):
            body = next(iter(tagged.values()))
            if body["shardAssignments"]["modelId"] == model_id:
                state["instances"][instance_id] = {"MlxRingInstanceV2": body}
        return state

    return edit


def every_card_with_vllm(state: dict[str, Any]) -> dict[str, Any]:
    """Every model card in exo's State as exo's ``POST /models/add`` writes one: with every
    backend exo knows, ``Vllm`` among them."""

    def visit(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "backends" and isinstance(inner, list):
                    inner.append("Vllm")
                else:
                    visit(inner)
        elif isinstance(value, list):
            for inner in value:
                visit(inner)

    visit(state)
    return state


def views_by_model(h: ExoWithBridge) -> dict[str, DeploymentView]:
    """The bridge's deployment views, by model."""
    views = h.bridge.deployments_view().deployments
    return {view.deployment.model_card.model_id: view for view in views}


# --- fail closed on exo's State ---------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("edit", "why"),
    [
        (without("instances"), 'exo\'s State has no "instances"'),
        (without("runners"), 'exo\'s State has no "runners"'),
        (without("topology"), 'exo\'s State has no "topology"'),
        (without("nodeMemory"), 'exo\'s State has no "nodeMemory"'),
        (renamed_instances, 'exo\'s State has no "instances"'),
    ],
    ids=["instances", "runners", "topology", "nodeMemory", "renamed"],
)
async def test_a_state_without_what_the_keeper_decides_on_places_nothing(
    edit: Edit, why: str
) -> None:
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        h.link.state_edit = edit
        await wait_until(lambda: h.bridge.outage is not None, 3, "the State refused")
        # Two placement timeouts: the measured failure placed twice within this.
        await anyio.sleep(2 * PLACEMENT_TIMEOUT)
        assert h.link.posted_instances() == [first]
        assert h.exo_instances() == [first]
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is not None
        expected = re.escape(why.format(instance=first))
        assert re.match(rf"exo state unreadable since \d\d:\d\d:\d\d: {expected}", view.detail), (
            view.detail
        )
        health = h.bridge.health().exo
        assert health.outage == STATE_UNREADABLE
        assert health.reachable is True and health.state_readable is False

        # The next good read brings everything back, with nothing placed meanwhile.
        h.link.state_edit = None
        await wait_until(lambda: h.bridge.outage is None, 3, "the State read again")
        await anyio.sleep(PLACEMENT_TIMEOUT)
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is None
        assert h.serving()
        assert h.link.posted_instances() == [first]
        assert h.exo_instances() == [first]


@pytest.mark.anyio
async def test_an_unreadable_instance_stops_only_its_deployment_every_other_is_kept() -> None:
    async with exo_with_bridge() as h:
        _, qwen = await h.serve_qwen()
        await h.bridge.create_deployment(LLAMA)
        await wait_until(lambda: len(h.exo_instances(LLAMA)) == 1, 30, "llama placed")
        (llama,) = h.exo_instances(LLAMA)
        h.link.state_edit = broken_instance_tag(QWEN)
        await wait_until(
            lambda: views_by_model(h)[QWEN].detail is not None, 3, "qwen's instance unread"
        )
        assert h.bridge.outage is None  # exo's State as a whole is followed
        detail = views_by_model(h)[QWEN].detail
        assert detail is not None
        assert detail.startswith(f"exo's instance {qwen} cannot be read: "), detail
        assert "MlxRingInstanceV2" in detail
        assert detail.endswith("placing and deleting nothing for this deployment until it reads")
        assert views_by_model(h)[LLAMA].detail is None

        # Llama's instance lost: placed again, while Qwen's, unread, is neither placed again
        # nor recorded as deleted.
        await h.master.delete_instance(llama)
        await wait_until(
            lambda: h.exo_instances(LLAMA) not in ([], [llama]), 30, "llama placed again"
        )
        await anyio.sleep(2 * PLACEMENT_TIMEOUT)
        assert h.exo_instances(QWEN) == [qwen]
        assert [i for i in h.link.posted_instances() if i == qwen] == [qwen]
        assert len(h.link.posted_instances()) == 3  # qwen, llama, llama's replacement
        assert h.link.deleted_instances() == []
        deployment = views_by_model(h)[QWEN].deployment
        assert qwen in deployment.placed_instance_ids

        h.link.state_edit = None
        await wait_until(
            lambda: views_by_model(h)[QWEN].detail is None, 3, "qwen's instance read again"
        )
        assert h.serving()


@pytest.mark.anyio
async def test_a_card_with_a_backend_we_do_not_run_is_read_and_kept() -> None:
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        h.link.state_edit = every_card_with_vllm
        await h.master.delete_instance(first)
        await wait_until(
            lambda: h.exo_instances() not in ([], [first]), 30, "placed again on Vllm cards"
        )
        assert h.bridge.outage is None
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is None or "cannot be read" not in view.detail


@pytest.mark.anyio
async def test_an_unreadable_state_deletes_nothing_and_a_good_one_resumes_both_ways() -> None:
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        deployment_id = h.bridge.deployments_view().deployments[0].deployment.deployment_id
        h.link.state_edit = without("runners")
        await wait_until(lambda: h.bridge.outage is not None, 3, "the State refused")
        await h.bridge.delete_deployment(deployment_id)
        await anyio.sleep(20)
        assert h.link.deleted_instances() == []  # not on the basis of that State
        assert h.exo_instances() == [first]
        h.link.state_edit = None
        await wait_until(lambda: not h.exo_instances(), 5, "deleted once exo's State reads")
        assert h.link.deleted_instances() == [first]


@pytest.mark.anyio
async def test_instances_lost_while_the_state_is_unreadable_are_placed_once_it_reads() -> None:
    async with exo_with_bridge() as h:
        _, first = await h.serve_qwen()
        h.link.state_edit = without("topology")
        await wait_until(lambda: h.bridge.outage is not None, 3, "the State refused")
        await h.master.delete_instance(first)
        await anyio.sleep(45)
        assert h.link.posted_instances() == [first]
        h.link.state_edit = None
        await wait_until(lambda: len(h.exo_instances()) == 1, 5, "placed again")
        (second,) = h.exo_instances()
        assert second != first
        assert h.link.posted_instances() == [first, second]


# --- elections ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("election_s", [3.0, 4.5, 6.0])
async def test_a_post_held_through_an_election_makes_exactly_one_instance(
    election_s: float,
) -> None:
    async with exo_with_bridge() as h:
        h.link.election_until = STARTUP_GRACE + 10**6  # from the first command on
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(h.link.posted_instances()), STARTUP_GRACE + 5, "a POST")
        h.link.election_until = anyio.current_time() + election_s
        await wait_until(h.serving, election_s + 10, "serving after the election")
        await anyio.sleep(PLACEMENT_TIMEOUT * 2)
        (instance,) = h.exo_instances()
        assert h.link.posted_instances() == [instance]  # answered within the deadline
        assert h.bridge.outage is None


@pytest.mark.anyio
async def test_an_election_longer_than_the_command_deadline_still_makes_one_instance() -> None:
    async with exo_with_bridge() as h:
        h.link.election_until = 10**6.0
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(h.link.posted_instances()), STARTUP_GRACE + 5, "a POST")
        (sent,) = h.link.posted_instances()
        ends = anyio.current_time() + PLACEMENT_TIMEOUT + 15  # beyond the keeper's own wait
        h.link.election_until = ends
        await wait_until(
            lambda: (h.bridge.deployments_view().deployments[0].detail or "").startswith(
                f"instance {sent[:8]}: exo has not answered POST /instance"
            ),
            COMMAND_TIMEOUT_S + 3,
            "the silence reported",
        )
        await anyio.sleep_until(ends - 1)
        # Resent as itself while exo holds it; never another instance.
        assert len(h.link.posted_instances()) >= 2
        assert set(h.link.posted_instances()) == {sent}
        await wait_until(h.serving, 10, "serving once the election is over")
        await anyio.sleep(2 * PLACEMENT_TIMEOUT)
        assert h.exo_instances() == [sent]
        assert set(h.link.posted_instances()) == {sent}
        assert h.link.deleted_instances() == []
        assert (
            h.bridge.state.deployments[
                h.bridge.deployments_view().deployments[0].deployment.deployment_id
            ].instance_id
            == sent
        )


@pytest.mark.anyio
async def test_a_creation_exo_applies_after_the_keeper_placed_another_is_deleted() -> None:
    async with exo_with_bridge() as h:
        h.link.hold_instances = True  # exo answers, and applies only on release
        await h.bridge.create_deployment(QWEN)
        await wait_until(lambda: bool(h.link.held), STARTUP_GRACE + 5, "an instance sent")
        (first,) = set(h.link.posted_instances())
        await wait_until(
            lambda: len(set(h.link.posted_instances())) == 2,
            PLACEMENT_TIMEOUT + 5,
            "another instance, once exo clearly dropped the first",
        )
        (second,) = set(h.link.posted_instances()) - {first}
        assert first in h.bridge.doomed_instances
        await h.link.release(second)
        await wait_until(h.serving, 10, "the second serving")
        await anyio.sleep(60)
        await h.link.release(first)  # the first lands after all
        await wait_until(lambda: first in h.exo_instances(), 2, "the first applied late")
        await wait_until(lambda: h.exo_instances() == [second], 5, "the extra deleted")
        assert h.link.deleted_instances() == [first]
        await anyio.sleep(PLACEMENT_TIMEOUT * 2)
        assert h.exo_instances() == [second]
        assert h.bridge.doomed_instances == []
        assert h.serving()


# --- failover ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_bridge_follows_the_next_exo_url_when_the_one_in_use_stops_answering() -> None:
    async with exo_with_bridge() as h:
        second = ExoLink(create_exo_compat_app(h.master))
        second.group = h.group
        h.bridge_scope.cancel()
        h.bridge = Bridge(
            [ExoClient(EXO_URL, transport=h.link), ExoClient(SECOND_URL, transport=second)],
            None,
            config=BridgeConfig(),
        )
        await h.group.start(h.bridge.run)
        _, first = await h.serve_qwen()
        assert h.bridge.exo.url == EXO_URL
        assert second.calls == []

        h.link.down = True  # the node in use leaves; exo loses the instance meanwhile
        await h.master.delete_instance(first)
        await wait_until(lambda: len(h.exo_instances()) == 1, 5, "placed again")
        assert h.bridge.outage is None
        assert h.bridge.exo.url == SECOND_URL
        (replacement,) = h.exo_instances()
        assert second.posted_instances() == [replacement]
        transport = httpx.ASGITransport(app=create_bridge_app(h.bridge))
        async with httpx.AsyncClient(transport=transport, base_url="http://bridge") as api:
            health = (await api.get("/healthz")).json()["exo"]
        assert health["url"] == SECOND_URL
        assert health["urls"] == [EXO_URL, SECOND_URL]

        # Neither answers: nothing is placed on what either said before.
        second.down = True
        await wait_until(lambda: h.bridge.outage is not None, 3, "the outage noticed")
        await h.master.delete_instance(replacement)
        await anyio.sleep(45)
        assert h.exo_instances() == []
        (view,) = h.bridge.deployments_view().deployments
        assert view.detail is not None and view.detail.startswith("exo unreachable since ")
        assert EXO_URL in view.detail and SECOND_URL in view.detail

        # The first comes back: it is followed (the second is still down) and places.
        h.link.down = False
        await wait_until(lambda: len(h.exo_instances()) == 1, 5, "placed through the first")
        assert h.bridge.exo.url == EXO_URL
        assert h.link.posted_instances() == [first, *h.exo_instances()]


# --- the command line --------------------------------------------------------------------------


def test_exo_takes_a_list_of_urls_in_order() -> None:
    args = build_parser().parse_args(
        ["bridge", "--exo", "http://studio.local:52415/, https://mini:52415"]
    )
    assert args.exo == ("http://studio.local:52415", "https://mini:52415")
    assert build_parser().parse_args(["bridge", "--exo", "http://a:1"]).exo == ("http://a:1",)


def test_exo_repeated_adds_its_urls_in_order_each_once() -> None:
    args = build_parser().parse_args(
        ["bridge", "--exo", "http://a:1,http://b:1", "--exo", "http://c:1", "--exo", "http://a:1"]
    )
    assert args.exo == ("http://a:1", "http://b:1", "http://c:1")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("http://a:1,,http://b:2", "'http://a:1,,http://b:2': item 2 is empty"),
        ("http://a:1,", "'http://a:1,': item 2 is empty"),
        ("", "no URL given"),
        ("http://a:1,ftp://b", "'ftp://b' is not exo's API URL (expected http://HOST:PORT)"),
        ("http://a:1,http://a:1/", "lists http://a:1 twice"),
        ("http://a:1,http://[::1", "'http://[::1' is not a URL"),
    ],
)
def test_a_bad_exo_list_is_a_usage_error_naming_the_item(
    given: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bridge", "--exo", given])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"error: argument --exo: {message}" in err, err
    assert "Traceback" not in err
