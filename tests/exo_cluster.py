"""A real exo cluster and an ``exo-deploy bridge`` beside it, for ``make test-exo`` (tests/exo).

The tier runs against unmodified exo processes the machine already runs: their APIs come from
``EXO_DEPLOY_EXO_URLS`` (comma-separated) and the faults go through a control API
(``EXO_DEPLOY_EXO_CONTROL``) that starts, kills, freezes and restarts them:

- ``GET /nodes``: each node's ``index``, ``pid`` (its process group), ``status`` (``running``,
  ``stopped``, ``killed``...), ``api``, ``node_id`` and the ``master_node_id`` it agrees on;
- ``GET /cluster?wait=S``: ``formed`` once every node runs and every node's State lists them all;
- ``POST /nodes/K/{kill,stop,cont,restart}``: SIGKILL, SIGSTOP or SIGCONT node K's process
  group; restart starts it again (exo gives it a new node id).

Everything here reads what a test needs from those APIs and the bridge's own HTTP API, so the
tier needs nothing but the URLs: no path of the machine that hosts the cluster. Each request has
a short deadline of its own, and every wait is on a condition with a deadline
(``process_helpers.wait_for``): a frozen node's API does not answer, and the helpers must not
freeze with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import shared_http as http
from process_helpers import START_DEADLINE_S, free_port, stop, wait_for

# The model the cluster serves: exo's id of a model small enough to load in about 2 s on a CPU.
DEFAULT_MODEL = "exo-harness/tiny-llama"
# One read of a node's State or of the control API on loopback: a node that takes longer is
# frozen or gone, and the reading moves on to the next.
READ_TIMEOUT_S = 1.5
# A command to exo's API (a deletion): answered at once by a node that keeps up with the master;
# past this the node is catching up or frozen, and the next one is asked.
COMMAND_TIMEOUT_S = 5.0
# A control action (a kill, a restart) is a signal or a process start: seconds at most.
CONTROL_TIMEOUT_S = 30.0
# exo needs its own node timeout (about 30 s) to forget a killed node, and a restarted one a few
# seconds to join; the control API's ``wait`` returns as soon as the cluster is whole again.
FORMED_WAIT_S = 60
# A restarted node asks the master for the events it lacks: with an hour of exo's one-second
# reports in the master's log (14,000 events) and the cores busy, it caught up at about 30
# events a second, so its State lists the running nodes only after minutes. The master's own view
# must list them within this bound.
RESTORE_DEADLINE_S = 300.0
# A 15 s freeze crosses zenoh's 10 s lease: exo holds an election, and a thawed node has been
# seen to stay master of a session of its own (a split brain) rather than rejoin. Past this long
# after the thaw with the nodes still disagreeing on their master, the ones that disagree with
# the majority (or that the master does not list) are restarted, as an operator would, so that
# one scenario's split does not fail every scenario after it. Reported (``healed``).
SPLIT_HEAL_S = 45.0
# A chat of 8 tokens of the tiny model answers in a fraction of a second; one that has not in
# 30 s is on an instance that cannot answer (the tier counts it as a timeout).
CHAT_TIMEOUT_S = 30.0
CHAT_MAX_TOKENS = 8
# A chat that checks whether the model serves: a ready instance answers it in well under a
# second; one routed to a frozen node's instance would hold a wait for the whole 30 s.
PROBE_CHAT_TIMEOUT_S = 5.0
# How often the watcher reads exo's State: a surplus instance lives for seconds, so a quarter of
# a second cannot miss one, and it costs the 2-core machine little beside exo's own traffic.
WATCH_EVERY_S = 0.25
# How often the watcher also reads every running node's copy of the State: after exo's master
# was killed, the two survivors each named a master of their own to the control API, and the copy
# read first was a node still replaying an old log, which never showed the instance exo served
# from 10 s after the kill (a 90 s timeout). Three reads every 2 s cost exo little.
SCAN_EVERY_S = 2.0
# What the bridge logs for each ``DELETE /instance/{id}`` it sends (keeper/bridge/ticking.py).
DELETION_SENT = "deletion sent to exo"


def _json(method: str, url: str, timeout: float, body: Any = None) -> Any | None:
    """The JSON of a 2xx answer, else None (no answer, another status, not JSON)."""
    try:
        response = http.request(method, url, json=body, timeout=timeout)
    except httpx.HTTPError:
        return None
    if not 200 <= response.status_code < 300:
        return None
    try:
        return response.json()
    except ValueError:
        return None


@dataclass(frozen=True)
class Node:
    """One exo process as the control API lists it."""

    index: int
    pid: int | None
    status: str
    api: str
    node_id: str | None
    master_node_id: str | None


@dataclass(frozen=True)
class Instance:
    """One instance of a model in exo's State: the node holding it and whether its runners are
    all ready (exo's ``RunnerReady``)."""

    instance_id: str
    node_ids: tuple[str, ...]
    ready: bool


class ExoCluster:
    """The exo nodes behind ``urls`` and the control API at ``control``."""

    def __init__(self, urls: list[str], control: str, model: str) -> None:
        self.lagging: list[int] = []  # nodes whose State is still catching up (``restore``)
        self.healed: list[str] = []  # nodes restarted to end a split brain (``restore``)
        self.urls = urls
        self.control = control.rstrip("/")
        self.model = model

    # --- the control API ----------------------------------------------------------------------

    def nodes(self) -> list[Node]:
        listed = _json("GET", f"{self.control}/nodes", CONTROL_TIMEOUT_S) or []
        return [
            Node(
                index=n["index"],
                pid=n.get("pid"),
                status=n.get("status", ""),
                api=n.get("api", ""),
                node_id=n.get("node_id"),
                master_node_id=n.get("master_node_id"),
            )
            for n in listed
        ]

    def act(self, index: int, action: str) -> None:
        """``POST /nodes/K/ACTION`` (kill, stop, cont, restart); fails the test if refused."""
        response = http.post(f"{self.control}/nodes/{index}/{action}", timeout=CONTROL_TIMEOUT_S)
        assert response.status_code == 200, f"{action} of node {index}: {response.text}"

    def formed(self, wait_s: int = FORMED_WAIT_S) -> dict[str, Any]:
        """The control API's ``GET /cluster?wait=S``: returns once the cluster is whole (every
        node running, one master, every State listing every node) or after ``wait_s``."""
        answer = _json("GET", f"{self.control}/cluster?wait={wait_s}", wait_s + CONTROL_TIMEOUT_S)
        return answer or {"formed": False}

    def index_of(self, node_id: str) -> int:
        (index,) = [n.index for n in self.nodes() if n.node_id == node_id]
        return index

    def node(self, index: int) -> Node:
        (node,) = [n for n in self.nodes() if n.index == index]
        return node

    def master_id(self) -> str | None:
        """The master every running node agrees on, else None."""
        masters = {n.master_node_id for n in self.nodes() if n.status == "running"}
        return masters.pop() if len(masters) == 1 else None

    def master_last(self) -> list[str]:
        """The APIs with exo's master's last: the bridge follows the first that answers, and a
        freeze of the node it follows is then a freeze of a node that is not exo's master (a
        frozen master stops every node's reports in every copy of the State, a case of its
        own: docs/design.md §8.3)."""
        master = self.master_id()
        apis = {n.api.rstrip("/"): n.node_id for n in self.nodes()}
        return sorted(self.urls, key=lambda url: apis.get(url.rstrip("/")) == master)

    def node_name(self, bridge: Bridge, node_id: str) -> str:
        """The name the bridge's ``GET /nodes`` gives exo's node ``node_id``, once it lists it
        (a node restarted to heal a split is in the bridge's next read, not at once)."""

        def named() -> str | None:
            listed = bridge.get("/nodes") or {"nodes": []}
            names = [n["name"] for n in listed["nodes"] if node_id in n["node_ids"]]
            return names[0] if len(names) == 1 else None

        return wait_for(f"the bridge listing node {node_id[:8]}", FORMED_WAIT_S, named)

    def instances_everywhere(self) -> set[str] | None:
        """The model's instance ids when every running node's State shows the same ones (a
        deletion reaches each node's copy in its own time), else None."""
        copies = self.copies()
        if None in copies.values():
            return None
        seen = [set(self.instances(state)) for state in copies.values() if state is not None]
        return seen[0] if seen and all(ids == seen[0] for ids in seen) else None

    def live_urls(self, nodes: list[Node] | None = None) -> list[str]:
        """The APIs of the nodes running now (not killed, not frozen), in ``urls`` order; of
        ``nodes`` when the control API's list was read already."""
        listed = self.nodes() if nodes is None else nodes
        running = {n.api.rstrip("/") for n in listed if n.status == "running"}
        return [u for u in self.urls if u.rstrip("/") in running]

    def runner_pids(self, index: int) -> list[int]:
        """The pids of node ``index``'s runner subprocesses (exo's multiprocessing children,
        not its resource tracker)."""
        pid = self.node(index).pid
        assert pid is not None
        found: list[int] = []
        for child in _children(pid):
            with contextlib.suppress(OSError):
                if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                    found.append(child)
        return found

    def restore(self) -> dict[str, Any]:
        """Every node running and exo's master counting them all again: a frozen node thawed,
        a killed one restarted. Returns the control API's view; fails the test if the master
        does not list exactly the running nodes in time.

        Whole means every node's State lists the running nodes (``formed``), but a restarted
        node catches up with the master's log by itself, which on a busy machine can take far
        longer than a scenario (``RESTORE_DEADLINE_S``); past ``FORMED_WAIT_S`` the master's
        own view is enough, and the nodes still catching up are kept in ``lagging`` for the
        report (a placement on one waits for it)."""
        for node in self.nodes():
            if node.status == "stopped":
                self.act(node.index, "cont")
            elif node.status != "running":
                self.act(node.index, "restart")
        view = self.formed_within(SPLIT_HEAL_S)
        if not view.get("formed") and not self._master_counts_all(view):
            view = self._heal_split(view)
        end = time.monotonic() + RESTORE_DEADLINE_S
        while not view.get("formed") and not self._master_counts_all(view):
            assert time.monotonic() < end, f"exo's master does not list the running nodes: {view}"
            view = self.formed_within(FORMED_WAIT_S)
        self.lagging = sorted(self._behind(view))
        self._model_known()
        return view

    def _model_known(self) -> None:
        """The model listed by every running node's ``GET /models``: a card added with exo's
        ``POST /models/add`` is known to the node that added it, and a restarted node may not
        list it again; it is added again there, as an operator would."""
        for url in self.live_urls():
            listed = _json("GET", f"{url}/models", COMMAND_TIMEOUT_S)
            ids = {m.get("id") for m in (listed or {}).get("data", []) if isinstance(m, dict)}
            if listed is not None and self.model not in ids:
                _json("POST", f"{url}/models/add", CONTROL_TIMEOUT_S, {"model_id": self.model})

    def _heal_split(self, view: dict[str, Any]) -> dict[str, Any]:
        """Restart the nodes that follow a master other than the majority's, or that the
        majority's master does not list (``SPLIT_HEAL_S``); the view once they are back."""
        nodes = [n for n in self.nodes() if n.status == "running"]
        majority = _majority_master(nodes)
        if majority is None:
            return view
        views: dict[str, Any] = view.get("views", {})
        listed: set[str] = set()
        for node in nodes:
            if node.node_id == majority and str(node.index) in views:
                listed = set(views[str(node.index)].get("topology_nodes") or [])
        apart = [
            n
            for n in nodes
            if n.node_id != majority and (n.master_node_id != majority or n.node_id not in listed)
        ]
        for node in apart:
            self.healed.append(f"node {node.index} (its master {str(node.master_node_id)[:8]})")
            self.act(node.index, "restart")
        return self.formed_within(FORMED_WAIT_S) if apart else view

    def _running_ids(self) -> set[str | None]:
        return {n.node_id for n in self.nodes() if n.status == "running"}

    def _master_counts_all(self, view: dict[str, Any]) -> bool:
        master = self.master_id()
        views: dict[str, Any] = view.get("views", {})
        for node in self.nodes():
            if node.node_id == master and str(node.index) in views:
                listed = set(views[str(node.index)].get("topology_nodes") or [])
                return listed == self._running_ids()
        return False

    def _behind(self, view: dict[str, Any]) -> set[int]:
        """The nodes whose State does not list the running nodes yet."""
        running = self._running_ids()
        views: dict[str, Any] = view.get("views", {})
        return {
            int(index)
            for index, seen in views.items()
            if set(seen.get("topology_nodes") or []) != running
        }

    def formed_within(self, deadline_s: float) -> dict[str, Any]:
        """``formed`` asked again until it holds or ``deadline_s`` has passed; the last view."""
        end = time.monotonic() + deadline_s
        view = self.formed(min(FORMED_WAIT_S, int(deadline_s)))
        while not view.get("formed") and time.monotonic() < end:
            view = self.formed(max(1, min(FORMED_WAIT_S, int(end - time.monotonic()))))
        return view

    # --- exo's APIs ---------------------------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """exo's State from the first running node that answers, else None."""
        read = self.read_state()
        return None if read is None else read[1]

    def read_state(self) -> tuple[str, dict[str, Any]] | None:
        """(the node's API, its State) from the first running node that answers, else None:
        exo's master's first, whose copy leads every other (a node restarted to heal a split
        replays the master's log from its start, and its copy lags minutes behind on a busy
        machine; read first, it showed none of the instances the others ran)."""
        nodes = [n for n in self.nodes() if n.status == "running"]
        leader = _majority_master(nodes)
        master_api = {n.api.rstrip("/") for n in nodes if n.node_id == leader}
        live = self.live_urls(nodes)
        for url in sorted(live, key=lambda url: url.rstrip("/") not in master_api):
            state = _json("GET", f"{url}/state", READ_TIMEOUT_S)
            if isinstance(state, dict):
                return url, state
        return None

    def copies(
        self, read: tuple[str, dict[str, Any]] | None = None
    ) -> dict[str, dict[str, Any] | None]:
        """Each running node's State by its API, None where it gave none; ``read``, a node's
        API and its State read just now (``read_state``), is taken as that node's copy rather
        than read again (417 KB, 80-100 ms of exo's event loop)."""
        found: dict[str, dict[str, Any] | None] = {}
        for url in self.live_urls():
            if read is not None and url == read[0]:
                found[url] = read[1]
                continue
            state = _json("GET", f"{url}/state", READ_TIMEOUT_S)
            found[url] = state if isinstance(state, dict) else None
        return found

    def states(self) -> dict[str, str]:
        """Each running node's ``lastEventAppliedIdx`` and the model's instances in its State:
        what a failure reports when the nodes disagree."""
        found: dict[str, str] = {}
        for url, state in self.copies().items():
            if state is not None:
                ids = sorted(i[:8] for i in self.instances(state))
                found[url] = f"event {state.get('lastEventAppliedIdx')}, instances {ids}"
            else:
                found[url] = "no State"
        return found

    def instances(
        self, state: dict[str, Any] | None = None, model: str | None = None
    ) -> dict[str, Instance]:
        """The model's instances in exo's State (``state``, else read now)."""
        state = self.state() if state is None else state
        if state is None:
            return {}
        runners: dict[str, Any] = state.get("runners", {})
        found: dict[str, Instance] = {}
        for instance_id, tagged in state.get("instances", {}).items():
            (instance,) = tagged.values()
            assignments = instance["shardAssignments"]
            if assignments["modelId"] != (model or self.model):
                continue
            node_to_runner: dict[str, str] = assignments["nodeToRunner"]
            ready = all("RunnerReady" in runners.get(r, {}) for r in node_to_runner.values())
            found[instance_id] = Instance(instance_id, tuple(node_to_runner), ready)
        return found

    def chat(self, url: str, timeout_s: float = CHAT_TIMEOUT_S) -> str:
        """One short chat of the model on ``url``: ``ok`` (200 with content), ``empty`` (200
        with no content: a cut chat), ``error`` (no answer or another status) or ``timeout``."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": CHAT_MAX_TOKENS,
        }
        try:
            response = http.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
        except httpx.TimeoutException:
            return "timeout"
        except httpx.HTTPError:
            return "error"
        if response.status_code != 200:
            return "error"
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            return "empty"
        return "ok" if content else "empty"

    def serving(
        self,
        away_from: str | None = None,
        gone: str | None = None,
        read: tuple[str, dict[str, Any]] | None = None,
    ) -> str | None:
        """The id of a ready instance of the model on a node other than ``away_from``, with the
        instance ``gone`` no longer in exo's State, once a chat is answered; else None. Judged
        on ``read`` (a node's API and its State, read already: ``Watch.serving``), else on a
        State read now."""
        read = self.read_state() if read is None else read
        if read is None:
            return None
        url, state = read
        found = self.instances(state)
        if gone is not None and gone in found:
            return None
        ready = [i for i in found.values() if i.ready and away_from not in i.node_ids]
        # The chat goes to the node whose State showed the instance: a node still catching up
        # with the master's log answers "No instance found" for a while.
        if not ready or self.chat(url, PROBE_CHAT_TIMEOUT_S) != "ok":
            return None
        return ready[0].instance_id

    def clear(self) -> None:
        """No instance of the model left in exo (one placed by hand, or by an earlier run)."""
        for instance_id in self.instances():
            # The first node that answers takes it: one catching up with the master's log can
            # leave its API unanswered for a while.
            for url in self.live_urls():
                if _json("DELETE", f"{url}/instance/{instance_id}", COMMAND_TIMEOUT_S) is not None:
                    break
        wait_for(
            "no instance of the model in exo", FORMED_WAIT_S, lambda: not self.instances() or None
        )


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


# --- the bridge ---------------------------------------------------------------------------------


@dataclass
class Bridge:
    """``exo-deploy bridge`` as a process: its URL, its log and its HTTP API."""

    url: str
    log: Path
    process: subprocess.Popen[bytes]
    started_at: float
    data_dir: Path

    def get(self, path: str) -> Any | None:
        return _json("GET", f"{self.url}{path}", READ_TIMEOUT_S)

    def deployment(self, model: str) -> dict[str, Any] | None:
        listed = self.get("/deployments") or {"deployments": []}
        for view in listed["deployments"]:
            if view["deployment"]["modelCard"]["modelId"] == model:
                return view
        return None

    def listed(self, model: str) -> dict[str, Any]:
        """The model's deployment as ``GET /deployments`` lists it (fails the test if not)."""
        view = self.deployment(model)
        assert view is not None, f"the bridge lists no deployment of {model}"
        return view

    def node_ids(self) -> set[str]:
        """Every node id the bridge's ``GET /nodes`` lists."""
        listed = self.get("/nodes") or {"nodes": []}
        return {node_id for n in listed["nodes"] for node_id in n["node_ids"]}

    def liveness(self) -> set[str]:
        """Each listed node's liveness (``alive``, ``suspect``, ``dead``, ``gone``)."""
        listed = self.get("/nodes") or {"nodes": []}
        return {n["liveness"] for n in listed["nodes"]}

    def lines(self, *needles: str) -> list[str]:
        """The bridge's log lines holding every one of ``needles``."""
        text = self.log.read_text(errors="replace")
        return [line for line in text.splitlines() if all(n in line for n in needles)]

    def deletions_sent(self) -> list[str]:
        """The instance ids the bridge sent exo's DELETE for, in order."""
        return [
            line.split("instance ", 1)[1].split(":", 1)[0] for line in self.lines(DELETION_SENT)
        ]

    def log_since(self, wall: float) -> str:
        """The bridge's log lines stamped at or after ``wall`` (time.time()), for a report."""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(wall - 1))
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text if line[:19] >= stamp and line[:4].isdigit())


