"""Fast failover through the bridge for real (docs/design.md §5.18): ``exo-deploy cluster
--exo-compat`` (the stand-in for a stock exo master, exo's own 30 s timeout and 10 s sweep) and
``exo-deploy bridge`` following it, as processes; the steps live in ``tests/bridge_freezes.py``,
which ``make bench`` runs with the issue's exact lengths and prints.

With fast failover on (the bridge's 3 s / 8 s defaults), one cluster goes through, in order, at
replicas 2 on 3 nodes (so chats have a replica left when one node is lost), each fault on a node
no earlier one touched: a 2 s freeze of a serving node (no verdict, no replacement); a freeze of
it just past dead-after (a replacement, then its instance deleted by the bridge's DELETE while
exo still lists the node, so not by exo's sweep; nothing of it after the thaw); a freeze of the
other past its suspicion, thawed once its replacement is there (the surplus gone after the
thaw); the bridge itself paused past
dead-after while clients chat (nothing deleted or placed on waking); and a kill -9 of a replica's
node under that load (deleted by the bridge long before exo's timeout, chats answered). A thread
reads exo's State every 50 ms: never more than replicas + 1 instances. How fast each of these
is, is a figure of ``make bench`` (``bridgefail``), not an assertion that a loaded machine could
fail. Off (the bridge's ``--suspect-after-s 0``): the kill waits for exo's timeout and sweep,
here at half their lengths (15 s and 3 s: the same rule, half the wait).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bridge_freezes import (
    HEARD_AGAIN_S,
    Watch,
    all_heard,
    deploy_and_wait,
    freeze,
    freeze_past_dead,
    freeze_under_dead,
    kill_and_time,
    kill_under_load,
    pause_bridge,
    running,
    start_chats,
    thaw_at,
)
from process_helpers import wait_for

from keeper.model.liveness import DEFAULT_DEAD_AFTER_S, DEFAULT_SUSPECT_AFTER_S

pytestmark = pytest.mark.e2e

REPLICAS = 2
# exo's own rule would delete a lost node's instances no sooner than its 30 s timeout; well
# before that, with room for a loaded machine, is the bridge's doing.
BEFORE_EXO_WOULD_S = 25.0
# The bridge paused past dead-after: long enough that every node's lastSeen looks stale to it.
BRIDGE_PAUSE_S = DEFAULT_DEAD_AFTER_S + 1.0
CLIENTS = 2
# Chats answered after the kill, once the replicas are back (the clients chat from before the
# bridge's pause, a few hundred by then): the bench counts a thousand more.
CHATS_AFTER = 50


@pytest.mark.e2e(seconds=80)
def test_freezes_a_paused_bridge_and_a_kill_under_load_through_the_bridge(tmp_path: Path) -> None:
    with running(tmp_path) as run, Watch(run).watching() as watch:
        first = deploy_and_wait(run, REPLICAS)
        x, y = sorted(first.values())
        (z,) = (run.exo_nodes() or set()) - {x, y}

        # 2 s: under the 3 s suspicion; no verdict, no replacement.
        pid = run.pid_of(x)
        thaw_at(pid, freeze(pid), 2.0)
        wait_for("every node heard again", HEARD_AGAIN_S, lambda: all_heard(run))
        assert watch.most == REPLICAS and watch.judged == set()
        assert run.instances() == first

        # Past dead-after: a replacement first, then the frozen node's instance deleted by the
        # bridge, exo still listing the node; after the thaw nothing of it is left.
        frozen = freeze_past_dead(run, x, None)
        assert frozen.replaced_s is not None and frozen.deleted_s is not None
        assert frozen.replaced_s < frozen.deleted_s  # make before break
        assert (frozen.silent_at_replacement_s or 0.0) >= DEFAULT_SUSPECT_AFTER_S
        assert frozen.silent_at_deletion_s is not None
        assert frozen.silent_at_deletion_s >= DEFAULT_DEAD_AFTER_S  # never while only suspect
        assert frozen.deleted_by_bridge and frozen.exo_still_listed_it
        assert sorted(frozen.left.values()) == sorted([y, z])
        after_dead = frozen.left

        # The other, past its suspicion (thawed once its replacement is there, the bench's 6 s
        # the same rule): a replacement (on the thawed node), then the surplus gone.
        short = freeze_under_dead(run, y, None)
        assert (
            short.replaced_s is not None
            and short.silent_at_replacement_s is not None
            and short.silent_at_replacement_s >= DEFAULT_SUSPECT_AFTER_S
        )
        assert short.left == after_dead  # the replacement went, the ready original stayed
        wait_for("every node heard again", HEARD_AGAIN_S, lambda: all_heard(run))

        # The bridge paused past dead-after while clients chat: nothing on waking.
        chats = start_chats(run, CLIENTS)
        judged, seen = set(watch.judged), set(watch.seen)
        paused = pause_bridge(run, BRIDGE_PAUSE_S)
        assert paused.deletions_after == paused.deletions_before
        assert paused.after == paused.before == after_dead
        assert watch.judged == judged and watch.seen == seen  # nobody suspected, nothing placed

        # kill -9 of the node no fault touched yet, under that load.
        killed = kill_under_load(run, z, chats, before=1, after=CHATS_AFTER)
    assert watch.most <= REPLICAS + 1
    assert killed.deleted_by_bridge and killed.exo_still_listed_it
    assert killed.deleted_s < BEFORE_EXO_WOULD_S
    assert killed.silent_at_deletion_s is not None
    assert killed.silent_at_deletion_s >= DEFAULT_DEAD_AFTER_S
    print(
        f"\nbridge, fast failover on: freeze 2 s -> no verdict; freeze {frozen.seconds:.1f} s "
        f"-> replacement {frozen.replaced_s:.1f} s, deleted {frozen.deleted_s:.1f} s (exo silent "
        f"{frozen.silent_at_deletion_s:.1f} s); freeze "
        f"{short.seconds:.1f} s -> replacement {short.replaced_s:.1f} s, surplus gone; bridge "
        f"paused {paused.seconds:.1f} s -> nothing; kill -9 under load -> deleted "
        f"{killed.deleted_s:.1f} s, replicas back {killed.recovered_s:.1f} s, {killed.answered} "
        f"of {killed.sent} chats answered {killed.failures[:3]}; most {watch.most}"
    )
    # The clients chat straight to exo's API (the stand-in behaving as exo): a chat in flight on
    # the killed node's instance is cut when that instance is deleted (exo's empty 200). Nothing
    # else may fail: at most one cut chat per client, each an empty answer.
    cut = [f for f in killed.failures if f.startswith("200 without an answer")]
    assert cut == killed.failures, killed.failures
    assert len(cut) <= CLIENTS


@pytest.mark.e2e(seconds=40)
def test_a_kill_through_the_bridge_with_fast_failover_off(tmp_path: Path) -> None:
    # exo's rule at half its lengths (15 s of silence, a sweep every 3 s): the same rule, half
    # the wait, and still well apart from what fast failover would do (8 s); the full 30 s /
    # 10 s is bench bridgefail's.
    timeout_s = 15
    exo_flags = ("--node-timeout", str(timeout_s), "--sweep-interval", "3")
    with (
        running(tmp_path, "--suspect-after-s", "0", exo_flags=exo_flags) as run,
        Watch(run).watching() as watch,
    ):
        first = deploy_and_wait(run, 1)
        (holder,) = first.values()
        chat_s, deleted_s, serving_s = kill_and_time(run, holder)
    assert watch.most <= 2 and watch.judged == set()
    print(
        f"\nbridge, fast failover off: kill -9 -> chat answered {chat_s:.1f} s, lost "
        f"instance deleted {deleted_s:.1f} s, serving (both) {serving_s:.1f} s; most "
        f"instances {watch.most}"
    )
    # Nothing before exo's timeout, counted from the node's last report (up to a second or two
    # before the kill on a loaded machine), then its sweep.
    assert deleted_s > timeout_s - 2
