"""Fast failover through the bridge, in virtual time, on the stand-in for a stock exo with
in-process nodes (docs/design.md §5.18): liveness from exo's ``lastSeen`` moving between the
bridge's polls; a frozen node is suspected, a replacement placed on another through exo's API,
and once it is confirmed dead (silent ``--dead-after-s`` while the others are heard) its
instance deleted with exo's ``DELETE /instance/{id}`` — long before exo's own 30 s timeout. Given
a node's own URL, the bridge probes it (``GET /node_id``): no answer confirms a suspect node at
once, and a refused connection any node at once (every node heard is probed for one each half
second). A freeze of the node whose
URL the bridge follows fails over like any other's: the bridge reads the next URL after the
State's short deadline and does not take the wait for its own pause. A State without
``lastSeen`` turns fast failover off and ``/healthz`` says why."""

from __future__ import annotations

import errno
import json
import logging
import socket
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import httpx
import pytest
from bridge_harness import EXO_URL, ExoWithBridge, exo_with_bridge, node_url, wait_until

from keeper.bridge.exo_client import (
    ExoClient,
    ExoConnectionRefusedError,
    ExoState,
    ExoUnavailableError,
    refused,
)
from keeper.bridge.following import ExoFollower
from keeper.bridge.node_liveness import NO_LAST_SEEN, BridgeLiveness, last_seen_refusal, parsed
from keeper.bridge.node_probes import (
    LOOKUP_EVERY_S,
    PROBE_EVERY_S,
    PROBE_TIMEOUT_S,
    NodeProbes,
    due_lookups,
    due_probes,
)
from keeper.bridge.service import BridgeConfig
from keeper.bridge.state_deadline import CEILING_S, FLOOR_S, hedge_after, next_deadline
from keeper.model.liveness import LivenessConfig
from keeper.model.state import NodeWatch, State, Topology

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
        # GET /state carries the verdict, so a TUI pointed at the bridge shows it too.
        served = json.loads(h.bridge.state_json())
        assert served["nodeWatch"][holder]["phase"] == "dead"


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


def holder_of(h: ExoWithBridge, instance_id: str) -> tuple[str, str]:
    """(node id, name) of the node holding ``instance_id`` in exo."""
    node_id = next(iter(h.master.state.instances[instance_id].shard_assignments.node_to_runner))
    return node_id, h.master.state.node_identities[node_id].friendly_name


def kill_with_its_api(h: ExoWithBridge, name: str) -> None:
    """kill -9 of node ``name``: its reports stop, and its own API's port refuses at once."""
    h.nodes.crash(name, 60.0)
    h.link.down_hosts.add(httpx.URL(node_url(name)).host)


@pytest.mark.anyio
async def test_a_killed_node_s_refused_port_confirms_it_dead_within_seconds() -> None:
    # The bridge has each node's own URL: it learns which is which by GET /node_id. The node is
    # killed with its API: its port refuses connections at once, a sign no freeze or slow
    # network gives, so a refused probe confirms it dead at once, before its reports are even
    # missed, let alone 8 s of silence.
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST, node_apis=True) as h:
        _, first = await h.serve_qwen()
        holder, name = holder_of(h, first)
        assert h.bridge.exo.url == EXO_URL  # the nodes' URLs are only asked GET /node_id
        assert set(h.link.node_id_asked) == {*h.link.node_hosts, httpx.URL(EXO_URL).host}
        verdicts: list[str] = []
        kill_with_its_api(h, name)
        crashed_at = anyio.current_time()

        def dead() -> bool:
            watch = h.bridge.state.node_watch.get(holder)
            if watch is not None and watch.phase not in verdicts:
                verdicts.append(watch.phase)
            return watch is not None and watch.phase == "dead"

        await wait_until(dead, 12, "the killed node confirmed dead", poll_s=0.05)
        dead_s = anyio.current_time() - crashed_at
        await wait_until(lambda: first not in h.exo_instances(), 5, "the old one deleted")
        deleted_s = anyio.current_time() - crashed_at
        assert first in h.link.deleted_instances()
        watch = h.bridge.state.node_watch[holder]
        assert "refused" in watch.why, watch.why
        # Refused at the probe round after the kill (every half second), which wakes the ticks:
        # dead before its reports were even missed. A State that still shows its last report
        # forgets the refusal (heard since), so at worst one round more.
        assert verdicts == ["dead"] and dead_s <= 2 * PROBE_EVERY_S + 0.5
        await wait_until(h.serving, 10, "serving again")
        serving_s = anyio.current_time() - crashed_at
        print(
            f"\nrefused: the killed node dead {dead_s:.2f} s after the kill, its instance "
            f"deleted at {deleted_s:.2f} s, serving again at {serving_s:.2f} s"
        )