def _majority_master(nodes: list[Node]) -> str | None:
    """The master most of ``nodes`` follow (exo split: the one to keep), or None if none says."""
    masters = Counter(n.master_node_id for n in nodes if n.master_node_id is not None)
    return masters.most_common(1)[0][0] if masters else None


# Linux's prctl option: the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1
# libc's prctl, looked up here: the forked child only calls it (no loader, no Python lock).
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_parent() -> None:
    """In the bridge's process before it runs: SIGTERM to it when this test run dies, however
    it dies. A run killed hard once left its bridge running, and that bridge went on placing the
    model on the next runs' clusters, spoiling two of them."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _start_bridge(cluster: ExoCluster, url: str, log: Path, data_dir: Path) -> Bridge:
    """``exo-deploy bridge`` on ``url``'s port and ``data_dir``, given every exo URL with exo's
    master's last (``ExoCluster.master_last``), its output appended to ``log``; once it follows
    exo."""
    port = url.rsplit(":", 1)[1]
    argv = ["bridge", "--exo", ",".join(cluster.master_last()), "--port", port]
    with log.open("ab") as output:  # the process keeps its own copy of the descriptor
        process = subprocess.Popen(
            [sys.executable, "-m", "keeper.cli", *argv, "--data-dir", str(data_dir)],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its group signalled alone (a freeze of it)
            # Safe beside threads here: it calls libc's prctl, looked up before the fork.
            preexec_fn=_die_with_parent,  # noqa: PLW1509
        )
    bridge = Bridge(url, log, process, time.monotonic(), data_dir)
    wait_for(
        "the bridge following exo",
        START_DEADLINE_S,
        lambda: (bridge.get("/healthz") or {}).get("exo", {}).get("reachable") or None,
    )
    return bridge


def _stop_bridge(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGCONT)
    stop(process)


def restart_bridge(cluster: ExoCluster, bridge: Bridge) -> None:
    """Stop ``bridge`` and start it again in place (same port, data dir and log), following
    exo's URLs in today's order, exo's master's last: after kills have moved exo's master onto
    the node the bridge follows, a freeze of that node is a freeze of exo's master, a case of
    its own. It keeps its deployments and instances (its data dir); its keeper waits out its
    startup grace again."""
    _stop_bridge(bridge.process)
    again = _start_bridge(cluster, bridge.url, bridge.log, bridge.data_dir)
    bridge.process, bridge.started_at = again.process, again.started_at


@contextlib.contextmanager
def running_bridge(cluster: ExoCluster, tmp: Path) -> Iterator[Bridge]:
    """A bridge with its own data dir and port, following every exo URL; stopped on exit."""
    url = f"http://127.0.0.1:{free_port()}"
    bridge = _start_bridge(cluster, url, tmp / "bridge.log", tmp / "bridge")
    try:
        yield bridge
    finally:
        _stop_bridge(bridge.process)


# --- watching while a fault runs ------------------------------------------------------------------


@dataclass
class Watch:
    """exo's State and the bridge's nodes, read every ``WATCH_EVERY_S`` in a thread: the most
    instances of the model seen at once, every instance id seen (with when it was first and last
    seen, and first seen ready, on the monotonic clock), and every liveness the bridge gave a
    node.

    While a Watch runs, the scenario asks it whether the model is served (``serving``) on the
    State it read last rather than reading one of its own: each ``GET /state`` costs exo's
    process 80-100 ms of its one event loop (417 KB), and the two loops reading side by side
    kept exo's master busy most of every second, slowing the placement being measured."""

    cluster: ExoCluster
    bridge: Bridge
    most: int = 0
    first_seen: dict[str, float] = field(default_factory=dict[str, float])
    last_seen: dict[str, float] = field(default_factory=dict[str, float])
    ready_at: dict[str, float] = field(default_factory=dict[str, float])
    liveness: set[str] = field(default_factory=set[str])
    first_judged: float | None = None
    latest: tuple[str, dict[str, Any]] | None = None  # the last State read, with its node's API
    # Every running node's copy, read every SCAN_EVERY_S: by the node's API.
    copies: dict[str, dict[str, Any]] = field(default_factory=dict[str, dict[str, Any]])
    _scanned_at: float = -math.inf
    _stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        while not self._stop.is_set():
            read = self.cluster.read_state()
            now = time.monotonic()
            if now - self._scanned_at >= SCAN_EVERY_S:
                copies = self.cluster.copies(read).items()
                self.copies = {url: state for url, state in copies if state is not None}
                self._scanned_at = now
            if read is not None:
                self.latest = read
                state = read[1]
                found = self.cluster.instances(state)
                self.most = max(self.most, len(found))
                for instance in found.values():
                    self.first_seen.setdefault(instance.instance_id, now)
                    self.last_seen[instance.instance_id] = now
                    if instance.ready:
                        self.ready_at.setdefault(instance.instance_id, now)
            phases = self.bridge.liveness()
            self.liveness |= phases
            if self.first_judged is None and phases - {"alive"}:
                self.first_judged = time.monotonic()
            self._stop.wait(WATCH_EVERY_S)

    @contextlib.contextmanager
    def watching(self) -> Iterator[Watch]:
        with _in_a_thread(self._loop, self._stop, join_s=10):
            yield self

    def serving(self, away_from: str | None = None, gone: str | None = None) -> str | None:
        """``ExoCluster.serving`` judged on the State this watch read last (class doc), else on
        each other node's copy it read last (``SCAN_EVERY_S``)."""
        reads = [] if self.latest is None else [self.latest]
        first = self.latest[0] if self.latest is not None else None
        reads += [(url, state) for url, state in self.copies.items() if url != first]
        for read in reads:
            found = self.cluster.serving(away_from, gone, read=read)
            if found is not None:
                return found
        return None

    def new_since(self, before: set[str]) -> list[str]:
        """Instance ids seen that were not in ``before``, in the order they appeared."""
        return sorted(set(self.first_seen) - before, key=self.first_seen.__getitem__)


