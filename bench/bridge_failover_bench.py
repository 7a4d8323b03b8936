"""Faults through the bridge on the stand-in, as real processes, at the issue's exact lengths
(docs/design.md §5.18): figures printed beside their targets, never asserted.

``tests/processes/test_bridge_failover_process.py`` runs the same steps
(``tests/bridge_freezes.py``) with the faults shortened to just past dead-after and asserts only
behaviour; how fast each one is, on this machine at this moment, is this section's figure. Two
clusters of ``exo-deploy cluster --exo-compat`` (exo's 30 s timeout and 10 s sweep) with
``exo-deploy bridge`` at its 3 s / 8 s defaults, Qwen3-0.6B held by every node:

1. Replicas 2: a 2 s freeze of a serving node, 20 s of it, 6 s of the other, the bridge itself
   paused 30 s while four clients chat through exo's API, then a kill -9 of the node no fault
   touched under that load (chats sent / answered / failed, counted on exo's API: the bridge
   sees no chats).
2. Replicas 1 at standby 1: a kill -9 of the serving node, timed to serving again as a stock exo
   serves (a chat answered and the lost instance deleted: exo's master sends chats to it until
   then). Target: dead-after + 1 s.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from keeper.model.liveness import DEFAULT_DEAD_AFTER_S, DEFAULT_SUSPECT_AFTER_S

# The fault lengths (the test shortens the long ones to just past dead-after).
FREEZE_SHORT_S = 2.0
FREEZE_MID_S = 6.0
FREEZE_LONG_S = 20.0
BRIDGE_PAUSE_S = 30.0
CLIENTS = 4
# Chats answered after the kill, once both replicas are back: one failure in a thousand shows.
CHATS_AFTER = 1000


def _freezes_and_load(tmp: Path) -> None:
    import bridge_freezes as bf  # pyright: ignore[reportMissingImports]  # noqa: PLC0415

    with bf.running(tmp) as run, bf.Watch(run).watching() as watch:
        first = bf.deploy_and_wait(run, 2)
        x, y = sorted(first.values())
        (z,) = (run.exo_nodes() or set()) - {x, y}
        pid = run.pid_of(x)
        bf.thaw_at(pid, bf.freeze(pid), FREEZE_SHORT_S)
        bf.wait_for("every node heard again", bf.HEARD_AGAIN_S, lambda: bf.all_heard(run))
        short_judged, short_most = set(watch.judged), watch.most
        long = bf.freeze_past_dead(run, x, FREEZE_LONG_S)
        mid = bf.freeze_under_dead(run, y, FREEZE_MID_S)
        chats = bf.start_chats(run, CLIENTS)
        paused = bf.pause_bridge(run, BRIDGE_PAUSE_S)
        seen_before_kill = set(watch.seen)
        killed = bf.kill_under_load(run, z, chats, before=1, after=CHATS_AFTER)
    print(
        f"freeze {FREEZE_SHORT_S:.0f} s: nodes judged {sorted(short_judged) or 'none'}, most "
        f"instances {short_most} (target: no verdict, no replacement, 2)"
    )
    print(
        f"freeze {long.seconds:.1f} s: replacement {long.replaced_s:.2f} s, the frozen node's "
        f"instance deleted {long.deleted_s:.2f} s (by the bridge's DELETE: "
        f"{long.deleted_by_bridge}; exo still listing the node: {long.exo_still_listed_it}); "
        f"after the thaw {len(long.left)} instances, on {sorted(long.left.values())} "
        f"(target: deleted after dead-after {DEFAULT_DEAD_AFTER_S:.0f} s + a poll, none left "
        "on the thawed node)"
    )
    print(
        f"freeze {mid.seconds:.1f} s: replacement {mid.replaced_s:.2f} s, after the thaw "
        f"{len(mid.left)} instances (target: a replacement after {DEFAULT_SUSPECT_AFTER_S:.0f} s "
        "+ a poll, then the surplus gone)"
    )
    print(
        f"bridge paused {paused.seconds:.1f} s: deletions sent on waking "
        f"{paused.deletions_after - paused.deletions_before}, instances before/after "
        f"{len(paused.before)}/{len(paused.after)}, same: {paused.before == paused.after} "
        f"(target: nothing deleted, nothing placed)"
    )
    print(
        f"kill -9 of one of 2 replicas' nodes under {CLIENTS} clients: {killed.answered} of "
        f"{killed.sent} chats answered ({100 * killed.share:.3f} %), {len(killed.failures)} "
        f"failed {killed.failures[:3]}; its instance deleted {killed.deleted_s:.2f} s after the "
        f"kill (by the bridge: {killed.deleted_by_bridge}), 2 ready again "
        f"{killed.recovered_s:.2f} s (target: >= 99.9 % answered)"
    )
    print(
        f"most instances at once, the whole run: {watch.most}; instances ever: "
        f"{len(watch.seen)} ({len(seen_before_kill)} before the kill) (target: <= replicas + 1 "
        "= 3)"
    )


def _kill(tmp: Path) -> None:
    import bridge_freezes as bf  # pyright: ignore[reportMissingImports]  # noqa: PLC0415

    with bf.running(tmp) as run, bf.Watch(run).watching() as watch:
        (holder,) = bf.deploy_and_wait(run, 1).values()
        chat_s, deleted_s, serving_s = bf.kill_and_time(run, holder)
    print(
        f"kill -9 of the serving node (replicas 1, standby 1): serving again {serving_s:.2f} s "
        f"(chat answered {chat_s:.2f} s, lost instance deleted {deleted_s:.2f} s), most "
        f"instances {watch.most} (target: <= dead-after + 1 s = {bf.KILL_TARGET_S:.0f} s, <= 2)"
    )


def run() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    print(
        "through the bridge (3 s / 8 s) on the stand-in (exo's 30 s timeout, 10 s sweep), real "
        "processes, Qwen3-0.6B on every node"
    )
    for step in (_freezes_and_load, _kill):
        with tempfile.TemporaryDirectory(prefix="bridgefail-") as tmp:
            try:
                step(Path(tmp))
            except BaseException as failed:  # the helpers' waits fail as pytest does
                if isinstance(failed, KeyboardInterrupt):
                    raise
                raise RuntimeError(f"{step.__name__}: {failed}") from failed


if __name__ == "__main__":
    run()
