"""Faults through the bridge on the stand-in, as real processes (docs/design.md §5.18): the
cluster, the watcher and each fault's steps, shared by
``tests/processes/test_bridge_failover_process.py`` (short faults, behaviour asserted) and
``bench/bridge_failover_bench.py`` (the issue's exact lengths, figures printed), so the test
and the bench run the very same steps.

``exo-deploy cluster --exo-compat`` is the stand-in for a stock exo master (exo's own 30 s
timeout and 10 s sweep, nothing faster: ``--suspect-after-s 0``), 3 nodes that all hold
Qwen3-0.6B, and ``exo-deploy bridge`` follows it. The stand-in is no node, so the bridge has no
node's own URL to probe: it confirms a silent node by ``--dead-after-s`` of silence while the
others are heard.

Who deleted an instance: the bridge logs ``instance ID: deletion sent to exo`` for each
``DELETE /instance/{id}`` it sends, and exo's sweep deletes only the instances of a node it has
timed out (gone from its topology). Each step checks both, so a deletion by exo's own rule
cannot pass for the bridge's.

A node's verdicts leave marks on it (a flap doubles its next suspicion; a long gap widens its
rhythm for its next 16 reports), so each fault in one cluster picks a node no earlier fault
has touched, as a real operator's cluster would meet them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from model_ids import QWEN
from process_helpers import (
    START_DEADLINE_S,
    alive,
    chat_reply,
    free_port,
    freeze,
    get_json,
    model_instances,
    nodes_heard,
    run_cli,
    start_cli,
    stop,
    thaw_at,
    wait_for,
)

__all__ = ["wait_for"]  # the bench waits with it too

from keeper.model.liveness import DEFAULT_DEAD_AFTER_S, PAUSE_SETTLE_S

# The watcher reads exo's State and the bridge's nodes this often: a surplus instance lives for
# a second or more, so 50 ms cannot miss one.
WATCH_EVERY_S = 0.05
# A thawed node is heard again (its lastSeen moving between two of the bridge's 1 s polls)
# within a few of its one-second reports, even on a loaded machine.
HEARD_AGAIN_S = 10
# The longest a chat may take before it counts as failed: a simulated one-token chat takes
# milliseconds; one that hangs is on an instance that cannot answer.
CHAT_TIMEOUT_S = 10.0
# What the bridge writes for each DELETE /instance/{id} it sends (keeper/bridge/ticking.py).
DELETION_SENT = "deletion sent to exo"


@dataclass
class Running:
    """The stand-in cluster and the bridge following it."""

    data_dir: Path
    exo_url: str
    bridge_url: str
    bridge_out: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list[subprocess.Popen[bytes]])
    pids_seen: set[int] = field(default_factory=set[int])

    def layout(self) -> dict[str, Any] | None:
        layout = read_json(self.data_dir / "cluster" / "cluster.json")
        if layout is not None:
            self.pids_seen.update(n["pid"] for n in layout["nodes"] if n["pid"] is not None)
        return layout

    def pid_of(self, name: str) -> int:
        layout = self.layout()
        assert layout is not None
        (pid,) = [n["pid"] for n in layout["nodes"] if n["name"] == name]
        return pid

    def name_of(self, node_id: str) -> str:
        """The node's name in the cluster's layout (its id while the layout does not list it)."""
        layout = self.layout() or {"nodes": []}
        names = [n["name"] for n in layout["nodes"] if n["node_id"] == node_id]
        return names[0] if names else node_id

    def bridge_pid(self) -> int:
        return self.processes[1].pid

    def instances(self) -> dict[str, str]:
        """Instance id -> node name of Qwen's instances in exo's State (empty unanswered)."""
        found = dict(model_instances(get_json(f"{self.exo_url}/state") or {}, QWEN))
        return {instance: self.name_of(node) for instance, node in found.items()}

    def silent_s(self, name: str) -> float | None:
        """Seconds since exo last heard node ``name`` (its ``lastSeen``, exo's wall clock on this
        machine): the bridge hears a report no sooner than exo stamps it, so a node it judged
        dead has been silent at least dead-after by this reading."""
        seen = (get_json(f"{self.exo_url}/state") or {}).get("lastSeen", {})
        stamps = [at for node, at in seen.items() if self.name_of(node) == name]
        if not stamps:
            return None
        return time.time() - datetime.fromisoformat(stamps[0].replace("Z", "+00:00")).timestamp()

    def exo_nodes(self) -> set[str] | None:
        """The names of the nodes in exo's topology (exo's own timeout removes a node there)."""
        state = get_json(f"{self.exo_url}/state")
        if state is None:
            return None
        return {self.name_of(node) for node in state["topology"]["nodes"]}

    def liveness(self) -> dict[str, str] | None:
        """Each node's liveness by the bridge's GET /nodes."""
        listed = get_json(f"{self.bridge_url}/nodes")
        return None if listed is None else {n["name"]: n["liveness"] for n in listed["nodes"]}

    def deletions_sent(self) -> list[str]:
        """The instance ids the bridge sent exo's DELETE for, in order, from its log."""
        lines = self.bridge_out.read_text(errors="replace").splitlines()
        return [
            line.split("instance ", 1)[1].split(":", 1)[0]
            for line in lines
            if DELETION_SENT in line and "instance " in line
        ]

    def ready_replicas(self) -> int | None:
        listed = get_json(f"{self.bridge_url}/deployments")
        if listed is None or len(listed["deployments"]) != 1:
            return None
        return listed["deployments"][0]["readyReplicas"]


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def running(
    tmp_path: Path, *bridge_flags: str, exo_flags: tuple[str, ...] = ()
) -> Iterator[Running]:
    """The stand-in (exo's rules, unless ``exo_flags`` change its membership timings) and a
    bridge beside it (``bridge_flags``)."""
    exo_port, bridge_port = free_port(), free_port()
    exo_url = f"http://127.0.0.1:{exo_port}"
    outputs = [(tmp_path / f"{n}.out").open("wb") for n in ("cluster", "bridge")]
    cluster_argv = [
        "cluster",
        "--exo-compat",
        "--suspect-after-s",
        "0",  # the stand-in keeps exo's rules only: 30 s timeout, 10 s sweep
        "--nodes",
        "3",
        "--port",
        str(exo_port),
        "--data-dir",
        str(tmp_path / "cluster"),
        "--has",
        QWEN,
        "--no-node-restart",
        *exo_flags,
    ]
    bridge_argv = [
        "bridge",
        *bridge_flags,
        "--exo",
        exo_url,
        "--port",
        str(bridge_port),
        "--data-dir",
        str(tmp_path / "bridge"),
    ]
    run = Running(tmp_path, exo_url, f"http://127.0.0.1:{bridge_port}", tmp_path / "bridge.out")
    run.processes = [start_cli(cluster_argv, outputs[0]), start_cli(bridge_argv, outputs[1])]
    try:
        yield run
    finally:
        run.layout()
        for pid in {*run.pids_seen, run.bridge_pid()}:  # a frozen one would not stop
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGCONT)
        for process in reversed(run.processes):
            stop(process)
        for pid in run.pids_seen:
            if alive(pid):
                with contextlib.suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
        for output in outputs:
            output.close()


