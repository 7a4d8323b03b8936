"""Bridges sharing an etcd store, as processes, for the end-to-end tests and the takeover bench.

One stand-in exo cluster (``exo-deploy cluster --exo-compat``, three simulated nodes), one etcd
(``keeper.sim.cluster.etcd_members``, one member or three) and several ``exo-deploy bridge --store``
processes on free ports. The helpers read each bridge's ``/healthz`` whatever its status (a
degraded bridge answers 503 with the same body), find the acting one, kill or stop one with a
signal and start it again, and count a model's instances in exo's State: what the tests assert
on. Every wait has a deadline (``process_helpers.wait_for``).
"""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest
import shared_http as http
from process_helpers import (
    START_DEADLINE_S,
    cluster_argv,
    free_port,
    get_json,
    model_instances,
    start_cli,
    stop,
    wait_for,
)

from keeper.sim.cluster.etcd_members import EtcdCluster, EtcdTls

# The bridges' lease in these tests: short, so a takeover is quick, and still above etcd's
# floor for a lease (1.5 election timeouts: 1.5 s with keeper.sim.cluster.etcd_members' timings).
LEASE_S = 2
# A takeover must happen within the lease (the old leader's key lapses) plus this: one
# campaign round and one tick of the new leader take well under 2 s on an idle machine, but the
# suite runs its clusters side by side on two cores, where a standby's tick can wait seconds for
# a core. So this is the bound of a broken takeover, not a speed target: how fast one is, is
# ``make bench``'s figure (bench/takeover_bench.py).
TAKEOVER_MARGIN_S = 8.0
PREFIX = "/exo-deploy-test/"
# How much of an exited bridge's output a failure quotes: its last lines say why.
LOG_TAIL_CHARS = 2000


def health(url: str) -> dict[str, Any] | None:
    """``/healthz`` of a bridge, 200 or 503 alike; None when it does not answer."""
    try:
        # Short: a stopped (SIGSTOP) bridge must not hold up the probe of the others.
        answer = http.get(f"{url}/healthz", timeout=0.5)
    except httpx.HTTPError:
        return None
    if answer.status_code not in (200, 503):
        return None
    return answer.json()


@dataclass
class BridgeProcess:
    name: str
    port: int
    output: IO[bytes]
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any] | None:
        return health(self.url)


