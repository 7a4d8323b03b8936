"""Faults on our master, as real processes, at the issue's exact lengths (docs/design.md §5.18):
figures printed beside their targets, never asserted.

``tests/processes/test_e2e_failover.py`` runs the same steps (``freezes_pause_and_kill``) with
the long freeze and the master's pause shortened to just past dead-after, and exo's timeout cut
to half when fast failover is off, and asserts only behaviour; how fast each one is, on this
machine at this moment, is this section's figure. ``exo-deploy cluster`` with exo's 30 s
timeout and 10 s sweep, the failover flags at their 3 s / 8 s defaults, Qwen3-0.6B at replicas 1
with a standby copy on every node:

1. A 2 s freeze of the serving node, 20 s of it, 6 s of the next, the master paused 30 s, then
   a kill -9 of the serving node. Target: serving again ≤ suspect + load + 1 s.
2. The same kill with fast failover off (``--suspect-after-s 0``): exo's timeout and sweep.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from keeper.model.liveness import DEFAULT_SUSPECT_AFTER_S

# The fault lengths (the test shortens the long ones to just past dead-after).
FREEZE_LONG_S = 20.0
MASTER_PAUSE_S = 30.0
# Qwen3-0.6B loads in well under a second on a simulated node: the target's "load" term.
LOAD_S = 1.0


def run() -> None:
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path[:0] = [str(tests), str(tests / "processes")]
    import test_e2e_failover as steps  # pyright: ignore[reportMissingImports]  # noqa: PLC0415

    with tempfile.TemporaryDirectory(prefix="bench-masterfail-") as tmp:
        (Path(tmp) / "on").mkdir()
        (Path(tmp) / "off").mkdir()
        with steps.running(Path(tmp) / "on") as cluster:
            on = steps.freezes_pause_and_kill(
                cluster, long_freeze_s=FREEZE_LONG_S, master_pause_s=MASTER_PAUSE_S
            )
        target = DEFAULT_SUSPECT_AFTER_S + LOAD_S + 1.0
        print("our master, fast failover on (3 s / 8 s), exo's 30 s timeout and 10 s sweep:")
        print("  2 s freeze: no verdict, no replacement (checked)")
        print(
            f"  {FREEZE_LONG_S:g} s freeze: replacement at {on.long_replaced_s:.2f} s, old "
            f"instance deleted at {on.long_deleted_s:.2f} s, nothing of it after the thaw"
        )
        print(f"  6 s freeze: replacement at {on.mid_replaced_s:.2f} s, surplus gone after thaw")
        print(f"  master paused {MASTER_PAUSE_S:g} s: nothing failed over on waking (checked)")
        print(
            f"  kill -9: serving again {on.serving_s:.2f} s (target <= {target:g} s), lost "
            f"instance deleted {on.lost_s:.2f} s; most instances {on.most} (replicas + 1 = 2)"
        )
        with steps.running(Path(tmp) / "off", "--suspect-after-s", "0") as cluster:
            _, holder = steps.deploy_and_wait(cluster)
            serving_s, lost_s = steps.kill_and_time(cluster, holder)
        print(
            f"our master, fast failover off: kill -9 -> serving {serving_s:.1f} s (lost instance "
            f"deleted {lost_s:.1f} s)"
        )