class Watch:
    """exo's State and the bridge's nodes read every 50 ms: the most instances of Qwen seen,
    every instance id ever seen, and every node the bridge ever judged other than alive."""

    def __init__(self, run: Running) -> None:
        self.run = run
        self.most = 0
        self.seen: set[str] = set()
        self.judged: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop)

    def loop(self) -> None:
        while not self.stop.is_set():
            found = dict(model_instances(get_json(f"{self.run.exo_url}/state") or {}, QWEN))
            self.most = max(self.most, len(found))
            self.seen.update(found)
            liveness = self.run.liveness() or {}
            self.judged.update(name for name, phase in liveness.items() if phase != "alive")
            time.sleep(WATCH_EVERY_S)

    @contextlib.contextmanager
    def watching(self) -> Iterator[Watch]:
        self.thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            self.thread.join(timeout=5)


def deploy_and_wait(run: Running, replicas: int) -> dict[str, str]:
    """Deploy Qwen at ``replicas`` through the bridge; its instances once each node's answers."""

    def following() -> bool | None:
        health = get_json(f"{run.bridge_url}/healthz")
        layout = run.layout()
        ready = (
            health is not None
            and health["exo"]["reachable"]
            and layout is not None
            and all(n["pid"] is not None for n in layout["nodes"])
            and run.exo_nodes() is not None
            and len(run.exo_nodes() or ()) == 3
        )
        return True if ready else None

    wait_for("exo's 3 nodes and the bridge following it", START_DEADLINE_S, following)
    flags = ("--replicas", str(replicas)) if replicas > 1 else ("--standby", "1")
    deployed = run_cli("deploy", QWEN, *flags, "--url", run.bridge_url)
    assert deployed.returncode == 0, deployed.stderr

    def placed() -> dict[str, str] | None:
        found = run.instances()
        ready = len(found) == replicas and run.ready_replicas() == replicas
        return found if ready and chat_reply(run.exo_url, QWEN) is not None else None

    return wait_for("Qwen serving", 60, placed)  # past the keeper's 15 s startup grace


def all_alive(run: Running) -> bool | None:
    liveness = run.liveness()
    return True if liveness and all(p == "alive" for p in liveness.values()) else None


def all_heard(run: Running) -> bool | None:
    """Every node alive and its report seen by the bridge within the last 1.5 s."""
    return nodes_heard(get_json(f"{run.bridge_url}/nodes"), 3)