@dataclass
class Stack:
    root: Path
    etcd: EtcdCluster
    exo_url: str
    cluster: subprocess.Popen[bytes]
    bridges: dict[str, BridgeProcess] = field(default_factory=dict[str, BridgeProcess])
    store_url: str | None = None  # another address of the store (a proxy), if set
    store_flags: list[str] = field(default_factory=list[str])  # TLS files, etcd's user

    def bridge_argv(self, bridge: BridgeProcess, *extra: str) -> list[str]:
        return [
            "bridge",
            "--exo",
            self.exo_url,
            "--port",
            str(bridge.port),
            "--store",
            self.store_url or self.etcd.endpoints,
            "--name",
            bridge.name,
            "--lease-s",
            str(LEASE_S),
            "--store-prefix",
            PREFIX,
            *self.store_flags,
            *extra,
        ]

    def start_bridge(self, name: str, *, store_url: str | None = None) -> BridgeProcess:
        bridge = self.bridges.get(name)
        if bridge is None:
            log_path = self.root / f"{name}.out"
            bridge = BridgeProcess(name, free_port(), log_path.open("ab"), log_path=log_path)
            self.bridges[name] = bridge
        argv = self.bridge_argv(bridge)
        if store_url is not None:
            argv[argv.index("--store") + 1] = store_url
        bridge.process = start_cli(argv, bridge.output)
        return bridge

    def wait_answering(self, bridge: BridgeProcess, deadline_s: float = START_DEADLINE_S) -> None:
        """Until ``/healthz`` answers; a bridge that exited instead fails at once, with the end
        of what it printed (why it exited), not after the deadline."""

        def probe() -> dict[str, Any] | None:
            process = bridge.process
            if process is not None and (code := process.poll()) is not None:
                said = bridge.log_path.read_text(errors="replace") if bridge.log_path else ""
                pytest.fail(f"bridge {bridge.name} exited {code}: {said[-LOG_TAIL_CHARS:]}")
            return bridge.health()

        wait_for(f"bridge {bridge.name} to answer", deadline_s, probe)

    def acting(self) -> BridgeProcess | None:
        """The one bridge whose /healthz says it acts, if exactly one does."""
        found = [
            bridge
            for bridge in self.bridges.values()
            if (h := bridge.health()) is not None and h["role"] == "acting"
        ]
        return found[0] if len(found) == 1 else None

    def wait_acting(self, deadline_s: float, *, not_: str | None = None) -> BridgeProcess:
        def probe() -> BridgeProcess | None:
            found = self.acting()
            return found if found is not None and found.name != not_ else None

        return wait_for("one acting bridge", deadline_s, probe)

    def signal(self, bridge: BridgeProcess, sig: int) -> None:
        assert bridge.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(bridge.process.pid, sig)
        if sig == signal.SIGKILL:
            bridge.process.wait(timeout=10)

    def exo_state(self) -> dict[str, Any] | None:
        return get_json(f"{self.exo_url}/state")

    def instances_of(self, model: str) -> int | None:
        state = self.exo_state()
        return None if state is None else len(list(model_instances(state, model)))

    def stop_all(self) -> None:
        for bridge in self.bridges.values():
            if bridge.process is not None:
                if bridge.process.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(bridge.process.pid, signal.SIGCONT)
                stop(bridge.process)
            bridge.output.close()
        stop(self.cluster)
        self.etcd.stop()


@contextlib.contextmanager
def stack(root: Path, etcd_members: int = 1, *, tls: EtcdTls | None = None) -> Iterator[Stack]:
    """etcd (TLS with ``tls``), the stand-in exo cluster with three nodes, no bridge yet; all
    stopped at the end."""
    etcd_out = (root / "etcd.out").open("wb")
    etcd = EtcdCluster(root / "etcd", etcd_members, etcd_out, ports=free_port, tls=tls).start()
    exo_port = free_port()
    cluster_out = (root / "cluster.out").open("wb")
    cluster = start_cli(cluster_argv(exo_port, root / "cluster", "--exo-compat"), cluster_out)
    running = Stack(root, etcd, f"http://127.0.0.1:{exo_port}", cluster)
    try:
        wait_for(
            "exo's three nodes",
            START_DEADLINE_S,
            lambda: (
                True
                if (s := running.exo_state()) is not None and len(s["topology"]["nodes"]) == 3
                else None
            ),
        )
        yield running
    finally:
        running.stop_all()
        etcd_out.close()
        cluster_out.close()


