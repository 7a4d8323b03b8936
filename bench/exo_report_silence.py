"""How long a short freeze of a real exo node silences its reports, at random phases.

The fast-failover rule suspects a node whose ``lastSeen`` has not moved for ``--suspect-after-s``
(3 s by default), and a 2 s freeze of a node must move nothing (docs/design.md §5.18). How much
margin that leaves depends on exo's report cadence, which only a real cluster shows: a node
frozen just before its next report is silent for the freeze plus almost a whole report
interval. This freezes one node (neither exo's master nor the node read from) again and again,
each time at a random moment, and prints, for each freeze, how long after the node's last report
before the freeze its next report was made and when it showed in another node's State; and the
least lag with which a report showed before the freeze (what dating a report by its least lag
could at best win back).

Not part of ``make bench``: it needs a real cluster, given by its control API as ``make
test-exo`` is (``EXO_DEPLOY_EXO_CONTROL``: it lists the nodes and their APIs, freezes and thaws
them). Run: ``python -m bench.exo_report_silence [FREEZES] [FREEZE_S]``.
It reads ``GET /state/lastSeen`` (a few hundred bytes) every 30 ms: the whole State would cost
exo's event loop 80-100 ms a read. ``lastSeen`` is the node's own clock: on one host (the
development cluster) the lags printed are exact; across hosts they carry the clocks' offset, which
cancels in the count of freezes that would have been suspected (a lag against the least lag).
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from datetime import datetime

import httpx

# How often the node's lastSeen is read: small beside exo's ~1 s report interval, so the time a
# report shows is measured to within this.
READ_EVERY_S = 0.03
# Between freezes the node reports undisturbed for this long (plus up to a second at random, so
# each freeze starts at a random point of the node's report interval); the least lag is taken
# over the reports of that time.
STEADY_S = 4.0
# The suspicion threshold the freezes are set against (``--suspect-after-s``'s default).
SUSPECT_AFTER_S = 3.0


def _last_seen(client: httpx.Client, api: str, node_id: str) -> float:
    seen: dict[str, str] = client.get(f"{api}/state/lastSeen").json()
    return datetime.fromisoformat(seen[node_id]).timestamp()


def main(freezes: int, freeze_s: float) -> None:
    control = os.environ.get("EXO_DEPLOY_EXO_CONTROL", "").rstrip("/")
    if not control:
        sys.exit("set EXO_DEPLOY_EXO_CONTROL=http://HOST:PORT, the control API that freezes nodes")
    client = httpx.Client(timeout=5.0)
    nodes = [n for n in client.get(f"{control}/nodes").json() if n["status"] == "running"]
    master = nodes[0]["master_node_id"]
    frozen, reader = [n for n in nodes if n["node_id"] != master][:2]
    node_id, api, index = frozen["node_id"], reader["api"], frozen["index"]
    print(f"freezing node {index} ({node_id[:8]}) for {freeze_s:g} s, reading {api}")
    silences: list[float] = []
    suspected = 0  # freezes a report dated by its least lag would have had suspected
    for _ in range(freezes):
        lags: list[float] = []
        last = _last_seen(client, api, node_id)
        steady_until = time.time() + STEADY_S + random.random()
        while time.time() < steady_until:
            made = _last_seen(client, api, node_id)
            if made != last:
                lags.append(time.time() - made)
                last = made
            time.sleep(READ_EVERY_S)
        client.post(f"{control}/nodes/{index}/stop")
        frozen_at = time.time()
        try:
            while time.time() < frozen_at + freeze_s:
                made = _last_seen(client, api, node_id)
                last = max(last, made) if made < frozen_at else last
                time.sleep(READ_EVERY_S)
        finally:
            client.post(f"{control}/nodes/{index}/cont")
        while (made := _last_seen(client, api, node_id)) < frozen_at:
            last = max(last, made)  # made before the freeze, shown after it
            time.sleep(READ_EVERY_S)
        shown = time.time() - last
        silences.append(made - last)
        suspected += shown > min(lags) + SUSPECT_AFTER_S
        print(
            f"frozen {frozen_at - last:.2f} s after a report; next report made "
            f"{made - last:.2f} s after it, shown {shown:.2f} s after it; "
            f"least lag before {min(lags):.3f} s"
        )
    print(
        f"{freezes} freezes of {freeze_s:g} s: silence {min(silences):.2f}-{max(silences):.2f} s "
        f"(median {statistics.median(silences):.2f}); dated by its least lag, the last report "
        f"before the freeze would have had {suspected} of them suspected at {SUSPECT_AFTER_S:g} s"
    )


if __name__ == "__main__":
    main(
        int(sys.argv[1]) if len(sys.argv) > 1 else 20,
        float(sys.argv[2]) if len(sys.argv) > 2 else 2.0,
    )