@dataclass
class Freeze:
    """One freeze of a serving node: when the replacement appeared and the frozen node's
    instance went (seconds after the freeze began; None: it did not), and what was left."""

    node: str
    seconds: float = 0.0
    replaced_s: float | None = None
    deleted_s: float | None = None
    deleted_by_bridge: bool = False
    exo_still_listed_it: bool = False
    # How long exo had not heard the node when the replacement, and the deletion, were seen.
    silent_at_replacement_s: float | None = None
    silent_at_deletion_s: float | None = None
    left: dict[str, str] = field(default_factory=dict[str, str])


def freeze_past_dead(run: Running, node: str, seconds: float | None) -> Freeze:
    """Freeze ``node`` until the bridge has deleted its instance through exo (``seconds`` None:
    thaw right then, just past dead-after), or for ``seconds``; then until it is heard again."""
    pid = run.pid_of(node)
    (lost,) = [i for i, n in run.instances().items() if n == node]
    before = run.instances()
    result = Freeze(node)
    frozen_at = freeze(pid)
    try:
        while result.deleted_s is None:
            now = time.monotonic() - frozen_at
            assert now < 30, f"{node}'s instance not deleted within 30 s of its freeze"
            found = run.instances()
            if result.replaced_s is None and set(found) - set(before):
                result.replaced_s = now
                result.silent_at_replacement_s = run.silent_s(node)
            if found and lost not in found:
                result.deleted_s = now
                result.silent_at_deletion_s = run.silent_s(node)
                result.exo_still_listed_it = node in (run.exo_nodes() or set())
            time.sleep(WATCH_EVERY_S)
        thaw_at(pid, frozen_at, seconds if seconds is not None else 0.0)
    finally:
        os.killpg(pid, signal.SIGCONT)
    result.seconds = time.monotonic() - frozen_at
    result.deleted_by_bridge = lost in run.deletions_sent()
    wait_for(f"{node} heard again", HEARD_AGAIN_S, lambda: all_alive(run))
    result.left = run.instances()
    return result


def freeze_under_dead(run: Running, node: str, seconds: float | None) -> Freeze:
    """Freeze ``node`` past the suspicion, short of death: for ``seconds``, or (None) until its
    replacement appears; after the thaw, until the surplus is gone."""
    pid = run.pid_of(node)
    before = run.instances()
    replicas = len(before)
    result = Freeze(node)
    # Thawed by then at the latest: a poll short of the death the scenario must not reach.
    until = seconds if seconds is not None else DEFAULT_DEAD_AFTER_S - 1.0
    frozen_at = freeze(pid)
    try:
        while (now := time.monotonic() - frozen_at) < until:
            if result.replaced_s is None and set(run.instances()) - set(before):
                result.replaced_s = now
                result.silent_at_replacement_s = run.silent_s(node)
                if seconds is None:
                    break
            time.sleep(WATCH_EVERY_S)
    finally:
        os.killpg(pid, signal.SIGCONT)
    result.seconds = time.monotonic() - frozen_at
    wait_for(f"{node} heard again", HEARD_AGAIN_S, lambda: all_alive(run))

    def surplus_gone() -> dict[str, str] | None:
        found = run.instances()
        return found if len(found) == replicas else None

    result.left = wait_for("the surplus gone", HEARD_AGAIN_S, surplus_gone)
    return result


@dataclass
class BridgePause:
    """The bridge frozen for ``seconds``, then watched through its settling after the pause."""

    seconds: float = 0.0
    deletions_before: int = 0
    deletions_after: int = 0
    before: dict[str, str] = field(default_factory=dict[str, str])
    after: dict[str, str] = field(default_factory=dict[str, str])


def pause_bridge(run: Running, seconds: float) -> BridgePause:
    """SIGSTOP the bridge for ``seconds`` (longer than dead-after), resume it, and wait past its
    settling: what it deleted and what exo runs, before and after."""
    result = BridgePause(before=run.instances(), deletions_before=len(run.deletions_sent()))
    pid = run.bridge_pid()
    frozen_at = freeze(pid)
    try:
        thaw_at(pid, frozen_at, seconds)
    finally:
        os.killpg(pid, signal.SIGCONT)
    result.seconds = time.monotonic() - frozen_at
    thawed_at = time.monotonic()
    wait_for("the bridge judging again", HEARD_AGAIN_S, lambda: all_alive(run))
    # It judges nobody while it settles; a verdict it owed would follow just after.
    wait_for(
        "the bridge's settling after its pause, and a poll past it",
        PAUSE_SETTLE_S + HEARD_AGAIN_S,
        lambda: time.monotonic() - thawed_at >= PAUSE_SETTLE_S + 1.5 or None,
    )
    result.after = run.instances()
    result.deletions_after = len(run.deletions_sent())
    return result


