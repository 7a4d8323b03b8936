"""Streams held at once through the front door, for ``python -m bench requests``
(docs/design.md §8.6): what each costs the bridge, and what they cost a chat beside them.

The front door takes up to ``--max-inflight`` chats at once (256 by default), held ones
included, and a stream is in flight until its last token: a cluster of slow models holds many
open. So the streams here stay open: the minimal upstream (``bench.exo_shaped_upstream``)
writes their first token at once and then one every few seconds, never a ``finish_reason``,
until the bench closes them. They are opened in steps up to the default; at each step the
bench reads the bridge's resident memory (per stream held: against the memory before the
first), whether the bridge still reads exo's State, and sends chats beside them both ways.

A stream that gets no first token within a deadline is waiting on something in the bridge (a
connection to exo, a hold) and is not held: it is closed, counted, and the steps stop there.

Last, one stream that exo holds with nothing but its keep-alive every 10 s, as exo does before
a long prompt's first token: the door's own bound on a silent stream is 30 s, so it should still
be open after two keep-alives, and sent to exo once.
"""

from __future__ import annotations

import time

import anyio

from bench.chat_client import ChatConnection, chat_body
from bench.chat_rounds import Kind, compare, hold_streams, interleaved
from bench.exo_shaped_upstream import HOLD, SILENT
from bench.requests_processes import Running, counts, following, rss_mib
from keeper.runtime.front_door import FrontDoorConfig

# --max-inflight's default: the most chats the door takes at once, held streams included.
DEFAULT_MAX_INFLIGHT = FrontDoorConfig().max_inflight
# The streams held at each step, up to --max-inflight's default.
HELD_STEPS = (64, 128, 192, DEFAULT_MAX_INFLIGHT)
# A held stream's first token comes at once from the minimal upstream; one that has none after
# this is waiting on something (a connection, a hold) and is not counted as held.
FIRST_TOKEN_DEADLINE_S = 15.0
# Chats beside the held streams, each way: enough for a p50 and a rough p99 at each step.
PROBE_CHATS = 200
# Their warm-up rounds: a fresh connection each way, after a step's burst of new streams.
PROBE_WARMUP = 5
# A chat beside held streams that takes this long is waiting, not slow: it is counted late.
PROBE_DEADLINE_S = 5.0
# After a step's streams are open: the bridge's memory settles (a poll or two of exo's State).
SETTLE_S = 2.0
# How long a silent stream (exo's keep-alive only) is watched: two of exo's 10 s intervals.
SILENT_WATCH_S = 20.0
# Tokens asked: the upstream writes its own, whatever is asked.
TOKENS = 8
# The shuffles' seed: a rerun sends the same order.
SEED = 7


def held(running: Running, model: str) -> None:
    """Print the held streams' figures (module doc)."""
    print(
        f"3. streams held at once through the door (the upstream writes a token every few "
        f"seconds and never ends them), up to --max-inflight's default {DEFAULT_MAX_INFLIGHT}; "
        f"beside them {PROBE_CHATS} streamed chats each way, interleaved:"
    )
    rss_before = rss_mib(running.bridge_pid)
    # One event loop for every step: the streams held stay open on it from step to step.
    anyio.run(_steps, running, model, rss_before)
    time.sleep(SETTLE_S)
    print(
        f"  all closed: bridge RSS {rss_mib(running.bridge_pid):.0f} MiB (before: {rss_before:.0f})"
    )
    print(
        f"  target: {DEFAULT_MAX_INFLIGHT} streams held, no chat beside them late, the bridge "
        "following exo throughout"
    )
    asked_before = counts(running.exo_url)["chats"]
    ended_s = anyio.run(_silent_stream, running.bridge_port, model)
    asked = counts(running.exo_url)["chats"] - asked_before
    what = f"ended after {ended_s:.1f} s" if ended_s is not None else "still open"
    print(
        f"  a stream exo holds with only its keep-alive every 10 s (as before a long prompt's "
        f"first token), watched {SILENT_WATCH_S:g} s: {what}, sent to exo {asked} time(s) "
        f"(target: still open, sent once: the door's own bound is 30 s of silence)"
    )


async def _steps(running: Running, model: str, rss_before: float) -> None:
    ports = (running.exo_port, running.bridge_port)
    hold_body = chat_body(model, HOLD, True, TOKENS)
    streams: list[ChatConnection] = []
    try:
        for asked in (0, *HELD_STEPS):
            missed = 0
            if asked > len(streams):
                opened, missed = await hold_streams(
                    running.bridge_port, hold_body, asked - len(streams), FIRST_TOKEN_DEADLINE_S
                )
                streams.extend(opened)
            await anyio.sleep(SETTLE_S)
            rss = rss_mib(running.bridge_pid)
            follows = await anyio.to_thread.run_sync(following, running.bridge_url)
            beside = Kind("streamed", chat_body(model, "hello", True, TOKENS), True)
            await interleaved(ports, [beside], PROBE_CHATS, PROBE_WARMUP, SEED, PROBE_DEADLINE_S)
            lacking = f"; {missed} had no first token in {FIRST_TOKEN_DEADLINE_S:g} s"
            per_stream = (rss - rss_before) * 1024 / len(streams) if streams else 0.0
            print(
                f"  {len(streams)} held (asked {asked}{lacking if missed else ''}): bridge RSS "
                f"{rss:.0f} MiB{f', {per_stream:.0f} KiB a stream' if streams else ''}; "
                f"follows exo: {'yes' if follows else 'NO'}; a chat beside them: "
                f"{_beside(beside)}",
                flush=True,
            )
            if missed:
                print("  (no more steps: more streams would wait as these did)")
                return
    finally:
        for stream in streams:
            await stream.aclose()


def _beside(kind: Kind) -> str:
    late = kind.late[1]
    if len(kind.through) < 2 or len(kind.straight) < 2:
        return f"through the door {late} late (> {PROBE_DEADLINE_S:g} s), the round given up"
    ttft = compare([t.ttft for t in kind.straight], [t.ttft for t in kind.through])
    note = f"; {late} late (> {PROBE_DEADLINE_S:g} s), the round given up" if late else ""
    return (
        f"first token added p50 {ttft.added_p50:+.2f} ms, p99 {ttft.added_p99:+.2f} ms "
        f"(through p50 {ttft.through_p50:.2f}, p99 {ttft.through_p99:.2f} ms){note}"
    )


async def _silent_stream(bridge_port: int, model: str) -> float | None:
    """Seconds until a silent stream through the door ended, or None if it was still open."""
    connection = await ChatConnection.open(bridge_port)
    started = time.perf_counter()
    try:
        await connection.send(chat_body(model, SILENT, True, TOKENS))
        with anyio.move_on_after(SILENT_WATCH_S):
            await connection.rest()
            return time.perf_counter() - started
        return None
    finally:
        await connection.aclose()