@pytest.mark.anyio
async def test_a_node_whose_own_api_answers_is_confirmed_by_silence_only() -> None:
    # Cut off from exo's master but its API still answers the bridge: the probe is no second
    # sign, so it is confirmed by --dead-after-s of silence, as without a URL.
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST, node_apis=True) as h:
        _, first = await h.serve_qwen()
        holder, name = holder_of(h, first)
        h.nodes.partition(name, 30.0)
        cut_at = anyio.current_time()
        asked = len(h.link.node_id_asked)
        await wait_until(lambda: first not in h.exo_instances(), 14, "the old one deleted")
        deleted_s = anyio.current_time() - cut_at
        watch = h.bridge.state.node_watch[holder]
        assert watch.phase == "dead" and "while the other nodes were heard" in watch.why
        # silent from its last report, which came within a second (the nodes' cadence) of the cut
        assert deleted_s >= FAST.liveness.dead_after_s - 1.0
        probed = h.link.node_id_asked[asked:]
        # every node heard is probed for a refusal; the cut one answered, which told nothing
        assert set(probed) == {httpx.URL(node_url(n)).host for n, _ in NODES}


@pytest.mark.anyio
async def test_the_stand_in_answers_get_node_id_with_an_id_of_no_node() -> None:
    async with exo_with_bridge(nodes=NODES) as h:
        answer = await h.exo_api("GET", "/node_id")
        assert answer.status_code == 200
        own = answer.json()
        assert isinstance(own, str) and str(uuid.UUID(own)) == own  # exo's ids are uuid4s
        assert own not in h.master.state.topology.nodes
        assert await ExoClient(EXO_URL, transport=h.link).node_id(2.0) != ""


def test_which_urls_are_probed_and_looked_up() -> None:
    suspect = NodeWatch(phase="suspect", last_heard=0.0, since=3.0)
    dead = NodeWatch(phase="dead", last_heard=0.0, since=8.0)
    node_of = {"http://b": "nb", "http://a": "na", "http://c": "nc"}
    assert due_probes({"na": suspect, "nb": suspect, "nc": dead}, node_of, {}) == [
        "http://a",
        "http://b",
    ]
    assert due_probes({}, node_of, {}) == []
    # alive and heard, whatever the silence: probed (for a refusal); a dead one never, nor one
    # never heard (no silence)
    silences = {"na": 0.0, "nc": 60.0}
    assert due_probes({"nc": dead}, node_of, silences) == ["http://a"]
    asked = {"http://a": 100.0, "http://b": 100.0 - LOOKUP_EVERY_S}
    urls = ["http://c", "http://b", "http://a"]
    assert due_lookups(urls, asked, 100.0) == ["http://c", "http://b"]
    assert due_lookups(urls, asked, 100.0 + LOOKUP_EVERY_S) == urls
    assert due_lookups(urls, asked, 100.0 + LOOKUP_EVERY_S - 0.01) == ["http://c", "http://b"]