class Chats:
    """One client sending one-token chats to exo's API back to back until ``stop`` is set: the
    bridge sees no chats, exo's master (here the stand-in) routes them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.answered = 0
        self.failures: list[str] = []
        self.thread = threading.Thread(target=self.client)

    def client(self) -> None:
        body = {"model": QWEN, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        with httpx.Client(trust_env=False, timeout=CHAT_TIMEOUT_S) as http:
            while not self.stop.is_set():
                try:
                    response = http.post(f"{self.url}/v1/chat/completions", json=body)
                    failure = _chat_failure(response)
                except httpx.HTTPError as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                if failure is None:
                    self.answered += 1
                else:
                    self.failures.append(failure)


def _chat_failure(response: httpx.Response) -> str | None:
    """Why a chat's answer is no answer, or None: an error status, or a 200 without content (exo
    answers a chat whose instance it deleted with an empty 200, neither a result nor an error)."""
    if response.status_code != 200:
        return f"{response.status_code}: {response.text[:200]}"
    try:
        content = response.json()["choices"][0]["message"]["content"]
    except (ValueError, LookupError, TypeError):
        return f"200 without an answer: {response.text[:200]!r}"
    return None if content else "200 with empty content"


@dataclass
class LoadKill:
    """kill -9 of one replica's node while clients chat through exo's API."""

    node: str
    answered: int = 0
    failures: list[str] = field(default_factory=list[str])
    deleted_s: float = 0.0
    recovered_s: float = 0.0
    deleted_by_bridge: bool = False
    exo_still_listed_it: bool = False
    silent_at_deletion_s: float | None = None

    @property
    def sent(self) -> int:
        return self.answered + len(self.failures)

    @property
    def share(self) -> float:
        return self.answered / self.sent if self.sent else 0.0


def kill_under_load(
    run: Running, node: str, chats: list[Chats], before: int, after: int
) -> LoadKill:
    """With ``chats`` running and ``before`` chats answered, kill -9 ``node``; wait for its
    instance deleted and the replicas ready again, then ``after`` chats more answered. The
    clients are stopped on the way out."""
    replicas = len(run.instances())
    (lost,) = [i for i, n in run.instances().items() if n == node]
    result = LoadKill(node)

    def answered() -> int:
        return sum(c.answered for c in chats)

    try:
        wait_for("chats answered before the kill", 60, lambda: answered() >= before or None)
        os.killpg(run.pid_of(node), signal.SIGKILL)
        killed_at = time.monotonic()
        while True:
            found = run.instances()
            assert time.monotonic() - killed_at < 60, f"{node}'s instance not deleted in 60 s"
            if found and lost not in found:
                result.deleted_s = time.monotonic() - killed_at
                result.silent_at_deletion_s = run.silent_s(node)
                result.exo_still_listed_it = node in (run.exo_nodes() or set())
                break
            time.sleep(WATCH_EVERY_S)
        wait_for(
            f"{replicas} replicas ready again",
            30,
            lambda: (run.ready_replicas() == replicas and len(run.instances()) == replicas) or None,
        )
        result.recovered_s = time.monotonic() - killed_at
        then = answered()
        wait_for("chats answered after", 60, lambda: answered() >= then + after or None)
    finally:
        for c in chats:
            c.stop.set()
        for c in chats:
            c.thread.join(timeout=CHAT_TIMEOUT_S + 5)
    result.answered = answered()
    result.failures = [f for c in chats for f in c.failures]
    result.deleted_by_bridge = lost in run.deletions_sent()
    return result


def start_chats(run: Running, clients: int) -> list[Chats]:
    chats = [Chats(run.exo_url) for _ in range(clients)]
    for c in chats:
        c.thread.start()
    return chats


def kill_and_time(run: Running, name: str) -> tuple[float, float, float]:
    """kill -9 of node ``name``: seconds to a chat answered, to the lost instance gone, and to
    both (serving as a stock exo serves: its master sends chats to the lost instance until it
    is deleted)."""
    before = set(run.instances())
    os.killpg(run.pid_of(name), signal.SIGKILL)
    killed_at = time.monotonic()
    chat_s = deleted_s = None
    while chat_s is None or deleted_s is None:
        now = time.monotonic()
        assert now - killed_at < 90, "not serving again within 90 s of the kill"
        if deleted_s is None and not before & set(run.instances()):
            deleted_s = now - killed_at
        if chat_s is None and chat_reply(run.exo_url, QWEN) is not None:
            chat_s = time.monotonic() - killed_at
        time.sleep(WATCH_EVERY_S)
    return chat_s, deleted_s, max(chat_s, deleted_s)


# The target a kill through the bridge is measured against (bench): serving within dead-after
# and one poll of the bridge's.
KILL_TARGET_S = DEFAULT_DEAD_AFTER_S + 1.0
