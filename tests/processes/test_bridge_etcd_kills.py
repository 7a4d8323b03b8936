"""The acting bridge killed (-9) again and again while deployments are created, scaled and deleted
through random bridges: never more instances of a model in exo's State than asked (sampled every
0.1 s), and every acknowledged write visible on every bridge at the end.

The kill count is ``EXO_DEPLOY_BRIDGE_KILLS`` (10 by default, about a minute here, to keep the
suite near its budget); ``python -m bench takeover`` runs the 100-kill loop and reports takeover
times.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from etcd_bridges import LEASE_S, TAKEOVER_MARGIN_S, kill_loop, stack

pytestmark = pytest.mark.e2e

# Six kills in a row give every path of a takeover (mid-write, mid-placement, idle) its turns;
# EXO_DEPLOY_BRIDGE_KILLS=50 makes a longer run of the same test.
KILLS = int(os.environ.get("EXO_DEPLOY_BRIDGE_KILLS", "6"))


@pytest.mark.e2e(seconds=55)
def test_kills_of_the_acting_bridge_duplicate_nothing_and_lose_no_write(tmp_path: Path) -> None:
    with stack(tmp_path) as running:
        report = kill_loop(running, KILLS)
    print(
        f"\n{report.kills} kills in {report.duration_s:.0f} s; takeover max "
        f"{max(report.takeovers_s):.2f} s; {report.acknowledged} writes acknowledged; "
        f"{report.samples} samples; ambiguous: {report.ambiguous_models}"
    )
    assert report.duplicates == []
    assert report.lost == []
    assert report.acknowledged > 0 and report.samples > KILLS
    assert max(report.takeovers_s) <= LEASE_S + TAKEOVER_MARGIN_S + 1