@pytest.mark.anyio
async def test_a_freeze_of_the_followed_node_fails_over_like_any_other() -> None:
    # The bridge follows node a's own API; a freezes and its API hangs (it never answers, as
    # a SIGSTOPped exo's). The bridge moves to the next URL within the State read's short
    # deadline, does not take the wait for its own pause, and judges a by its lastSeen frozen
    # in the State the next URL serves: suspect, a replacement placed, then dead on the probe.
    nodes = (("a", 48.0), ("b", 32.0), ("c", 32.0))
    async with exo_with_bridge(nodes=nodes, bridge_config=FAST, follow="a") as h:
        _, first = await h.serve_qwen()
        holder, name = holder_of(h, first)
        assert name == "a" and h.bridge.exo.url == node_url("a")
        said: set[str] = set()

        async def watch_health() -> None:
            while True:
                said.add(h.bridge.health().fast_failover)
                await anyio.sleep(0.1)

        h.group.start_soon(watch_health)
        h.nodes.freeze(name, 15.0)
        h.link.hung_hosts.add(httpx.URL(node_url(name)).host)
        frozen_at = anyio.current_time()
        await wait_until(lambda: h.bridge.exo.url != node_url(name), 10, "the next URL followed")
        switched_s = anyio.current_time() - frozen_at
        await wait_until(lambda: holder in h.bridge.state.node_watch, 10, "a suspected")
        suspected_s = anyio.current_time() - frozen_at
        suspicion = h.bridge.state.node_watch[holder]
        await wait_until(lambda: len(h.exo_instances()) == 2, 10, "a replacement in exo")
        placed_s = anyio.current_time() - frozen_at
        await wait_until(lambda: first not in h.exo_instances(), 10, "the old one deleted")
        deleted_s = anyio.current_time() - frozen_at
        watch = h.bridge.state.node_watch[holder]
        assert watch.phase == "dead" and "GET /node_id" in watch.why, watch.why
        print(
            f"\nfollowed node frozen: next URL at {switched_s:.1f} s, suspected at "
            f"{suspected_s:.1f} s, replacement at {placed_s:.1f} s, old one deleted at "
            f"{deleted_s:.1f} s; health said {sorted(said)}"
        )
        # a poll's wait, then the hedge (the next URL read beside the hung one), then its State
        assert switched_s <= 1.0 + hedge_after(FLOOR_S) + 0.1
        assert not [s for s in said if "paused" in s]  # exo's hang is not the bridge's pause
        # silent from its last report (before the freeze), not from the first State the next
        # URL gave, and checked when the threshold falls, not at the next poll
        # (a tick at the threshold, then its read of exo's State: well under the poll's second)
        assert suspected_s <= FAST.liveness.suspect_after_s + 0.5
        assert suspicion.since - suspicion.last_heard <= FAST.liveness.suspect_after_s + 0.5
        assert placed_s <= 6.0
        # suspected, probed within half a second, the probe's deadline, the next poll
        assert deleted_s <= suspected_s + 0.5 + PROBE_TIMEOUT_S + 1.0


def test_a_refusal_is_told_from_other_failures_to_connect() -> None:
    def connect_error(*causes: OSError) -> httpx.ConnectError:
        # as httpx raises it: httpcore's error, over anyio's "all attempts failed", over the
        # OS's error of each address tried (one, or a group of several)
        cause: BaseException = causes[0] if len(causes) == 1 else ExceptionGroup("all", causes)
        attempts = OSError("All connection attempts failed")
        attempts.__cause__ = cause
        inner = httpx.ConnectError("inner")
        inner.__context__ = attempts
        outer = httpx.ConnectError("All connection attempts failed")
        outer.__cause__ = inner
        return outer

    no = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    unreachable = OSError(errno.EHOSTUNREACH, "No route to host")
    assert refused(connect_error(no))
    assert refused(connect_error(no, no))  # IPv6 and IPv4 both refused
    assert not refused(connect_error(no, unreachable))  # one address may yet be the node's
    assert not refused(connect_error(unreachable))
    assert not refused(connect_error(socket.gaierror(-2, "Name or service not known")))
    assert not refused(httpx.ConnectError("no cause at all"))