@contextlib.contextmanager
def _in_a_thread(loop: Callable[[], None], stop: threading.Event, join_s: float) -> Iterator[None]:
    """``loop`` running in a thread of its own until the block ends; then ``stop`` is set and the
    thread given ``join_s`` to finish."""
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=join_s)


@dataclass
class Chats:
    """One client chatting with the model back to back, round-robin over the running nodes'
    APIs (exo's own, not the bridge's), counting each outcome: ``ok``, ``empty``, ``error``,
    ``timeout``."""

    cluster: ExoCluster
    counts: Counter[str] = field(default_factory=Counter[str])
    _stop: threading.Event = field(default_factory=threading.Event)

    def _loop(self) -> None:
        turn = 0
        while not self._stop.is_set():
            live = self.cluster.live_urls()
            if not live:
                self.counts["error"] += 1
                self._stop.wait(WATCH_EVERY_S)
                continue
            outcome = self.cluster.chat(live[turn % len(live)])
            self.counts[outcome] += 1
            turn += 1
            if outcome == "error":  # 404 "No instance found" answers at once: not a flood
                self._stop.wait(WATCH_EVERY_S)

    @contextlib.contextmanager
    def chatting(self) -> Iterator[Chats]:
        with _in_a_thread(self._loop, self._stop, join_s=CHAT_TIMEOUT_S + 5):
            yield self

    def summary(self) -> dict[str, int]:
        return {k: self.counts[k] for k in ("ok", "empty", "error", "timeout")}