class ProxyProcess:
    """``tests/proxy_process.py`` in front of a port: ``swallow`` (requests pass, answers are
    dropped), ``cut``, ``heal``, and ``wait_line`` for what it prints (``swallowed N``)."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).parent / "proxy_process.py"),
                str(target_port),
                str(self.port),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.wait_line("ready", 30)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.strip())

    def wait_line(self, starting: str, deadline_s: float, passed: list[str] | None = None) -> str:
        """The first line printed that starts with ``starting``; the ones before it are
        dropped, or kept in ``passed``."""
        end = time.monotonic() + deadline_s
        while (left := end - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if line.startswith(starting):
                return line
            if passed is not None:
                passed.append(line)
        raise TimeoutError(f"the proxy did not print {starting!r} in {deadline_s} s")

    def drain(self) -> None:
        """Forget what it printed so far."""
        with contextlib.suppress(queue.Empty):
            while True:
                self._lines.get_nowait()

    def swallow(self) -> None:
        self.drain()
        self.process.send_signal(signal.SIGHUP)
        self.wait_line("swallowing", 10)

    def cut(self) -> None:
        self.process.send_signal(signal.SIGUSR1)
        self.wait_line("cut", 10)

    def heal(self) -> int:
        """Let everything through again; how many answer chunks it dropped since ``swallow``."""
        self.process.send_signal(signal.SIGUSR2)
        passed: list[str] = []
        self.wait_line("healed", 10, passed)
        return sum(line.startswith("swallowed") for line in passed)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def since(started: float) -> float:
    return time.monotonic() - started


# --- the kill loop: the acting bridge killed again and again while writes go on -------------

# The models the loop deploys, scales and deletes: two the stand-in's three nodes hold at once.
LOOP_MODELS = ("mlx-community/Qwen3-0.6B-4bit", "mlx-community/Llama-3.2-1B-Instruct-4bit")
# Deleting an instance takes exo a poll or two, resent every 5 s (keeper.bridge.doomed): for this
# long after a write lowered a model's count, the higher count is still not a duplicate.
SCALE_DOWN_WINDOW_S = 12.0
# exo's State sampled this often for the duplicate check.
SAMPLE_EVERY_S = 0.1


@dataclass
class LoopReport:
    kills: int
    takeovers_s: list[float]
    duplicates: list[str]  # "t=12.3 s: 3 instances of M, at most 2 allowed"
    acknowledged: int  # writes answered 2xx
    lost: list[str]  # acknowledged writes not visible at the end
    ambiguous_models: list[str]  # last write unanswered: its outcome is unknown, not checked
    samples: int
    duration_s: float


@dataclass
class _Targets:
    """Per model, the instance counts writes asked for, with when (the duplicate check's bound).

    A model may hold, at a moment, the most any recent write asked for (a write not answered may
    have happened), plus what writes took away in the last ``SCALE_DOWN_WINDOW_S``: instances of
    a deployment being deleted, or scaled down, are still in exo's State while a new deployment
    of the same model is placed. Anything above that is a second instance placed for one."""

    history: dict[str, list[tuple[float, int, int]]] = field(
        default_factory=dict[str, list[tuple[float, int, int]]]
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def asked(self, model: str, replicas: int, taken: int = 0) -> None:
        with self.lock:
            self.history.setdefault(model, []).append((time.monotonic(), replicas, taken))

    def allowed(self, model: str, now: float) -> int:
        with self.lock:
            history = list(self.history.get(model, []))
        if not history:
            return 0
        start = now - SCALE_DOWN_WINDOW_S
        recent = [count for at, count, _ in history if at >= start]
        before = [count for at, count, _ in history if at < start]
        going = sum(taken for at, _, taken in history if at >= start)
        return max([*recent, *(before[-1:] or [0])]) + going


def kill_loop(running: Stack, kills: int, *, seed: int = 7) -> LoopReport:
    """Three bridges; ``kills`` times: kill -9 the acting one, time the takeover, restart it in
    the background. Meanwhile a writer deploys, scales and deletes through random live bridges
    and a sampler checks exo's State never holds more instances of a model than asked."""
    rng = random.Random(seed)
    started = time.monotonic()
    for name in ("b1", "b2", "b3"):
        running.start_bridge(name)
    for bridge in running.bridges.values():
        running.wait_answering(bridge)
    running.wait_acting(15)
    targets = _Targets()
    duplicates: list[str] = []
    samples = [0]
    done = threading.Event()
    # model -> (the last write's expectation: replicas, 0 for deleted; answered?)
    last_write: dict[str, tuple[int, bool]] = {}
    acknowledged = [0]

    def sample() -> None:
        while not done.is_set():
            state = running.exo_state()
            now = time.monotonic()
            if state is not None:
                samples[0] += 1
                for model in LOOP_MODELS:
                    count = len(list(model_instances(state, model)))
                    allowed = targets.allowed(model, now)
                    if count > allowed:
                        duplicates.append(
                            f"t={now - started:.1f} s: {count} instances of {model}, "
                            f"at most {allowed} asked"
                        )
            done.wait(SAMPLE_EVERY_S)

    def live_bridge() -> BridgeProcess:
        return rng.choice(
            [
                b
                for b in running.bridges.values()
                if b.process is not None and b.process.poll() is None
            ]
        )

    def current() -> dict[str, dict[str, Any]] | None:
        listed = get_json(f"{live_bridge().url}/deployments")
        if listed is None:
            return None
        return {v["deployment"]["modelCard"]["modelId"]: v for v in listed["deployments"]}

    def write_once() -> None:
        deployed = current()
        if deployed is None:
            return
        model = rng.choice(LOOP_MODELS)
        url = live_bridge().url
        view = deployed.get(model)
        try:
            if view is None:
                targets.asked(model, 1)
                answer = http.post(
                    f"{url}/deployments",
                    json={"model_id": model, "standby": 0},
                    timeout=5,
                )
                expect = 1
            elif rng.random() < 0.3:
                answer = http.delete(
                    f"{url}/deployments/{view['deployment']['deploymentId']}",
                    timeout=5,
                )
                expect = 0
                targets.asked(model, 0, taken=view["deployment"]["replicas"])
            else:
                expect = rng.choice((1, 2))
                targets.asked(model, expect, taken=max(0, view["deployment"]["replicas"] - expect))
                answer = http.patch(
                    f"{url}/deployments/{view['deployment']['deploymentId']}",
                    json={"replicas": expect},
                    timeout=5,
                )
        except httpx.HTTPError:
            last_write[model] = (-1, False)  # unanswered: it may or may not have happened
            return
        if 200 <= answer.status_code < 300:
            acknowledged[0] += 1
            last_write[model] = (expect, True)
        elif answer.status_code >= 500:
            last_write[model] = (-1, False)  # refused, or may have happened (a lost answer)

    def write() -> None:
        while not done.is_set():
            write_once()
            done.wait(0.3)

    threads = [threading.Thread(target=sample), threading.Thread(target=write)]
    for thread in threads:
        thread.start()
    takeovers: list[float] = []
    try:
        for _ in range(kills):
            acting = running.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 15)
            running.signal(acting, signal.SIGKILL)
            killed = time.monotonic()
            running.wait_acting(LEASE_S + TAKEOVER_MARGIN_S + 15, not_=acting.name)
            takeovers.append(time.monotonic() - killed)
            running.start_bridge(acting.name)  # back as a standby, in the background
            time.sleep(rng.uniform(0.2, 1.0))  # the new leader acts a moment before its turn
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=30)
    # Every acknowledged write visible at the end, on every bridge (their views converged).
    for bridge in running.bridges.values():
        running.wait_answering(bridge)
    lost: list[str] = []
    ambiguous: list[str] = []
    for bridge in running.bridges.values():
        listed = wait_for(
            f"{bridge.name}'s deployments", 10, lambda b=bridge: get_json(f"{b.url}/deployments")
        )
        seen = {
            v["deployment"]["modelCard"]["modelId"]: v["deployment"]["replicas"]
            for v in listed["deployments"]
        }
        for model, (expect, answered) in last_write.items():
            if not answered:
                if model not in ambiguous:
                    ambiguous.append(model)
                continue
            if seen.get(model, 0) != expect:
                lost.append(
                    f"{bridge.name}: {model} has {seen.get(model, 0)} replica(s), the last "
                    f"acknowledged write said {expect}"
                )
    return LoopReport(
        kills=kills,
        takeovers_s=takeovers,
        duplicates=duplicates,
        acknowledged=acknowledged[0],
        lost=lost,
        ambiguous_models=ambiguous,
        samples=samples[0],
        duration_s=time.monotonic() - started,
    )