def test_a_closed_port_is_refused_and_said_so() -> None:
    async def ask() -> str:
        with socket.socket() as sock:  # a port just freed: nobody listens on it
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        client = ExoClient(f"http://127.0.0.1:{port}")
        try:
            with pytest.raises(ExoConnectionRefusedError) as caught:
                await client.node_id(PROBE_TIMEOUT_S)
        finally:
            await client.aclose()
        return str(caught.value)

    said = anyio.run(ask, backend="asyncio")
    assert said.endswith("refused the connection") and "GET /node_id" in said


def test_the_state_deadline_follows_what_exo_takes() -> None:
    # a quick exo keeps the short deadline a freeze needs
    assert next_deadline(FLOOR_S, 0.01) == FLOOR_S
    # a slow one gets three of its reads, never more than the ceiling
    assert next_deadline(FLOOR_S, 1.0) == 3.0
    assert next_deadline(FLOOR_S, 2.5) == CEILING_S
    # no State in time anywhere: twice the deadline, up to the ceiling
    assert next_deadline(FLOOR_S, None) == 3.0
    assert next_deadline(4.0, None) == CEILING_S
    # quick again: back to the short deadline at once
    assert next_deadline(CEILING_S, 0.02) == FLOOR_S


@pytest.mark.anyio
async def test_a_slow_exo_is_followed_not_called_unreachable() -> None:
    # Every answer of exo takes 2 s (a loaded machine): longer than a quick exo's deadline.
    # The bridge stays blind a walk or two, then reads it and places the model.
    async with exo_with_bridge(nodes=NODES) as h:
        h.link.slow_s = 2.0
        await h.serve_qwen()
        assert h.bridge.health().exo.reachable


@pytest.mark.anyio
async def test_a_dead_node_s_instance_is_deleted_beside_its_replacement_not_before() -> None:
    # A loaded exo answers a DELETE in up to a second (0.9 s measured on a real cluster): the
    # replacement's placement must not wait for it. Here exo takes 4 s to answer the DELETE.
    slow_delete_s = 4.0
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST, node_apis=True) as h:
        _, first = await h.serve_qwen()
        _, name = holder_of(h, first)
        h.link.slow_deletes_s = slow_delete_s
        posted = len(h.link.posted_instances())
        kill_with_its_api(h, name)
        await wait_until(
            lambda: first in h.link.deleted_instances(), 12, "the DELETE sent", poll_s=0.05
        )
        delete_sent_at = anyio.current_time()
        await wait_until(
            lambda: len(h.link.posted_instances()) > posted,
            slow_delete_s + 3,
            "the replacement posted",
            poll_s=0.05,
        )
        replacement_after_s = anyio.current_time() - delete_sent_at
        assert replacement_after_s < slow_delete_s / 2, replacement_after_s
        await wait_until(h.serving, 10, "serving again")


@pytest.mark.anyio
async def test_a_dead_node_s_last_seen_going_back_is_no_report() -> None:
    # On a real cluster, the second a killed node's API refused, exo's State showed its
    # lastSeen 26 minutes back, then moving forward from there (exo replaying old reports):
    # taking each change for a report judged it heard again, then dead, every second.
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST, node_apis=True) as h:
        _, first = await h.serve_qwen()
        holder, name = holder_of(h, first)
        kill_with_its_api(h, name)
        await wait_until(
            lambda: (
                h.bridge.state.node_watch.get(holder) is not None
                and h.bridge.state.node_watch[holder].phase == "dead"
            ),
            12,
            "the killed node confirmed dead",
            poll_s=0.05,
        )
        replayed = [0]

        def replaying(state: dict[str, Any]) -> dict[str, Any]:
            # 26 minutes back, then a second forward at each read
            replayed[0] += 1
            back = datetime.now(UTC) - timedelta(minutes=26) + timedelta(seconds=replayed[0])
            state["lastSeen"][holder] = back.isoformat().replace("+00:00", "Z")
            return state

        h.link.state_edit = replaying
        phases: set[str] = set()
        end = anyio.current_time() + 10
        while anyio.current_time() < end:
            phases.add(h.bridge.state.node_watch[holder].phase)
            await anyio.sleep(0.1)
        assert replayed[0] >= 5 and phases == {"dead"}
        await wait_until(h.serving, 10, "serving again")


