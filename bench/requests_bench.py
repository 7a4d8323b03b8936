"""What the front door costs a chat: the same chats sent straight to an exo-shaped upstream and
through the bridge's ``POST /v1/chat/completions`` (docs/design.md §8.6), and how many streams
it holds at once. Figures printed beside their targets, never asserted.

Run with ``make bench SECTIONS=requests`` or ``python -m bench requests`` (about 10 minutes on
two shared cores). Real processes on real sockets throughout (``bench.requests_processes``):
``exo-deploy bridge --exo URL`` at its defaults (``--hold-s 30``, ``--max-inflight 256``), the
bench's chats from a bare keep-alive client (``bench.chat_client``), each interleaved with its
straight partner (``bench.chat_rounds``).

Two upstreams, because each answers a different question:

1. *The stand-in, end to end.* ``exo-deploy cluster --exo-compat`` (our stand-in for a stock exo
   master, with node processes) and a bridge beside it; Qwen3-0.6B deployed through the bridge
   and serving, so a chat takes the normal path: a deployment that serves. What a user of the
   simulation sees, but each answer is paced by the node's 50 ms a token and carried through a
   master, a websocket and a node process, so its jitter on two shared cores hides a cost of a
   millisecond or two.
2. *A minimal exo-shaped upstream* (``bench.exo_shaped_upstream``): exo's answers written the
   moment a chat is read, and the stand-in's State as recorded at the end of (1). A second
   bridge on the first one's data dir adopts the recorded instance, so its deployment serves
   at once: the front door's own cost, on both paths it takes (a model with a serving
   deployment, and one with none, passed straight on). The target is read on these figures:
   added p50 <= 2 ms. Beside them, the bridge's CPU per chat (less at the mercy of the other
   processes than a latency), how many connections it opened to the upstream, and for scale
   the bridge's own ``GET /healthz`` (neither exo nor the door: what any answer of the
   bridge's HTTP server costs).

Then, on (2), streams held at once (``bench.requests_held``). The machine is described before
and after (``requests_processes.machine``): on shared cores a latency is mostly waiting for a
core, and the ratio of a reference loop's wall time to its CPU time says how much.

``BENCH_REQUESTS_DOOR_ONLY=1`` runs (2)'s chats alone (about a minute): the stand-in is still
started, its model deployed and its State recorded (the minimal upstream serves it), but its
chats are not sent, nor are streams held. For measuring a change to the door's own cost.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import anyio

from bench.chat_client import chat_body
from bench.chat_rounds import Kind, bad, compare, interleaved, pct
from bench.master_bench import (  # pyright: ignore[reportPrivateUsage]
    _cpu_seconds,
    timed_gets,
)
from bench.requests_held import held
from bench.requests_processes import (
    Running,
    counts,
    machine,
    minimal,
    record,
    standin,
    tests_on_path,
)

# The model deployed, and one exo lists that has no deployment (the door passes it straight on).
DEPLOYED = "mlx-community/Qwen3-0.6B-4bit"
UNDEPLOYED = "mlx-community/Llama-3.2-1B-Instruct-4bit"
# Tokens a stand-in chat asks for: two, so a stream's first token and its end are apart (the
# node writes one each 50 ms), and a round of four chats takes under half a second.
STANDIN_TOKENS = 2
# Chats of each kind each way: at least 500 each for a p99 (the 5 slowest set it).
STANDIN_CHATS = 500
# The minimal upstream's chats take a few ms: twice as many, for a steadier p99.
MINIMAL_CHATS = 1000
# Tokens asked of the minimal upstream: it writes its few at once whatever is asked.
MINIMAL_TOKENS = 8
# Rounds sent first and not counted (module doc of bench.chat_rounds).
WARMUP = 20
# The target (the issue's): the front door adds at most this to a chat's p50.
TARGET_ADDED_P50_MS = 2.0
# Over this long the bridge's CPU at rest is measured, to take it out of its CPU per chat.
IDLE_S = 3.0
# GETs of the bridge's /healthz, for scale: enough for a p50 and a rough p99.
SCALE_GETS = 200
# The shuffles' seed: a rerun sends the same order.
SEED = 7
# Set (to anything but "" or "0"): (2)'s chats alone (module doc).
DOOR_ONLY = os.environ.get("BENCH_REQUESTS_DOOR_ONLY", "") not in ("", "0")


def _print_kinds(kinds: Sequence[Kind]) -> list[float]:
    """Each kind's figures; the added p50s (ms): a stream's first token and end, an answer."""
    added: list[float] = []
    for kind in kinds:
        both = (kind.straight, kind.through)
        if kind.streamed:
            ttft = compare(*([t.ttft for t in timed] for timed in both))
            print(f"  {kind.label}, first token: {ttft.line()}")
            added.append(ttft.added_p50)
        totals = compare(*([t.total for t in timed] for timed in both))
        print(f"  {kind.label}, {'end' if kind.streamed else 'answer'}: {totals.line()}")
        added.append(totals.added_p50)
        trouble = bad(kind)
        if trouble:
            print(f"    not counted as whole: {trouble}")
    return added


def _standin_figures(running: Running) -> None:
    kinds = [
        Kind("streamed", chat_body(DEPLOYED, "hello", True, STANDIN_TOKENS), True),
        Kind("not streamed", chat_body(DEPLOYED, "hello", False, STANDIN_TOKENS), False),
    ]
    started = time.perf_counter()
    ports = (running.exo_port, running.bridge_port)
    anyio.run(interleaved, ports, kinds, STANDIN_CHATS, WARMUP, SEED)
    print(
        f"1. the stand-in (exo-deploy cluster --exo-compat, node processes), {DEPLOYED} "
        f"deployed and serving, {STANDIN_TOKENS} tokens at 50 ms each; {STANDIN_CHATS} chats "
        f"of each kind each way, interleaved ({time.perf_counter() - started:.0f} s):"
    )
    _print_kinds(kinds)


def _door_cost(running: Running) -> None:
    pid = running.bridge_pid
    idle_before = _cpu_seconds(pid)
    time.sleep(IDLE_S)
    idle_rate = (_cpu_seconds(pid) - idle_before) / IDLE_S
    kinds = [
        Kind(f"{label}, {name}", chat_body(model, "hello", stream, MINIMAL_TOKENS), stream)
        for label, model in (("deployed", DEPLOYED), ("no deployment", UNDEPLOYED))
        for name, stream in (("streamed", True), ("not streamed", False))
    ]
    before = counts(running.exo_url)
    cpu_before, started = _cpu_seconds(pid), time.perf_counter()
    anyio.run(
        interleaved, (running.exo_port, running.bridge_port), kinds, MINIMAL_CHATS, WARMUP, SEED
    )
    took = time.perf_counter() - started
    chats = len(kinds) * (MINIMAL_CHATS + WARMUP)  # the warm-up's chats cost the bridge too
    cpu_ms = (_cpu_seconds(pid) - cpu_before - idle_rate * took) / chats * 1e3
    # The bench's own straight chats came on one connection of their own, and each count is
    # read on a connection of its own (the second one's is counted in it).
    connections = counts(running.exo_url)["connections"] - before["connections"] - 2
    print(
        f"2. a minimal exo-shaped upstream (answers at once; the stand-in's State recorded), "
        f"{DEPLOYED} deployed and serving, {UNDEPLOYED} with no deployment; {MINIMAL_CHATS} "
        f"chats of each kind each way, interleaved ({took:.0f} s):"
    )
    worst = max(_print_kinds(kinds))
    print(
        f"  the bridge's CPU per chat through it: {cpu_ms:.2f} ms (its CPU at rest, "
        f"{idle_rate * 1e3:.0f} ms/s, taken out); connections it opened to the upstream: "
        f"{connections} for {chats} chats (one kept alive would carry them all)"
    )
    health = anyio.run(timed_gets, running.bridge_port, "/healthz", SCALE_GETS)
    print(
        f"  for scale, the bridge's GET /healthz (neither exo nor the door), {SCALE_GETS} on "
        f"one connection: p50 {pct(health, 0.5) * 1e3:.2f} ms, p99 {pct(health, 0.99) * 1e3:.2f}"
        " ms"
    )
    print(
        f"  target: the front door adds <= {TARGET_ADDED_P50_MS:g} ms to a chat's p50: "
        f"{'met' if worst <= TARGET_ADDED_P50_MS else 'NOT met'} (the most added, of every "
        f"kind's first token and end: {worst:+.2f} ms)"
    )


def run() -> None:
    tests_on_path()
    print(f"the machine before: {machine()}")
    with tempfile.TemporaryDirectory(prefix="requests-") as tmp:
        with standin(Path(tmp), DEPLOYED) as running:
            if not DOOR_ONLY:
                _standin_figures(running)
            recorded = record(running.exo_url)
        with minimal(Path(tmp), recorded, DEPLOYED) as running:
            _door_cost(running)
            if not DOOR_ONLY:
                held(running, DEPLOYED)
            sent = counts(running.exo_url)["commands"]
        by_kind = Counter(command.split("/chatcmpl")[0] for command in sent)
        print(f"  commands the bridge sent the upstream, by kind: {dict(by_kind) or 'none'}")
    print(f"the machine after: {machine()}")


if __name__ == "__main__":
    run()