def seen(a: str, b: str) -> State:
    """Two nodes, ``a`` and ``b``, whose ``lastSeen`` are these."""
    return State(topology=Topology(nodes=["a", "b"]), last_seen={"a": a, "b": b})


def both_seen_at_ten() -> BridgeLiveness:
    """The bridge's liveness after one read of ``seen``, both nodes at 10:00:00, at time 0."""
    liveness = BridgeLiveness(FAST.liveness)
    liveness.observe(seen("2026-12-06T10:00:00Z", "2026-12-06T10:00:00Z"), RAW_SEEN, 0.0, 0.0)
    return liveness


RAW_SEEN: dict[str, Any] = {"lastSeen": {}}  # the raw State's only key the check reads


def test_an_alive_node_s_clock_set_back_still_reports() -> None:
    liveness = both_seen_at_ten()
    for t in range(1, 12):
        # a's clock stepped back 30 s at t=1 (NTP), its reports going on from there
        a = f"2026-12-06T09:59:{30 + t:02d}Z"
        liveness.observe(seen(a, f"2026-12-06T10:00:{t:02d}Z"), RAW_SEEN, float(t), float(t))
    assert liveness.verdicts == {}  # neither judged: a kept reporting


def test_a_report_read_late_is_dated_from_the_one_before_it() -> None:
    # The bridge could not read a State for 2.5 s (the node it followed froze); the next URL's
    # State shows a's last report, made 1 s after the one read before: a has been silent since
    # then (1.5 s), not since the read, and its threshold is 1.5 s away, not 3.
    liveness = both_seen_at_ten()
    for beat in (0.25 * k for k in range(1, 10)):
        liveness.beat(beat)  # the bridge's own loop ran: waiting on exo is no pause
    liveness.observe(seen("2026-12-06T10:00:01Z", "2026-12-06T10:00:02Z"), RAW_SEEN, 2.5, 2.5)
    assert liveness.silent_s("a", 2.5) == pytest.approx(1.5)
    assert liveness.silent_s("b", 2.5) == pytest.approx(0.5)
    assert liveness.next_check_in(2.5) == pytest.approx(FAST.liveness.suspect_after_s - 1.5)


class RefusingApi:
    """A node's own API whose port nobody listens on, then one that answers again."""

    url = "http://a.node.test"
    answering = False

    async def node_id(self, timeout_s: float) -> str:
        if self.answering:
            return "a"
        raise ExoConnectionRefusedError("GET /node_id: refused")


@pytest.mark.anyio
async def test_a_node_refused_round_after_round_is_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # exo down for minutes: every half-second round finds its port refused; the log says so once
    # a spell, not twice a second, and every refusal still reaches the rule.
    api = RefusingApi()
    probes = NodeProbes([api])  # type: ignore[list-item]  # the one method a probe calls
    probes.node_of[api.url] = "a"
    signs: list[str] = []
    caplog.set_level(logging.INFO, logger="keeper.bridge.node_probes")

    async def rounds(count: int) -> None:
        for k in range(count):
            await probes.once(float(k), {}, {"a": 0.1}, lambda _, sign: signs.append(sign))

    await rounds(6)
    said = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(signs) == 6 and len(said) == 1
    api.answering = True
    await rounds(1)
    api.answering = False
    await rounds(3)  # a new spell: said again, once
    said = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(said) == 2


@pytest.mark.anyio
async def test_a_stale_copy_of_the_state_is_left_for_one_that_hears_the_nodes() -> None:
    # Node a's exo is cut off from exo's master (a split exo, a partition): its copy of the State
    # shows b and c silent since the same moment, a stale view, while b's copy hears everyone.
    # The bridge, following a, reads b's copy instead, and judges again from it: nobody is
    # suspected, for nobody is silent there.
    async with exo_with_bridge(nodes=NODES, bridge_config=FAST, follow="a") as h:
        await h.serve_qwen()
        ids = {i.friendly_name: n for n, i in h.master.state.node_identities.items()}
        frozen_at: dict[str, str] = {}

        def cut_off(state: dict[str, Any]) -> dict[str, Any]:
            for name in ("b", "c"):
                seen = frozen_at.setdefault(name, state["lastSeen"][ids[name]])
                state["lastSeen"][ids[name]] = seen
            return state

        h.link.state_edit_at[httpx.URL(node_url("a")).host] = cut_off
        await wait_until(lambda: h.bridge.exo.url != node_url("a"), 12, "another copy read")
        await wait_until(lambda: h.bridge.health().fast_failover == "on", 5, "a fresh view")
        assert h.bridge.state.node_watch == {}  # b and c were never suspected


class CopyApi:
    """One node's exo API as the follower reads it: a State, or refused (``down``)."""

    def __init__(self, url: str, down: bool = False) -> None:
        self.url = url
        self.down = down
        self.reads = 0

    async def state(self, deadline_s: float) -> ExoState:
        del deadline_s
        self.reads += 1
        if self.down:
            raise ExoUnavailableError(f"exo at {self.url} refused the connection")
        return ExoState(state=State(), raw={}, cards={})


def follower(*apis: CopyApi) -> tuple[ExoFollower, list[str]]:
    switches: list[str] = []
    follow = ExoFollower(
        tuple(apis),  # type: ignore[arg-type]  # the one method a read calls
        lambda: datetime.now(UTC),
        lambda: switches.append("x"),
    )
    return follow, switches


@pytest.mark.anyio
async def test_every_copy_stale_is_tried_once_then_kept() -> None:
    # exo's master itself silent: every node's copy shows the others silent together. The
    # bridge tries each URL once, then stays (no copy can be fresher), until a view is fresh.
    follow, switches = follower(CopyApi("http://a"), CopyApi("http://b"), CopyApi("http://c"))
    for _ in range(5):
        await follow.read()
        follow.stale_here("3 of 3 nodes fell silent together")
    assert follow.exo.url == "http://c" and len(switches) == 2
    follow.fresh_here()
    follow.stale_here("again")
    await follow.read()
    assert follow.exo.url == "http://a" and len(switches) == 3


@pytest.mark.anyio
async def test_a_ticks_commands_go_where_its_state_was_read_and_a_dead_copy_is_tried_once() -> None:
    # exo's master killed, its URL among those given: the copy read shows most nodes silent
    # (the election), the next URL is the dead master's. Found on a real cluster: the bridge
    # moved there at once, so every command of the tick went to a refused port, tick after tick.
    dead = CopyApi("http://dead", down=True)
    follow, _ = follower(CopyApi("http://a"), dead, CopyApi("http://c"))
    await follow.read()
    follow.stale_here("2 of 3 nodes fell silent together")
    assert follow.exo.url == "http://a"  # this tick's commands: where its State came from
    await follow.read()  # the dead one first, refused at once: the next copy answers
    assert follow.exo.url == "http://c" and dead.reads == 1
    for _ in range(3):
        follow.stale_here("2 of 3 nodes fell silent together")
        await follow.read()
    assert follow.exo.url == "http://c" and dead.reads == 1  # every copy tried: it stays
